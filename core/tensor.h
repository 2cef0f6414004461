// Tensor: a shape, a dtype and a contiguous span (offset + numel) of a reference-counted
// Storage block from the device's caching allocator. Tensors are handles: copying one shares the
// data. Views (reshape, narrow on dim 0, the parameter arena's slices) share storage too.
// Every tensor is contiguous; that keeps every kernel a flat loop over numel elements.
// This is the base layer: a Tensor moves bytes (copies between devices, zeros) but computes
// nothing. Factories and conversions that run kernels (full, fill_, to_dtype, uniform, normal)
// are in kernels/factories.h; backward() is in ops/autograd.h, which reads the autograd fields
// (requires_grad, grad, tape slot) kept here. Read next: kernels/backend.h.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace accrue {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);

// One block of device memory, returned to its allocator when the last reference goes.
class CachingAllocator;

class Tensor;

class Storage {
 public:
  // From the device's allocator (allocator_for), or from `allocator` (pinned host memory).
  Storage(Device device, size_t nbytes);
  Storage(Device device, size_t nbytes, CachingAllocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Bumped by every in-place write through a tensor (fill_, copy_, optimizer updates). Backward
  // compares it with the value each node saved, so a saved tensor modified between forward and
  // backward is an error instead of a silently wrong gradient (PyTorch's version counter).
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }
  // ZeRO's transient buffers (a gathered layer, a whole gradient between micro-steps): release()
  // hands the memory back to the allocator while every tensor viewing this storage stays valid,
  // as the tape's saved weights must; reacquire() takes as many bytes again (contents
  // unspecified) before anything reads them. held(): not released. The version is unchanged
  // by both, so a gather that restores the same values between forward and backward is no
  // modification (FSDP's storage resize to 0 and back).
  void release();
  void reacquire();
  bool held() const { return data_ != nullptr || nbytes_ == 0; }
  // reacquire() when released, then zeroes t (a view of this storage, all of it).
  void reacquire_zeroed(Tensor& t);

 private:
  Device device_;
  size_t nbytes_;
  CachingAllocator* allocator_;
  void* data_;
  uint64_t version_ = 0;
};

class Tensor;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::kFloat32;
  // Autograd. A leaf that requires grad accumulates into `grad` (for parameters: a view of the
  // gradient arena). A non-leaf result of a recorded op names its node on the tape.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  uint64_t node_id = 0;    // the producing node's process-wide unique id (autograd.h)
  int64_t tape_slot = -1;  // -1: a leaf
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories. Contents of empty() are unspecified; zeros() are all-zero bytes, which is 0 in
  // every dtype.
  static Tensor empty(const Shape& shape, DType dtype = DType::kFloat32,
                      Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32,
                      Device device = Device::cpu());
  // Zeros in page-locked host memory (pinned_host_allocator(), core/allocator.h): a CPU tensor
  // that a GPU copies to and from asynchronously. The offloaded optimizer keeps its state here.
  static Tensor zeros_pinned(const Shape& shape, DType dtype = DType::kFloat32);
  // The same, uninitialised (core/staging.h writes micro-batches there).
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::kFloat32);
  // Copies host values in; values.size() must equal the shape's element count.
  template <typename T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values,
                            Device device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  // The accessors below throw ValueError on an undefined tensor (Tensor()).
  const Shape& shape() const { return checked("shape").shape; }
  int64_t dim() const { return static_cast<int64_t>(checked("dim").shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(checked("numel").shape); }
  DType dtype() const { return checked("dtype").dtype; }
  Device device() const { return checked("device").storage->device(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  std::string describe() const;  // "float32[32, 784] on cpu"

  // Raw pointer to the first element (device memory for CUDA tensors).
  void* raw() const;
  // Typed pointer; throws DTypeError when T does not match dtype().
  template <typename T>
  T* data() const;

  // Host copy of the values (copies from the device when needed).
  template <typename T>
  std::vector<T> to_vector() const;
  // The single value of a one-element tensor, as a double.
  double item() const;

  // Views sharing storage (no autograd; see ops.h reshape() for the recorded version).
  Tensor view(const Shape& shape) const;
  // Rows [start, start + length) of dimension 0.
  Tensor narrow(int64_t start, int64_t length) const;

  // New tensors: byte copies (same dtype; kernels/factories.h to_dtype() converts).
  Tensor clone() const;
  Tensor to(Device device) const;

  // In place. Each bumps the storage's version (see Storage::version).
  void zero_();
  void copy_(const Tensor& src);  // same shape and dtype; any devices
  // Records an in-place write made behind the tensor's back (a backend primitive that updates
  // it, such as the fused optimizer step).
  void mark_modified() const { checked("mark_modified").storage->bump_version(); }

  // Autograd.
  bool requires_grad() const { return checked("requires_grad").requires_grad; }
  Tensor& set_requires_grad(bool flag);
  bool is_leaf() const { return checked("is_leaf").tape_slot < 0; }
  Tensor grad() const { return Tensor(checked("grad").grad); }
  // Binds a persistent gradient buffer (same shape and dtype) to this leaf.
  void set_grad(const Tensor& grad);
  // Points this tensor at other's memory (same shape and dtype): every handle sees the move.
  // The parameter arena uses it to gather parameters into one buffer.
  void set_data(const Tensor& other);
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  const TensorImpl& checked(const char* op) const {
    if (!impl_) throw_undefined(op);
    return *impl_;
  }
  [[noreturn]] static void throw_undefined(const char* op);

  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& t);

}  // namespace accrue
