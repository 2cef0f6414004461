// What a user hands the engine to train a model of their own: a dataset (its sample count, each
// sample's loss-item count, and a function that materialises the samples of given indices on the
// device), a model factory, a loss returning a sum and a count (nn::LossSum), and an evaluation.
// The engine owns everything else (engine.h). tests/test_engine.cpp trains a model that is not
// MNIST through it in a few lines. Read next: engine.h.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "nn/loss.h"
#include "nn/module.h"

namespace accrue::train {

// The tensors of some samples (a micro-batch's; "batch" is the effective batch alone), on the
// run's device.
struct Samples {
  Tensor input, target;
};

// What evaluate() measured: reported after every epoch as "<label> <value>" (a percentage when
// percent) and in the metrics under `key`.
struct Evaluation {
  std::string key = "test_accuracy";
  std::string label = "test accuracy";
  double value = 0;
  bool percent = true;
  bool lower_is_better = false;  // an error rate: --keep-best and --early-stop follow the sign
  // Measured on held-out training data (a validation split), never the test set: only such an
  // evaluation chooses the best weights (--keep-best) or ends a run early (--early-stop).
  bool held_out = false;
  // Further measures, key -> number: printed after the value as "key value" and added to the
  // epoch's metrics record.
  nlohmann::json details = nlohmann::json::object();
};

// What the engine resolved before it asks for data: where the run computes, in which dtypes.
struct Setup {
  Device device = Device::cpu();  // this rank's device
  DType compute = DType::kFloat32, master = DType::kFloat32;
  int rank = 0, world_size = 1;
  // The data-parallel ranks, for an evaluation shared between them (each measures its share and
  // the counts are summed); valid for the run.
  distributed::Communicator* comm = nullptr;
  // Prints a line of the run's log (rank 0's output; other ranks print nothing).
  std::function<void(const std::string&)> log;
  // Whether this process is the one that prints (the job's first rank): under --pipeline every
  // stage has data-parallel rank 0, so `rank` cannot say.
  bool prints = true;
};

// One layer of a model that --pipeline cuts into stages: its parameters (those of its modules)
// go with the stage that runs it. A parameter it only borrows from another layer (a head tied to
// the embedding) stays with its owner: the stage that borrows it keeps a copy, sends its
// gradient to the owner at every boundary and receives the updated values after the step.
struct Layer {
  std::string name;                                // printed in the stage plan
  std::vector<nn::Module*> modules;                // own the layer's parameters
  std::function<Tensor(const Tensor& x)> forward;  // the previous layer's output -> this one's
  std::vector<Tensor> borrowed;                    // parameters of other layers it uses
};

struct Task {
  std::string program = "accrue";  // prefixes messages: "accrue-mnist: ..."
  // Called once, first: loads the data onto setup.device; returns the training samples' count.
  std::function<int64_t(const Setup& setup)> prepare;
  // The loss items of sample i (1 for a classified sample, its target tokens for a sequence);
  // null: one each. The window's normaliser is their sum over the window, known from the plan.
  std::function<int64_t(int64_t sample)> items;
  // The length of sample i in tokens, not counting padding; null: samples have no length. When
  // set, each window's share of a rank is ordered by it (stable) before it is cut into
  // micro-batches, so a micro-batch holds sequences of similar lengths and pads little (the
  // window's sum is the same), and the metrics report tokens_per_second.
  std::function<int64_t(int64_t sample)> length;
  // The samples of `index` (int32 [b], positions in the training set, on the device).
  std::function<Samples(const Tensor& index)> samples;
  // For data assembled on the host (sequences padded per micro-batch): the same samples as host
  // tensors, `index` being on the host too; null: training micro-batches come from `samples`. The
  // engine writes each one into pinned memory and copies it to the device on a copy stream one
  // micro-batch ahead (core/staging.h), so neither the host nor the device waits for the other.
  std::function<Samples(const Tensor& index)> host_samples;
  // The same samples as the largest they could be (sequences padded to the longest of the
  // dataset), for --memory-budget's probes; null: samples.
  std::function<Samples(const Tensor& index)> largest_samples;
  // The model, its parameters in `master` (built under the run's seed, before --init).
  std::function<std::unique_ptr<nn::Module>(DType master)> model;
  // The micro-batch's sum-reduced loss and its item count; logits should be cast to loss_dtype
  // (float32 or float64) for the softmax, whatever the activations are in.
  std::function<nn::LossSum(nn::Module& model, const Samples& batch, DType loss_dtype)> loss;
  // For --pipeline: the model's layers in order, the first taking Samples::input; and the
  // micro-batch's loss from the last layer's output (what `loss` computes from the batch). Null:
  // the model cannot be cut into stages.
  std::function<std::vector<Layer>(nn::Module& model)> layers;
  std::function<nn::LossSum(const Tensor& output, const Samples& batch, DType loss_dtype)>
      loss_of_output;
  // Measures the model (the engine puts it in eval mode under NoGradGuard around the call).
  std::function<Evaluation(nn::Module& model)> evaluate;
  // The measure on held-out training data (Evaluation::held_out) that --eval-every takes between
  // steps and --keep-best and --early-stop choose by; null: `evaluate`, when what it returns is
  // held out (else those two flags are refused).
  std::function<Evaluation(nn::Module& model)> validate;
  // After the last epoch instead of evaluate, when set (a costlier measure, e.g. the test split
  // too, taken once).
  std::function<Evaluation(nn::Module& model)> evaluate_final;
  // String metadata stored with the saved weights (--save), e.g. what it takes to rebuild the
  // model; null: none. Called after training.
  std::function<std::map<std::string, std::string>()> metadata;
  // The files the data is read from: a checkpoint holds their hash (checkpoint.h files_hash), so
  // a resume may read the same data from another place but not other data. Empty: only the
  // training set's size is checked.
  std::vector<std::string> data_files;
  // The model's settings: a resume must match `settings`; `reported` goes into the summary.
  nlohmann::json settings = nlohmann::json::object();
  nlohmann::json reported = nlohmann::json::object();
};

}  // namespace accrue::train
