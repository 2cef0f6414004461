// Tensor and Storage: construction, views, byte copies and printing. Copies and zeros go to
// memcpy / memset on the CPU and to the CUDA runtime (core/cuda_seam.h) on a GPU.
#include "core/tensor.h"

#include <cstring>
#include <iomanip>

#include "core/allocator.h"
#include "core/cuda_seam.h"
#include "core/host_waits.h"

namespace accrue {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      throw ShapeError(str_cat(
          "[shape] ", shape_str(shape),
          d < 0 ? " has a negative dimension" : " has more elements than an int64 can count"));
    }
  }
  return n;
}

void Tensor::throw_undefined(const char* op) {
  throw ValueError(str_cat("[", op, "] the tensor is undefined (a default-constructed Tensor())"));
}

Storage::Storage(Device device, size_t nbytes) : Storage(device, nbytes, allocator_for(device)) {}

Storage::Storage(Device device, size_t nbytes, CachingAllocator& allocator)
    : device_(device), nbytes_(nbytes), allocator_(&allocator), data_(allocator.allocate(nbytes)) {}

Storage::~Storage() {
  if (data_ != nullptr) allocator_->deallocate(data_);
}

void Storage::release() {
  if (data_ != nullptr) allocator_->deallocate(data_);
  data_ = nullptr;
}

void Storage::reacquire() {
  if (data_ == nullptr && nbytes_ > 0) data_ = allocator_->allocate(nbytes_);
}

void Storage::reacquire_zeroed(Tensor& t) {
  if (held()) return;
  reacquire();
  t.zero_();
}

namespace {

void check_shape(const Shape& shape, const char* op) {
  for (int64_t d : shape) {
    if (d < 0)
      throw ShapeError(str_cat("[", op, "] negative dimension in shape ", shape_str(shape)));
  }
}

}  // namespace

namespace {

// An uninitialised tensor whose storage comes from `allocator` (the device's own, or pinned).
Tensor empty_from(const Shape& shape, DType dtype, Device device, CachingAllocator& allocator,
                  const char* op) {
  check_shape(shape, op);
  size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype), &nbytes)) {
    throw ShapeError(str_cat("[", op, "] ", dtype_name(dtype), shape_str(shape),
                             " needs more bytes than a size_t can count"));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(device, nbytes, allocator);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace

Tensor Tensor::zeros_pinned(const Shape& shape, DType dtype) {
  Tensor t = empty_pinned(shape, dtype);
  t.zero_();
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  return empty_from(shape, dtype, Device::cpu(), pinned_host_allocator(), "empty_pinned");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty_from(shape, dtype, device, allocator_for(device), "empty");
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values, Device device) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape)) {
    throw ShapeError(str_cat("[from_vector] ", values.size(), " values do not fill shape ",
                             shape_str(shape), " (", shape_numel(shape), " elements)"));
  }
  Tensor host = empty(shape, dtype_of<T>(), Device::cpu());
  if (!values.empty()) std::memcpy(host.raw(), values.data(), values.size() * sizeof(T));
  return device.is_cpu() ? host : host.to(device);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if (dtype_of<T>() != dtype()) {
    throw DTypeError(str_cat("[to_vector] tensor is ", dtype_name(dtype()), ", asked for ",
                             dtype_name(dtype_of<T>())));
  }
  count_host_wait(HostWait::kRead);
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<T> out(static_cast<size_t>(numel()));
  if (!out.empty()) std::memcpy(out.data(), host.raw(), out.size() * sizeof(T));
  return out;
}

template Tensor Tensor::from_vector<float>(const Shape&, const std::vector<float>&, Device);
template Tensor Tensor::from_vector<double>(const Shape&, const std::vector<double>&, Device);
template Tensor Tensor::from_vector<int32_t>(const Shape&, const std::vector<int32_t>&, Device);
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template Tensor Tensor::from_vector<int64_t>(const Shape&, const std::vector<int64_t>&, Device);
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template Tensor Tensor::from_vector<bf16>(const Shape&, const std::vector<bf16>&, Device);
template Tensor Tensor::from_vector<f16>(const Shape&, const std::vector<f16>&, Device);
template std::vector<bf16> Tensor::to_vector<bf16>() const;
template std::vector<f16> Tensor::to_vector<f16>() const;

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  if (d < -n || d >= n) {
    throw ShapeError(
        str_cat("[size] dimension ", d, " is out of range for shape ", shape_str(shape())));
  }
  return shape()[static_cast<size_t>(d < 0 ? d + n : d)];
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str_cat(dtype_name(dtype()), shape_str(shape()), " on ", device().str());
}

void* Tensor::raw() const {
  checked("raw");
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * static_cast<int64_t>(dtype_size(impl_->dtype));
}

