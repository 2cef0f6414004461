// accrue-mnist: trains the MNIST MLP. See trainer.h, or run with --help.
#include <iostream>

#include "trainer.h"

int main(int argc, char** argv) {
  return accrue::mnist::run_cli(argc, argv, std::cout, std::cerr);
}
