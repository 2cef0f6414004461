// accrue-mnist: trains an MLP or a CNN on MNIST. See mnist.h, or run with --help.
#include <iostream>

#include "mnist.h"

int main(int argc, char** argv) {
  return accrue::mnist::run_cli(argc, argv, std::cout, std::cerr);
}
