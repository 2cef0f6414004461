// accrue-mnist's task and flags (see mnist.h).
#include "mnist.h"

#include <filesystem>
#include <memory>
#include <sstream>
#include <tuple>
#include <utility>

#include "cnn.h"
#include "core/error.h"
#include "dataset.h"
#include "nn/activation.h"
#include "nn/mlp.h"
#include "ops/ops.h"
#include "train/flags.h"
#include "train/run.h"
#include "train/sample_order.h"

namespace accrue::mnist {

namespace {

constexpr int64_t kMaxWidth = 1 << 20;

std::unique_ptr<nn::Module> make_model(const Config& c, int64_t pixels, DType dtype) {
  if (c.model == "cnn") {
    if (pixels != 28 * 28) {
      throw FileError(
          str_cat("--model cnn needs 28 x 28 images, the data has ", pixels, " pixels per image"));
    }
    return std::make_unique<MnistCNN>(MnistCNN::parse_norm(c.norm), dtype);
  }
  std::vector<int64_t> sizes{pixels};
  sizes.insert(sizes.end(), c.hidden.begin(), c.hidden.end());
  sizes.push_back(10);
  return std::make_unique<nn::MLP>(sizes, nn::activation<nn::ReLU>(), dtype);
}

// The MLP's parameter count on 28 x 28 images, saturating at INT64_MAX.
int64_t mlp_parameters(const std::vector<int64_t>& hidden) {
  int64_t total = 0, in = 28 * 28;
  std::vector<int64_t> outs = hidden;
  outs.push_back(10);
  for (int64_t out : outs) {
    int64_t layer = 0;
    if (__builtin_mul_overflow(in, out, &layer) || __builtin_add_overflow(layer, out, &layer) ||
        __builtin_add_overflow(total, layer, &total)) {
      return INT64_MAX;
    }
    in = out;
  }
  return total;
}

// The share of test images classified right, in chunks of 1000.
double accuracy(nn::Module& model, const Split& test) {
  int64_t correct = 0;
  for (int64_t start = 0; start < test.size(); start += 1000) {
    const int64_t n = std::min<int64_t>(1000, test.size() - start);
    correct +=
        count_equal(argmax(model(test.images.narrow(start, n))), test.labels.narrow(start, n));
  }
  return test.size() ? static_cast<double>(correct) / static_cast<double>(test.size()) : 0.0;
}

// The softmax and the loss in float32 (or float64), whatever the activations are in.
nn::LossSum loss_of_logits(const Tensor& logits, const train::Samples& b, DType loss_dtype) {
  return nn::LossSum{
      cross_entropy(cast(logits, loss_dtype), b.target), Tensor(),
      // One item per row, known on the host: the accumulator sums it there, with no kernel.
      static_cast<double>(b.target.numel())};
}

}  // namespace

namespace {

// The rows of a split whose positions are (not) in `held_out` (increasing): the held-out split
// and the rest.
std::pair<Split, Split> hold_out(const Split& all, const std::vector<size_t>& held_out) {
  std::vector<int32_t> kept, taken;
  size_t next = 0;
  for (int64_t i = 0; i < all.size(); ++i) {
    const bool out = next < held_out.size() && held_out[next] == static_cast<size_t>(i);
    (out ? taken : kept).push_back(static_cast<int32_t>(i));
    next += out ? 1 : 0;
  }
  const auto rows = [&](const std::vector<int32_t>& index) {
    const Tensor at = Tensor::from_vector<int32_t>({static_cast<int64_t>(index.size())}, index,
                                                   all.labels.device());
    return Split{gather_rows(all.images, at), gather_rows(all.labels, at), all.image_path};
  };
  return {rows(taken), rows(kept)};
}

}  // namespace

std::vector<std::string> data_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const char* file : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    files.push_back(dir + "/" + file);
  }
  return files;
}

train::Task make_task(const Config& c) {
  struct Data {
    Split train, test, validation;
  };
  auto data = std::make_shared<Data>();
  train::Task task;
  task.program = "accrue-mnist";
  task.prepare = [data, c](const train::Setup& setup) {
    data->train = load_split(c.data, "train", c.train_limit, setup.device, setup.compute);
    data->test = load_split(c.data, "t10k", 0, setup.device, setup.compute);  // both 28 x 28
    if (c.validation > 0) {
      if (c.validation >= data->train.size()) {
        throw FileError(str_cat(data->train.image_path, ": --validation ", c.validation,
                                " holds out every one of its ", data->train.size(),
                                " training samples"));
      }
      std::tie(data->validation, data->train) =
          hold_out(data->train, train::seeded_subset(static_cast<size_t>(data->train.size()),
                                                     static_cast<size_t>(c.validation), c.seed));
    }
    return data->train.size();
  };
  task.samples = [data](const Tensor& index) {
    return train::Samples{gather_rows(data->train.images, index),
                          gather_rows(data->train.labels, index)};
  };
  task.model = [data, c](DType master) {
    return make_model(c, data->train.images.size(1), master);
  };
  task.loss = [](nn::Module& model, const train::Samples& b, DType loss_dtype) {
    return loss_of_logits(model(b.input), b, loss_dtype);
  };
  // --pipeline: the MLP's Linear layers (each with its activation) for the stages to share.
  if (c.model != "cnn") {
    task.layers = [](nn::Module& model) {
      auto& mlp = dynamic_cast<nn::MLP&>(model);
      std::vector<train::Layer> layers;
      for (size_t i = 0; i < mlp.layers().size(); ++i) {
        layers.push_back({str_cat("layers.", i),
                          {mlp.layers()[i].get()},
                          [&mlp, i](const Tensor& h) { return mlp.forward_layer(i, h); },
                          {}});
      }
      return layers;
    };
    task.loss_of_output = loss_of_logits;
  }
  task.evaluate = [data](nn::Module& model) {
    return train::Evaluation{"test_accuracy", "test accuracy", accuracy(model, data->test), true};
  };
  if (c.validation > 0) {
    task.validate = [data](nn::Module& model) {
      train::Evaluation e{"val_accuracy", "validation accuracy", accuracy(model, data->validation),
                          true};
      e.held_out = true;
      return e;
    };
  }
  task.settings = {{"model", c.model}, {"norm", c.norm}, {"hidden", c.hidden}};
  task.data_files = data_files(c.data);
  task.reported = {{"model", c.model}, {"norm", c.norm}};
  return task;
}

