// The optimizer registry (registry.h): a table made on first use with the built-in kinds.
#include "optim/registry.h"

#include <deque>
#include <mutex>

#include "optim/adam.h"
#include "optim/sgd.h"

namespace accrue::optim {

namespace {

AdamOptions adam_options(const OptimizerSettings& s, double default_weight_decay) {
  AdamOptions o;
  o.lr = s.lr;
  o.weight_decay = s.weight_decay.value_or(default_weight_decay);
  return o;
}

std::deque<OptimizerKind> built_in() {
  std::deque<OptimizerKind> kinds;
  kinds.push_back({"adam", "Adam (weight decay added to the gradient)", 2, false, 0.0,
                   [](ParameterArena& arena, const OptimizerSettings& s) {
                     return std::make_unique<Adam>(arena, adam_options(s, 0.0));
                   }});
  const double adamw_decay = AdamW::defaults().weight_decay;
  kinds.push_back({"adamw", "AdamW (decoupled weight decay, default 0.01)", 2, false, adamw_decay,
                   [adamw_decay](ParameterArena& arena, const OptimizerSettings& s) {
                     return std::make_unique<AdamW>(arena, adam_options(s, adamw_decay));
                   }});
  kinds.push_back({"sgd", "SGD with momentum (--momentum)", 1, true, 0.0,
                   [](ParameterArena& arena, const OptimizerSettings& s) {
                     SgdOptions o;
                     o.lr = s.lr;
                     o.momentum = s.momentum;
                     o.weight_decay = s.weight_decay.value_or(0.0);
                     return std::make_unique<SGD>(arena, o);
                   }});
  return kinds;
}

struct Registry {
  std::mutex mutex;
  // A deque: optimizer_kind() hands out references that a later registration must not move.
  std::deque<OptimizerKind> kinds = built_in();
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_optimizer(OptimizerKind kind) {
  if (kind.name.empty() || !kind.make) {
    throw ValueError("[optimizer] a registered optimizer needs a name and a make function");
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const OptimizerKind& k : r.kinds) {
    if (k.name == kind.name) {
      throw ValueError("[optimizer] '" + kind.name + "' is registered already");
    }
  }
  r.kinds.push_back(std::move(kind));
}

const OptimizerKind& optimizer_kind(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string names;
  for (const OptimizerKind& k : r.kinds) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  throw ValueError("[optimizer] no optimizer '" + name + "' (registered: " + names + ")");
}

std::vector<std::string> optimizer_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const OptimizerKind& k : r.kinds) names.push_back(k.name);
  return names;
}

}  // namespace accrue::optim
