// The built-in strategies around one process's training (data parallel, ZeRO-1, the offloaded
// optimizer), the table of what combines, and their composition (strategies.h). Pipeline stages
// are pipeline_strategy.cpp's.
#include "train/strategies.h"

#include <algorithm>
#include <filesystem>

#include "distributed/data_parallel.h"
#include "distributed/zero.h"
#include "kernels/backend.h"
#include "ops/autograd.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/pipeline_strategy.h"
#include "train/report.h"
#include "train/zero3_strategy.h"

namespace accrue::train {

namespace {

// Several ranks replicate the model and sum the window's gradient once: whole at the boundary,
// or bucket by bucket during the last backward (--bucket-kib).
class DataParallel final : public OverRanks {
 public:
  std::string name() const override {
    return str_cat("data parallel: all-reduce over ", ranks_->world_size(), " ranks");
  }
  void attach(optim::Optimizer& optimizer) override {
    all_reduce_ = std::make_unique<distributed::GradientAllReduce>(optimizer.arena(), *ranks_);
  }
  optim::GradientConsumer* gradients() override { return all_reduce_.get(); }
  optim::PartialSumReducer* loss_reducer() override { return all_reduce_.get(); }

 private:
  std::unique_ptr<distributed::GradientAllReduce> all_reduce_;
};

// ZeRO stages 1 and 2: the arena padded to equal shards, each rank keeping the optimizer state
// (and under stage 2 the gradient) of its own; the gradient reduce-scattered, the updated shards
// all-gathered (distributed/zero.h).
class ZeroShards final : public OverRanks {
 public:
  ZeroShards(int stage, distributed::ZeroReduce reduce) : stage_(stage), reduce_(reduce) {}
  std::string name() const override {
    return stage_ == 1
               ? str_cat("ZeRO-1: optimizer state in ", ranks_->world_size(), " shards")
               : str_cat("ZeRO-2: optimizer state and gradients in ", ranks_->world_size(),
                         " shards, reduce-scattered at ",
                         reduce_ == distributed::ZeroReduce::kBoundary ? "the boundary"
                                                                       : "every micro-step");
  }
  std::unique_ptr<optim::ParameterArena> make_arena(nn::Module& model) override {
    return std::make_unique<optim::ParameterArena>(model, ranks_->world_size());
  }
  void attach(optim::Optimizer& optimizer) override {
    zero_ = std::make_unique<distributed::ZeroOptimizerState>(optimizer, *ranks_, stage_, reduce_);
  }
  optim::GradientConsumer* gradients() override { return zero_.get(); }
  optim::PartialSumReducer* loss_reducer() override { return zero_.get(); }
  Footprint held_beyond_arena() const override {
    Footprint f;
    f.gradients = zero_ ? zero_->accumulated_bytes() : 0;
    return f;
  }
  void begin_window(const optim::Window& window) override {
    zero_->begin_window(window.most_micro);
  }
  bool works_in_micro_steps() const override {
    return stage_ == 2 && reduce_ == distributed::ZeroReduce::kMicroStep;
  }
  void describe(nlohmann::json& run_config) const override {
    // Stage 1's checkpoints have no such key, and resume as before.
    if (stage_ == 2) run_config["zero_reduce"] = distributed::zero_reduce_name(reduce_);
  }

