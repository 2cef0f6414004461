// The offloaded optimizer's copies (see offload.h).
#include "optim/offload.h"

#include <algorithm>

#include "core/error.h"
#include "optim/offload_copies.h"

namespace accrue::optim {

HostOffload::HostOffload(Optimizer& optimizer)
    : optimizer_(optimizer), arena_(optimizer.arena()), device_(arena_.device()) {
  if (!arena_.offloaded()) {
    throw ValueError(
        "[offload] the arena's masters are on the compute device; call "
        "ParameterArena::offload_masters() before building the optimizer");
  }
  grads_ = arena_.master_grads();
  working_ = arena_.master_working();
  if (!arena_.masters_whole())
    restrict_to(arena_.masters_begin(), arena_.masters_begin() + arena_.masters().numel());
  optimizer.set_parameter_sync(this);
  send_loss_scale();
}

HostOffload::~HostOffload() {
  try {
    wait(false);   // a fault stays recorded for whoever reads next
  } catch (...) {  // a device failure: already reported by whoever saw it first
  }
}

void HostOffload::copy_range(int64_t begin, int64_t end) {
  const Tensor src = arena_.grads().narrow(begin, end - begin);
  Tensor dst = grads_.narrow(begin - arena_.masters_begin(), end - begin);
  if (src.device().is_cuda()) {
    copy_to_host_async(dst.raw(), src.raw(), src.device(), src.nbytes());
    in_flight_ = true;
  } else {
    dst.copy_(src);
  }
  started_.emplace_back(begin, end);
  traffic_.to_host_bytes += src.nbytes();
}

void HostOffload::restrict_to(int64_t begin, int64_t end) {
  if (begin < 0 || end <= begin || end > arena_.size()) {
    throw ValueError(
        str_cat("[offload] slice [", begin, ", ", end, ") outside the arena of ", arena_.size()));
  }
  const int64_t held = arena_.masters_begin(), held_end = held + arena_.masters().numel();
  if (begin < held || end > held_end) {
    throw ValueError(str_cat("[offload] slice [", begin, ", ", end, ") outside the masters on the ",
                             "host, [", held, ", ", held_end, ")"));
  }
  lo_ = begin;
  hi_ = end;
}

void HostOffload::prefetch(int64_t begin, int64_t end) {
  if (begin < 0 || end < begin || end > arena_.size()) {
    throw ValueError(str_cat("[offload] prefetch of elements [", begin, ", ", end,
                             ") outside the arena of ", arena_.size()));
  }
  for (const auto& [b, e] : started_) {
    if (begin < e && b < end) {
      throw ValueError(str_cat("[offload] prefetch of elements [", begin, ", ", end, ") overlaps [",
                               b, ", ", e, "), already copied this window"));
    }
  }
  if (hi_ >= 0) {  // only this rank's slice
    begin = std::max(begin, lo_);
    end = std::min(end, hi_);
  }
  if (begin >= end) return;
  copy_range(begin, end);
  ++traffic_.prefetched;
}

void HostOffload::fetch() {
  std::vector<std::pair<int64_t, int64_t>> done = started_;
  std::sort(done.begin(), done.end());
  const int64_t last = hi_ >= 0 ? hi_ : arena_.size();
  int64_t next = lo_;  // everything in [lo_, next) has been copied
  for (const auto& [b, e] : done) {
    if (b > next) {
      copy_range(next, b);
      ++traffic_.fetched_at_step;
    }
    next = std::max(next, e);
  }
  if (next < last) {
    copy_range(next, last);
    ++traffic_.fetched_at_step;
  }
  wait(true);
  started_.clear();
  grads_.mark_modified();
  arena_.zero_grad();  // the next window accumulates from zero on the device
  ++traffic_.steps;
}

void HostOffload::wait(bool report_faults) {
  if (!in_flight_) return;
  in_flight_ = false;
  wait_copies_to_host(device_, report_faults);
}

void HostOffload::discard() {
  started_.clear();
  wait(false);  // a fault stays recorded for the next host read
}

void HostOffload::push(bool skipped) {
  if (skipped) return;  // the weights did not change
  const Tensor& host = working_.defined() ? working_ : arena_.masters();
  const int64_t begin = hi_ >= 0 ? lo_ : 0, n = (hi_ >= 0 ? hi_ : arena_.size()) - begin;
  Tensor device = arena_.working().narrow(begin, n);
  send(host.narrow(begin - arena_.masters_begin(), n), device);
  traffic_.from_host_bytes += device.nbytes();
}

void HostOffload::send(const Tensor& host, Tensor& device) {
  if (host.shape() != device.shape() || host.dtype() != device.dtype() || !host.device().is_cpu()) {
    throw ShapeError(str_cat("[offload] cannot send ", host.describe(), " to ", device.describe()));
  }
  if (device.device().is_cuda()) {
    copy_from_host_async(device.raw(), device.device(), host.raw(), host.nbytes());
    in_flight_ = true;
    device.mark_modified();
  } else {
    device.copy_(host);
  }
}

bool HostOffload::abandon() {
  try {
    discard();
  } catch (...) {
    return false;
  }
  return true;
}

void HostOffload::after_update() {
  push(optimizer_.report().skipped);  // the host knows the skip flag without a device read
  send_loss_scale();
}

void HostOffload::send_loss_scale() {
  if (!optimizer_.loss_scaled()) return;
  if (!device_scale_.defined()) {
    device_scale_ = Tensor::zeros({1}, optimizer_.scaler().dtype(), device_);
    optimizer_.mirror_loss_scale(device_scale_);
  }
  send(optimizer_.scaler().narrow(0, 1), device_scale_);
}

void HostOffload::quiesce() {
  synchronize(device_);
}

}  // namespace accrue::optim
