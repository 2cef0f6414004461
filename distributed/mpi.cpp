// The MPI communicator for CPU tensors (Open MPI). MPI is initialised on first use with
// MPI_THREAD_FUNNELED (only the thread that first calls distributed::world(), the main thread in
// practice, calls MPI; OpenMP threads never do) and finalised at exit. Errors return instead of
// aborting (MPI_ERRORS_RETURN) and are thrown with MPI's own message and file:line, so the
// trainer's handler can report them and abort every rank. Every collective is started
// nonblocking and waited for by polling (MPI_Testall, which also drives MPI's progress) against
// the communicator's timeout: the watchdog of communicator.h.
#include <mpi.h>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/error.h"
#include "distributed/communicator.h"

#define ACCRUE_MPI_CHECK(call)                                                              \
  do {                                                                                      \
    const int accrue_mpi_status = (call);                                                   \
    if (accrue_mpi_status != MPI_SUCCESS) {                                                 \
      ::accrue::distributed::throw_mpi_error(accrue_mpi_status, #call, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

namespace accrue::distributed {

[[noreturn]] void throw_mpi_error(int status, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) length = 0;
  throw BackendError(str_cat("MPI error ", status, " (", std::string(text, length), ") in ", call,
                             " at ", file, ":", line));
}

namespace {

// How a collective or transfer uses the elements: summed, or only moved (16-bit types may be
// moved as their bits, never summed: gradients are float32).
enum class Use { kSummed, kMoved };

MPI_Datatype mpi_type(const Tensor& t, const char* op, Use use) {
  if (!t.device().is_cpu()) {
    throw DeviceError(str_cat("[", op, "] the MPI communicator takes CPU tensors, got ",
                              t.describe(), " (CUDA tensors go through NCCL)"));
  }
  switch (t.dtype()) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kBFloat16:
    case DType::kFloat16:
      if (use == Use::kMoved) return MPI_UINT16_T;
      break;
    default:
      break;
  }
  throw DTypeError(str_cat("[", op, "] no MPI type for ", t.describe()));
}

int mpi_count(const Tensor& t, const char* op) {
  if (t.numel() > INT32_MAX) {
    throw ShapeError(str_cat("[", op, "] ", t.describe(), " has more than 2^31 - 1 elements"));
  }
  return static_cast<int>(t.numel());
}

class Mpi final : public Communicator {
 public:
  explicit Mpi(const LaunchInfo& info) : local_rank_(info.local_rank) {
    int initialised = 0;
    ACCRUE_MPI_CHECK(MPI_Initialized(&initialised));
    if (!initialised) {
      int provided = 0;
      ACCRUE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      if (provided < MPI_THREAD_FUNNELED) {
        MPI_Finalize();
        throw BackendError(str_cat("[dist] MPI provides thread level ", provided,
                                   ", below MPI_THREAD_FUNNELED, which accrue needs"));
      }
      std::atexit([] {
        int finalized = 0;
        if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
      });
    }
    ACCRUE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    ACCRUE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    ACCRUE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    if (size_ != info.world_size || rank_ != info.rank) {
      throw BackendError(str_cat("[dist] MPI says rank ", rank_, " of ", size_, " but ",
                                 info.launcher, " said rank ", info.rank, " of ", info.world_size));
    }
    world_rank_ = rank_;
    read_max_tag();
  }
  // A group of the job (split): owns its MPI communicator.
  Mpi(MPI_Comm comm, int local_rank, double timeout) : local_rank_(local_rank), comm_(comm) {
    owned_ = true;
    timeout_ = timeout;
    ACCRUE_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    ACCRUE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    ACCRUE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    ACCRUE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
    read_max_tag();
  }
  ~Mpi() override {
    int finalized = 1;
    if (owned_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&comm_);
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  const char* backend() const override { return "mpi"; }

  void all_reduce_sum(Tensor& t) override {
    MPI_Request request = MPI_REQUEST_NULL;
    ACCRUE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t, "all_reduce_sum"),
                                    mpi_type(t, "all_reduce_sum", Use::kSummed), MPI_SUM, comm_,
                                    &request));
    wait(&request, 1, "all_reduce_sum");
  }
  void broadcast(Tensor& t, int root) override {
    if (root < 0 || root >= size_) {
      throw ValueError(str_cat("[broadcast] root ", root, " in a world of ", size_, " ranks"));
    }
    MPI_Request request = MPI_REQUEST_NULL;
    ACCRUE_MPI_CHECK(MPI_Ibcast(t.raw(), mpi_count(t, "broadcast"),
                                mpi_type(t, "broadcast", Use::kMoved), root, comm_, &request));
    wait(&request, 1, "broadcast");
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    MPI_Request request = begin_all_gather(in, out);
    wait(&request, 1, "all_gather");
  }
  std::unique_ptr<Transfer> start_all_gather(const Tensor& in, Tensor& out) override {
    auto transfer = std::make_unique<MpiTransfer>(*this, out, "all_gather (started ahead)");
    transfer->input = in;
    transfer->collective = true;
    transfer->request = begin_all_gather(in, out);
    return transfer;
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_gather("reduce_scatter", out, in, size_, rank_);
    // In place, MPI takes the input from the receive buffer and leaves the result at its start:
    // this rank's slice is moved there after.
    const bool in_place =
        out.raw() == static_cast<char*>(in.raw()) + static_cast<size_t>(rank_) * out.nbytes();
    MPI_Request request = MPI_REQUEST_NULL;
    ACCRUE_MPI_CHECK(MPI_Ireduce_scatter_block(
        in_place ? MPI_IN_PLACE : in.raw(), in_place ? const_cast<void*>(in.raw()) : out.raw(),
        mpi_count(out, "reduce_scatter"), mpi_type(in, "reduce_scatter", Use::kSummed), MPI_SUM,
        comm_, &request));
    wait(&request, 1, "reduce_scatter");
    if (in_place && rank_ > 0) std::memcpy(out.raw(), in.raw(), out.nbytes());
  }
  void barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    ACCRUE_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    wait(&request, 1, "barrier");
  }
  void start_all_reduce_sum(Tensor& t) override {
    MPI_Request request = MPI_REQUEST_NULL;
    ACCRUE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t, "all_reduce_sum"),
                                    mpi_type(t, "all_reduce_sum", Use::kSummed), MPI_SUM, comm_,
                                    &request));
    requests_.push_back(request);  // only a request that was started
  }
  void wait_all() override {
    // Completed requests become MPI_REQUEST_NULL; on an error the rest stay for a later wait.
    wait(requests_.data(), static_cast<int>(requests_.size()), "all_reduce_sum (overlapped)");
    requests_.clear();
  }
  std::unique_ptr<Transfer> isend(const Tensor& t, int peer, int tag) override {
    check_peer("isend", peer, tag, rank_, size_, max_tag_);
    auto transfer = std::make_unique<MpiTransfer>(*this, t, "isend");
    ACCRUE_MPI_CHECK(MPI_Isend(t.raw(), mpi_count(t, "isend"), mpi_type(t, "isend", Use::kMoved),
                               peer, tag, comm_, &transfer->request));
    return transfer;
  }
  std::unique_ptr<Transfer> irecv(Tensor& t, int peer, int tag) override {
    check_peer("irecv", peer, tag, rank_, size_, max_tag_);
    auto transfer = std::make_unique<MpiTransfer>(*this, t, "irecv");
    ACCRUE_MPI_CHECK(MPI_Irecv(t.raw(), mpi_count(t, "irecv"), mpi_type(t, "irecv", Use::kMoved),
                               peer, tag, comm_, &transfer->request));
    return transfer;
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) throw ValueError(str_cat("[split] color ", color, " is negative"));
    MPI_Comm group = MPI_COMM_NULL;
    ACCRUE_MPI_CHECK(MPI_Comm_split(comm_, color, key, &group));
    return std::make_unique<Mpi>(group, local_rank_, timeout_);
  }
  // Every rank of the job, whatever group this is.
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort should not return; if it does, this rank still ends
  }

 private:
  // Polls the requests until all completed: spinning first (a collective between busy ranks
  // completes in microseconds), then sleeping up to a millisecond between polls. Past the
  // timeout, throws BackendError naming the operation, this rank and the limit.
  void wait(MPI_Request* requests, int count, const char* op) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const double limit = timeout();
    auto pause = std::chrono::microseconds(0);
    auto last_poll = start;
    double longest_gap = 0;  // between polls: this process not running (watchdog_message)
    ++waits_;
    for (;;) {
      int done = 0;
      ACCRUE_MPI_CHECK(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
      if (done) return;
      const auto now = Clock::now();
      longest_gap = std::max(longest_gap, std::chrono::duration<double>(now - last_poll).count());
      last_poll = now;
      const double waited = std::chrono::duration<double>(now - start).count();
      if (limit > 0 && waited > limit) {
        throw BackendError(
            watchdog_message(world_rank_, str_cat("MPI ", op), waits_, limit, longest_gap));
      }
      if (waited > 1e-3) {
        std::this_thread::sleep_for(pause);
        pause =
            std::min(pause * 2 + std::chrono::microseconds(10), std::chrono::microseconds(1000));
      }
    }
  }

  // MPI_Iallgather on in and out, in place when in is this rank's slice of out (MPI forbids
  // other aliasing).
  MPI_Request begin_all_gather(const Tensor& in, Tensor& out) {
    check_gather("all_gather", in, out, size_, rank_);
    const int n = mpi_count(in, "all_gather");
    const MPI_Datatype type = mpi_type(in, "all_gather", Use::kMoved);
    const bool in_place = static_cast<const char*>(in.raw()) ==
                          static_cast<const char*>(out.raw()) + rank_ * in.nbytes();
    MPI_Request request = MPI_REQUEST_NULL;
    ACCRUE_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.raw(), n, type, out.raw(), n, type,
                                    comm_, &request));
    return request;
  }

  // A started MPI_Isend, MPI_Irecv or nonblocking collective; holds its tensors until it
  // completes.
  struct MpiTransfer final : Transfer {
    MpiTransfer(Mpi& owner, const Tensor& t, const char* op) : owner(owner), tensor(t), op(op) {}
    // A transfer dropped unfinished (a stage unwinding after an error): cancelled (a collective
    // cannot be) and given a second to finish. MPI may go on reading (a send it cannot cancel)
    // or writing (a matched receive, a collective) the buffers after that, so then the tensors
    // are kept alive for good rather than handed back to the allocator; the job is ending anyway.
    ~MpiTransfer() override {
      int finalized = 1;
      if (request == MPI_REQUEST_NULL || MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) {
        return;
      }
      if (!collective) MPI_Cancel(&request);
      const auto start = std::chrono::steady_clock::now();
      int done = 0;
      while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(1)) {
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      }
      if (done) return;
      if (!collective) MPI_Request_free(&request);  // erroneous for a collective's request
      static std::vector<Tensor>* kept = new std::vector<Tensor>();  // never freed, on purpose
      kept->push_back(tensor);
      kept->push_back(input);
    }
    void wait() override { owner.wait(&request, 1, op); }
    bool done() override {
      int flag = 0;
      ACCRUE_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
      return flag != 0;
    }
    Mpi& owner;
    Tensor tensor;
    Tensor input;             // a collective's other buffer
    bool collective = false;  // cannot be cancelled or freed
    const char* op;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  // The largest tag this MPI allows (at least 32767 by the standard).
  void read_max_tag() {
    void* value = nullptr;
    int found = 0;
    ACCRUE_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found));
    max_tag_ = found ? *static_cast<int*>(value) : 32767;
  }

  int64_t waits_ = 0;  // numbered in the message: where in the run the job stopped
  int rank_ = 0, size_ = 1, local_rank_ = 0, max_tag_ = 32767;
  int world_rank_ = 0;  // in the job, for messages (rank_ is in this group)
  MPI_Comm comm_ = MPI_COMM_WORLD;
  bool owned_ = false;                 // a split group, freed with this object
  std::vector<MPI_Request> requests_;  // started, not yet waited for
};

}  // namespace

std::unique_ptr<Communicator> make_mpi(const LaunchInfo& info) {
  return std::make_unique<Mpi>(info);
}

}  // namespace accrue::distributed
