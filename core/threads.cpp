// The CPU thread policy (see threads.h): the OpenMP team size, and the tuner that picks it by
// timing the program's own windows. A round measures every candidate: the count in use by its
// last probe_windows windows, each other one by probe_windows timed windows, cut short when it
// is plainly behind the best so far. It keeps the fastest median (leaving the current choice only
// for a clear margin) and holds it for an interval that doubles while the choice stands,
// re-checking at once when the windows slow down. On a busy machine a re-check of the slow count
// costs one window; on an idle one, two.
#include "core/threads.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace accrue {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int cpu_cores() {
  return omp_get_num_procs();
}

namespace {

// The number after `key` on its line of a /proc file, or -1.
int proc_count(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) return std::atoi(line.c_str() + key.size());
  }
  return -1;
}

// This process's threads that are running now (state R in /proc/self/task/*/stat).
int own_running_threads() {
  int running = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream stat(task.path() / "stat");
    std::string text;
    std::getline(stat, text);
    const size_t close = text.rfind(')');  // the name may hold spaces and parentheses
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'R') {
      ++running;
    }
  }
  return running;
}

}  // namespace

int busy_cores() {
  int least = -1;
  for (int look = 0; look < 3; ++look) {
    if (look > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int all = proc_count("/proc/stat", "procs_running ");
    if (all < 0) return 0;
    const int others = std::max(0, all - own_running_threads());
    least = least < 0 ? others : std::min(least, others);
  }
  return least;
}
int cpu_threads() {
  return omp_get_max_threads();
}
void set_cpu_threads(int n) {
  if (n < 1) throw ValueError(str_cat("set_cpu_threads: ", n, " threads; give at least 1"));
  omp_set_num_threads(n);
}

std::vector<int> ThreadTuner::default_candidates(int cores) {
  std::vector<int> c{1};
  for (int t = 2; t < cores; t *= 2) c.push_back(t);
  if (cores > 1) c.push_back(cores);
  return c;
}

ThreadTuner::ThreadTuner(std::vector<int> candidates, ThreadTunerOptions options)
    : candidates_(std::move(candidates)), options_(options) {
  if (candidates_.empty() || !std::is_sorted(candidates_.begin(), candidates_.end()) ||
      candidates_.front() < 1) {
    throw ValueError("ThreadTuner: candidates must be ascending thread counts >= 1");
  }
  if (options_.probe_windows < 1 || options_.first_hold < 1 ||
      options_.max_hold < options_.first_hold || !(options_.slowdown > 1) ||
      !(options_.hopeless >= options_.slowdown) || !(options_.prefer_fewer >= 1) ||
      !(options_.switch_margin >= 1)) {
    throw ValueError(
        "ThreadTuner: probe_windows and first_hold must be >= 1, max_hold >= first_hold, "
        "slowdown > 1, hopeless >= slowdown, prefer_fewer and switch_margin >= 1");
  }
  chosen_ = current_ = candidates_.front();
  hold_ = options_.first_hold;
  if (candidates_.size() > 1) start_probe();
}

void ThreadTuner::start_probe() {
  probing_ = true;
  timings_.assign(candidates_.size(), {});
  medians_.assign(candidates_.size(), 0.0);
  // The count in use first: its last windows are its measurement when there are enough of them,
  // and it is the yardstick that cuts the others short. Then the rest from the fewest threads
  // up, so that on a busy machine the slow counts come after a yardstick and stop early.
  order_.clear();
  const size_t in_use = static_cast<size_t>(
      std::find(candidates_.begin(), candidates_.end(), chosen_) - candidates_.begin());
  order_.push_back(in_use);
  // Counts that would not fit beside the other processes' busy cores are not probed now.
  const int busy = options_.busy_cores ? options_.busy_cores() : 0;
  const int room = std::max(1, candidates_.back() - busy);
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (i != in_use && (i == 0 || candidates_[i] <= room)) order_.push_back(i);
  }
  order_pos_ = 0;
  if (static_cast<int>(recent_.size()) >= options_.probe_windows) {
    timings_[in_use] = recent_;
    medians_[in_use] = median(recent_);
    order_pos_ = 1;
  }
  if (order_pos_ == order_.size()) {  // measured already, and no room to try another count
    probe_index_ = in_use;
    finish_probe();
    return;
  }
  probe_index_ = order_[order_pos_];
  current_ = candidates_[probe_index_];
}

