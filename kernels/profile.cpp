// The profiling decorator (see profile.h): one override per primitive, generated from the list in
// kernels/backend.h like the tracer's, each timing the forwarded call (by the wall clock, or by a
// device's marks through a MarkedCalls queue); one process-wide record of per-primitive and
// per-scope sums and of the first million calls for the Chrome trace; the table (and the trace
// file) written when the program ends.
#include "kernels/profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/device.h"
#include "core/file.h"
#include "core/graph.h"
#include "kernels/cuda_seam.h"

namespace accrue {

namespace {

using Clock = std::chrono::steady_clock;

thread_local const char* current_scope = nullptr;

struct Event {
  const char *name, *scope;
  double start, seconds;  // seconds since the profile began
  int thread;
};

// The process-wide record; every profiling backend adds to it.
class Recorder {
 public:
  static Recorder& get() {
    static Recorder* recorder = new Recorder;  // never destroyed: atexit prints it
    return *recorder;
  }
  double now() const { return std::chrono::duration<double>(Clock::now() - origin_).count(); }
  // A call timed on this thread as it returned, under its innermost scope.
  void add(const char* name, double start, double seconds, double bytes, double flops) {
    std::lock_guard<std::mutex> lock(mutex_);
    add_locked(name, scope_name(), start, seconds, bytes, flops, thread_number());
  }
  // A call timed by a device's marks, on the trace's row `timeline`.
  void add_marked(const char* name, const std::string& scope, double start, double seconds,
                  double bytes, double flops, int timeline) {
    std::lock_guard<std::mutex> lock(mutex_);
    add_locked(name, scope.c_str(), start, seconds, bytes, flops, timeline);
  }
  // The host's time inside a device-timed call.
  void add_host(const char* name, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    add_to(host_[name], seconds, 0, 0);
  }
  // Calls lost because their marks could not be read (a device error at exit).
  void add_unread(size_t calls) {
    std::lock_guard<std::mutex> lock(mutex_);
    unread_ += calls;
  }
  static const char* scope_name() { return current_scope ? current_scope : "forward/other"; }
  ProfileTotals totals() const {
    std::lock_guard<std::mutex> lock(mutex_);
    ProfileTotals t;
    for (const auto& [name, row] : primitives_) {
      t.primitives.push_back(named(name, row));
      t.seconds += row.seconds;
    }
    for (const auto& [name, row] : scopes_) t.scopes.push_back(named(name, row));
    for (const auto& [name, row] : host_) {
      t.host.push_back(named(name, row));
      t.host_seconds += row.seconds;
    }
    for (auto* rows : {&t.primitives, &t.scopes, &t.host}) {
      std::stable_sort(rows->begin(), rows->end(), [](const ProfileRow& a, const ProfileRow& b) {
        return a.seconds > b.seconds;
      });
    }
    return t;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    primitives_.clear(), scopes_.clear(), host_.clear(), events_.clear();
    dropped_ = unread_ = 0;
  }
  size_t unread() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return unread_;
  }
  // Chrome's trace-event format: one complete ("X") event per call, times in microseconds.
  void write_chrome_trace(const std::string& path) const {
    std::ostringstream out;
    out << std::fixed << std::setprecision(3) << "{\"traceEvents\":[";
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      out << (i ? ",\n" : "\n") << "{\"name\":\"" << e.name << "\",\"cat\":\"" << e.scope
          << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << e.thread << ",\"ts\":" << e.start * 1e6
          << ",\"dur\":" << e.seconds * 1e6 << "}";
    }
    out << "\n],\"otherData\":{\"dropped_events\":" << dropped_ << "}}\n";
    AtomicFile file(path);
    file.write(out.str());
    file.commit();
  }

