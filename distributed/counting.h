// A communicator that counts what it is handed: every collective goes on to the communicator
// it wraps, and the bytes of its buffer are added to that kind's total. The strategies talk
// through one, so a run reports the bytes each rank gives the collectives per window
// (docs/zero.md compares them with the formulas): an all-reduce counts its buffer, a
// reduce-scatter its larger input, an all-gather its larger output, a broadcast its tensor. A
// ring moves 2 (N - 1) / N of an all-reduce's buffer over the wire, and (N - 1) / N of the
// other two's. Point-to-point transfers and barriers go on uncounted. Read next: zero.h.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "distributed/communicator.h"

namespace accrue::distributed {

struct CollectiveBytes {
  size_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;
  size_t total() const { return all_reduce + reduce_scatter + all_gather + broadcast; }
};

class CountingCommunicator final : public Communicator {
 public:
  // `inner` must outlive this.
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) { timeout_ = inner.timeout(); }
  // The waits are inner's: its limit is the one that counts.
  void set_timeout(double seconds) override {
    Communicator::set_timeout(seconds);
    inner_.set_timeout(seconds);
  }
  const CollectiveBytes& bytes() const { return bytes_; }

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  int local_rank() const override { return inner_.local_rank(); }
  const char* backend() const override { return inner_.backend(); }
  void all_reduce_sum(Tensor& t) override {
    bytes_.all_reduce += t.nbytes();
    inner_.all_reduce_sum(t);
  }
  void broadcast(Tensor& t, int root) override {
    bytes_.broadcast += t.nbytes();
    inner_.broadcast(t, root);
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    bytes_.all_gather += out.nbytes();
    inner_.all_gather(in, out);
  }
  std::unique_ptr<Transfer> start_all_gather(const Tensor& in, Tensor& out) override {
    bytes_.all_gather += out.nbytes();
    return inner_.start_all_gather(in, out);
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    bytes_.reduce_scatter += in.nbytes();
    inner_.reduce_scatter(in, out);
  }
  void barrier() override { inner_.barrier(); }
  void start_all_reduce_sum(Tensor& t) override {
    bytes_.all_reduce += t.nbytes();
    inner_.start_all_reduce_sum(t);
  }
  void wait_all() override { inner_.wait_all(); }
  void settle() override { inner_.settle(); }
  std::unique_ptr<Transfer> isend(const Tensor& t, int peer, int tag) override {
    return inner_.isend(t, peer, tag);
  }
  std::unique_ptr<Transfer> irecv(Tensor& t, int peer, int tag) override {
    return inner_.irecv(t, peer, tag);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return inner_.split(color, key);
  }
  [[noreturn]] void abort(int code) override {
    inner_.abort(code);
    std::abort();  // not reached: inner's abort does not return
  }

 private:
  Communicator& inner_;
  CollectiveBytes bytes_;
};

}  // namespace accrue::distributed
