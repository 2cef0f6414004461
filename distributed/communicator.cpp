// The launcher's environment, the world of one process, and the choice of backend (see
// communicator.h).
#include "distributed/communicator.h"

#include <cmath>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "kernels/backend.h"

namespace accrue::distributed {

#ifdef ACCRUE_WITH_MPI
std::unique_ptr<Communicator> make_mpi(const LaunchInfo& info);  // distributed/mpi.cpp
#endif
#ifdef ACCRUE_WITH_NCCL
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap,
                                        int device);  // distributed/nccl.cu
#endif

namespace {

// The integer in environment variable `name`, or `fallback` when unset; throws when it is set
// to something that is not a non-negative integer (a launcher never does that).
int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > (1 << 24)) {
    throw ValueError(str_cat("[dist] environment variable ", name, "='", text,
                             "' is not a rank or a rank count"));
  }
  return static_cast<int>(value);
}

// A transfer that completed before it was returned.
struct Completed final : Transfer {
  void wait() override {}
  bool done() override { return true; }
};

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend() const override { return "single"; }
  void all_reduce_sum(Tensor&) override {}
  void broadcast(Tensor&, int root) override {
    if (root != 0) throw ValueError(str_cat("[broadcast] root ", root, " in a world of 1 rank"));
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_gather("all_gather", in, out, 1, 0);
    if (in.raw() != out.raw()) backend_for(in.device()).copy(in, out);
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather("reduce_scatter", out, in, 1, 0);
    if (in.raw() != out.raw()) backend_for(in.device()).copy(in, out);
  }
  void barrier() override {}
  // A world of one has no other rank to talk to: check_peer names the mistake.
  std::unique_ptr<Transfer> isend(const Tensor&, int peer, int tag) override {
    check_peer("isend", peer, tag, 0, 1, INT32_MAX);
    return nullptr;  // not reached
  }
  std::unique_ptr<Transfer> irecv(Tensor&, int peer, int tag) override {
    check_peer("irecv", peer, tag, 0, 1, INT32_MAX);
    return nullptr;  // not reached
  }
  std::unique_ptr<Communicator> split(int, int) override { return make_single_process(); }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

}  // namespace

std::unique_ptr<Transfer> Communicator::start_all_gather(const Tensor& in, Tensor& out) {
  all_gather(in, out);
  return std::make_unique<Completed>();
}

std::string watchdog_message(int rank, const std::string& op, int64_t wait, double limit,
                             double longest_gap) {
  const std::string what = str_cat("[watchdog] rank ", rank, ": ", op, " (wait ", wait,
                                   ") did not complete within ", limit, " s: ");
  if (longest_gap >= 1 && longest_gap >= 0.5 * limit) {
    return str_cat(what, "this rank itself did not run for ", std::lround(longest_gap),
                   " s of the wait (stopped by SIGSTOP or a debugger, or its machine paused)");
  }
  return str_cat(what,
                 "another rank is stopped, hung or much slower (--comm-timeout sets the limit)");
}

LaunchInfo launch_info() {
  LaunchInfo info;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    info.launcher = "mpirun";
    info.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    info.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  } else if (std::getenv("SLURM_STEP_NUM_TASKS") != nullptr) {
    // An srun step. (A batch script's own environment has SLURM_NTASKS and SLURM_PROCID = 0
    // too, but no step: a program run there directly is one process.)
    info.launcher = "srun";
    info.world_size = env_int("SLURM_STEP_NUM_TASKS", 1);
    info.rank = env_int("SLURM_PROCID", 0);
    info.local_rank = env_int("SLURM_LOCALID", 0);
  } else if (std::getenv("PMI_SIZE") != nullptr) {  // MPICH's and Intel MPI's mpiexec
    info.launcher = "mpiexec (PMI)";
    info.world_size = env_int("PMI_SIZE", 1);
    info.rank = env_int("PMI_RANK", 0);
    info.local_rank = env_int("MPI_LOCALRANKID", 0);
  }
  if (info.world_size < 1 || info.rank >= info.world_size) {
    throw ValueError(str_cat("[dist] the ", info.launcher, " environment says rank ", info.rank,
                             " of ", info.world_size, " ranks"));
  }
  return info;
}