 private:
  static constexpr size_t kMaxEvents = 1000000;
  Recorder() : origin_(Clock::now()) {}
  void add_locked(const char* name, const char* scope, double start, double seconds, double bytes,
                  double flops, int thread) {
    add_to(primitives_[name], seconds, bytes, flops);
    // The event keeps the map's copy of the scope name: a module's name dies with the module,
    // before the trace is written at exit.
    const auto row = scopes_.try_emplace(scope).first;
    add_to(row->second, seconds, bytes, flops);
    if (events_.size() < kMaxEvents) {
      events_.push_back({name, row->first.c_str(), start, seconds, thread});
    } else {
      ++dropped_;
    }
  }
  static void add_to(ProfileRow& row, double seconds, double bytes, double flops) {
    ++row.calls;
    row.seconds += seconds;
    row.bytes += bytes;
    row.flops += flops;
  }
  static ProfileRow named(const std::string& name, ProfileRow row) {
    row.name = name;
    return row;
  }
  int thread_number() {  // under mutex_
    const auto id = std::this_thread::get_id();
    const auto it = threads_.find(id);
    if (it != threads_.end()) return it->second;
    const int n = static_cast<int>(threads_.size());
    threads_[id] = n;
    return n;
  }
  Clock::time_point origin_;
  mutable std::mutex mutex_;
  std::map<std::string, ProfileRow> primitives_, scopes_, host_;
  std::vector<Event> events_;
  size_t dropped_ = 0, unread_ = 0;
  std::map<std::thread::id, int> threads_;
};

// The calls of one profiling backend timed by a device's marks: each call's two marks wait in
// issue order until the device has passed them, then go to the Recorder. Every queue registers
// itself, so that reading the profile reads every queue first.
class MarkedCalls {
 public:
  MarkedCalls(std::unique_ptr<DeviceMarks> marks, int timeline)
      : marks_(std::move(marks)), timeline_(timeline) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().push_back(this);
  }
  ~MarkedCalls() {
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      auto& all = registry();
      all.erase(std::find(all.begin(), all.end(), this));
    }
    read_all_or_count_unread();
  }
  MarkedCalls(const MarkedCalls&) = delete;
  MarkedCalls& operator=(const MarkedCalls&) = delete;

  // The mark before a call; abandon() gives it back where the call threw.
  DeviceMarks::Mark begin() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (origin_ == nullptr) {
      origin_ = marks_->record();
      origin_seconds_ = Recorder::get().now();
    }
    return marks_->record();
  }
  void abandon(DeviceMarks::Mark start) {
    std::lock_guard<std::mutex> lock(mutex_);
    marks_->release(start);
  }
  void end(const char* name, DeviceMarks::Mark start, double bytes, double flops) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({name, Recorder::scope_name(), start, marks_->record(), bytes, flops});
    read(kMaxQueued);
  }
  // Every queued call, waiting for the device where it has not passed them yet.
  void read_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    read(0);
  }
  // Every queue of the process, read in full.
  static void read_every_queue() {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (MarkedCalls* calls : registry()) calls->read_all();
  }
  static void read_every_queue_or_count_unread() noexcept {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (MarkedCalls* calls : registry()) calls->read_all_or_count_unread();
  }

 private:
  struct Call {
    const char* name;
    std::string scope;  // copied: a module's name may die before the call is read
    DeviceMarks::Mark start, stop;
    double bytes, flops;
  };
  // A bound on the queue (and on the marks it holds): past it, end() waits for the oldest call.
  static constexpr size_t kMaxQueued = 4096;
  static std::vector<MarkedCalls*>& registry() {
    static auto* all = new std::vector<MarkedCalls*>;  // never destroyed, like the Recorder
    return *all;
  }
  static std::mutex& registry_mutex() {
    static auto* m = new std::mutex;
    return *m;
  }
  // Reads the calls the device has passed, then waits for the oldest ones until at most `keep`
  // are queued. Under mutex_.
  void read(size_t keep) {
    while (!queue_.empty() && (queue_.size() > keep || marks_->reached(queue_.front().stop))) {
      const Call& c = queue_.front();
      const double seconds = marks_->seconds_between(c.start, c.stop);
      // The call's start on the device's row: the last call read (or the first mark) plus the
      // device time since. The device's times are float milliseconds, too coarse to count from
      // the first mark through a long run; the sum of the short steps is kept in double.
      const double start = origin_seconds_ + marks_->seconds_between(origin_, c.start);
      Recorder::get().add_marked(c.name, c.scope, start, seconds, c.bytes, c.flops, timeline_);
      marks_->release(origin_);
      origin_ = c.start;
      origin_seconds_ = start;
      marks_->release(c.stop);
      queue_.pop_front();
    }
  }
  // At exit, or as the backend goes: what is queued is read, or counted as unread and dropped
  // where the device cannot say (its runtime already shut down, a fault on the device).
  void read_all_or_count_unread() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      read(0);
    } catch (const std::exception& e) {
      Recorder::get().add_unread(queue_.size());
      std::cerr << "[profile] " << queue_.size() << " device calls left unread: " << e.what()
                << "\n";
      queue_.clear();
    }
  }

  std::mutex mutex_;
  std::unique_ptr<DeviceMarks> marks_;
  int timeline_;
  // The last read call's start mark (before any, the first mark) and its time on the trace.
  DeviceMarks::Mark origin_ = nullptr;
  double origin_seconds_ = 0;
  std::deque<Call> queue_;
};

double bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype()))
                     : 0.0;
}
template <typename T>
double bytes_of(const T&) {
  return 0.0;
}

// The multiply-adds x 2 of the GEMM and convolution primitives, from their shapes; 0 for the
// others. A convolution pass counts the direct convolution's 2 N O OH OW C KH KW whatever the
// algorithm (out [.., O, OH, OW] x the filter's C KH KW per output channel).
template <typename... Args>
double flops_of(const char*, const Args&...) {
  return 0.0;
}
double flops_of(const char* name, bool trans_a, bool, double, const Tensor& a, const Tensor&,
                double, const Tensor& c) {  // gemm, gemm_batched: c [..., M, N], K from a
  if (std::strncmp(name, "gemm", 4) != 0) return 0.0;
  const double k = static_cast<double>(a.size(trans_a ? a.dim() - 2 : a.dim() - 1));
  return 2.0 * static_cast<double>(c.numel()) * k;
}
double flops_of(const char* name, const Tensor& x, const Tensor&, const Tensor&, bool,
                const Tensor& y) {  // linear_forward: x [N, K] -> y [N, M]
  if (std::strcmp(name, "linear_forward") != 0) return 0.0;
  return 2.0 * static_cast<double>(y.numel()) * static_cast<double>(x.size(x.dim() - 1));
}

double conv_flops(const Tensor& out, const Tensor& filter) {
  return 2.0 * static_cast<double>(out.numel()) *
         static_cast<double>(filter.numel() / std::max<int64_t>(filter.size(0), 1));
}
double flops_of(const char* name, const Tensor&, const Tensor& w, const Tensor&,
                const Conv2dGeometry&, const Tensor& y) {  // conv2d_forward
  return std::strcmp(name, "conv2d_forward") == 0 ? conv_flops(y, w) : 0.0;
}
double flops_of(const char* name, const Tensor& dy, const Tensor& w, const Conv2dGeometry&,
                const Tensor&) {  // conv2d_backward_data
  return std::strcmp(name, "conv2d_backward_data") == 0 ? conv_flops(dy, w) : 0.0;
}
double flops_of(const char* name, const Tensor& dy, const Tensor&, const Conv2dGeometry&, double,
                const Tensor& dw, const Tensor&) {  // conv2d_backward_filter
  return std::strcmp(name, "conv2d_backward_filter") == 0 ? conv_flops(dy, dw) : 0.0;
}

// A call's row: the primitive's name, with the op for those that take one ("unary:tanh",
// "unary_backward:tanh", "binary:mul"). Names live as long as the process, as the trace needs.
const char* with_op(const char* primitive, const char* op) {
  static std::mutex mutex;
  static auto* names = new std::set<std::string>;  // never destroyed, like the Recorder
  const std::lock_guard<std::mutex> lock(mutex);
  return names->insert(str_cat(primitive, ":", op)).first->c_str();
}
template <typename... Args>
const char* call_name(const char* primitive, const Args&...) {
  return primitive;
}
template <typename... Args>
const char* call_name(const char* primitive, UnaryOp op, const Args&...) {
  return with_op(primitive, op_name(op));
}
template <typename... Args>
const char* call_name(const char* primitive, BinaryOp op, const Args&...) {
  return with_op(primitive, op_name(op));
}

