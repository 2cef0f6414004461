// accrue-g2p: trains a small GPT to pronounce English words. See g2p.h, or run with --help.
#include <iostream>

#include "g2p.h"
#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  accrue::cpu::run_with_cpu_blas_kernels(argv);  // OpenBLAS's kernels for this CPU
  return accrue::g2p::run_cli(argc, argv, std::cout, std::cerr);
}
