// blas_core_probe: started without OPENBLAS_CORETYPE, runs itself again as accrue's programs do
// (run_with_cpu_blas_kernels) and exits 0 when OpenBLAS then runs kernels of the CPU's own vector
// level, 1 with the two levels when it does not.
#include <cstdio>

#include "kernels/cpu/blas_core.h"

int main(int, char** argv) {
  using namespace accrue::cpu;
  run_with_cpu_blas_kernels(argv);
  const int running = blas_core_level(blas_core_name()), cpu = cpu_vector_level();
  std::printf("OpenBLAS core %s (level %d), CPU level %d\n", blas_core().c_str(), running, cpu);
  return running >= cpu ? 0 : 1;
}