template <typename T>
T* Tensor::data() const {
  if (dtype_of<T>() != dtype()) {
    throw DTypeError(str_cat("[data] tensor is ", dtype_name(dtype()), ", accessed as ",
                             dtype_name(dtype_of<T>())));
  }
  return static_cast<T*>(raw());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template int32_t* Tensor::data<int32_t>() const;
template int64_t* Tensor::data<int64_t>() const;
template bf16* Tensor::data<bf16>() const;
template f16* Tensor::data<f16>() const;

double Tensor::item() const {
  if (numel() != 1) {
    throw ShapeError(str_cat("[item] needs one element, tensor has shape ", shape_str(shape())));
  }
  switch (dtype()) {
    case DType::kFloat32:
      return to_vector<float>()[0];
    case DType::kFloat64:
      return to_vector<double>()[0];
    case DType::kInt32:
      return to_vector<int32_t>()[0];
    case DType::kBFloat16:
      return to_vector<bf16>()[0];
    case DType::kFloat16:
      return to_vector<f16>()[0];
    case DType::kInt64:
      return static_cast<double>(to_vector<int64_t>()[0]);  // exact below 2^53
  }
  return 0;
}

Tensor Tensor::view(const Shape& shape) const {
  check_shape(shape, "view");
  if (shape_numel(shape) != numel()) {
    throw ShapeError(
        str_cat("[view] cannot view shape ", shape_str(this->shape()), " as ", shape_str(shape)));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = shape;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  // length > rows - start, not start + length > rows: the sum may overflow.
  if (dim() == 0 || start < 0 || length < 0 || start > shape()[0] || length > shape()[0] - start) {
    throw ShapeError(str_cat("[narrow] ", length, " rows from row ", start,
                             " are out of range for shape ", shape_str(shape())));
  }
  Shape s = shape();
  s[0] = length;
  Tensor out = view(shape());
  out.impl_->shape = s;
  out.impl_->offset += start * (numel() / std::max<int64_t>(shape()[0], 1));
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  out.copy_(*this);
  return out;
}

void Tensor::zero_() {
  if (device().is_cpu()) {
    if (nbytes() > 0) std::memset(raw(), 0, nbytes());
  } else {
    cuda_zero_bytes(raw(), device(), nbytes());
  }
  mark_modified();
}

void Tensor::copy_(const Tensor& src) {
  if (src.shape() != shape() || src.dtype() != dtype()) {
    throw ShapeError(
        str_cat("[copy_] source ", src.describe(), " does not match destination ", describe()));
  }
  if (src.device().is_cpu() && device().is_cpu()) {
    if (nbytes() > 0 && src.raw() != raw()) std::memcpy(raw(), src.raw(), nbytes());
  } else {
    cuda_copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
  }
  mark_modified();
}

Tensor& Tensor::set_requires_grad(bool flag) {
  if (flag && !is_floating(dtype())) {
    throw DTypeError(
        str_cat("[set_requires_grad] only floating tensors can require grad, got ", describe()));
  }
  if (!is_leaf()) {
    throw AutogradError("[set_requires_grad] only leaf tensors can change requires_grad");
  }
  impl_->requires_grad = flag;
  return *this;
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined() &&
      (grad.shape() != shape() || grad.dtype() != dtype() || grad.device() != device())) {
    throw ShapeError(
        str_cat("[set_grad] gradient ", grad.describe(), " does not match tensor ", describe()));
  }
  impl_->grad = grad.impl_;
}

void Tensor::set_data(const Tensor& other) {
  if (other.shape() != shape() || other.dtype() != dtype()) {
    throw ShapeError(str_cat("[set_data] ", other.describe(), " does not match ", describe()));
  }
  impl_->storage = other.impl_->storage;
  impl_->offset = other.impl_->offset;
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "Tensor(undefined)";
  out << "Tensor(" << t.describe() << ", [";
  const int64_t n = t.numel();
  const int64_t show = std::min<int64_t>(n, 12);
  Tensor host = t.to(Device::cpu());
  for (int64_t i = 0; i < show; ++i) {
    if (i) out << ", ";
    switch (t.dtype()) {
      case DType::kFloat32:
        out << host.data<float>()[i];
        break;
      case DType::kFloat64:
        out << host.data<double>()[i];
        break;
      case DType::kInt32:
        out << host.data<int32_t>()[i];
        break;
      case DType::kBFloat16:
        out << static_cast<float>(host.data<bf16>()[i]);
        break;
      case DType::kFloat16:
        out << static_cast<float>(host.data<f16>()[i]);
        break;
      case DType::kInt64:
        out << host.data<int64_t>()[i];
        break;
    }
  }
  if (show < n) out << ", ...";
  return out << "])";
}

}  // namespace accrue
