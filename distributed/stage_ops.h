// The boundary between two pipeline stages as two recorded ops, so that backward crosses ranks
// by itself (the articles' GPipe: a model cut into stages on several ranks):
//   stage s:      token = send_activation(y, next, micro, comm);  ...  backward(token)
//                 -- the token's node receives dL/dy from `next` and goes on from y
//   stage s + 1:  x = recv_activation(prev, micro, dtype, device, comm);  ...  backward(loss)
//                 -- x's node sends dL/dx back to `prev`
// Sending never waits: the activation goes out with isend, and the receive of its gradient is
// posted at once, so it lands while the stage computes. The shape travels with the activation
// (a small header before it, with the dtype, which the receiver checks), so micro-batches of
// different shapes (the last, short one; padded sequences) need no agreement. Micro-batch m's
// messages carry tag 2m (activation) and 2m + 1 (its gradient), so they cannot be mistaken for
// another micro-batch's of the same window; the tags repeat every window, so a window that
// fails on one stage must end the job (the engine does: any error aborts every rank), or a
// later window could receive its leftovers. Read next: pipeline.h, the schedules that call these.
#pragma once

#include "core/tensor.h"
#include "distributed/communicator.h"

namespace accrue::distributed {

// Sends y [any shape, at most 8 dims] to rank `next` as micro-batch `micro`'s activation.
// Returns a one-element token on the tape when y requires grad (backward(token) receives y's
// gradient from `next` and continues backward from y), else an undefined tensor.
Tensor send_activation(const Tensor& y, int next, int micro, Communicator& comm);

// Receives micro-batch `micro`'s activation from rank `prev` (waiting for it, under the
// watchdog). With grad enabled the result requires grad, and its backward sends the gradient
// back to `prev`.
Tensor recv_activation(int prev, int micro, DType dtype, Device device, Communicator& comm);

// Seconds this thread has spent waiting in these two ops for a neighbour (an activation to
// arrive, a gradient to come back): the pipeline's measured bubble.
double boundary_wait_seconds();

// The tags of micro-batch m's messages; throws when m is negative or past what MPI can tag.
int activation_tag(int micro);
int gradient_tag(int micro);

}  // namespace accrue::distributed
