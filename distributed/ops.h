// Collectives as recorded ops, the custom AllGather / AllReduceSum autograd functions of the
// articles: a model split across ranks calls them in its forward and backward does the right
// exchange. Every rank must call them in the same order, with the same shapes.
#pragma once

#include "core/tensor.h"
#include "distributed/communicator.h"

namespace accrue::distributed {

// x [n, ...] on each rank -> [world * n, ...], the ranks' x in rank order. Backward: the
// gradient summed over ranks (each rank's loss read the whole gather), this rank's slice of it:
// a reduce-scatter of dy.
Tensor all_gather(const Tensor& x, Communicator& comm);
// x -> the sum over ranks of x. Backward: the all-reduce of dy (every rank's loss read the sum).
Tensor all_reduce_sum(const Tensor& x, Communicator& comm);

}  // namespace accrue::distributed
