// HostToDevice (staging.h): pinned buffers from pinned_host_allocator() and the bookkeeping of
// which copies may still read them. The copy stream and its events are core/cuda/staging.cu's.
#include "core/staging.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/cuda_seam.h"

namespace accrue {

HostToDevice::~HostToDevice() {
  try {
    discard_pending();
    // The pinned pool hands a block to the next writer at once: the copies reading them finish
    // first.
    if (!staged_.empty()) cuda_wait_copies(device_);
  } catch (...) {
    // A failed device: the pinned blocks are still freed below; nothing else can be done here.
  }
}

void HostToDevice::discard_pending() {
  for (void* e : pending_events_) cuda_wait_copy(e, device_);
  pending_events_.clear();
}

HostToDevice::Pending HostToDevice::stage(const Tensor& host) {
  if (!host.device().is_cpu()) {
    throw DeviceError(str_cat("[stage] stages host tensors, got one on ", host.device().str()));
  }
  if (device_.is_cpu()) return {host, nullptr};
  Tensor pinned = Tensor::empty_pinned(host.shape(), host.dtype());
  if (host.nbytes() > 0) std::memcpy(pinned.raw(), host.raw(), host.nbytes());
  Pending p{Tensor::empty(host.shape(), host.dtype(), device_), nullptr,
            released_ + static_cast<int64_t>(staged_.size()) + 1};
  p.copied = cuda_copy_to_device_async(p.tensor.raw(), device_, pinned.raw(), host.nbytes());
  if (p.copied != nullptr) pending_events_.push_back(p.copied);
  staged_.push_back(std::move(pinned));
  return p;
}

Tensor HostToDevice::ready(Pending& pending) {
  if (pending.copied != nullptr) {
    const auto it = std::find(pending_events_.begin(), pending_events_.end(), pending.copied);
    if (it != pending_events_.end()) {  // else discard_pending() made the stream wait already
      cuda_wait_copy(pending.copied, device_);
      pending_events_.erase(it);
    }
    pending.copied = nullptr;
    // Every copy staged before this one was queued earlier on the same copy stream.
    waited_ = std::max(waited_, pending.order);
  }
  return pending.tensor;
}

void HostToDevice::release_waited() {
  staged_.erase(staged_.begin(), staged_.begin() + (waited_ - released_));
  released_ = waited_;
}

}  // namespace accrue
