// A job in which one rank fails: run under `mpiexec -n 2` by tests/dist/abort.sh. Rank 1 is
// given a data folder without MNIST files, so accrue-mnist's loader throws there while rank 0
// loads its data and goes on to the first window's all-reduce, where it would wait forever.
// The trainer's handler must print rank 1's message and end both ranks within seconds.
#include <iostream>
#include <iterator>

#include "distributed/communicator.h"
#include "mnist_fixture.h"

int main() {
  using namespace accrue;
  const distributed::LaunchInfo info = distributed::launch_info();
  const auto data = info.rank == 0 ? accrue::testing::make_dataset("abort", 512, 64)
                                   : accrue::testing::temp_dir("abort-empty");
  const std::string folder = data.string();
  // On the CPU whatever the machine has: this is MPI's failure path, not NCCL's.
  const char* argv[] = {"accrue-mnist", "--data",   folder.c_str(), "--threads", "1",
                        "--quiet",      "--device", "cpu"};
  return mnist::run_cli(static_cast<int>(std::size(argv)), argv, std::cout, std::cerr);
}
