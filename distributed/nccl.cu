// The NCCL communicator for CUDA tensors: one communicator per process on cuda:<local rank>, its
// unique id made by rank 0 and broadcast over MPI (the bootstrap the NCCL documentation
// describes). Collectives run on the device's accrue stream, so they are ordered after the
// kernels that produced their input and before the ones that read their output, with no host
// synchronisation. Point-to-point transfers (pipeline stages) are staged through host memory
// over MPI for now: correct, not fast (NCCL's own send/recv, grouped, on per-peer streams, is the
// faster path still to write); CPU tensors handed to it (small host-side sums and statistics)
// go through its MPI twin, and a group made by split() is bootstrapped over its own MPI twin as
// the world's is. Errors throw with ncclGetErrorString and file:line; abort() is MPI_Abort.
//
// No NCCL wait is without a limit (the watchdog, --comm-timeout). The communicator is made
// nonblocking (NCCL 2.14+: ncclCommInitRankConfig with blocking = 0), so its setup, and any call
// that answers ncclInProgress, is polled through ncclCommGetAsyncError; past the limit the
// communicator is aborted locally (ncclCommAbort) and the call throws. Waits for the device after
// collectives (barrier(), settle(): the boundary's read) poll both streams and NCCL's
// asynchronous error, sleeping between polls.
// A communicator is never destroyed: ncclCommDestroy is collective (a rank leaving alone would
// hang in it) and at exit the CUDA runtime may already be gone; the process's end frees it.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/cuda/check.h"
#include "core/error.h"
#include "distributed/communicator.h"
#include "kernels/cuda/context.h"

#define ACCRUE_NCCL_CHECK(call)                                                             \
  do {                                                                                      \
    const ncclResult_t accrue_nccl_status = (call);                                         \
    if (accrue_nccl_status != ncclSuccess) {                                                \
      throw ::accrue::BackendError(                                                         \
          ::accrue::str_cat("NCCL error ", static_cast<int>(accrue_nccl_status), " (",      \
                            ncclGetErrorString(accrue_nccl_status), ") in ", #call, " at ", \
                            __FILE__, ":", __LINE__));                                      \
    }                                                                                       \
  } while (0)

namespace accrue::distributed {
namespace {

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
// Older headers lack it; their blocking communicators never return it.
constexpr ncclResult_t ncclInProgress = static_cast<ncclResult_t>(7);
#endif

ncclDataType_t nccl_type(const Tensor& t, const char* op) {
  if (!t.device().is_cuda()) {
    throw DeviceError(
        str_cat("[", op, "] the NCCL communicator takes CUDA tensors, got ", t.describe()));
  }
  switch (t.dtype()) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kBFloat16:
    case DType::kFloat16:
      // Moved, never summed (gradients are float32): a 16-bit sum would round every addition.
      if (std::strcmp(op, "all_gather") != 0 && std::strcmp(op, "broadcast") != 0) break;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 3)
      return t.dtype() == DType::kBFloat16 ? ncclBfloat16 : ncclFloat16;
#else
      return ncclFloat16;  // the same two bytes per element: all_gather and broadcast move bits
#endif
    default:
      break;
  }
  throw DTypeError(str_cat("[", op, "] no NCCL type for ", t.describe()));
}

// NCCL takes one GPU per rank and answers two ranks on one GPU with "invalid usage" from
// ncclCommInitRank. Before any NCCL call, every rank compares the UUIDs of all ranks' GPUs (over
// MPI: they may be on other nodes), so all of them throw when two ranks would share one. A UUID
// of zeros (a driver that reports none) is not compared.
void require_one_gpu_per_rank(Communicator& bootstrap, int device) {
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  constexpr int64_t kWords = sizeof(prop.uuid) / sizeof(int32_t);
  static_assert(sizeof(prop.uuid) % sizeof(int32_t) == 0, "uuid size");
  Tensor mine = Tensor::empty({kWords}, DType::kInt32);
  std::memcpy(mine.raw(), &prop.uuid, sizeof(prop.uuid));
  Tensor all = Tensor::empty({kWords * bootstrap.world_size()}, DType::kInt32);
  bootstrap.all_gather(mine, all);
  const int32_t* uuids = all.data<int32_t>();
  const auto known = [&](int rank) {
    const int32_t* u = uuids + rank * kWords;
    return std::any_of(u, u + kWords, [](int32_t word) { return word != 0; });
  };
  for (int a = 0; a < bootstrap.world_size(); ++a) {
    for (int b = a + 1; b < bootstrap.world_size(); ++b) {
      if (!known(a) || std::memcmp(uuids + a * kWords, uuids + b * kWords, sizeof(prop.uuid))) {
        continue;
      }
      throw DeviceError(str_cat("ranks ", a, " and ", b, " would share one GPU (rank ",
                                bootstrap.rank(), " has cuda:", device, ", ", prop.name,
                                "): NCCL takes one GPU per rank; start at most as many ranks per "
                                "node as it has GPUs, or train on the CPU (--device cpu)"));
    }
  }
}

