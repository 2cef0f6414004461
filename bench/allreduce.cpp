// The cost of the one exchange per window: the all-reduce of an arena-sized float32 buffer
// through accrue's communicator against MPI_Allreduce on a plain buffer, in the same run, so the
// ratio says what the communicator layer costs. Run under MPI:
//   mpirun -np 2 build-bench/bench/accrue-bench-allreduce [elements ...]
// (default: the MNIST MLP's 567,434 parameters and 10x, 0.1x of it). Rank 0 prints one line per
// size: median microseconds of each over 51 repetitions, algorithm bandwidth, and the ratio.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "distributed/communicator.h"
#include "kernels/factories.h"

namespace {

template <typename F>
double median_us(F run) {
  std::vector<double> t;
  for (int i = 0; i < 51; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                    .count());
  }
  std::sort(t.begin(), t.end());
  double m = t[t.size() / 2];
  MPI_Bcast(&m, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // rank 0's timing decides
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace accrue;
  distributed::Communicator& comm = distributed::world();  // initialises MPI
  std::vector<int64_t> sizes{56743, 567434, 5674340};
  if (argc > 1) sizes.assign(argc - 1, 0);
  for (int i = 1; i < argc; ++i) sizes[size_t(i - 1)] = std::atoll(argv[i]);
  if (comm.rank() == 0) {
    std::printf("all-reduce (sum) of float32 buffers over %d ranks (%s)\n", comm.world_size(),
                comm.backend());
    std::printf("%12s %14s %14s %12s %8s\n", "elements", "accrue us", "MPI_Allreduce us",
                "accrue GB/s", "ratio");
  }
  for (int64_t n : sizes) {
    Tensor t = full({n}, 1.0);
    std::vector<float> plain(static_cast<size_t>(n), 1.0f);
    const double ours = median_us([&] { comm.all_reduce_sum(t); });
    const double raw = median_us([&] {
      MPI_Allreduce(MPI_IN_PLACE, plain.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    if (comm.rank() == 0) {
      std::printf("%12lld %14.1f %14.1f %12.2f %8.3f\n", static_cast<long long>(n), ours, raw,
                  double(n) * 4 / ours / 1e3, ours / raw);
    }
  }
  return 0;
}
