// accrue-g2p: trains a small GPT to pronounce English words. See g2p.h, or run with --help.
#include <iostream>

#include "g2p.h"

int main(int argc, char** argv) {
  return accrue::g2p::run_cli(argc, argv, std::cout, std::cerr);
}
