// What the multi-rank tests share (they run under mpiexec, every test on every rank): the
// world's communicator, a check that a value is the same on every rank, and a run stopped at a
// checkpoint and resumed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>

#include "distributed/communicator.h"
#include "mnist_fixture.h"

namespace accrue::testing {

inline distributed::Communicator& comm() {
  return distributed::world();
}

// Gathers a 64-bit value (a parameter hash) from every rank and expects them all equal.
inline void expect_same_on_every_rank(uint64_t h) {
  const Tensor mine = Tensor::from_vector<int32_t>(
      {2}, {static_cast<int32_t>(h >> 32), static_cast<int32_t>(h & 0xffffffffu)});
  Tensor all = Tensor::zeros({2 * comm().world_size()}, DType::kInt32);
  comm().all_gather(mine, all);
  const auto v = all.to_vector<int32_t>();
  for (int r = 1; r < comm().world_size(); ++r) {
    EXPECT_EQ(v[2 * r], v[0]) << "rank " << r;
    EXPECT_EQ(v[2 * r + 1], v[1]) << "rank " << r;
  }
}

// Trains `c` to step 5 with a checkpoint at step 5 in a fresh folder shared by the ranks (each
// rank's fixture folder has its own name), as on a cluster's shared file system; then resumes it
// to step 10 with `c` as `adjust` leaves it. Returns the resumed run; `c` is the resuming config.
inline Recorded checkpoint_and_resume(mnist::Config& c, const std::filesystem::path& dir,
                                      const std::function<void(mnist::Config&)>& adjust = {}) {
  if (comm().rank() == 0) std::filesystem::remove_all(dir);
  comm().barrier();
  c.max_steps = 5;
  c.checkpoint = dir.string();
  c.checkpoint_every = 5;
  train_recorded(c, std::cout);
  c.max_steps = 10;
  c.checkpoint.clear();
  c.resume = dir.string();
  if (adjust) adjust(c);
  return train_recorded(c, std::cout);
}

}  // namespace accrue::testing
