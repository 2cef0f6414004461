// The OpenBLAS core check and the re-execution under OPENBLAS_CORETYPE (see blas_core.h).
#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace accrue::cpu {

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name && *name ? name : "unknown";
}

std::string blas_core() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  std::string core = blas_core_name();
  if (forced && *forced) core += std::string(" (OPENBLAS_CORETYPE=") + forced + ")";
  return core;
}

namespace {

// OpenBLAS's x86 cores by vector level; the first of a level is the one to ask for.
struct CoreLevel {
  const char* name;
  int level;
};
constexpr CoreLevel kCores[] = {
    {"Cooperlake", 4}, {"SapphireRapids", 4}, {"SkylakeX", 3}, {"Haswell", 2}, {"Zen", 2}};

}  // namespace

int blas_core_level(const std::string& core) {
  for (const CoreLevel& c : kCores) {
    if (core == c.name) return c.level;
  }
  return 1;
}

bool blas_transposes_exactly() {
  static const bool exact = blas_core_level(blas_core_name()) >= 3;
  return exact;
}

bool blas_chains_short_products() {
  return blas_transposes_exactly();  // the same kernels: OpenBLAS's AVX-512 ones
}

int cpu_vector_level() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512cd");
  if (avx512) return __builtin_cpu_supports("avx512bf16") ? 4 : 3;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 2 : 1;
}

std::string blas_core_to_request(const std::string& running, const char* coretype_env,
                                 int cpu_level) {
  if (coretype_env && *coretype_env) return "";  // the user's choice stands
  if (blas_core_level(running) >= cpu_level) return "";
  for (const CoreLevel& c : kCores) {
    if (c.level == cpu_level) return c.name;
  }
  return "";
}

void run_with_cpu_blas_kernels(char** argv) {
  const std::string running = blas_core_name();
  const std::string want =
      blas_core_to_request(running, std::getenv("OPENBLAS_CORETYPE"), cpu_vector_level());
  if (want.empty() || argv == nullptr || argv[0] == nullptr) return;
  // OPENBLAS_CORETYPE set, a second run never comes back here: no loop, whatever OpenBLAS picks.
  if (setenv("OPENBLAS_CORETYPE", want.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  const int error = errno;
  unsetenv("OPENBLAS_CORETYPE");
  std::fprintf(stderr,
               "accrue: OpenBLAS runs its %s kernels; running again with %s's failed (%s)\n",
               running.c_str(), want.c_str(), std::strerror(error));
}

}  // namespace accrue::cpu
