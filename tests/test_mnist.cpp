// The MNIST trainer on generated fixtures (no network): IDX validation, command-line errors,
// safetensors round trip and rejection, the same samples per window across micro-batch splits,
// and a short training run.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mnist_fixture.h"
#include "train/checkpoint.h"
#include "train/sample_order.h"

namespace accrue::testing {
namespace {

TEST(Idx, ReadsWhatWasWritten) {
  const fs::path dir = make_dataset("idx-good", 20, 5);
  const IdxImages images = mnist::read_idx_images((dir / "train-images-idx3-ubyte").string());
  EXPECT_EQ(images.count, 20);
  EXPECT_EQ(images.rows, 28);
  EXPECT_EQ(images.pixels.size(), 20u * 784);
  const mnist::Split split = mnist::load_split(dir.string(), "train", 0, Device::cpu());
  EXPECT_EQ(split.images.shape(), (Shape{20, 784}));
  // Normalisation: a 255 pixel maps to (1 - 0.1307) / 0.3081.
  const auto x = split.images.to_vector<float>();
  EXPECT_NEAR(*std::max_element(x.begin(), x.end()), (1 - 0.1307) / 0.3081, 1e-5);
  EXPECT_EQ(mnist::load_split(dir.string(), "train", 7, Device::cpu()).size(), 7);
}

TEST(Idx, RejectsBadFilesNamingThem) {
  const fs::path dir = make_dataset("idx-bad", 20, 5);
  const std::string images = (dir / "train-images-idx3-ubyte").string();
  const std::string labels = (dir / "train-labels-idx1-ubyte").string();
  // Truncated data.
  fs::resize_file(images, 16 + 784 * 19 + 100);
  expect_error<FileError>([&] { mnist::read_idx_images(images); }, {images, "truncated"});
  // Truncated header.
  fs::resize_file(images, 10);
  expect_error<FileError>([&] { mnist::read_idx_images(images); }, {images, "header"});
  // Wrong magic: a labels file read as images.
  expect_error<FileError>([&] { mnist::read_idx_images(labels); }, {labels, "magic", "803"});
  // Mismatched counts between images and labels.
  write_fixture(dir, "train", 20, 1);
  write_idx_labels(labels, std::vector<uint8_t>(19, 1));
  expect_error<FileError>([&] { mnist::load_split(dir.string(), "train", 0, Device::cpu()); },
                          {"19 labels", "20 images"});
  write_idx_labels(labels, std::vector<uint8_t>(20, 11));
  expect_error<FileError>([&] { mnist::load_split(dir.string(), "train", 0, Device::cpu()); },
                          {labels, "label 11"});
  expect_error<FileError>([&] { mnist::read_idx_images((dir / "missing").string()); },
                          {"missing", "cannot open"});
}

// The articles' cluster: 30 nodes x 8 GPUs at micro-batch 10 cannot make an effective batch of
// 3072 (k would be 1.28); the one-line error names the nearest valid batches and their rates.
TEST(Cli, ABatchTheRanksDoNotDivideNamesTheNearestValidOnes) {
  mnist::Config c;
  c.batch = 3072;
  c.micro_batch = 10;
  c.lr = 1e-3;
  c.base_batch = 2400;
  c.lr_scaling = optim::LrScaling::kLinear;
  try {
    train::resolve_config_batch(c, 240);
    FAIL() << "no throw";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--batch 3072 is not a multiple of 240 ranks x micro-batch 10 = 2400; nearest valid "
              "effective batches: 2400 (k = 1, lr 0.001) and 4800 (k = 2, lr 0.002) with "
              "--lr-scaling linear");
  }
  c.micro_batch = 0;
  c.accum_steps = 12;
  c.batch = 3072;  // 8 ranks x 12 steps = 96 divides 3072: micro-batch 32
  EXPECT_EQ(train::resolve_config_batch(c, 8).str(),
            "effective batch 3072 = 8 ranks x micro-batch 32 x 12 accumulation steps");
  c.batch = 3000;
  try {
    train::resolve_config_batch(c, 8);
    FAIL() << "no throw";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("2976 (micro-batch 31"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3072 (micro-batch 32"), std::string::npos) << e.what();
  }
}

// Who this process is, read from the launcher's environment (no MPI call): one row per launcher,
// and the environments that must not start data parallelism or must be refused.
TEST(Launch, ReadsTheLaunchersEnvironment) {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_LOCAL_RANK",
                        "SLURM_STEP_NUM_TASKS",
                        "SLURM_NTASKS",
                        "SLURM_PROCID",
                        "SLURM_LOCALID",
                        "PMI_SIZE",
                        "PMI_RANK",
                        "MPI_LOCALRANKID"};
  struct Row {
    std::vector<std::pair<const char*, const char*>> env;
    const char* launcher;
    int rank, world, local;
  };
  const std::vector<Row> rows{
      {{}, "none", 0, 1, 0},
      {{{"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_RANK", "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
       "mpirun",
       2,
       4,
       0},
      {{{"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_PROCID", "9"}, {"SLURM_LOCALID", "1"}},
       "srun",
       9,
       16,
       1},
      // A batch script's own environment: the job has 4 tasks, but this is one process.
      {{{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}, "none", 0, 1, 0},
      {{{"PMI_SIZE", "3"}, {"PMI_RANK", "1"}, {"MPI_LOCALRANKID", "1"}}, "mpiexec (PMI)", 1, 3, 1},
  };
  for (const Row& row : rows) {
    for (const char* v : vars) unsetenv(v);
    for (const auto& [k, v] : row.env) setenv(k, v, 1);
    const distributed::LaunchInfo info = distributed::launch_info();
    EXPECT_EQ(info.launcher, row.launcher);
    EXPECT_EQ(info.rank, row.rank) << row.launcher;
    EXPECT_EQ(info.world_size, row.world) << row.launcher;
    EXPECT_EQ(info.local_rank, row.local) << row.launcher;
  }
  const std::vector<std::vector<std::pair<const char*, const char*>>> refused{
      {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "5"}},
      {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "one"}},
      {{"SLURM_STEP_NUM_TASKS", "-3"}, {"SLURM_PROCID", "0"}},
  };
  for (const auto& env : refused) {
    for (const char* v : vars) unsetenv(v);
    for (const auto& [k, v] : env) setenv(k, v, 1);
    EXPECT_THROW(distributed::launch_info(), ValueError) << env[0].first << "=" << env[0].second;
  }
  for (const char* v : vars) unsetenv(v);
}

TEST(Cli, MistakesPrintOneLineAndExitTwo) {
  const std::vector<std::vector<std::string>> mistakes{
      {"--bogus"},
      {"--optimizer", "lion"},
      {"--hidden", "512,x"},
      {"--epochs", "0"},
      {"--lr", "fast"},
      {"--batch", "100", "--micro-batch", "32"},
      {"--batch", "128", "--micro-batch", "32", "--accum-steps", "3"},
      {"--schedule", "step"},
      {"--schedule", "warmup"},               // --warmup N ramps any schedule
      {"--model", "cnn", "--norm", "layer"},  // GroupNorm with one group is --norm group1
      {"--device", "tpu"},
  };
  for (const auto& args : mistakes) {
    const CliResult r = cli(args);
    EXPECT_EQ(r.status, 2) << args[0];
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("accrue-mnist: ", 0), 0u) << r.err;
  }
  if (cuda_device_count() == 0) {
    const CliResult r = cli({"--device", "cuda"});
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find("cuda"), std::string::npos) << r.err;
  }
  const CliResult help = cli({"--help"});
  EXPECT_EQ(help.status, 0);
  for (const char* flag :
       {"--micro-batch", "--accum-steps", "--lr-scaling", "--metrics", "--init"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
  const CliResult missing = cli({"--data", "/nonexistent-accrue"});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("/nonexistent-accrue/train-images-idx3-ubyte"), std::string::npos);
  EXPECT_NE(missing.err.find("scripts/fetch-mnist.sh /nonexistent-accrue"), std::string::npos);
}

TEST(Checkpoint, RoundTripAndRejection) {
  const fs::path dir = temp_dir("ckpt");
  const std::string path = (dir / "w.safetensors").string();
  nn::manual_seed(3);
  nn::MLP a({6, 5, 3});
  optim::save_safetensors(path, a.named_parameters(), {{"format", "pt"}});
  const auto tensors = optim::read_safetensors(path);
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(tensors.at("layers.0.weight").shape(), (Shape{5, 6}));
  EXPECT_EQ(tensors.at("layers.1.bias").shape(), (Shape{3}));
  nn::manual_seed(4);
  nn::MLP b({6, 5, 3});
  optim::ParameterArena arena(b);  // loading writes through the arena
  optim::load_parameters(b, path);
  for (auto& [name, t] : a.named_parameters()) {
    EXPECT_EQ(t.to_vector<float>(), b.parameter(name).to_vector<float>()) << name;
  }
  nn::MLP wider({6, 7, 3});
  expect_error<FileError>([&] { optim::load_parameters(wider, path); },
                          {"layers.0.weight", "[5, 6]", "[7, 6]"});
  nn::MLP deeper({6, 5, 3, 2});
  expect_error<FileError>([&] { optim::load_parameters(deeper, path); }, {"layers.2.weight"});
  // Truncated data section.
  const auto size = fs::file_size(path);
  fs::copy_file(path, dir / "cut.safetensors");
  fs::resize_file(dir / "cut.safetensors", size - 8);
  expect_error<FileError>([&] { optim::read_safetensors((dir / "cut.safetensors").string()); },
                          {"cut.safetensors", "truncated", "layers.1.bias"});
  // Header length past the end, and a header that is not JSON.
  std::ofstream((dir / "len.safetensors").string(), std::ios::binary)
      << std::string("\xff\xff\0\0\0\0\0\0{}", 10);
  expect_error<FileError>([&] { optim::read_safetensors((dir / "len.safetensors").string()); },
                          {"len.safetensors", "header length"});
  std::ofstream((dir / "json.safetensors").string(), std::ios::binary)
      << std::string("\x04\0\0\0\0\0\0\0{{{{", 12);
  expect_error<FileError>([&] { optim::read_safetensors((dir / "json.safetensors").string()); },
                          {"json.safetensors", "JSON"});
}

TEST(Windows, HoldTheSameSamplesWhateverTheSplit) {
  const auto order = train::epoch_order(1000, 42, 3, true);
  EXPECT_EQ(order, train::epoch_order(1000, 42, 3, true));
  EXPECT_NE(order, train::epoch_order(1000, 42, 4, true));
  EXPECT_EQ(train::epoch_order(5, 42, 0, false), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  const auto one = optim::plan_windows(1000, optim::resolve_batch({128, 128, 0, 1}));
  const auto four = optim::plan_windows(1000, optim::resolve_batch({128, 32, 0, 1}));
  ASSERT_EQ(one.size(), four.size());
  for (size_t w = 0; w < one.size(); ++w) {
    EXPECT_EQ(one[w].start, four[w].start);
    EXPECT_EQ(one[w].samples, four[w].samples);
  }
}

mnist::Config small_config(const fs::path& data) {
  mnist::Config c;
  c.data = data.string();
  c.hidden = {32};
  c.quiet = true;
  c.seed = 9;
  return c;
}

// In one process the sharded step (reduce-scatter, shard norm, all-gather) is the plain step:
// the same weights to the byte, for Adam and for SGD.
TEST(Trainer, ZeroOneInOneProcessWritesTheSameWeights) {
  const fs::path data = make_dataset("zero-one", 512, 64);
  for (const char* optimizer : {"adam", "sgd"}) {
    std::vector<std::string> files;
    for (const char* zero : {"0", "1"}) {
      const fs::path save = data / (std::string("w") + optimizer + zero + ".safetensors");
      const auto r = cli({"--data", data.string(), "--epochs", "2", "--hidden", "32", "--quiet",
                          "--optimizer", optimizer, "--zero", zero, "--save", save.string()});
      ASSERT_EQ(r.status, 0) << r.err;
      std::ifstream in(save, std::ios::binary);
      files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    EXPECT_EQ(files[0], files[1]) << optimizer;
  }
}

TEST(Trainer, SplitsOfOneWindowGiveTheSameLosses) {
  const fs::path data = make_dataset("same-samples", 512, 64);
  mnist::Config c = small_config(data);
  c.epochs = 2;
  c.micro_batch = 128;
  c.accum_steps = 1;
  const Recorded whole = train_recorded(c, std::cout);
  c.micro_batch = 32;
  c.accum_steps = 4;
  const Recorded split = train_recorded(c, std::cout);
  ASSERT_EQ(whole.step_losses.size(), 8u);
  ASSERT_EQ(split.step_losses.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(split.step_losses[i], whole.step_losses[i], 1e-5 * whole.step_losses[i]) << i;
  }
}

// In float64 the split of a window changes nothing but rounding at the 1e-16 level: 1000
// samples in windows of 128 (the eighth one short, 104 samples) give the same 8 losses and
// gradient norms whether a window runs as 128 x 1, 32 x 4 or 8 x 16. (In float32 a ReLU input
// within rounding of zero can flip between splits and move the gradient by 1e-4, which would
// hide whether the short last window is normalised exactly.)
TEST(Trainer, Float64SplitsAgreeToTenDigitsIncludingTheShortLastWindow) {
  const fs::path data = make_dataset("fp64-splits", 1000, 64);
  mnist::Config c = small_config(data);
  c.precision = train::Precision::kFp64;
  c.epochs = 1;
  c.train_limit = 1000;
  c.batch = 128;
  std::vector<Recorded> runs;
  for (int64_t micro : {128, 32, 8}) {
    c.micro_batch = micro;
    runs.push_back(train_recorded(c, std::cout));
    ASSERT_EQ(runs.back().step_losses.size(), 8u) << micro;
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_NEAR(runs[r].step_losses[i], runs[0].step_losses[i], 1e-10 * runs[0].step_losses[i])
          << "run " << r << " step " << i;
      EXPECT_NEAR(runs[r].step_grad_norms[i], runs[0].step_grad_norms[i],
                  1e-10 * runs[0].step_grad_norms[i])
          << "run " << r << " step " << i;
    }
  }
}

TEST(Trainer, LearnsTheGeneratedDigitsAndWritesMetrics) {
  const fs::path data = make_dataset("train-run", 2048, 512);
  mnist::Config c = small_config(data);
  c.epochs = 3;
  c.metrics = (data / "metrics.jsonl").string();
  c.save = (data / "final.safetensors").string();
  const Recorded s = train_recorded(c, std::cout);
  EXPECT_GE(s.test_accuracy, 0.95);
  EXPECT_EQ(s.steps, 3 * 16);
  std::ifstream metrics(c.metrics);
  std::string line, last;
  int steps = 0, epochs = 0;
  while (std::getline(metrics, line)) {
    if (line.find("\"event\":\"epoch\"") != std::string::npos)
      ++epochs;
    else if (line.find("\"grad_norm\"") != std::string::npos)
      ++steps;
    last = line;
  }
  EXPECT_EQ(steps, 48);
  EXPECT_EQ(epochs, 3);
  for (const char* key : {"\"event\":\"summary\"", "train_seconds", "first_window_seconds",
                          "samples_per_second", "peak_activation_bytes", "\"device\":\"cpu\""}) {
    EXPECT_NE(last.find(key), std::string::npos) << key;
  }
  // --init from the saved weights starts where the run ended.
  c.init = c.save;
  c.save.clear();
  c.metrics.clear();
  c.max_steps = 1;
  c.lr = 0;
  EXPECT_NEAR(train_recorded(c, std::cout).test_accuracy, s.test_accuracy, 1e-12);
}

// Mixed precision end to end: bf16 and fp16 learn the generated digits as float32 does, the
// metrics carry the loss scale of every step (2^16 for fp16, 1 for bf16), the saved weights are
// the float32 masters, and a micro-step's activations take at most 0.6x the float32 bytes.
TEST(Trainer, MixedPrecisionTrainsAndHalvesTheActivations) {
  const fs::path data = make_dataset("mixed", 2048, 512);
  mnist::Config c = small_config(data);
  c.epochs = 3;
  const Recorded fp32 = train_recorded(c, std::cout);
  for (const char* precision : {"bf16", "fp16"}) {
    c.precision = train::parse_precision(precision);
    c.metrics = (data / (std::string(precision) + ".jsonl")).string();
    c.save = (data / (std::string(precision) + ".safetensors")).string();
    const Recorded s = train_recorded(c, std::cout);
    EXPECT_GE(s.test_accuracy, 0.95) << precision;
    EXPECT_NEAR(s.test_accuracy, fp32.test_accuracy, 0.02) << precision;
    EXPECT_EQ(s.skipped_steps, 0) << precision;
    EXPECT_LE(s.peak_activation_bytes, 0.6 * fp32.peak_activation_bytes) << precision;
    const double scale = std::string(precision) == "fp16" ? 65536 : 1;
    ASSERT_EQ(s.step_loss_scales.size(), static_cast<size_t>(s.steps));
    for (double v : s.step_loss_scales) EXPECT_EQ(v, scale) << precision;
    std::ifstream metrics(c.metrics);
    std::string line;
    std::getline(metrics, line);  // the run's id, then the first step
    std::getline(metrics, line);
    EXPECT_NE(line.find(str_cat("\"loss_scale\":", static_cast<int>(scale))), std::string::npos)
        << line;
    for (const auto& [name, t] : optim::read_safetensors(c.save)) {
      EXPECT_EQ(t.dtype(), DType::kFloat32) << name << ": the masters are saved";
    }
    // --init from the saved masters continues in the same precision where the run ended.
    mnist::Config again = c;
    again.init = c.save;
    again.save.clear();
    again.metrics.clear();
    again.max_steps = 1;
    again.lr = 0;
    EXPECT_NEAR(train_recorded(again, std::cout).test_accuracy, s.test_accuracy, 1e-12)
        << precision;
  }
}

// The CNN end to end on the generated digits, with each normalisation: it learns them; with
// BatchNorm the saved file carries the running statistics; a run started from it (--init, one
// step at lr 0) evaluates as the one that saved it: exactly without BatchNorm, and within a few
// test samples with it (that step's forward passes move the running statistics once more).
TEST(Trainer, CnnTrainsWithEachNormAndSavesBatchNormBuffers) {
  const fs::path data = make_dataset("cnn", 512, 128);
  for (const char* norm : {"none", "batch", "group", "group1"}) {
    mnist::Config c = small_config(data);
    c.model = "cnn";
    c.norm = norm;
    c.epochs = 1;
    c.save = (data / (std::string(norm) + ".safetensors")).string();
    const Recorded s = train_recorded(c, std::cout);
    EXPECT_GE(s.test_accuracy, 0.9) << norm;
    const auto saved = optim::read_safetensors(c.save);
    EXPECT_EQ(saved.count("conv1.weight"), 1u);
    EXPECT_EQ(saved.count("fc2.bias"), 1u);
    EXPECT_EQ(saved.count("norm1.running_mean"), std::string(norm) == "batch" ? 1u : 0u) << norm;
    if (std::string(norm) == "batch") {
      EXPECT_EQ(saved.at("norm1.num_batches_tracked").dtype(), DType::kInt64) << "PyTorch's";
    }
    mnist::Config again = c;
    again.init = c.save;
    again.save.clear();
    again.max_steps = 1;
    again.lr = 0;
    const double tolerance = std::string(norm) == "batch" ? 0.05 : 1e-12;
    EXPECT_NEAR(train_recorded(again, std::cout).test_accuracy, s.test_accuracy, tolerance) << norm;
  }
}

// The CNN in 16 bits on the CPU (the convolutions lowered into 16-bit products, conv_half.cpp;
// through oneDNN on a CPU with bfloat16 instructions), without normalisation, with GroupNorm and
// with BatchNorm (statistics and affine in float32 inside 16-bit kernels): it learns the generated
// digits as float32 does, the saved weights are the float32 masters (and BatchNorm's running
// statistics float32 buffers), the weights are the same to the byte on 1 and 2 threads, and its
// activations take at most 0.7x float32's bytes. One case per norm, so CTest runs them side by
// side (together, the suite's longest test).
class CnnInSixteenBits : public ::testing::TestWithParam<const char*> {};

TEST_P(CnnInSixteenBits, TrainsOnTheCpu) {
  const char* norm = GetParam();
  const fs::path data = make_dataset(str_cat("cnn-half-", norm), 512, 128);
  mnist::Config c = small_config(data);
  c.model = "cnn";
  c.norm = norm;
  c.device = Device::cpu();
  c.epochs = 2;
  c.threads = 2;  // the per-thread scratch counts as activations: the most the runs below use
  const Recorded fp32 = train_recorded(c, std::cout);
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(str_cat(precision, ", --norm ", norm));
    c.precision = train::parse_precision(precision);
    std::vector<std::string> files;
    for (int threads : {1, 2}) {
      c.threads = threads;
      c.save = (data / str_cat(norm, "-", precision, "-", threads, ".safetensors")).string();
      const Recorded s = train_recorded(c, std::cout);
      EXPECT_GE(s.test_accuracy, 0.9);
      EXPECT_NEAR(s.test_accuracy, fp32.test_accuracy, 0.03);
      EXPECT_EQ(s.skipped_steps, 0);
      // 16-bit activations, the norms' included (their CPU kernels keep no float32 copies)
      EXPECT_LE(s.peak_activation_bytes, 0.7 * fp32.peak_activation_bytes);
      for (const auto& [name, t] : optim::read_safetensors(c.save)) {
        if (t.dtype() == DType::kInt64) continue;  // BatchNorm's num_batches_tracked
        EXPECT_EQ(t.dtype(), DType::kFloat32) << name << ": the masters and buffers are saved";
      }
      std::ifstream in(c.save, std::ios::binary);
      files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    EXPECT_EQ(files[0], files[1]) << "1 and 2 threads";
  }
}
INSTANTIATE_TEST_SUITE_P(Trainer, CnnInSixteenBits, ::testing::Values("none", "group", "batch"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// --accum-schedule: each epoch's windows have the effective batch its k gives, the learning rate
// follows through --lr-scaling, and every window is exact for its own size: the same schedule
// of effective batches split twice as finely gives the same losses and norms in float64.
TEST(Trainer, AccumulationScheduleSetsTheBatchOfEveryStep) {
  const fs::path data = make_dataset("k-schedule", 256, 64);
  mnist::Config c = small_config(data);
  c.precision = train::Precision::kFp64;
  c.epochs = 4;
  c.micro_batch = 8;
  c.accum_schedule = optim::AccumSchedule::parse("1:1,2:2,3:4", train::kMaxBatch);
  c.lr_scaling = optim::LrScaling::kLinear;
  c.base_batch = 8;
  c.metrics = (data / "k.jsonl").string();
  const Recorded coarse = train_recorded(c, std::cout);
  std::vector<int64_t> expect;
  for (int64_t batch : {8, 16, 32, 32}) {
    for (int64_t i = 0; i < 256 / batch; ++i) expect.push_back(batch);
  }
  EXPECT_EQ(coarse.step_batches, expect);
  std::ifstream metrics(c.metrics);
  std::string line;
  int64_t step = 0;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("step")) continue;  // epoch and summary records
    const int64_t batch = expect.at(static_cast<size_t>(step++));
    EXPECT_EQ(j.at("batch").get<int64_t>(), batch);
    EXPECT_EQ(j.at("accum_steps").get<int64_t>(), batch / 8);  // one key per concept
    EXPECT_FALSE(j.contains("k"));
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), 1e-3 * static_cast<double>(batch) / 8);
  }
  EXPECT_EQ(step, static_cast<int64_t>(expect.size()));
  // The same effective batches as 4 x 2, 4 x 4, 4 x 8.
  c.micro_batch = 4;
  c.accum_schedule = optim::AccumSchedule::parse("1:2,2:4,3:8", train::kMaxBatch);
  c.metrics.clear();
  const Recorded fine = train_recorded(c, std::cout);
  ASSERT_EQ(fine.step_losses.size(), coarse.step_losses.size());
  for (size_t i = 0; i < fine.step_losses.size(); ++i) {
    EXPECT_NEAR(fine.step_losses[i], coarse.step_losses[i], 1e-10 * coarse.step_losses[i]) << i;
    EXPECT_NEAR(fine.step_grad_norms[i], coarse.step_grad_norms[i],
                1e-10 * coarse.step_grad_norms[i])
        << i;
  }
}

// --memory-budget: the chosen run's measured peak stays under the budget, and halving the room
// the budget leaves for activations halves the micro-batch (the effective batch, 256, keeps
// its divisors powers of two); a budget below one sample's need is refused, naming the minimum.
TEST(Trainer, MemoryBudgetPicksTheMicroBatchThatFits) {
  const fs::path data = make_dataset("budget", 512, 64);
  mnist::Config c = small_config(data);
  c.hidden = {256, 256};
  c.batch = 256;
  c.max_steps = 2;
  c.memory_budget = int64_t{1} << 30;
  const Recorded roomy = train_recorded(c, std::cout);
  EXPECT_EQ(roomy.micro_batch, 256);
  ASSERT_GT(roomy.activation_bytes_per_sample, 0);
  const double base =
      static_cast<double>(roomy.memory_baseline_bytes) + roomy.activation_fixed_bytes;
  std::vector<int64_t> chosen;
  for (double samples : {96.0, 48.0}) {  // room for 96 and for 48 samples
    const int64_t budget = static_cast<int64_t>(base + samples * roomy.activation_bytes_per_sample);
    c.memory_budget = static_cast<int64_t>(budget);
    const Recorded s = train_recorded(c, std::cout);
    EXPECT_LE(s.peak_bytes, static_cast<size_t>(budget)) << "budget " << budget;
    chosen.push_back(s.micro_batch);
  }
  EXPECT_EQ(chosen, (std::vector<int64_t>{64, 32}));
  c.memory_budget = static_cast<int64_t>(roomy.memory_baseline_bytes / 2);
  try {
    train_recorded(c, std::cout);
    ADD_FAILURE() << "a budget below the baseline was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("below what one sample needs"), std::string::npos)
        << e.what();
  }
}

// Checkpoints: 20 steps, a resume, 20 more write the weights of 40 uninterrupted steps to the
// byte, for Adam, AdamW and SGD, in fp32 and bf16 (the working copy is re-derived from the
// masters), with a k schedule whose change falls after the resume; the checkpoint lands
// mid-epoch, so the sample order's position is restored too.
// A checkpoint written at a7c3aef, before the configuration became typed (tests/data: its
// description holds the settings as text and -1 for an unset weight decay), still resumes: its
// weights load exactly (a resume with nothing left to train saves them as they were), and the
// run continues from its step.
TEST(Trainer, ACheckpointOfAnEarlierVersionResumes) {
  const fs::path data = make_dataset("old-checkpoint", 512, 64);
  const fs::path dir = temp_dir("old-checkpoint-run");
  fs::copy(fs::path(ACCRUE_SOURCE_DIR) / "tests/data/checkpoint-a7c3aef", dir / "ckpt");
  mnist::Config c;
  c.data = data.string();
  c.hidden = {4};
  c.seed = 2;
  c.train_limit = 256;
  c.threads = 1;
  c.quiet = true;
  c.resume = (dir / "ckpt").string();
  c.max_steps = 2;  // where the checkpoint is: nothing to train, its weights saved
  c.save = (dir / "as-loaded.safetensors").string();
  std::ostringstream out;
  const train::Summary loaded = mnist::train(c, out);
  EXPECT_EQ(loaded.steps, 2);
  const auto saved = optim::read_safetensors(c.save);
  const auto checkpoint =
      optim::read_safetensors((dir / "ckpt" / "step-0000000002.safetensors").string());
  for (const auto& [name, t] : saved) {
    const auto it = checkpoint.find("model/" + name);
    ASSERT_NE(it, checkpoint.end()) << name;
    EXPECT_EQ(t.to_vector<float>(), it->second.to_vector<float>()) << name;
  }
  c.max_steps = 4;
  c.save.clear();
  const train::Summary continued = mnist::train(c, out);
  EXPECT_EQ(continued.steps, 4);
  fs::remove_all(dir);
  fs::remove_all(data);
}

TEST(Trainer, ResumeContinuesBitForBit) {
  const fs::path data = make_dataset("resume", 512, 64);
  struct Case {
    const char* optimizer;
    const char* precision;
    const char* schedule;
  };
  for (const Case& k :
       {Case{"adam", "fp32", ""}, Case{"adamw", "fp32", ""}, Case{"sgd", "fp32", ""},
        Case{"adam", "bf16", ""}, Case{"adam", "fp16", ""}, Case{"adam", "fp32", "1:1,2:2"}}) {
    mnist::Config c = small_config(data);
    c.optimizer = k.optimizer;
    c.precision = train::parse_precision(k.precision);
    c.micro_batch = 16;
    if (*k.schedule) {
      c.accum_schedule = optim::AccumSchedule::parse(
          k.schedule, train::kMaxBatch);  // epoch 1: 32 windows of 16, epoch 2: windows of 32
    } else {
      c.accum_steps = 2;  // 16 windows an epoch: the resume at 20 is mid-epoch 2
    }
    c.epochs = 3;
    const std::string tag = str_cat(k.optimizer, "-", k.precision, *k.schedule ? "-k" : "");
    c.max_steps = 40;
    c.save = (data / (tag + "-whole.safetensors")).string();
    const Recorded whole = train_recorded(c, std::cout);
    const fs::path dir = data / ("ckpt-" + tag);
    c.max_steps = 20;
    c.save.clear();
    c.checkpoint = dir.string();
    c.checkpoint_every = 10;
    train_recorded(c, std::cout);
    c.max_steps = 40;
    c.checkpoint.clear();
    c.resume = dir.string();
    c.save = (data / (tag + "-resumed.safetensors")).string();
    const Recorded resumed = train_recorded(c, std::cout);
    EXPECT_EQ(resumed.parameter_hash, whole.parameter_hash) << tag;
    EXPECT_EQ(read_file_bytes(c.save),
              read_file_bytes((data / (tag + "-whole.safetensors")).string()))
        << tag;
    ASSERT_EQ(resumed.step_losses.size(), 20u) << tag;
    for (size_t i = 0; i < 20; ++i)
      EXPECT_EQ(resumed.step_losses[i], whole.step_losses[20 + i]) << tag;
  }
}

// A BatchNorm CNN's checkpoint whose num_batches_tracked counters are int32 (as accrue wrote them
// before the counters were int64) resumes: the counters widen, and the run writes the bytes of
// the uninterrupted one.
TEST(Trainer, ResumeWidensAnInt32BatchNormCounter) {
  const fs::path data = make_dataset("resume-i32", 256, 64);
  mnist::Config c = small_config(data);
  c.model = "cnn";
  c.norm = "batch";
  c.micro_batch = 16;
  c.accum_steps = 2;
  c.max_steps = 4;
  c.save = (data / "whole.safetensors").string();
  train_recorded(c, std::cout);
  c.max_steps = 2;
  c.save.clear();
  c.checkpoint = (data / "ckpt").string();
  c.checkpoint_every = 2;
  train_recorded(c, std::cout);
  const train::Checkpoint saved = train::read_latest_checkpoint(c.checkpoint);
  std::vector<nn::NamedTensor> model, optimizer;
  for (const auto& [name, t] : saved.model) {
    const bool counter = name.find("num_batches_tracked") != std::string::npos;
    if (counter) {
      EXPECT_EQ(t.to_vector<int64_t>()[0], 2 * 2) << name;  // the micro-batches seen
    }
    model.emplace_back(name, counter ? to_dtype(t, DType::kInt32) : t);
  }
  for (const auto& [name, t] : saved.optimizer) optimizer.emplace_back(name, t);
  const fs::path old = data / "ckpt-i32";
  train::write_checkpoint(old.string(), saved.run_id, saved.config, saved.flags, saved.position,
                          saved.best, model, optimizer);
  EXPECT_EQ(
      train::read_latest_checkpoint(old.string()).model.at("norm1.num_batches_tracked").dtype(),
      DType::kInt32);
  c.max_steps = 4;
  c.checkpoint.clear();
  c.resume = old.string();
  c.save = (data / "resumed.safetensors").string();
  train_recorded(c, std::cout);
  EXPECT_EQ(read_file_bytes(c.save), read_file_bytes((data / "whole.safetensors").string()));
}

// --offload-optimizer: the masters and the optimizer state on the host, the step on the CPU.
// With the model on the CPU the same kernels see the same values: the same weights to the byte,
// for every optimizer and precision; the compute device holds 12 bytes a parameter less under
// mixed precision (8 in fp32), measured; and a run checkpointed on the device resumes offloaded.
TEST(Trainer, OffloadedOptimizerWritesTheSameWeights) {
  const fs::path data = make_dataset("offload", 512, 64);
  struct Case {
    const char* optimizer;
    const char* precision;
    int saved;  // bytes a parameter the device no longer holds (SGD: one state tensor)
  };
  for (const Case& k : {Case{"adam", "fp32", 8}, Case{"sgd", "fp32", 4}, Case{"adamw", "bf16", 12},
                        Case{"adam", "fp16", 12}, Case{"adam", "fp64", 16}}) {
    mnist::Config c = small_config(data);
    c.optimizer = k.optimizer;
    c.precision = train::parse_precision(k.precision);
    c.epochs = 2;
    c.micro_batch = 16;
    c.accum_steps = 2;
    const std::string tag = str_cat(k.optimizer, "-", k.precision);
    SCOPED_TRACE(tag);
    c.save = (data / (tag + "-device.safetensors")).string();
    const Recorded plain = train_recorded(c, std::cout);
    c.offload_optimizer = true;
    c.bucket_kib = 1;  // {fc1 bias, fc1 weight: 1.3 KiB}, then {fc0 bias, fc0 weight}
    c.save = (data / (tag + "-offloaded.safetensors")).string();
    c.metrics = (data / (tag + "-offloaded.jsonl")).string();
    const Recorded offloaded = train_recorded(c, std::cout);
    EXPECT_EQ(offloaded.parameter_hash, plain.parameter_hash);
    EXPECT_EQ(read_file_bytes(c.save),
              read_file_bytes((data / (tag + "-device.safetensors")).string()));
    EXPECT_EQ(offloaded.step_losses, plain.step_losses);
    const int64_t params = 784 * 32 + 32 + 32 * 10 + 10;
    const int64_t saved = static_cast<int64_t>(plain.device_state_bytes) -
                          static_cast<int64_t>(offloaded.device_state_bytes);
    EXPECT_GE(saved, k.saved * params)
        << plain.device_state_bytes << " -> " << offloaded.device_state_bytes;
    EXPECT_LE(saved, k.saved * (params + 1024)) << "arena padding and granules at most";
    EXPECT_EQ(plain.host_state_bytes, 0u);
    EXPECT_GT(offloaded.host_state_bytes, offloaded.device_state_bytes);
    const int64_t steps = offloaded.steps;
    EXPECT_EQ(offloaded.offload.steps, steps);
    EXPECT_EQ(offloaded.offload.prefetched, 2 * steps) << "buckets copied during backward";
    EXPECT_EQ(offloaded.offload.fetched_at_step, 0);
    const size_t master_bytes = std::string(k.precision) == "fp64" ? 8 : 4;
    EXPECT_GE(offloaded.offload.to_host_bytes, steps * master_bytes * params);
    // The metrics summary carries the measured bytes.
    std::ifstream in(c.metrics);
    std::string line, last;
    while (std::getline(in, line)) last = line;
    const auto summary = nlohmann::json::parse(last);
    EXPECT_EQ(summary["device_state_bytes"], offloaded.device_state_bytes);
    EXPECT_EQ(summary["offload_to_host_bytes"], offloaded.offload.to_host_bytes);
    EXPECT_EQ(summary["offload_optimizer"], true);
  }
  // Checkpointed with the optimizer on the device, resumed offloaded: the same bytes.
  mnist::Config c = small_config(data);
  c.micro_batch = 16;
  c.accum_steps = 2;
  c.epochs = 3;
  c.max_steps = 30;
  c.save = (data / "whole.safetensors").string();
  train_recorded(c, std::cout);
  c.max_steps = 15;
  c.save.clear();
  c.checkpoint = (data / "ckpt").string();
  train_recorded(c, std::cout);
  c.max_steps = 30;
  c.checkpoint.clear();
  c.resume = (data / "ckpt").string();
  c.offload_optimizer = true;
  c.save = (data / "resumed.safetensors").string();
  train_recorded(c, std::cout);
  EXPECT_EQ(read_file_bytes(c.save), read_file_bytes((data / "whole.safetensors").string()));
}

// A damaged checkpoint is refused, naming the file and the older intact one; a resume with
// another configuration is refused, naming the setting; writing keeps the newest two.
TEST(Trainer, DamagedOrMismatchedCheckpointsAreRefused) {
  const fs::path data = make_dataset("resume-bad", 256, 64);
  mnist::Config c = small_config(data);
  c.max_steps = 6;
  c.micro_batch = 16;
  c.accum_steps = 2;
  c.checkpoint = (data / "ckpt").string();
  c.checkpoint_every = 2;
  train_recorded(c, std::cout);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(data / "ckpt")) files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{".lock", "step-0000000004.json",
                                             "step-0000000004.safetensors", "step-0000000006.json",
                                             "step-0000000006.safetensors"}));
  mnist::Config r = small_config(data);
  r.micro_batch = 16;
  r.accum_steps = 2;
  r.max_steps = 8;
  r.resume = c.checkpoint;
  // Another optimizer: named.
  r.optimizer = "sgd";
  try {
    train_recorded(r, std::cout);
    ADD_FAILURE() << "a resume with another optimizer was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer = \"adam\", this run has \"sgd\""),
              std::string::npos)
        << e.what();
  }
  r.optimizer = "adam";
  const fs::path newest = data / "ckpt" / "step-0000000006.safetensors";
  const std::vector<uint8_t> good = read_file_bytes(newest.string());
  const auto expect_refused = [&](const std::vector<uint8_t>& bytes, const char* words) {
    {
      std::ofstream out(newest, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    try {
      train_recorded(r, std::cout);
      ADD_FAILURE() << "a damaged checkpoint was accepted";
    } catch (const FileError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(words), std::string::npos) << what;
      EXPECT_NE(what.find("step-0000000004 is intact"), std::string::npos) << what;
    }
  };
  expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2), "truncated");
  std::vector<uint8_t> flipped = good;
  flipped[flipped.size() - 3] ^= 0x40;
  expect_refused(flipped, "do not match the hash");
}

}  // namespace
}  // namespace accrue::testing