 private:
  int stage_;
  distributed::ZeroReduce reduce_;
  std::unique_ptr<distributed::ZeroOptimizerState> zero_;
};

// The offloaded optimizer: masters and state in pinned host memory, the gradient copied there
// (by buckets during the last backward, 1 MiB by default on one rank), the step on the CPU, the
// weights copied back. Under ZeRO-1 and 2 each rank's host holds its slice of the masters (the
// slices ZeroOptimizerState gives the ranks), and the whole masters are gathered when saved.
class Offload final : public OverRanks {
 public:
  Offload(Device device, int zero) : device_(device), zero_(zero) {}
  std::string name() const override { return "offloaded optimizer: masters and state on the host"; }
  void place_parameters(nn::Module&, optim::ParameterArena& arena) override {
    if (zero_ == 1 || zero_ == 2) {
      const int64_t n = arena.size() / ranks_->world_size(), begin = ranks_->rank() * n;
      arena.offload_masters(begin, begin + n);
    } else {
      arena.offload_masters();
    }
  }
  std::optional<std::vector<nn::NamedTensor>> whole_masters(optim::ParameterArena& arena,
                                                            nn::Module&) override {
    if (arena.masters_whole()) return std::nullopt;
    Tensor whole = Tensor::empty({arena.size()}, arena.dtype());
    ranks_->all_gather(arena.masters(), whole);
    return arena.named_views(whole);
  }
  // Under ZeRO-1 and 2 only this rank's slice goes to the host and back, and ZeRO's all-gather
  // follows the copy back.
  void attach(optim::Optimizer& optimizer) override {
    optim::ParameterSync* zero = optimizer.parameter_sync();
    offload_ = std::make_unique<optim::HostOffload>(optimizer);
    if (zero != nullptr) {
      chain_ = std::make_unique<optim::ParameterSyncChain>(*offload_, *zero);
      optimizer.set_parameter_sync(chain_.get());
    }
    if (optimizer.restricted()) {
      offload_->restrict_to(optimizer.slice_offset(),
                            optimizer.slice_offset() + optimizer.slice_grads().numel());
    }
  }
  optim::GradientConsumer* gradients() override { return offload_.get(); }
  int64_t default_bucket_kib() const override {
    return ranks_->world_size() == 1 && zero_ == 0 ? 1024 : 0;
  }
  void report(Summary& summary, MetricsLog&) override { summary.offload = offload_->traffic(); }
  std::string summary_part(const Summary& s) const override {
    const auto per_step = [&](size_t bytes) {
      return mib(bytes / static_cast<size_t>(std::max<int64_t>(s.offload.steps, 1)));
    };
    return str_cat(" | offloaded: training state ", mib(s.device_state_bytes), " on ",
                   device_.str(), ", ", mib(s.host_state_bytes), " pinned on the host; per step ",
                   per_step(s.offload.to_host_bytes), " to the host (", s.offload.prefetched,
                   " copies during backward, ", s.offload.fetched_at_step, " at the boundary), ",
                   per_step(s.offload.from_host_bytes), " back");
  }

 private:
  Device device_;
  int zero_;
  std::unique_ptr<optim::HostOffload> offload_;
  std::unique_ptr<optim::ParameterSyncChain> chain_;
};

// Consumers in turn (strategies.h): the buckets go to the first, and each finishes in order.
class Consumers final : public optim::GradientConsumer {
 public:
  explicit Consumers(std::vector<optim::GradientConsumer*> list) : list_(std::move(list)) {}
  void ready(int64_t begin, int64_t end) override { list_.front()->ready(begin, end); }
  void micro_step_done() override { list_.front()->micro_step_done(); }
  void finish() override {
    for (optim::GradientConsumer* c : list_) c->finish();
  }
  bool abandon() override {
    bool all = true;
    for (optim::GradientConsumer* c : list_) all = c->abandon() && all;
    return all;
  }

