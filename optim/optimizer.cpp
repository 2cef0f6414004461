// The shared boundary pipeline of every optimizer.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/factories.h"

namespace accrue::optim {

namespace {
// The loss scaler's clean-window count is a float32 on the device: exact up to 2^24.
constexpr int kMaxCleanWindows = 1 << 24;
}  // namespace

Optimizer::Optimizer(ParameterArena& arena, double lr)
    : arena_(arena),
      lr_(lr),
      norm_sq_(state_zeros({2}, arena.dtype())),
      boundary_(state_zeros({4}, arena.dtype())),
      applied_steps_(state_zeros({1}, DType::kInt32)),
      params_(arena.masters()),
      grads_(arena.master_grads()),
      working_(arena.master_working()) {
  set_lr(lr);
}

Optimizer::~Optimizer() = default;

Tensor Optimizer::loss_scale() const {
  if (!loss_scaled()) return Tensor();
  return scale_mirror_.defined() ? scale_mirror_ : scaler_.narrow(0, 1);
}

void Optimizer::restrict_to_slice(int64_t offset, int64_t n, bool in_arena) {
  if (stepped_) throw ValueError("[optimizer] restrict_to_slice() after the first step");
  if (offset < 0 || n <= 0 || n > arena_.size() - offset) {
    throw ValueError(str_cat("[optimizer] slice [", offset, ", ", offset + n,
                             ") is not inside an arena of ", arena_.size(), " elements"));
  }
  // The masters (and their host copies) may hold a slice of the arena only: this one.
  const int64_t begin = arena_.masters_begin();
  if (offset < begin || offset + n > begin + arena_.masters().numel()) {
    throw ValueError(str_cat("[optimizer] slice [", offset, ", ", offset + n,
                             ") is not inside the masters this process holds, [", begin, ", ",
                             begin + arena_.masters().numel(), ")"));
  }
  slice_offset_ = offset;
  params_ = arena_.masters().narrow(offset - begin, n);
  // Offloaded, the slice of the host gradient the offload's copy fills.
  grads_ = arena_.offloaded() ? arena_.master_grads().narrow(offset - begin, n)
           : in_arena         ? arena_.grads().narrow(offset, n)
                              : Tensor::zeros({n}, arena_.dtype(), arena_.device());
  if (working_.defined()) working_ = arena_.master_working().narrow(offset - begin, n);
  resize_state(n);
}

void Optimizer::set_loss_scaling(const LossScaling& scaling, double initial_scale) {
  require_finite_at_least("optimizer", "loss scale", initial_scale, 0);
  if (initial_scale == 0) throw ValueError("[optimizer] loss scale must be > 0, got 0");
  if (scaling.dynamic) {
    require_finite_at_least("optimizer", "loss scale growth factor", scaling.growth, 1);
    require_finite_at_least("optimizer", "loss scale backoff factor", scaling.backoff, 0);
    if (!(scaling.backoff < 1) || scaling.backoff == 0 || scaling.growth_interval < 1 ||
        scaling.growth_interval > kMaxCleanWindows) {
      throw ValueError(str_cat("[optimizer] loss scaling needs 0 < backoff < 1 and an interval ",
                               "in [1, 2^24], got backoff ", scaling.backoff, ", interval ",
                               scaling.growth_interval));
    }
  }
  scaling_ = scaling;
  // A scaler on the host may still be read by its copy to the device: write it, never free it.
  if (!scaler_.defined()) scaler_ = state_zeros({2}, arena_.dtype());
  scaler_.copy_(to_dtype(Tensor::from_vector<double>({2}, {initial_scale, 0.0}, scaler_.device()),
                         arena_.dtype()));
  if (sync_ != nullptr) sync_->scalars_changed();
}

std::pair<double, double> Optimizer::scaler_state() const {
  if (!loss_scaled()) return {1.0, 0.0};
  const std::vector<double> s = to_dtype(scaler_, DType::kFloat64).to_vector<double>();
  return {s[0], s[1]};
}

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw ValueError(str_cat("[optimizer] learning rate must be finite and >= 0, got ", lr));
  }
  lr_ = lr;
}

void require_finite_at_least(const char* op, const char* name, double value, double low) {
  if (!std::isfinite(value) || value < low) {
    throw ValueError(str_cat("[", op, "] ", name, " must be finite and >= ", low, ", got ", value));
  }
}

void Optimizer::step(double max_norm, const Tensor& veto) {
  queue_step(max_norm, veto);
  finish_step();
}

