// The optimizers a run can name, each registered once with what the rest of accrue would
// otherwise learn by comparing its name: how to build it, how much state it keeps per parameter
// (the memory checks), whether --momentum applies, its default weight decay and a line for
// --help. The engine, the flags and the configuration read this table; adding an optimizer is
// its fused pass (a functor in kernels/functors.h run by both backends), its Optimizer subclass
// and one register_optimizer() call. adam, adamw and sgd are registered here. Read next:
// optimizer.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace accrue::optim {

// The run's settings an optimizer is built from (train::Config's, resolved).
struct OptimizerSettings {
  double lr = 1e-3;
  std::optional<double> weight_decay;  // unset: the kind's default
  double momentum = 0.9;               // for kinds that take it
};

struct OptimizerKind {
  std::string name;  // what --optimizer names
  std::string help;  // a few words for --help
  // Elements of optimizer state per parameter, in the master dtype (Adam's two moments: 2).
  int state_per_parameter = 0;
  bool takes_momentum = false;
  double default_weight_decay = 0;
  std::function<std::unique_ptr<Optimizer>(ParameterArena&, const OptimizerSettings&)> make;
};

// Adds a kind; throws ValueError when its name is taken or it cannot make anything.
void register_optimizer(OptimizerKind kind);
// The kind of that name; throws ValueError naming the registered ones otherwise.
const OptimizerKind& optimizer_kind(const std::string& name);
// Every registered name, in registration order.
std::vector<std::string> optimizer_names();

}  // namespace accrue::optim
