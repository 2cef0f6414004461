// ACCRUE_PROFILE=1: a decorator over the backend interface, beside ACCRUE_TRACE's, that times
// every primitive and prints, when the program ends, a table per primitive (calls, total and mean
// time, share of the profiled time, bytes/s of the tensors it touched, FLOP/s of the GEMMs) and per
// scope (the autograd node whose backward issued it, or "forward/other"), like torch.profiler's
// key_averages(). ACCRUE_PROFILE_JSON=path also writes every call (the first million) in Chrome's
// trace-event format, for chrome://tracing or Perfetto. On the CPU a call is timed by the wall
// clock as it returns; on CUDA by two events on the device's stream (DeviceMarks below), read once
// the device has passed them, so the run is not serialised. While the GPU is busy that is the
// call's own work on it; where the GPU waits for the host (a small call, a library's algorithm
// search), the host's time inside the call counts too. A third table gives device calls' host
// time alone (the time each took to return), where an eager GPU run's host limit shows. Read next:
// kernels/trace.h, the other decorator.
//   ACCRUE_PROFILE=1 build/examples/accrue-g2p --max-steps 20 ... 2> profile.txt
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace accrue {

// Whether ACCRUE_PROFILE is set to something other than "" or "0" (read once), or
// enable_profile() was called.
bool profile_enabled();
// Profiles every backend call from now on and prints the tables at exit, as ACCRUE_PROFILE=1
// does (the training engine's --profile).
void enable_profile();

// One row of a profile table.
struct ProfileRow {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;
  double bytes = 0;  // the bytes of every tensor argument, summed over the calls
  double flops = 0;  // the GEMM primitives' 2 M N K, summed over the calls
};

// What the profiling backends of this process recorded.
struct ProfileTotals {
  std::vector<ProfileRow> primitives, scopes;  // each sorted by total time, longest first
  double seconds = 0;                          // the sum over every call
  // The host's own time inside each device-timed call, per primitive (launches, a library's work
  // on the host), sorted likewise: what an eager GPU run spends before the device sees the work.
  // Empty on the CPU, where a call's time is the host's.
  std::vector<ProfileRow> host;
  double host_seconds = 0;
};
ProfileTotals profile_totals();
void print_profile(std::ostream& out);
// The recorded calls in Chrome's trace-event format (what ACCRUE_PROFILE_JSON writes at exit):
// one row per host thread, and one per GPU from row 1000 on.
void write_profile_trace(const std::string& path);
// Where the trace goes at exit: ACCRUE_PROFILE_JSON's path ("" : none), which a program of
// several ranks makes one per rank (set_profile_trace_path), so no two processes write one file.
// A write that fails at exit ends the process with status 1.
std::string profile_trace_path();
void set_profile_trace_path(const std::string& path);
void clear_profile();

// Marks queued in a device's own order of work (CUDA events on its stream): a call's time is the
// time between the marks before and after it, read once the device has passed both. Calls wait in
// a queue until then; the queue is read as calls are made, in full by profile_totals(),
// print_profile() and clear_profile(), and when the backend goes. A test can pass its own.
class DeviceMarks {
 public:
  using Mark = void*;
  virtual ~DeviceMarks() = default;
  virtual Mark record() = 0;            // after the work queued so far
  virtual bool reached(Mark mark) = 0;  // whether that work is done, without waiting
  virtual double seconds_between(Mark start, Mark stop) = 0;  // waits for stop
  virtual void release(Mark mark) = 0;                        // the mark may be recorded again
};

// Wraps `inner` (the backend of `device`); each call is timed and recorded in the profile: on the
// CPU by the wall clock, on CUDA by the device's events (make_cuda_marks, kernels/cuda_seam.h).
std::unique_ptr<Backend> make_profiling_backend(Backend& inner, Device device);
// The same, timing each call by `marks`, its calls drawn on the Chrome trace's row `timeline`.
std::unique_ptr<Backend> make_profiling_backend(Backend& inner, std::unique_ptr<DeviceMarks> marks,
                                                int timeline);

// Times work that is no primitive, such as the replay of a CUDA graph (core/graph.h), as one call
// named `name` when profiling (without: runs it). The primitives a graph holds are not timed one
// by one: a capture queues nothing, and a replay is one launch.
void profile_device_work(Device device, const char* name, const std::function<void()>& work);

// The primitives issued on this thread while it lives belong to `name` in the per-scope table
// (scopes nest; the innermost wins; a null name keeps the enclosing scope). The autograd engine
// opens one per node's backward, nn::Module one per registered module's forward.
class ProfileScope {
 public:
  explicit ProfileScope(const char* name);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* previous_;
};

}  // namespace accrue