// Times each call by the wall clock as it returns, or by the device's marks where it has them.
class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner) {}
  ProfilingBackend(Backend& inner, std::unique_ptr<DeviceMarks> marks, int timeline, Device device)
      : inner_(inner),
        marked_(std::make_unique<MarkedCalls>(std::move(marks), timeline)),
        device_(device) {}

  // Work that is not a primitive (a CUDA graph's replay), timed as one call.
  void time_work(const char* name, const std::function<void()>& work) { timed(name, 0, 0, work); }

#define ACCRUE_PROFILE_OVERRIDE(name, params, args)                                              \
  void name params override {                                                                    \
    timed(call_name(#name, ACCRUE_PROFILE_UNPACK args), total_bytes(ACCRUE_PROFILE_UNPACK args), \
          flops_of(#name, ACCRUE_PROFILE_UNPACK args), [&] { inner_.name args; });               \
  }
#define ACCRUE_PROFILE_UNPACK(...) __VA_ARGS__
  ACCRUE_BACKEND_PRIMITIVES(ACCRUE_PROFILE_OVERRIDE)
#undef ACCRUE_PROFILE_UNPACK
#undef ACCRUE_PROFILE_OVERRIDE

 private:
  template <typename... Args>
  static double total_bytes(const Args&... args) {
    return (0.0 + ... + bytes_of(args));
  }
  template <typename Call>
  void timed(const char* name, double bytes, double flops, Call call) {
    // Inside a CUDA graph's capture nothing runs: the replay is timed instead.
    if (marked_ && graph_capturing(device_)) return call();
    if (marked_) {
      Recorder& r = Recorder::get();
      const DeviceMarks::Mark start = marked_->begin();
      const double host_start = r.now();
      try {
        call();
      } catch (...) {
        marked_->abandon(start);
        throw;
      }
      r.add_host(name, r.now() - host_start);
      marked_->end(name, start, bytes, flops);
      return;
    }
    Recorder& r = Recorder::get();
    const double start = r.now();
    call();
    r.add(name, start, r.now() - start, bytes, flops);
  }
  Backend& inner_;
  std::unique_ptr<MarkedCalls> marked_;  // null on the CPU
  Device device_ = Device::cpu();        // a GPU's: its captures are not timed
};

void print_rows(std::ostream& out, const char* what, const std::vector<ProfileRow>& rows,
                double total) {
  out << std::left << std::setw(32) << what << std::right << std::setw(10) << "calls"
      << std::setw(12) << "total ms" << std::setw(12) << "mean us" << std::setw(8) << "share"
      << std::setw(10) << "GB/s" << std::setw(10) << "GFLOP/s"
      << "\n";
  for (const ProfileRow& r : rows) {
    const double seconds = std::max(r.seconds, 1e-12);
    out << std::left << std::setw(32) << r.name << std::right << std::setw(10) << r.calls
        << std::fixed << std::setprecision(2) << std::setw(12) << r.seconds * 1e3 << std::setw(12)
        << r.seconds * 1e6 / double(std::max<int64_t>(r.calls, 1)) << std::setprecision(1)
        << std::setw(7) << 100 * r.seconds / std::max(total, 1e-12) << "%" << std::setprecision(2)
        << std::setw(10) << r.bytes / seconds / 1e9 << std::setw(10);
    if (r.flops > 0) {
      out << r.flops / seconds / 1e9 << "\n";
    } else {
      out << "-"
          << "\n";
    }
    out.unsetf(std::ios::fixed);
  }
}

// The two tables of `t`, under a line with the profiled total.
void print_totals(const ProfileTotals& t, std::ostream& out) {
  out << "[profile] " << std::fixed << std::setprecision(3) << t.seconds
      << " s in backend primitives (bytes: the tensors each call was given)\n";
  out.unsetf(std::ios::fixed);
  if (const size_t unread = Recorder::get().unread(); unread > 0) {
    out << "[profile] " << unread << " device calls are missing: their marks could not be read\n";
  }
  print_rows(out, "primitive", t.primitives, t.seconds);
  print_rows(out, "scope (module forward, backward node)", t.scopes, t.seconds);
  if (t.host.empty()) return;
  out << "[profile] " << std::fixed << std::setprecision(3) << t.host_seconds
      << " s of host time inside the device calls (each call until it returned)\n";
  out << std::left << std::setw(32) << "host, per primitive" << std::right << std::setw(10)
      << "calls" << std::setw(12) << "total ms" << std::setw(12) << "mean us" << std::setw(8)
      << "share\n";
  for (const ProfileRow& r : t.host) {
    out << std::left << std::setw(32) << r.name << std::right << std::setw(10) << r.calls
        << std::setprecision(2) << std::setw(12) << r.seconds * 1e3 << std::setw(12)
        << r.seconds * 1e6 / double(std::max<int64_t>(r.calls, 1)) << std::setprecision(1)
        << std::setw(7) << 100 * r.seconds / std::max(t.host_seconds, 1e-12) << "%\n";
  }
  out.unsetf(std::ios::fixed);
}

// At exit: the table on stderr, and the trace file where ACCRUE_PROFILE_JSON names one. The
// queues of the GPUs were read by an earlier exit handler (make_profiling_backend); a device that
// cannot be read any more costs its queued calls (counted in the table), not the report.
void report_at_exit() {
  MarkedCalls::read_every_queue_or_count_unread();
  print_totals(Recorder::get().totals(), std::cerr);
  const std::string path = profile_trace_path();
  if (path.empty()) return;
  try {
    Recorder::get().write_chrome_trace(path);
    std::cerr << "[profile] wrote " << path << "\n";
  } catch (const std::exception& e) {
    std::cerr << "[profile] " << e.what() << "\n";
    std::_Exit(1);  // the run's exit status says the trace was not written
  }
}

std::string& trace_path() {
  static std::string path = [] {
    const char* env = std::getenv("ACCRUE_PROFILE_JSON");
    return std::string(env != nullptr ? env : "");
  }();
  return path;
}

}  // namespace

namespace {
std::atomic<bool>& profile_switch() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("ACCRUE_PROFILE");
    const bool set = v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
    if (set) std::atexit(report_at_exit);
    return set;
  }();
  return on;
}
}  // namespace