// Polls `done` until it returns true, sleeping between polls (20 us doubling up to 1 ms, so a
// short wait is short and a long one does not spin a core); calls `limit_error` (which throws)
// once `seconds` (> 0) have passed.
template <typename Done, typename LimitError>
void poll_until(Done done, double seconds, LimitError limit_error) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  while (!done()) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0 && waited > seconds) limit_error();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

class Nccl final : public Communicator {
 public:
  Nccl(Communicator& bootstrap, int device) : mpi_(&bootstrap), device_(device) {
    static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0, "unique id size");
    require_one_gpu_per_rank(*mpi_, device_);
    ncclUniqueId id;
    if (mpi_->rank() == 0) ACCRUE_NCCL_CHECK(ncclGetUniqueId(&id));
    Tensor bytes = Tensor::empty({int64_t(sizeof(id) / sizeof(int32_t))}, DType::kInt32);
    std::memcpy(bytes.raw(), &id, sizeof(id));
    mpi_->broadcast(bytes, 0);
    std::memcpy(&id, bytes.raw(), sizeof(id));
    cuda::context(device_);      // makes the device current
    timeout_ = mpi_->timeout();  // the bootstrap's limit, until the caller sets one
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    complete(ncclCommInitRankConfig(&comm_, mpi_->world_size(), id, mpi_->rank(), &config),
             "ncclCommInitRankConfig (setting up the communicator)");
#else
    ACCRUE_NCCL_CHECK(ncclCommInitRank(&comm_, mpi_->world_size(), id, mpi_->rank()));
#endif
    ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  int rank() const override {
    return mpi_->rank();
  }
  int world_size() const override {
    return mpi_->world_size();
  }
  int local_rank() const override {
    return mpi_->local_rank();
  }
  const char* backend() const override {
    return "nccl";
  }