train::Summary train(const Config& config, std::ostream& out, const train::Callbacks& callbacks) {
  train::Task task = make_task(config);
  return train::train(config, task, out, callbacks);
}

int parse_args(int argc, const char* const* argv, Config& c, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "accrue-mnist: train an MLP or a CNN to classify MNIST digits, with gradient "
      "accumulation"};
  train::Flags flags(app, c);
  flags.data_files_are([&c] { return data_files(c.data); });
  std::string hidden = "512,256,128";
  app.add_option("--data", c.data, "Folder with the four MNIST IDX files");
  app.add_option("--model", c.model, "mlp, or cnn (conv-pool x 2, fc 128, fc 10)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--norm", c.norm,
                 "The CNN's normalisation: none, batch (BatchNorm2d), group (GroupNorm, 8 groups) "
                 "or group1 (GroupNorm, one group: LayerNorm's statistics, per-channel affine)")
      ->check(CLI::IsMember({"none", "batch", "group", "group1"}));
  app.add_option("--hidden", hidden, "The MLP's hidden layer sizes, comma-separated");
  app.add_option("--validation", c.validation,
                 "Hold out this many training samples (drawn with --seed) as the validation split "
                 "that --keep-best and --early-stop choose by (0: none)")
      ->transform(train::int_in(0, INT32_MAX));
  return train::parse_command_line(app, argc, argv, "accrue-mnist", out, err, flags.checked([&] {
    c.hidden = train::parse_size_list("--hidden", hidden, kMaxWidth, "512,256,128");
    if (c.model == "mlp")
      train::check_model_fits("--hidden " + hidden, mlp_parameters(c.hidden), c);
    // The best is chosen on held-out training samples, never on the test set.
    for (const char* flag : {"--keep-best", "--early-stop"}) {
      if (app.count(flag) > 0 && c.validation == 0) {
        throw ValueError(str_cat(flag,
                                 " chooses by a validation split, never the test set: give "
                                 "--validation N (training samples held out)"));
      }
    }
    if (c.train_limit > 0 && c.validation >= c.train_limit) {
      throw ValueError(str_cat("--validation ", c.validation,
                               " holds out every one of --train-limit ", c.train_limit,
                               " samples"));
    }
    // --pipeline cuts the MLP's layers into stages (before any data is read: D10).
    if (c.zero == 3 && c.model == "cnn") {
      throw ValueError(
          "--zero 3 gathers the MLP's layers one at a time; --model cnn is not cut into layers");
    }
    if (c.pipeline > 1 && c.model == "cnn") {
      throw ValueError(str_cat("--pipeline ", c.pipeline,
                               " cuts the MLP's layers into stages; --model cnn is not cut"));
    }
    const int64_t mlp_layers = static_cast<int64_t>(c.hidden.size()) + 1;
    if (c.pipeline > 1 && c.model == "mlp" && c.pipeline > mlp_layers) {
      throw ValueError(str_cat("--pipeline ", c.pipeline, " needs as many layers; --hidden ",
                               hidden, " makes ", mlp_layers));
    }
    if (c.model != "cnn" && c.norm != "none") {
      throw ValueError("--norm " + c.norm + " applies to --model cnn");
    }
    if (c.model == "cnn" && app.count("--hidden") > 0) {
      throw ValueError("--hidden " + hidden + " sizes the MLP; --model cnn has fixed layers");
    }
    const bool sixteen_bits =
        c.precision == train::Precision::kBf16 || c.precision == train::Precision::kFp16;
    if (c.model == "cnn" && sixteen_bits && c.device.is_cuda()) {
      throw ValueError(str_cat("--model cnn runs --precision ", train::precision_name(c.precision),
                               " on the CPU (the CUDA convolution and pooling kernels take fp32 "
                               "and fp64), got --device ",
                               c.device.str()));
    }
  }));
}

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Config config;
  const int status = parse_args(argc, argv, config, out, err);
  if (status >= 0) return status;
  return train::run_reporting_failure(
      "accrue-mnist", err, [&] { train(config, out); },
      [&](const FileError&) -> std::string {
        // The hint only where the script could put the files: a folder without them, or a
        // path not there yet (never a file such as /etc/passwd).
        std::error_code ec;
        const auto kind = std::filesystem::status(config.data, ec).type();
        if (kind != std::filesystem::file_type::directory &&
            kind != std::filesystem::file_type::not_found) {
          return "";
        }
        if (std::filesystem::exists(config.data + "/train-images-idx3-ubyte", ec)) return "";
        return "accrue-mnist: fetch the data with scripts/fetch-mnist.sh " + config.data;
      });
}

}  // namespace accrue::mnist
