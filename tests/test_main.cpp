// The test programs' main: OpenBLAS's kernels for this CPU, as accrue's own programs run them
// (kernels/cpu/blas_core.h), then GoogleTest.
#include <gtest/gtest.h>

#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  accrue::cpu::run_with_cpu_blas_kernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