bool profile_enabled() {
  return profile_switch().load(std::memory_order_relaxed);
}

void enable_profile() {
  if (!profile_switch().exchange(true)) std::atexit(report_at_exit);
}

ProfileTotals profile_totals() {
  MarkedCalls::read_every_queue();
  return Recorder::get().totals();
}

void print_profile(std::ostream& out) {
  print_totals(profile_totals(), out);
}

std::string profile_trace_path() {
  return trace_path();
}

void set_profile_trace_path(const std::string& path) {
  trace_path() = path;
}

void write_profile_trace(const std::string& path) {
  MarkedCalls::read_every_queue();
  Recorder::get().write_chrome_trace(path);
}

void clear_profile() {
  MarkedCalls::read_every_queue();
  Recorder::get().clear();
}

// A GPU's calls go on the trace's rows from kDeviceTimelines on, one per device.
constexpr int kDeviceTimelines = 1000;

std::unique_ptr<Backend> make_profiling_backend(Backend& inner, Device device) {
  if (device.is_cpu()) return std::make_unique<ProfilingBackend>(inner);
  auto backend = std::make_unique<ProfilingBackend>(inner, make_cuda_marks(device.index),
                                                    kDeviceTimelines + device.index, device);
  // Exit handlers run in the reverse order of their registration. This one is registered after
  // the CUDA runtime started, so it reads the queues before any teardown the runtime registered
  // then, and before the decorators holding the profiling backends are destroyed.
  static std::once_flag read_at_exit;
  std::call_once(read_at_exit,
                 [] { std::atexit([] { MarkedCalls::read_every_queue_or_count_unread(); }); });
  return backend;
}

std::unique_ptr<Backend> make_profiling_backend(Backend& inner, std::unique_ptr<DeviceMarks> marks,
                                                int timeline) {
  return std::make_unique<ProfilingBackend>(inner, std::move(marks), timeline, Device::cpu());
}

void profile_device_work(Device device, const char* name, const std::function<void()>& work) {
  if (!profile_enabled()) return work();
  auto* profiled = dynamic_cast<ProfilingBackend*>(&backend_for(device));
  if (profiled == nullptr) return work();
  profiled->time_work(name, work);
}

ProfileScope::ProfileScope(const char* name) : previous_(current_scope) {
  if (name != nullptr) current_scope = name;
}

ProfileScope::~ProfileScope() {
  current_scope = previous_;
}

}  // namespace accrue
