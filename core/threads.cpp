// The CPU thread policy (see threads.h): the OpenMP team size, and the tuner that picks it by
// timing the program's own windows. A round probes every candidate (one warm-up window, then
// probe_windows timed ones, cut short when the first timing is already far behind the best),
// keeps the fastest median, and holds it for an interval that doubles while the choice stands.
#include "core/threads.h"

#include <omp.h>

#include <algorithm>
#include <sstream>

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
      !(options_.prefer_fewer >= 1)) {
    throw ValueError(
        "ThreadTuner: probe_windows and first_hold must be >= 1, max_hold >= "
        "first_hold, slowdown > 1 and prefer_fewer >= 1");
  }
  chosen_ = current_ = candidates_.front();
  hold_ = options_.first_hold;
  if (candidates_.size() > 1) start_probe();
}

void ThreadTuner::start_probe() {
  probing_ = true;
  timings_.assign(candidates_.size(), {});
  medians_.assign(candidates_.size(), 0.0);
  begin_candidate(0);
}

void ThreadTuner::begin_candidate(size_t index) {
  probe_index_ = index;
  // Staying on the count the last window ran with needs no warm-up.
  warmed_up_ = candidates_[index] == current_ && checks_ > 0;
  current_ = candidates_[index];
}

void ThreadTuner::record(double seconds_per_sample) {
  if (!probing_) {
    if (candidates_.size() == 1) return;
    recent_.push_back(seconds_per_sample);
    if (recent_.size() > 5) recent_.erase(recent_.begin());
    const bool slowed = recent_.size() == 5 && median(recent_) > options_.slowdown * chosen_median_;
    if (--hold_left_ <= 0 || slowed) {
      if (slowed) hold_ = options_.first_hold;
      start_probe();
    }
    return;
  }
  if (!warmed_up_) {  // the first window on a new count pays for waking its threads
    warmed_up_ = true;
    return;
  }
  std::vector<double>& t = timings_[probe_index_];
  t.push_back(seconds_per_sample);
  double best = 0;
  for (double m : medians_) {
    if (m > 0 && (best == 0 || m < best)) best = m;
  }
  const bool hopeless = best > 0 && seconds_per_sample > options_.slowdown * best;
  if (static_cast<int>(t.size()) < options_.probe_windows && !hopeless) return;
  medians_[probe_index_] = median(t);
  if (probe_index_ + 1 < candidates_.size()) {
    begin_candidate(probe_index_ + 1);
  } else {
    finish_probe();
  }
}

void ThreadTuner::finish_probe() {
  // Fewest threads first: a larger count replaces the choice only when clearly faster.
  size_t best = 0;
  for (size_t i = 1; i < candidates_.size(); ++i) {
    if (medians_[i] * options_.prefer_fewer < medians_[best]) best = i;
  }
  const int previous = chosen_;
  chosen_ = current_ = candidates_[best];
  chosen_median_ = medians_[best];
  ++checks_;
  if (checks_ > 1 && chosen_ != previous) ++switches_;
  hold_ = (checks_ > 1 && chosen_ == previous) ? std::min(2 * hold_, options_.max_hold)
                                               : options_.first_hold;
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
