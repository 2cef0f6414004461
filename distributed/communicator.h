// Data-parallel communication: who this process is among the ranks of a job, and the collectives
// the boundary step needs. Three backends behind one interface: the world of one process (no
// library, every collective a no-op or a copy), MPI for CPU tensors (distributed/mpi.cpp, Open
// MPI), NCCL for CUDA tensors (distributed/nccl.cu, its unique id bootstrapped over MPI). world()
// picks one from the launcher's environment: `mpirun -np N` (Open MPI: OMPI_COMM_WORLD_*), `srun`
// (SLURM_STEP_NUM_TASKS, SLURM_PROCID, SLURM_LOCALID) or MPICH's mpiexec (PMI_SIZE, PMI_RANK).
//
// Collectives work in place on contiguous tensors of one dtype and are called by every rank in
// the same order. A failure on one rank must not leave the others waiting in a collective:
// abort() ends every rank of the job (MPI_Abort), and the trainers call it from their error
// handler. world_for(cuda) is itself collective the first time (NCCL's bootstrap): every rank
// makes that first call at the same point. Read next: data_parallel.h, which all-reduces once
// per window.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace accrue::distributed {

// What the launcher says about this process (environment variables only: no library needed).
struct LaunchInfo {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string launcher = "none";  // "mpirun", "srun", "mpiexec (PMI)" or "none"
};
LaunchInfo launch_info();

// A point-to-point transfer in progress (Communicator::isend / irecv). wait() completes it under
// the watchdog; done() says whether it has, without waiting. It keeps its tensor alive until it
// completes, and must not outlive its communicator. Destroying one that has not completed
// cancels it (the way out of a job that is failing).
class Transfer {
 public:
  virtual ~Transfer() = default;
  virtual void wait() = 0;
  virtual bool done() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;
  virtual const char* backend() const = 0;  // "single", "mpi", "nccl"

  // t = sum over ranks of t
  virtual void all_reduce_sum(Tensor& t) = 0;
  // t = root's t
  virtual void broadcast(Tensor& t, int root) = 0;
  // out [world * n] = concatenation of every rank's in [n], rank order; in may be this rank's
  // slice of out (in place)
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // out [n] = this rank's slice [rank * n, (rank + 1) * n) of the sum over ranks of in [world * n];
  // out may be that slice of in (in place: the rest of in is left unspecified)
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  virtual void barrier() = 0;
  // Starts t = sum over ranks of t without waiting; wait_all() completes every started one, in
  // the order started. Every rank starts the same collectives in the same order; t must stay
  // untouched until wait_all() returns. (The overlap of the boundary all-reduce with backward.)
  virtual void start_all_reduce_sum(Tensor& t) { all_reduce_sum(t); }
  virtual void wait_all() {}
  // Starts all_gather(in, out) without waiting (ZeRO-3's gather of the next layer while this one
  // computes); the returned Transfer's wait() completes it: on the MPI backend the host waits,
  // under the watchdog; under NCCL the gather runs on a side stream after the work the compute
  // stream has queued so far, and wait() makes the compute stream wait for it. in stays
  // untouched and out unread until then; every rank starts the same collectives in the same
  // order. By default the gather completes before this returns.
  virtual std::unique_ptr<Transfer> start_all_gather(const Tensor& in, Tensor& out);
  // Returns once the collectives queued so far have completed, under the watchdog: before the
  // host reads what they produced (the boundary's sums), a plain read would wait forever for a
  // stopped peer. A no-op where collectives complete before they return (MPI, one process).
  virtual void settle() {}
  // Point-to-point without waiting (pipeline stages): starts sending t to rank `peer`, or
  // receiving into t (its shape and dtype agreed beforehand) from `peer`. The messages from one
  // rank to another with one tag arrive in the order they were sent; every rank posts its
  // transfers in the order its peers post the matching ones (the schedules do). t stays
  // untouched (send) or unread (receive) until the transfer completes.
  virtual std::unique_ptr<Transfer> isend(const Tensor& t, int peer, int tag) = 0;
  virtual std::unique_ptr<Transfer> irecv(Tensor& t, int peer, int tag) = 0;
  // A communicator over the ranks that pass the same color, ranked by key (ties by this
  // communicator's rank), as MPI_Comm_split: the data-parallel and pipeline groups. Collective:
  // every rank calls it. The result must not outlive this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Ends every rank of the job with this exit code; does not return.
  [[noreturn]] virtual void abort(int code) = 0;

  // The watchdog: a wait for the other ranks (a collective, a barrier, point-to-point) that has
  // not completed after this many seconds throws TimeoutError naming the operation and this
  // rank, and the trainer's handler aborts the job -- instead of a stopped or hung rank leaving
  // the others waiting forever. 600 s by default, as PyTorch's process groups; <= 0: no limit.
  // A communicator that sends some tensors through another (NCCL's host tensors over MPI) sets
  // the other's limit too.
  virtual void set_timeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_ + allowance_; }

 protected:
  double timeout_ = 600;
  double allowance_ = 0;  // extra seconds for waits that follow long work on one rank
  friend class LongWaitAllowance;
};

// The watchdog's message for a wait of `op` (the rank's `wait`-th) that passed `limit` seconds.
// longest_gap: the longest time between two of the wait's polls, which run at least every
// millisecond while the process runs: a gap of a second or more, and half the limit, means this
// rank itself did not run (SIGSTOP, a debugger, a paused machine), and the message says so
// instead of blaming another rank.
std::string watchdog_message(int rank, const std::string& op, int64_t wait, double limit,
                             double longest_gap);

// While it lives, waits may take `seconds` longer: for the waits that follow work one rank does
// alone (rank 0 writing a checkpoint while the others wait at the barrier after it).
class LongWaitAllowance {
 public:
  LongWaitAllowance(Communicator& comm, double seconds) : comm_(comm), before_(comm.allowance_) {
    comm_.allowance_ = before_ + seconds;
  }
  ~LongWaitAllowance() { comm_.allowance_ = before_; }
  LongWaitAllowance(const LongWaitAllowance&) = delete;
  LongWaitAllowance& operator=(const LongWaitAllowance&) = delete;

 private:
  Communicator& comm_;
  double before_;
};

// The process-wide communicator, made on first use from launch_info(): the world of one when the
// job has one rank, else MPI (CPU tensors). Throws when the launcher started several ranks and
// this build has no MPI, naming what to install.
Communicator& world();

// The communicator for tensors on `device`: world() for the CPU; for CUDA, NCCL on this rank's
// GPU (made once, bootstrapped over world()) when the job has several ranks. Throws when the
// job has several ranks and this build has no NCCL.
Communicator& world_for(Device device);

// The world of one process: collectives are identities (all_gather and reduce_scatter copy).
std::unique_ptr<Communicator> make_single_process();

// Checks shared by the backends: one dtype and device, the sizes the collective needs (every
// accrue tensor is contiguous).
// `in` is the smaller tensor; in_place_rank >= 0 lets it be exactly that rank's slice of `out`
// (all_gather in place); any other overlap of the two throws.
void check_gather(const char* op, const Tensor& in, const Tensor& out, int world_size,
                  int in_place_rank = -1);

// Checks a point-to-point call's peer and tag: a rank of this world other than this one, and a
// tag in [0, max_tag].
void check_peer(const char* op, int peer, int tag, int rank, int world_size, int max_tag);

}  // namespace accrue::distributed
