// Evaluation during training and the best weights (issue #52 item 4): --eval-every records the
// held-out measure between steps and changes no weight; --keep-best writes the weights of the best
// held-out evaluation beside the checkpoints; --early-stop ends the run after PATIENCE
// evaluations without improvement, exit 0, naming the best; a resumed run goes on choosing as the
// uninterrupted one. MNIST's held-out split is --validation N seeded training samples.
#include <fstream>
#include <nlohmann/json.hpp>

#include "mnist_fixture.h"
#include "optim/safetensors.h"

namespace accrue::testing {
namespace {

std::vector<nlohmann::json> events(const fs::path& metrics, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") == kind) out.push_back(j);
  }
  return out;
}

// 384 training samples in 24 windows of 8 x 2, 64 held out. quiet: no log on the output.
std::vector<std::string> base(const fs::path& data, std::vector<std::string> more,
                              bool quiet = true) {
  std::vector<std::string> args{
      "--data",   data.string(), "--train-limit", "448", "--micro-batch", "8", "--accum-steps", "2",
      "--hidden", "16",          "--validation",  "64",  "--threads",     "1"};
  if (quiet) args.push_back("--quiet");
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// A run with --eval-every ends with the bytes of one without; its evaluations are recorded.
TEST(Best, EvaluationsBetweenStepsChangeNoWeight) {
  const fs::path data = make_dataset("best-same", 448, 64);
  const std::string plain = (data / "plain.safetensors").string();
  const std::string evaluated = (data / "evaluated.safetensors").string();
  const fs::path metrics = data / "m.jsonl";
  ASSERT_EQ(cli(base(data, {"--max-steps", "12", "--save", plain})).status, 0);
  const CliResult r = cli(base(data, {"--max-steps", "12", "--save", evaluated, "--eval-every", "3",
                                      "--metrics", metrics.string()}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(evaluated), slurp(plain));
  const auto evals = events(metrics, "eval");
  ASSERT_EQ(evals.size(), 4u);
  for (size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i]["step"], 3 * static_cast<int64_t>(i + 1));
    EXPECT_TRUE(evals[i].contains("val_accuracy")) << evals[i];
  }
}

// --keep-best: DIR/best.safetensors holds the weights of the best evaluation (the earliest of
// equals), named with its step and value in its metadata, in the checkpoint and the summary.
TEST(Best, KeepBestWritesTheBestEvaluationsWeights) {
  const fs::path data = make_dataset("best-keep", 448, 64);
  const fs::path ckpt = data / "ckpt", metrics = data / "m.jsonl";
  const CliResult r = cli(base(data,
                               {"--epochs", "2", "--eval-every", "4", "--keep-best", "--checkpoint",
                                ckpt.string(), "--metrics", metrics.string()},
                               false));
  ASSERT_EQ(r.status, 0) << r.err;
  int64_t best_step = -1;
  double best = -1;
  // Every held-out measure in step order; an epoch's record is at its last step (24 windows).
  std::vector<nlohmann::json> measured = events(metrics, "eval");
  for (auto epoch : events(metrics, "epoch")) {
    epoch["step"] = 24 * epoch["epoch"].get<int64_t>();
    measured.push_back(epoch);
  }
  std::stable_sort(measured.begin(), measured.end(),
                   [](const auto& a, const auto& b) { return a["step"] < b["step"]; });
  for (const auto& m : measured) {
    const double v = m["val_accuracy"].get<double>();
    if (v > best) best = v, best_step = m["step"].get<int64_t>();
  }
  ASSERT_GT(best_step, 0);
  std::map<std::string, std::string> meta;
  optim::read_safetensors((ckpt / "best.safetensors").string(), &meta);
  EXPECT_EQ(meta["accrue.best.step"], std::to_string(best_step));
  EXPECT_EQ(std::stod(meta["accrue.best.val_accuracy"]), best);
  const auto summary = events(metrics, "summary").at(0);
  EXPECT_EQ(summary["best"]["step"], best_step);
  EXPECT_EQ(summary["best"]["key"], "val_accuracy");
  EXPECT_NE(r.out.find("best validation accuracy"), std::string::npos) << r.out;
  // The best file is no output of a resumed run's, and stays outside the checkpoints' rotation.
  EXPECT_TRUE(fs::exists(ckpt / "best.safetensors"));
}

// --early-stop 2 with a rate too small to move the accuracy: the first evaluation stays the best,
// the run ends two evaluations later with exit 0 and says so; cut at step 2 and resumed, it ends
// at the same step with the same weights.
TEST(Best, EarlyStopEndsTheRunAndResumesWhereItWould) {
  const fs::path data = make_dataset("best-early", 448, 64);
  const std::vector<std::string> slow = {"--lr", "1e-12", "--eval-every", "1", "--early-stop", "2"};
  std::vector<std::string> args = base(data, slow, false);
  const fs::path metrics = data / "m.jsonl";
  const std::string whole = (data / "whole.safetensors").string();
  args.insert(args.end(), {"--metrics", metrics.string(), "--save", whole});
  CliResult r = cli(args);
  ASSERT_EQ(r.status, 0) << r.err;
  auto summary = events(metrics, "summary").at(0);
  EXPECT_EQ(summary["steps"], 3);
  EXPECT_EQ(summary["stopped_early"], true);
  EXPECT_EQ(summary["best"]["step"], 1);
  EXPECT_NE(r.out.find("stopped early: 2 evaluations without improvement"), std::string::npos)
      << r.out;
  const fs::path ckpt = data / "ckpt";
  args = base(data, slow);
  args.insert(args.end(), {"--max-steps", "2", "--checkpoint", ckpt.string()});
  ASSERT_EQ(cli(args).status, 0);
  const std::string resumed = (data / "resumed.safetensors").string();
  const fs::path resumed_metrics = data / "resumed.jsonl";
  r = cli({"--resume", ckpt.string(), "--max-steps", "0", "--save", resumed, "--metrics",
           resumed_metrics.string(), "--quiet"});
  ASSERT_EQ(r.status, 0) << r.err;
  summary = events(resumed_metrics, "summary").at(0);
  EXPECT_EQ(summary["steps"], 3);
  EXPECT_EQ(summary["stopped_early"], true);
  EXPECT_EQ(slurp(resumed), slurp(whole));

  // The run early stopping ended, resumed from its last checkpoint: nothing is left to train.
  const fs::path ended = data / "ended";
  args = base(data, slow);
  args.insert(args.end(), {"--checkpoint", ended.string()});
  ASSERT_EQ(cli(args).status, 0);
  const std::string again = (data / "again.safetensors").string();
  const fs::path again_metrics = data / "again.jsonl";
  r = cli({"--resume", ended.string(), "--save", again, "--metrics", again_metrics.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  expect_words(r.out, {"nothing left to train: --early-stop 2 ended the run at step 3",
                       "2 evaluations since the best, at step 1"});
  summary = events(again_metrics, "summary").at(0);
  EXPECT_EQ(summary["steps"], 3);
  EXPECT_EQ(summary["stopped_early"], true);
  EXPECT_EQ(slurp(again), slurp(whole));
  // A larger patience on the resume trains on from there.
  r = cli({"--resume", ended.string(), "--early-stop", "3", "--max-steps", "4", "--quiet"});
  ASSERT_EQ(r.status, 0) << r.err;
}

// --keep-best resumed into another --checkpoint folder brings the best so far along: the folder
// the summary names holds it though the resumed run never improves on it.
TEST(Best, AResumeIntoAnotherFolderCarriesTheBestWeights) {
  const fs::path data = make_dataset("best-carried", 448, 64);
  const fs::path first = data / "first", second = data / "second";
  std::vector<std::string> args = base(data, {"--lr", "1e-12", "--eval-every", "1", "--keep-best",
                                              "--checkpoint", first.string(), "--max-steps", "2"});
  ASSERT_EQ(cli(args).status, 0);
  ASSERT_TRUE(fs::exists(first / "best.safetensors"));
  const CliResult r = cli(
      {"--resume", first.string(), "--checkpoint", second.string(), "--max-steps", "4", "--quiet"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(second / "best.safetensors"), slurp(first / "best.safetensors"));
  // --keep-best comes from the checkpoint; --checkpoint is the command's own.
  const CliResult bare = cli({"--resume", first.string(), "--max-steps", "4", "--quiet"});
  EXPECT_EQ(bare.status, 2) << bare.err;
  expect_words(bare.err,
               {"--keep-best (the resumed run's) needs --checkpoint DIR", "--keep-best=false"});
  EXPECT_EQ(
      cli({"--resume", first.string(), "--max-steps", "4", "--keep-best=false", "--quiet"}).status,
      0);
}

// The best weights a resume finds must be the checkpoint's best: a run stopped after a better
// evaluation but before its next checkpoint leaves newer ones, a file may be damaged or gone.
// Such a file is neither carried nor named by the summary (the log says why), and stays as it was
// until the resumed run's own evaluations choose a best.
TEST(Best, ABestFileTheCheckpointDoesNotDescribeIsNotCarried) {
  const fs::path data = make_dataset("best-mismatch", 448, 64);
  const fs::path first = data / "first";
  ASSERT_EQ(cli(base(data, {"--lr", "1e-12", "--eval-every", "1", "--keep-best", "--checkpoint",
                            first.string(), "--max-steps", "2"}))
                .status,
            0);
  std::map<std::string, std::string> meta;
  const auto weights = optim::read_safetensors((first / "best.safetensors").string(), &meta);
  ASSERT_EQ(meta["accrue.best.step"], "1");  // the earliest of equal evaluations
  std::vector<nn::NamedTensor> named(weights.begin(), weights.end());
  meta["accrue.best.step"] = "2";
  const fs::path newer_weights = data / "newer.safetensors";
  optim::save_safetensors(newer_weights.string(), named, optim::with_digest(meta, named));
  // Step 1's metadata over tensors that are not the model's.
  meta["accrue.best.step"] = "1";
  const fs::path foreign_weights = data / "foreign.safetensors";
  optim::save_safetensors(foreign_weights.string(), {{"big", Tensor::zeros({3})}}, meta);
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"newer", "it holds the weights of step 2, not those of the checkpoint's best (step 1)"},
      {"foreign", "its tensors are not the model's"},
      {"damaged", "best.safetensors"},
      {"missing", "best.safetensors is missing"},
  };
  for (const auto& [name, words] : rows) {
    const fs::path folder = data / name, other = data / (name + "-other");
    fs::remove_all(folder);
    fs::remove_all(other);
    fs::copy(first, folder, fs::copy_options::recursive);
    const fs::path best = folder / "best.safetensors";
    if (name == "newer") fs::copy_file(newer_weights, best, fs::copy_options::overwrite_existing);
    if (name == "foreign") {
      fs::copy_file(foreign_weights, best, fs::copy_options::overwrite_existing);
    }
    if (name == "damaged") std::ofstream(best, std::ios::trunc) << "garbage";
    if (name == "missing") fs::remove(best);
    const std::string before = fs::exists(best) ? slurp(best) : "";
    // Into another folder, then into the same one (both from step 2).
    for (const fs::path& to : {other, folder}) {
      const CliResult r =
          cli({"--resume", folder.string(), "--checkpoint", to.string(), "--max-steps", "3"});
      ASSERT_EQ(r.status, 0) << name << ": " << r.err;
      expect_words(r.out, {"--keep-best: ", words, "written again when this run's evaluations",
                           "resumed from", "step 2", "best validation accuracy"});
      EXPECT_EQ(r.out.find("(weights in"), std::string::npos) << name << ": " << r.out;
      EXPECT_EQ(fs::exists(best) ? slurp(best) : "", before) << name;
      EXPECT_FALSE(fs::exists(other / "best.safetensors")) << name;
    }
  }
  // A best.safetensors that links to a data file would be written through: refused first.
  const fs::path linked = data / "linked", labels = data / "train-labels-idx1-ubyte";
  fs::remove_all(linked);
  fs::copy(first, linked, fs::copy_options::recursive);
  fs::remove(linked / "best.safetensors");
  fs::create_symlink(labels, linked / "best.safetensors");
  const std::string before = slurp(labels);
  const CliResult r =
      cli({"--resume", linked.string(), "--checkpoint", linked.string(), "--max-steps", "3"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err,
               {"--keep-best " + (linked / "best.safetensors").string(), "is the data file"});
  EXPECT_EQ(slurp(labels), before);
}

}  // namespace
}  // namespace accrue::testing
