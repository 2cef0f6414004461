// The CPU thread policy. accrue's loops (kernels/cpu/parallel.h) and its GEMM blocks
// (kernels/cpu/gemm.cpp) share one OpenMP team and BLAS runs single-threaded inside it, so one
// number, set_cpu_threads(), governs every core accrue uses and nothing oversubscribes.
//
// Which number is best is not knowable in advance: on a small micro-batch a second thread can
// win 1.5x when its core is free and lose 5x when another process is busy on it (each parallel
// region then waits for a thread the scheduler has parked). ThreadTuner decides by measuring the
// program's own work: it times a few windows at each candidate count, keeps the fastest, watches
// for the chosen count slowing down, and checks again at growing intervals. Results do not
// depend on the thread count (the GEMM cut and every reduction's order are fixed by the shape),
// so switching mid-run changes timings only, never a bit of the weights.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace accrue {

int cpu_cores();  // cores this process may run on
// Runnable threads of other processes (Linux: /proc/stat procs_running, less this process's
// own running threads; the least of three looks 2 ms apart); 0 where it cannot be read.
int busy_cores();
int cpu_threads();            // the team size set now
void set_cpu_threads(int n);  // n >= 1

struct ThreadTunerOptions {
  int probe_windows = 5;        // timed windows per candidate
  int64_t first_hold = 200;     // windows before the first re-check
  int64_t max_hold = 6400;      // the interval doubles while the choice stands, up to this
  double slowdown = 1.5;        // re-check at once when the chosen count gets this much slower
  double hopeless = 3.0;        // a probe stops after one timing this much behind the best
  double prefer_fewer = 1.03;   // more threads must be at least this much faster to be chosen
  double switch_margin = 1.05;  // and any other count this much faster than the current choice
  // Cores busy with other processes right now (busy_cores() by default); a round does not probe
  // counts that would not fit beside them (1 and the count in use are always measured). Null:
  // probe every count.
  std::function<int()> busy_cores = accrue::busy_cores;
};

class ThreadTuner {
 public:
  // candidates: thread counts to try, ascending (default_candidates(cpu_cores()) in practice).
  explicit ThreadTuner(std::vector<int> candidates, ThreadTunerOptions options = {});
  static std::vector<int> default_candidates(int cores);  // 1, 2, 4, ..., cores

  // The thread count for the next window; then record() its measured seconds per sample.
  int next() const { return current_; }
  void record(double seconds_per_sample);

  int chosen() const { return chosen_; }
  int64_t checks() const { return checks_; }      // completed probe rounds
  int64_t switches() const { return switches_; }  // rounds that changed the choice
  std::string describe() const;

 private:
  void start_probe();
  void finish_probe();

  std::vector<int> candidates_;
  ThreadTunerOptions options_;
  bool probing_ = false;
  std::vector<size_t> order_;  // candidate indices in probing order
  size_t order_pos_ = 0;
  size_t probe_index_ = 0;
  bool warmed_up_ = false;  // the run's first window (first-touch allocations) is not timed
  std::vector<std::vector<double>> timings_;  // per candidate, this round
  std::vector<double> medians_;               // per candidate, this round (0: not measured)
  int current_ = 1, chosen_ = 1;
  double chosen_median_ = 0;
  std::vector<double> recent_;  // the chosen count's last probe_windows timings while holding
  int64_t hold_ = 0, hold_left_ = 0;
  bool slowed_down_ = false;  // the probe running was started by a slowdown
  int64_t checks_ = 0, switches_ = 0;
};

}  // namespace accrue
