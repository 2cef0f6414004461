// The ops' names and what their backward reads, from the functors (kernels/functors.h).
#include "kernels/functors.h"

namespace accrue {

namespace {

struct FunctorName {
  template <typename F>
  const char* operator()(F) const {
    return F::kName;
  }
};
struct SavesOutput {
  template <typename F>
  bool operator()(F) const {
    return F::kSavesOutput;
  }
};

}  // namespace

const char* op_name(UnaryOp op) {
  return visit(op, FunctorName{});
}
const char* op_name(BinaryOp op) {
  return visit(op, FunctorName{});
}
bool saves_output(UnaryOp op) {
  return visit(op, SavesOutput{});
}

}  // namespace accrue
