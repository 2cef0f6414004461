// accrue-mnist on a fixture dataset, for multi-rank command-line tests run under mpiexec by the
// scripts in tests/dist/: `dist_cli N args...` makes a learnable dataset of N training samples
// (each rank its own copy, the same bytes for the same N) and runs the command line with
// `--data <it> args...`. An MPMD launch (`mpiexec -n 1 dist_cli 512 A : -n 1 dist_cli 512 B`)
// gives the ranks different arguments. DIST_CLI_SIGSTOP_AT=R:S makes rank R stop itself
// (SIGSTOP, as a debugger or a frozen node would) after optimizer step S: the watchdog's case.
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "mnist_fixture.h"
#include "train/run.h"

int main(int argc, char** argv) {
  using namespace accrue;
  if (argc < 2) {
    std::cerr << "usage: dist_cli TRAIN_SAMPLES [accrue-mnist flags...]\n";
    return 2;
  }
  const int64_t samples = std::atoll(argv[1]);
  const std::string data =
      accrue::testing::make_dataset("dist-cli-" + std::to_string(samples), samples, 64).string();
  std::vector<const char*> args{"accrue-mnist", "--data", data.c_str()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  mnist::Config config;
  const int status =
      mnist::parse_args(static_cast<int>(args.size()), args.data(), config, std::cout, std::cerr);
  if (status >= 0) return status;
  int stop_rank = -1;
  long long stop_step = 0;
  if (const char* at = std::getenv("DIST_CLI_SIGSTOP_AT")) {
    std::sscanf(at, "%d:%lld", &stop_rank, &stop_step);
  }
  train::Callbacks callbacks;
  callbacks.on_step = [&](const train::StepEvent& e) {
    if (e.step == stop_step && distributed::launch_info().rank == stop_rank) ::raise(SIGSTOP);
  };
  return train::run_reporting_failure("accrue-mnist", std::cerr,
                                      [&] { mnist::train(config, std::cout, callbacks); });
}
