// The tracing decorator (see trace.h): one override per primitive, generated from the list in
// kernels/backend.h, each printing "[trace] name(arg, arg, ...)" and forwarding.
#include "kernels/trace.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <ostream>

namespace accrue {

namespace {

void print(std::ostream& out, const Tensor& t) {
  out << t.describe();
}
void print(std::ostream& out, double v) {
  out << v;
}
void print(std::ostream& out, bool v) {
  out << (v ? "true" : "false");
}
void print(std::ostream& out, UnaryOp op) {
  out << op_name(op);
}
void print(std::ostream& out, BinaryOp op) {
  out << op_name(op);
}
void print(std::ostream& out, const AdamArgs& hp) {
  out << (hp.decoupled ? "adamw" : "adam") << "{lr " << hp.lr << ", wd " << hp.weight_decay << "}";
}
void print(std::ostream& out, const SgdArgs& hp) {
  out << "sgd{lr " << hp.lr << ", momentum " << hp.momentum << "}";
}
void print(std::ostream& out, int64_t v) {
  out << v;
}
void print(std::ostream& out, const Shape& dims) {
  out << shape_str(dims);
}
void print(std::ostream& out, const Conv2dGeometry& g) {
  out << "conv{stride " << g.stride_h << "x" << g.stride_w << ", pad " << g.pad_h << "x" << g.pad_w
      << ", dilation " << g.dilation_h << "x" << g.dilation_w << "}";
}
void print(std::ostream& out, const Pool2dGeometry& g) {
  out << "pool{" << g.kernel_h << "x" << g.kernel_w << ", stride " << g.stride_h << "x"
      << g.stride_w << ", pad " << g.pad_h << "x" << g.pad_w << "}";
}
void print(std::ostream& out, const DropoutKey& k) {
  out << "dropout{p " << k.p << ", seed " << k.seed << ", step " << k.step << "}";
}
void print(std::ostream& out, const LossScaling& s) {
  out << (s.dynamic ? "dynamic" : "fixed") << " loss scale";
}

class TracingBackend final : public Backend {
 public:
  TracingBackend(Backend& inner, std::ostream& out) : inner_(inner), out_(out) {}

#define ACCRUE_TRACE_OVERRIDE(name, params, args) \
  void name params override {                     \
    line(#name, ACCRUE_TRACE_UNPACK args);        \
    inner_.name args;                             \
  }
#define ACCRUE_TRACE_UNPACK(...) __VA_ARGS__
  ACCRUE_BACKEND_PRIMITIVES(ACCRUE_TRACE_OVERRIDE)
#undef ACCRUE_TRACE_UNPACK
#undef ACCRUE_TRACE_OVERRIDE

 private:
  template <typename... Args>
  void line(const char* name, const Args&... args) {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    out_ << "[trace] " << name << "(";
    const char* sep = "";
    ((out_ << sep, print(out_, args), sep = ", "), ...);
    out_ << ")\n";
  }

  Backend& inner_;
  std::ostream& out_;
};

}  // namespace

bool trace_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("ACCRUE_TRACE");
    return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

std::unique_ptr<Backend> make_tracing_backend(Backend& inner, std::ostream& out) {
  return std::make_unique<TracingBackend>(inner, out);
}

}  // namespace accrue
