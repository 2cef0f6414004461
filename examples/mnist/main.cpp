// accrue-mnist: trains an MLP or a CNN on MNIST. See mnist.h, or run with --help.
#include <iostream>

#include "kernels/cpu/blas_core.h"
#include "mnist.h"

int main(int argc, char** argv) {
  accrue::cpu::run_with_cpu_blas_kernels(argv);  // OpenBLAS's kernels for this CPU
  return accrue::mnist::run_cli(argc, argv, std::cout, std::cerr);
}