void ThreadTuner::record(double seconds_per_sample) {
  if (!warmed_up_) {
    warmed_up_ = true;
    return;
  }
  if (!probing_) {
    if (candidates_.size() == 1) return;
    recent_.push_back(seconds_per_sample);
    const size_t keep = static_cast<size_t>(options_.probe_windows);
    if (recent_.size() > keep) recent_.erase(recent_.begin());
    const bool slowed =
        recent_.size() == keep && median(recent_) > options_.slowdown * chosen_median_;
    if (--hold_left_ <= 0 || slowed) {
      slowed_down_ = slowed;
      start_probe();
    }
    return;
  }
  std::vector<double>& t = timings_[probe_index_];
  t.push_back(seconds_per_sample);
  double best = 0;
  for (double m : medians_) {
    if (m > 0 && (best == 0 || m < best)) best = m;
  }
  // Cut short when one timing is hopelessly behind the best median so far, or when not even the
  // faster of two beats it (the median of five would then not win by switch_margin either): a
  // single noisy window decides on its own only when the gap is that wide.
  const double fastest = *std::min_element(t.begin(), t.end());
  const bool behind = best > 0 && ((t.size() == 1 && fastest > options_.hopeless * best) ||
                                   (t.size() >= 2 && fastest > best));
  if (static_cast<int>(t.size()) < options_.probe_windows && !behind) return;
  medians_[probe_index_] = median(t);
  if (++order_pos_ < order_.size()) {
    probe_index_ = order_[order_pos_];
    current_ = candidates_[probe_index_];
  } else {
    finish_probe();
  }
}

void ThreadTuner::finish_probe() {
  // Fewest threads first: a larger count replaces the choice only when clearly faster (counts
  // not measured this round, for want of room, have no median and are passed over).
  size_t best = 0;
  for (size_t i = 1; i < candidates_.size(); ++i) {
    if (medians_[i] > 0 && medians_[i] * options_.prefer_fewer < medians_[best]) best = i;
  }
  const int previous = chosen_;
  // Hysteresis: leaving the current choice takes a clear margin, so noise does not flip it.
  const auto held = std::find(candidates_.begin(), candidates_.end(), previous);
  if (checks_ > 0 && held != candidates_.end()) {
    const size_t i = static_cast<size_t>(held - candidates_.begin());
    if (medians_[i] > 0 && !(medians_[best] * options_.switch_margin < medians_[i])) best = i;
  }
  chosen_ = current_ = candidates_[best];
  chosen_median_ = medians_[best];
  ++checks_;
  if (checks_ > 1 && chosen_ != previous) ++switches_;
  // After a slowdown the machine has changed: the next check comes soon, kept or not.
  hold_ = (checks_ > 1 && chosen_ == previous && !slowed_down_)
              ? std::min(2 * hold_, options_.max_hold)
              : options_.first_hold;
  slowed_down_ = false;
  hold_left_ = hold_;
  recent_.clear();
  probing_ = false;
}

std::string ThreadTuner::describe() const {
  std::ostringstream s;
  s << chosen_ << " thread" << (chosen_ == 1 ? "" : "s");
  if (candidates_.size() > 1) {
    s << " (tuned: " << checks_ << " check" << (checks_ == 1 ? "" : "s") << ", " << switches_
      << " switch" << (switches_ == 1 ? "" : "es") << ")";
  }
  return s.str();
}

}  // namespace accrue
