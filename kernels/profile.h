// ACCRUE_PROFILE=1: a decorator over the backend interface, beside ACCRUE_TRACE's, that times
// every primitive and prints, when the program ends, a table per primitive (calls, total and mean
// time, share of the profiled time, bytes/s of the tensors it touched, FLOP/s of the GEMMs) and per
// scope (the autograd node whose backward issued it, or "forward/other"), like torch.profiler's
// key_averages(). ACCRUE_PROFILE_JSON=path also writes every call (the first million) in Chrome's
// trace-event format, for chrome://tracing or Perfetto. On the CPU a call is timed by the wall
// clock; on CUDA the device is synchronised before and after it, so each kernel's time is its own
// (and the run is serialised: profile for where time goes, not for the total).
//   ACCRUE_PROFILE=1 build/examples/accrue-g2p --max-steps 20 ... 2> profile.txt
#pragma once

#include <cstdint>
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
};
ProfileTotals profile_totals();
void print_profile(std::ostream& out);
void clear_profile();

// Wraps `inner` (the backend of `device`); each call is timed and recorded in the profile.
std::unique_ptr<Backend> make_profiling_backend(Backend& inner, Device device);

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