 private:
  std::vector<optim::GradientConsumer*> list_;
};

// What does not combine: both flags, and why.
struct Exclusion {
  const char* first;
  const char* second;
  bool (*both)(const Config&);
  const char* why;
};

const Exclusion kExclusions[] = {
    {"--zero", "--bucket-kib",
     [](const Config& c) { return c.zero > 0 && c.bucket_kib.value_or(0) > 0; },
     "ZeRO reduce-scatters the gradient, it overlaps no all-reduce"},
    {"--zero 3", "--cuda-graphs on",
     [](const Config& c) { return c.zero == 3 && c.cuda_graphs == CudaGraphs::kOn; },
     "a layer's gathers are collectives no graph holds"},
    {"--pipeline", "--zero", [](const Config& c) { return c.pipeline > 1 && c.zero > 0; },
     "a stage's arena is its own layers'"},
    {"--pipeline", "--offload-optimizer",
     [](const Config& c) { return c.pipeline > 1 && c.offload_optimizer; },
     "a stage's optimizer stays on its device"},
    {"--pipeline", "--memory-budget",
     [](const Config& c) { return c.pipeline > 1 && c.memory_budget.has_value(); },
     "the probes run one process's micro-step"},
    {"--pipeline", "--bucket-kib",
     [](const Config& c) { return c.pipeline > 1 && c.bucket_kib.value_or(0) > 0; },
     "stages send their gradients at the boundary"},
    {"--pipeline", "--cuda-graphs on",
     [](const Config& c) { return c.pipeline > 1 && c.cuda_graphs == CudaGraphs::kOn; },
     "pipeline stages run eagerly"},
    {"--zero-reduce micro-step", "--cuda-graphs on",
     [](const Config& c) {
       return c.zero_reduce == distributed::ZeroReduce::kMicroStep &&
              c.cuda_graphs == CudaGraphs::kOn;
     },
     "a micro-step's reduce-scatter is a collective no graph holds"},
};

}  // namespace

void check_strategies(const Config& config) {
  if (config.zero_reduce && config.zero != 2) {
    throw ValueError(str_cat("--zero-reduce needs --zero 2 (this run has --zero ", config.zero,
                             "): only ZeRO-2 shards the gradient"));
  }
  if (config.zero_prefetch && config.zero != 3) {
    throw ValueError(str_cat("--zero-prefetch needs --zero 3 (this run has --zero ", config.zero,
                             "): only ZeRO-3 gathers parameters"));
  }
  for (const Exclusion& e : kExclusions) {
    if (e.both(config)) {
      throw ValueError(str_cat(e.first, " does not combine with ", e.second, " (", e.why, ")"));
    }
  }
}

Strategies::Strategies(const StrategyContext& ctx) : ctx_(ctx) {}
Strategies::~Strategies() = default;

distributed::Communicator& Strategies::place(distributed::Communicator& world) {
  const Config& c = ctx_.config;
  check_strategies(c);
  distributed::Communicator* ranks = &world;
  const auto add = [&](std::shared_ptr<Strategy> s) {
    ranks = &s->place(*ranks);
    list_.push_back(std::move(s));
  };
  if (c.pipeline > 1) add(std::make_shared<PipelineStages>(ctx_));
  // Whether the parameters are replicated is known once the stages have taken their ranks.
  if (c.zero == 1 || c.zero == 2) {
    add(std::make_shared<ZeroShards>(c.zero,
                                     c.zero_reduce.value_or(distributed::ZeroReduce::kBoundary)));
  } else if (c.zero == 3) {
    add(make_zero_stage_three(ctx_));
  } else if (ranks->world_size() > 1) {
    add(std::make_shared<DataParallel>());
  }
  if (c.offload_optimizer) add(std::make_shared<Offload>(c.device, c.zero));
  for (const std::shared_ptr<Strategy>& s : c.strategies) add(s);
  return *ranks;
}

std::string Strategies::names() const {
  std::string out;
  for (const auto& s : list_) out += (out.empty() ? "" : "; ") + s->name();
  return out.empty() ? "one process" : out;
}

std::string Strategies::checkpoint_subfolder() const {
  std::string out;
  for (const auto& s : list_) out += s->checkpoint_subfolder();
  return out;
}

void Strategies::check_resume_folder(const std::string& resume) const {
  if (checkpoint_subfolder().empty() && std::filesystem::is_directory(resume + "/stage-0")) {
    throw FileError(str_cat("--resume ", resume,
                            ": it holds the checkpoints of pipeline "
                            "stages (written with --pipeline); this run has --pipeline 1"));
  }
  const std::string ranks = checkpoints_per_rank() ? "" : rank_folder_with_checkpoints(resume);
  if (!ranks.empty()) {
    throw FileError(str_cat("--resume ", resume, ": it holds per-rank checkpoints (", ranks,
                            ", written with --zero 3); this run has --zero ", ctx_.config.zero));
  }
  for (const auto& s : list_) s->check_resume_folder(resume);
}

std::unique_ptr<optim::ParameterArena> Strategies::make_arena(nn::Module& model) {
  for (const auto& s : list_) {
    if (auto arena = s->make_arena(model)) return arena;
  }
  return std::make_unique<optim::ParameterArena>(model, 1);
}

void Strategies::place_parameters(nn::Module& model, optim::ParameterArena& arena) {
  for (const auto& s : list_) s->place_parameters(model, arena);
}

void Strategies::attach(optim::Optimizer& optimizer) {
  for (const auto& s : list_) s->attach(optimizer);
  std::vector<optim::GradientConsumer*> consumers;
  for (const auto& s : list_) {
    if (optim::GradientConsumer* g = s->gradients()) consumers.push_back(g);
  }
  if (consumers.size() == 1) gradients_ = consumers.front();
  if (consumers.size() > 1) {
    chains_.push_back(std::make_unique<Consumers>(consumers));
    gradients_ = chains_.back().get();
  }
}

optim::PartialSumReducer* Strategies::loss_reducer() {
  for (const auto& s : list_) {
    if (optim::PartialSumReducer* r = s->loss_reducer()) return r;
  }
  return nullptr;
}

int64_t Strategies::default_bucket_kib() const {
  int64_t kib = 0;
  for (const auto& s : list_) kib = std::max(kib, s->default_bucket_kib());
  return kib;
}

Strategy* Strategies::window_runner() const {
  for (const auto& s : list_) {
    if (s->runs_windows()) return s.get();
  }
  return nullptr;
}

void Strategies::check_plan(const optim::ResolvedBatch& batch, int64_t epoch) const {
  for (const auto& s : list_) s->check_plan(batch, epoch);
}

void Strategies::gather_model(nn::Module& model) {
  for (const auto& s : list_) s->gather_model(model);
}

std::vector<nn::NamedTensor> Strategies::whole_masters(optim::ParameterArena& arena,
                                                       nn::Module& model) {
  for (const auto& s : list_) {
    if (auto masters = s->whole_masters(arena, model)) return *masters;
  }
  return arena.named_masters();
}

void Strategies::after_resume(int64_t step) {
  for (const auto& s : list_) s->after_resume(step);
}

void Strategies::describe(nlohmann::json& run_config) const {
  for (const auto& s : list_) s->describe(run_config);
}

void Strategies::report(Summary& summary, MetricsLog& metrics) {
  for (const auto& s : list_) s->report(summary, metrics);
}

std::string Strategies::summary_part(const Summary& summary) const {
  std::string out;
  for (const auto& s : list_) out += s->summary_part(summary);
  return out;
}

// What the tensors hold, not a formula: the masters and the copy the model computes with, the
// gradient arena while it is held and a slice buffer of the optimizer's own, the state.
Footprint Strategies::footprint(const optim::ParameterArena& arena,
                                const optim::Optimizer& optimizer) const {
  const auto held = [](const Tensor& t) {
    return t.defined() && t.impl()->storage->held() ? t.impl()->storage->nbytes() : size_t{0};
  };
  Footprint f;
  f.parameters = held(arena.masters()) + held(arena.working());
  f.gradients = held(arena.grads());
  const Tensor& slice = optimizer.slice_grads();
  if (optimizer.restricted() && slice.impl()->storage != arena.grads().impl()->storage) {
    f.gradients += held(slice);
  }
  f.optimizer_state = optimizer.state_bytes();
  for (const auto& s : list_) {
    const Footprint beyond = s->held_beyond_arena();
    f.parameters += beyond.parameters;
    f.gradients += beyond.gradients;
    const distributed::CollectiveBytes b = s->collective_bytes();
    f.collectives.all_reduce += b.all_reduce;
    f.collectives.reduce_scatter += b.reduce_scatter;
    f.collectives.all_gather += b.all_gather;
    f.collectives.broadcast += b.broadcast;
  }
  return f;
}

void Strategies::begin_window(const optim::Window& window) {
  for (const auto& s : list_) s->begin_window(window);
}

bool Strategies::checkpoints_per_rank() const {
  for (const auto& s : list_) {
    if (s->checkpoints_per_rank()) return true;
  }
  return false;
}

bool Strategies::works_in_micro_steps() const {
  for (const auto& s : list_) {
    if (s->works_in_micro_steps()) return true;
  }
  return false;
}

nn::LossSum Strategy::run_micro_batches(nn::Module&, const WindowRun&) {
  throw std::logic_error("[strategy] " + name() + " does not run windows");
}

void Strategy::add_loss(const nn::LossSum& loss, DType dtype, nn::LossSum& sums) {
  nn::check_count(loss, "strategy");
  const NoGradGuard no_grad;
  Backend& be = backend_for(sums.sum.device());
  be.axpy(1.0, to_dtype(loss.sum, dtype), sums.sum);
  if (loss.count.defined()) be.axpy(1.0, to_dtype(loss.count, dtype), sums.count);
  sums.host_count += loss.host_count;
}

}  // namespace accrue::train