  // CPU tensors (a run's small host-side sums, hashes and statistics) go through the MPI twin.
  void all_reduce_sum(Tensor& t) override {
    if (t.device().is_cpu()) return mpi_->all_reduce_sum(t);
    complete(ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t, "all_reduce_sum"),
                           ncclSum, comm_, stream(t)),
             "ncclAllReduce");
  }
  void broadcast(Tensor& t, int root) override {
    if (t.device().is_cpu()) return mpi_->broadcast(t, root);
    if (root < 0 || root >= world_size()) {
      throw ValueError(
          str_cat("[broadcast] root ", root, " in a world of ", world_size(), " ranks"));
    }
    complete(ncclBroadcast(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t, "broadcast"), root,
                           comm_, stream(t)),
             "ncclBroadcast");
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    if (in.device().is_cpu() && out.device().is_cpu()) return mpi_->all_gather(in, out);
    // In place when in is this rank's slice of out: NCCL's own in-place layout.
    check_gather("all_gather", in, out, world_size(), rank());
    complete(ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_type(in, "all_gather"),
                           comm_, stream(in)),
             "ncclAllGather");
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    if (in.device().is_cpu() && out.device().is_cpu()) return mpi_->reduce_scatter(in, out);
    check_gather("reduce_scatter", out, in, world_size(), rank());  // NCCL's in place
    complete(ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()),
                               nccl_type(in, "reduce_scatter"), ncclSum, comm_, stream(in)),
             "ncclReduceScatter");
  }
  // On a side stream, after what the main stream has enqueued so far (the gradients of this
  // bucket), so the reduction runs while the main stream goes on with backward; wait_all()
  // makes the main stream wait for the side stream.
  void start_all_reduce_sum(Tensor& t) override {
    const cudaStream_t main = stream(t);
    ACCRUE_CUDA_CHECK(cudaEventRecord(ready_, main));
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side_, ready_, 0));
    complete(ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t, "all_reduce_sum"),
                           ncclSum, comm_, side_),
             "ncclAllReduce (overlapped)");
  }
  void wait_all() override {
    ACCRUE_CUDA_CHECK(cudaEventRecord(done_, side_));
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(cuda::context(device_).stream, done_, 0));
  }
  // On the side stream, after what the main stream has enqueued so far: the kernels that wrote
  // `in`, and those still reading the memory `out` was handed from (the allocator reuses a
  // buffer in the main stream's order). Its wait() orders the main stream after the gather.
  std::unique_ptr<Transfer> start_all_gather(const Tensor& in, Tensor& out) override {
    if (in.device().is_cpu() && out.device().is_cpu()) return mpi_->start_all_gather(in, out);
    check_gather("all_gather", in, out, world_size(), rank());
    const cudaStream_t main = stream(in);
    auto transfer = std::make_unique<SideStreamGather>(in, out, main);  // its event first
    ACCRUE_CUDA_CHECK(cudaEventRecord(ready_, main));
    ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(side_, ready_, 0));
    complete(ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_type(in, "all_gather"),
                           comm_, side_),
             "ncclAllGather (started ahead)");
    ACCRUE_CUDA_CHECK(cudaEventRecord(transfer->gathered, side_));
    return transfer;
  }

  // Host tensors and the barrier go through MPI: the same limit there.
  void set_timeout(double seconds) override {
    timeout_ = seconds;
    mpi_->set_timeout(seconds);
  }
  void barrier() override {
    settle();
    const LongWaitAllowance allowance(*mpi_, allowance_);  // this wait's, for this wait alone
    mpi_->barrier();
  }
  // Both streams drained, watching NCCL's asynchronous error (a peer or the network failing),
  // which a plain cudaStreamSynchronize would wait on forever; past the watchdog's limit it
  // throws, as the MPI waits do.
  void settle() override {
    const cudaStream_t main = cuda::context(device_).stream;
    poll_until(
        [&] {
          check_async_error("a collective");
          return ACCRUE_CUDA_QUERY(cudaStreamQuery(side_)) &&
                 ACCRUE_CUDA_QUERY(cudaStreamQuery(main));
        },
        timeout(),
        [&] {
          throw BackendError(str_cat("[watchdog] rank ", rank(),
                                     ": the NCCL collectives queued did not complete within ",
                                     timeout(),
                                     " s: another rank is stopped, hung or much slower "
                                     "(--comm-timeout sets the limit)"));
        });
  }
  // Staged: a device tensor copied to host (after the stream's work), sent over MPI; CPU
  // tensors (the activations' shape headers) go as they are.
  std::unique_ptr<Transfer> isend(const Tensor& t, int peer, int tag) override {
    if (t.device().is_cpu()) return mpi_->isend(t, peer, tag);
    stream(t);  // checks the device
    return mpi_->isend(t.to(Device::cpu()), peer, tag);
  }
  std::unique_ptr<Transfer> irecv(Tensor& t, int peer, int tag) override {
    if (t.device().is_cpu()) return mpi_->irecv(t, peer, tag);
    stream(t);
    return std::make_unique<StagedReceive>(*mpi_, t, peer, tag);
  }
  // A group: its MPI twin split the same way, and a communicator of its own bootstrapped over
  // the twin as the world's is (no ncclCommSplit: it needs NCCL 2.18).
  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) throw ValueError(str_cat("[split] color ", color, " is negative"));
    std::unique_ptr<Communicator> mpi_group = mpi_->split(color, key);
    mpi_group->set_timeout(timeout_);
    auto group = std::make_unique<Nccl>(*mpi_group, device_);
    group->owned_mpi_ = std::move(mpi_group);
    group->set_timeout(timeout_);
    return group;
  }
  // MPI_Abort ends every process of the job; ncclCommAbort is not called because NCCL requires
  // every rank to call it, and here one rank is failing alone.
  [[noreturn]] void abort(int code) override {
    mpi_->abort(code);  // [[noreturn]]; nvcc does not see through the virtual call
    std::_Exit(code);
  }

 private:
  cudaStream_t stream(const Tensor& t) {
    if (t.device().index != device_) {
      throw DeviceError(
          str_cat("[nccl] this rank's communicator is on cuda:", device_, ", got ", t.describe()));
    }
    return cuda::context(device_).stream;
  }

  // A gather queued on the side stream. It holds its tensors' handles; a Storage released while
  // the gather runs would still go back to the allocator, so its owner completes the gather
  // first (ShardedLayers::release). Dropped unwaited (unwinding after an error), it still orders
  // the main stream after the gather, so the memory is not reused under it.
  struct SideStreamGather final : Transfer {
    SideStreamGather(const Tensor& in, const Tensor& out, cudaStream_t main)
        : in(in), out(out), main(main) {
      ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&gathered, cudaEventDisableTiming));
    }
    ~SideStreamGather() override {
      cudaStreamWaitEvent(main, gathered, 0);  // no error to report from here
      cudaEventDestroy(gathered);              // released once it completes
    }
    void wait() override { ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(main, gathered, 0)); }
    bool done() override { return ACCRUE_CUDA_QUERY(cudaEventQuery(gathered)); }
    Tensor in, out;
    cudaStream_t main;
    cudaEvent_t gathered = nullptr;
  };

  // Received into host memory over MPI; wait() copies it into the device tensor.
  struct StagedReceive final : Transfer {
    StagedReceive(Communicator& mpi, Tensor& t, int peer, int tag)
        : device_tensor(t),
          host(Tensor::empty(t.shape(), t.dtype())),
          inner(mpi.irecv(host, peer, tag)) {}
    void wait() override {
      inner->wait();
      if (!copied) device_tensor.copy_(host);
      copied = true;
    }
    bool done() override {
      if (!copied && inner->done()) wait();  // the host data is in: copy it to the device
      return copied;
    }
    Tensor device_tensor, host;
    std::unique_ptr<Transfer> inner;
    bool copied = false;
  };

  // NCCL's asynchronous error of this communicator, thrown naming `what`; ncclInProgress (a
  // nonblocking call still under way) is returned, not thrown.
  ncclResult_t check_async_error(const char* what) {
    ncclResult_t state = ncclSuccess;
    ACCRUE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      throw BackendError(str_cat("NCCL error ", static_cast<int>(state), " (",
                                 ncclGetErrorString(state), ") in ", what, " on rank ", rank()));
    }
    return state;
  }
  // A call's result: on a nonblocking communicator ncclInProgress is polled until the call has
  // finished (the setup, a connection), under the watchdog; past the limit the communicator is
  // aborted on this rank (its resources freed: nothing of it can be used after) and the call
  // throws. Any other failure throws with NCCL's string.
  void complete(ncclResult_t result, const char* call) {
    if (result == ncclInProgress) {
      poll_until([&] { return check_async_error(call) != ncclInProgress; }, timeout(),
                 [&] {
                   ncclCommAbort(comm_);
                   comm_ = nullptr;
                   throw BackendError(str_cat("[watchdog] rank ", rank(), ": ", call,
                                              " did not complete within ", timeout(),
                                              " s: another rank is stopped, hung or much slower "
                                              "(--comm-timeout sets the limit)"));
                 });
      return;
    }
    if (result != ncclSuccess) {
      throw BackendError(str_cat("NCCL error ", static_cast<int>(result), " (",
                                 ncclGetErrorString(result), ") in ", call, " on rank ", rank()));
    }
  }

  std::unique_ptr<Communicator> owned_mpi_;  // a split group's MPI twin
  Communicator* mpi_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t side_ = nullptr;  // the overlapped all-reduces
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device) {
  return std::make_unique<Nccl>(bootstrap, device);
}

}  // namespace accrue::distributed