void Optimizer::queue_step(double max_norm, const Tensor& veto) {
  Backend& be = backend_for(state_device());
  be.norm_sq(grads_, norm_sq_);
  if (veto.defined()) {
    // Before the reducer: a rank's veto reaches every rank's decision.
    Tensor nonfinite = norm_sq_.narrow(1, 1);
    be.axpy(1.0, to_dtype(veto, norm_sq_.dtype()).view({1}).to(state_device()), nonfinite);
  }
  if (reducer_ != nullptr) reducer_->sum(norm_sq_);  // every process decides clip and skip alike
  be.boundary(norm_sq_, 1.0, max_norm, scaling_, scaler_, boundary_, applied_steps_);
  update();
  if (sync_ != nullptr) sync_->after_update();
}

void Optimizer::finish_step() {
  stepped_ = true;
  arena_.masters().mark_modified();  // a forward's saved weights are stale now
  arena_.grads().mark_modified();
  if (arena_.working().defined()) arena_.working().mark_modified();
}

std::vector<nn::NamedTensor> Optimizer::save_state() {
  std::vector<nn::NamedTensor> out;
  for (auto& [name, t] : element_state()) {
    if (!restricted()) {
      out.emplace_back(name, t);
      continue;
    }
    if (gather_ == nullptr) {
      throw ValueError("[optimizer] save_state() of a restricted optimizer needs a SliceGather");
    }
    Tensor full = Tensor::empty({arena_.size()}, t.dtype(), t.device());
    gather_->gather(t, full);
    out.emplace_back(name, full);
  }
  out.emplace_back("steps", applied_steps_);
  if (scaler_.defined()) out.emplace_back("scaler", scaler_);
  return out;
}

std::vector<std::pair<Tensor, Tensor>> Optimizer::state_copies(
    const std::map<std::string, Tensor>& state) {
  const auto get = [&](const std::string& name, const Shape& shape, DType dtype) {
    const auto it = state.find(name);
    if (it == state.end() || it->second.shape() != shape || it->second.dtype() != dtype) {
      throw ValueError(str_cat("[optimizer] the checkpoint's optimizer state '", name, "' is ",
                               it == state.end() ? "missing" : it->second.describe(),
                               "; this optimizer expects ", dtype_name(dtype), shape_str(shape)));
    }
    return it->second;
  };
  // Every tensor is found and checked before the first one is copied: a refused state leaves the
  // optimizer as it was.
  std::vector<std::pair<Tensor, Tensor>> copies;  // {destination, source}
  const auto elements = element_state();
  for (const auto& [name, t] : state) {
    const bool kept = name == "steps" || name == "scaler" ||
                      std::any_of(elements.begin(), elements.end(),
                                  [&](const auto& e) { return e.first == name; });
    if (!kept) {
      throw ValueError(str_cat("[optimizer] the checkpoint's optimizer state has '", name, "' (",
                               t.describe(), "), which this optimizer does not keep"));
    }
  }
  for (auto& [name, t] : elements) {
    const Tensor full = get(name, {arena_.size()}, t.dtype());
    copies.emplace_back(t, full.narrow(restricted() ? slice_offset_ : 0, t.numel()));
  }
  copies.emplace_back(applied_steps_, get("steps", applied_steps_.shape(), DType::kInt32));
  if (scaler_.defined()) {
    const Tensor saved = get("scaler", scaler_.shape(), scaler_.dtype());
    const std::vector<double> v =
        to_dtype(saved.to(Device::cpu()), DType::kFloat64).to_vector<double>();
    // The scale multiplies every loss; the clean-window count is a whole number.
    if (!(v[0] > 0) || !std::isfinite(v[0]) || !(v[1] >= 0) || v[1] > kMaxCleanWindows ||
        v[1] != std::floor(v[1])) {
      throw ValueError(str_cat("[optimizer] the checkpoint's loss scaler holds scale ", v[0],
                               " and ", v[1], " clean windows; a scale must be finite and > 0, ",
                               "the count an integer in [0, 2^24]"));
    }
    copies.emplace_back(scaler_, saved);
  } else if (state.count("scaler")) {
    throw ValueError("[optimizer] the checkpoint has a loss scaler; this run has no loss scaling");
  }
  return copies;
}

void Optimizer::check_state(const std::map<std::string, Tensor>& state) {
  state_copies(state);
}

void Optimizer::load_state(const std::map<std::string, Tensor>& state) {
  // Copies in flight may still read the state (the offloaded optimizer's): they finish first.
  if (sync_ != nullptr) sync_->quiesce();
  for (auto& [to, from] : state_copies(state)) to.copy_(from.to(to.device()));
  if (scaler_.defined() && sync_ != nullptr) sync_->scalars_changed();
  stepped_ = true;
}

BoundaryScalars Optimizer::report() const {
  const std::vector<double> s = to_dtype(boundary_, DType::kFloat64).to_vector<double>();
  return report_of(s.data());
}

BoundaryScalars Optimizer::report_of(const double* s) {
  return {s[0], s[1], s[2] != 0.0, s[3]};
}

int64_t Optimizer::applied_steps() const {
  return static_cast<int64_t>(applied_steps_.item());
}

}  // namespace accrue::optim
