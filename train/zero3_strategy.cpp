// ZeRO stage 3 as a strategy (zero3_strategy.h).
#include "train/zero3_strategy.h"

#include <filesystem>
#include <optional>
#include <unordered_map>

#include "distributed/data_parallel.h"
#include "distributed/zero3.h"
#include "kernels/factories.h"
#include "nn/norm.h"
#include "ops/autograd.h"
#include "train/agreement.h"
#include "train/checkpoint.h"

namespace accrue::train {

namespace {

class ZeroStageThree final : public OverRanks {
 public:
  explicit ZeroStageThree(const StrategyContext& ctx)
      : c_(ctx.config), task_(ctx.task), compute_(ctx.compute), master_(ctx.master) {}

  std::string name() const override {
    return str_cat("ZeRO-3: parameters, gradients and optimizer state in ", ranks_->world_size(),
                   " shards, ", layers_.size(), " layers gathered around their use (prefetch: ",
                   distributed::zero_prefetch_name(prefetch()), ")");
  }

  // The units: each layer's own parameters; a layer also uses the units of those it borrows.
  std::unique_ptr<optim::ParameterArena> make_arena(nn::Module& model) override {
    if (!task_.layers || !task_.loss_of_output) {
      throw ValueError(task_.program +
                       ": --zero 3 gathers the model layer by layer, and this model's task "
                       "gives no layers (Task::layers, Task::loss_of_output)");
    }
    layers_ = task_.layers(model);
    std::unordered_map<const TensorImpl*, int> owner;
    std::vector<distributed::ShardedLayers::Unit> units;
    for (size_t i = 0; i < layers_.size(); ++i) {
      distributed::ShardedLayers::Unit u{layers_[i].name, {}};
      for (nn::Module* m : layers_[i].modules) {
        for (const Tensor& p : m->parameters()) {
          u.params.push_back(p);
          owner[p.impl().get()] = static_cast<int>(i);
        }
      }
      units.push_back(std::move(u));
    }
    std::vector<std::vector<int>> uses(layers_.size());
    for (size_t i = 0; i < layers_.size(); ++i) {
      uses[i].push_back(static_cast<int>(i));
      for (const Tensor& p : layers_[i].borrowed) {
        const auto it = owner.find(p.impl().get());
        if (it == owner.end()) {
          throw ValueError(str_cat(task_.program, ": layer ", layers_[i].name,
                                   " borrows a parameter no layer owns"));
        }
        if (it->second != static_cast<int>(i)) uses[i].push_back(it->second);
      }
    }
    sharded_ = std::make_unique<distributed::ShardedLayers>(
        std::move(units), std::move(uses), model.named_parameters(), *ranks_, master_, compute_,
        c_.device, prefetch());
    return std::make_unique<optim::ParameterArena>(sharded_->shards(), 1);
  }
  void place_parameters(nn::Module&, optim::ParameterArena& arena) override {
    sharded_->bind(arena);
  }
  void attach(optim::Optimizer& optimizer) override {
    sum_ = std::make_unique<distributed::GroupSum>(*ranks_);
    optimizer.set_partial_sum_reducer(sum_.get());
  }
  optim::PartialSumReducer* loss_reducer() override { return sum_.get(); }

  bool works_in_micro_steps() const override { return true; }
  bool runs_windows() const override { return true; }
  void begin_window(const optim::Window& window) override {
    sharded_->begin_window();
    most_micro_ = window.most_micro;
  }

  // The window's micro-batches layer by layer, then the collectives of the micro-steps other
  // ranks have and this one does not.
  nn::LossSum run_micro_batches(nn::Module&, const WindowRun& run) override {
    const optim::Window& w = run.window;
    nn::LossSum sums{Tensor::zeros({}, master_, c_.device), Tensor::zeros({}, master_, c_.device)};
    for (const optim::MicroBatch& mb : w.micro) {
      const Tensor index = run.order.narrow(mb.start, mb.count);
      const nn::SampleKeys keys(c_.seed, run.step, index);
      const Samples batch = run.largest && task_.largest_samples ? task_.largest_samples(index)
                                                                 : task_.samples(index);
      Tensor h = batch.input;
      for (int i = 0; i < sharded_->layers(); ++i) {
        sharded_->before_forward(i);
        h = layers_[static_cast<size_t>(i)].forward(h);
        sharded_->after_forward(i);
        h = sharded_->mark(h, i);
      }
      const nn::LossSum loss = task_.loss_of_output(h, batch, master_);
      add_loss(loss, master_, sums);
      backward(loss.sum, to_dtype(run.seed, loss.sum.dtype()).view(loss.sum.shape()));
      sharded_->after_backward();
    }
    for (int64_t m = static_cast<int64_t>(w.micro.size()); m < most_micro_; ++m) {
      sharded_->phantom_micro_step();
    }
    return sums;
  }

  void gather_model(nn::Module&) override { sharded_->gather_all(); }
  std::optional<std::vector<nn::NamedTensor>> whole_masters(optim::ParameterArena&,
                                                            nn::Module&) override {
    return sharded_->whole_masters();
  }
  Footprint held_beyond_arena() const override {
    Footprint f;
    f.parameters = sharded_->held_parameter_bytes();
    f.gradients = sharded_->held_gradient_bytes();
    return f;
  }

  std::string checkpoint_subfolder() const override {
    return "/" + rank_folder(ranks_->rank(), ranks_->world_size());
  }
  bool checkpoints_per_rank() const override { return true; }
  // Each rank read its own newest checkpoint: a rank stopped while writing may have one fewer,
  // and the ranks must start from the same step. The layers gathered before the resume hold the
  // values from before it: released, the next use gathers the resumed ones.
  void after_resume(int64_t step) override {
    check_same_resume_step(*ranks_, step, c_.resume, "rank", true);
    sharded_->begin_window();
  }
  // Names what the folder holds when this rank's is missing: per-rank folders of another rank
  // count, or none (another stage).
  void check_resume_folder(const std::string& resume) const override {
    const std::string mine = resume + checkpoint_subfolder();
    if (std::filesystem::is_directory(mine)) return;
    const std::string other = rank_folder_with_checkpoints(resume);
    const std::string held =
        other.empty() ? "no per-rank checkpoints (written without --zero 3)"
                      : str_cat("the checkpoints of ", other.substr(other.rfind("-of-") + 4),
                                " ranks (", other, ")");
    throw FileError(str_cat("--resume ", resume, ": no checkpoint of rank ", ranks_->rank(), " of ",
                            ranks_->world_size(), " (", mine, "); it holds ", held,
                            "; this run has --zero 3 on ", ranks_->world_size(), " ranks"));
  }

 private:
  distributed::ZeroPrefetch prefetch() const {
    return c_.zero_prefetch.value_or(distributed::ZeroPrefetch::kForward);
  }

  const Config& c_;
  Task& task_;
  DType compute_, master_;
  std::vector<Layer> layers_;
  std::unique_ptr<distributed::ShardedLayers> sharded_;
  std::unique_ptr<distributed::GroupSum> sum_;
  int64_t most_micro_ = 0;
};

}  // namespace

std::shared_ptr<Strategy> make_zero_stage_three(const StrategyContext& ctx) {
  return std::make_shared<ZeroStageThree>(ctx);
}

}  // namespace accrue::train