std::unique_ptr<Communicator> make_single_process() {
  return std::make_unique<SingleProcess>();
}

Communicator& world() {
  static std::once_flag once;
  static std::unique_ptr<Communicator> comm;
  std::call_once(once, [] {
    const LaunchInfo info = launch_info();
    if (info.world_size == 1) {
      comm = make_single_process();
      return;
    }
#ifdef ACCRUE_WITH_MPI
    comm = make_mpi(info);
#else
    throw BackendError(str_cat("[dist] ", info.launcher, " started ", info.world_size,
                               " ranks but this accrue was built without MPI: install Open MPI "
                               "(apt-get install openmpi-bin libopenmpi-dev) and rebuild"));
#endif
  });
  return *comm;
}

Communicator& world_for(Device device) {
  Communicator& cpu = world();
  if (device.is_cpu() || cpu.world_size() == 1) return cpu;
#ifdef ACCRUE_WITH_NCCL
  static std::mutex mutex;
  static Communicator* nccl = nullptr;  // never destroyed: see distributed/nccl.cu
  static int nccl_device = -1;
  std::lock_guard<std::mutex> lock(mutex);
  if (nccl == nullptr) {
    nccl = make_nccl(cpu, device.index).release();
    nccl_device = device.index;
  }
  if (device.index != nccl_device) {
    throw DeviceError(str_cat("[dist] this rank communicates on cuda:", nccl_device, ", not ",
                              device.str(), " (one GPU per rank)"));
  }
  return *nccl;
#else
  throw BackendError(str_cat("[dist] ", cpu.world_size(), " ranks train on ", device.str(),
                             " but this accrue was built without NCCL (it comes with the CUDA "
                             "toolkit's NCCL package); CPU tensors work over MPI"));
#endif
}

void check_peer(const char* op, int peer, int tag, int rank, int world_size, int max_tag) {
  if (peer < 0 || peer >= world_size || peer == rank) {
    throw ValueError(str_cat(
        "[", op, "] peer rank ", peer, " from rank ", rank, " in a world of ", world_size,
        world_size == 1 ? " rank: there is no other rank" : " ranks: a rank other than this one"));
  }
  if (tag < 0 || tag > max_tag) {
    throw ValueError(str_cat("[", op, "] tag ", tag, " outside [0, ", max_tag, "]"));
  }
}

void check_gather(const char* op, const Tensor& in, const Tensor& out, int world_size,
                  int in_place_rank) {
  if (in.dtype() != out.dtype() || in.device() != out.device()) {
    throw DTypeError(str_cat("[", op, "] input ", in.describe(), " and output ", out.describe(),
                             " differ in dtype or device"));
  }
  if (out.numel() != in.numel() * world_size) {
    throw ShapeError(str_cat("[", op, "] the larger tensor must hold ", world_size,
                             " x the smaller: ", in.describe(), " and ", out.describe()));
  }
  // The libraries allow one aliasing only: the smaller tensor as this rank's slice of the larger.
  const auto* small = static_cast<const char*>(in.raw());
  const auto* large = static_cast<const char*>(out.raw());
  const bool overlap = small < large + out.nbytes() && large < small + in.nbytes();
  const bool own_slice =
      in_place_rank >= 0 && small == large + static_cast<size_t>(in_place_rank) * in.nbytes();
  if (overlap && !own_slice) {
    throw ValueError(str_cat("[", op, "] input and output overlap",
                             in_place_rank >= 0 ? " other than as this rank's slice" : "", ": ",
                             in.describe(), " and ", out.describe()));
  }
}

}  // namespace accrue::distributed
