// Resuming from the checkpoint alone (issue #52 item 1): --resume DIR takes the flags that shaped
// the run from its checkpoint, refuses a different value naming every difference at once (exit 2,
// before the data is read), lets the outputs, the data's place and the run's length change, and
// refuses another length where a cosine schedule's horizon would move. A checkpoint written
// before the flags were recorded resumes as before. Every file is made here.
#include <fstream>
#include <nlohmann/json.hpp>

#include "mnist_fixture.h"

namespace accrue::testing {
namespace {

// A run with settings far from the defaults: another batch, rate, schedule, seed, optimizer and
// model, so that a resume which took any of them from the defaults would differ.
std::vector<std::string> recipe(const fs::path& data) {
  return {"--data",
          data.string(),
          "--train-limit",
          "384",
          "--micro-batch",
          "8",
          "--accum-steps",
          "3",
          "--lr",
          "0.003",
          "--warmup",
          "2",
          "--seed",
          "7",
          "--optimizer",
          "sgd",
          "--momentum",
          "0.8",
          "--hidden",
          "24,12",
          "--no-shuffle",
          "--threads",
          "1",
          "--quiet"};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// --resume DIR --max-steps N --save W alone gives the bytes of the uninterrupted run, and a
// flag given with the value the run had is no difference.
TEST(Resume, TheCheckpointAloneContinuesTheRunBitForBit) {
  const fs::path data = make_dataset("resume-alone", 384, 64);
  const std::string ckpt = (data / "ckpt").string();
  const std::string whole = (data / "whole.safetensors").string();
  CliResult r = cli(with(recipe(data), {"--max-steps", "10", "--save", whole}));
  ASSERT_EQ(r.status, 0) << r.err;
  r = cli(with(recipe(data), {"--max-steps", "4", "--checkpoint", ckpt}));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string resumed = (data / "resumed.safetensors").string();
  r = cli({"--resume", ckpt, "--max-steps", "10", "--save", resumed, "--quiet"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(resumed), slurp(whole));
  // The same values typed again (0.0030 is 0.003), and the data read from another place.
  const fs::path moved = data / "moved";
  fs::create_directories(moved);
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    fs::copy_file(data / f, moved / f);
  }
  const std::string again = (data / "again.safetensors").string();
  r = cli({"--resume", ckpt, "--max-steps", "10", "--save", again, "--lr", "0.0030", "--optimizer",
           "sgd", "--data", moved.string(), "--quiet"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(again), slurp(whole));
}

// Every flag that shapes the run and differs is named in one line, with the run's value: exit 2
// before any data is read (the data folder is gone by then).
TEST(Resume, EveryDifferenceIsNamedInOneMessage) {
  const fs::path data = make_dataset("resume-differences", 384, 64);
  const std::string ckpt = (data / "ckpt").string();
  ASSERT_EQ(cli(with(recipe(data), {"--max-steps", "3", "--checkpoint", ckpt})).status, 0);
  struct Row {
    std::string name;
    std::vector<std::string> flags, words;
  };
  const std::vector<Row> table{
      {"batch and rate",
       {"--accum-steps", "4", "--lr", "0.001"},
       {"--accum-steps 4 (the run's: --accum-steps 3)", "--lr 0.001 (the run's: --lr 0.003)"}},
      {"a default given another value", {"--clip", "2"}, {"--clip 2 (the run's: the default 1)"}},
      {"a flag the run did not have", {"--schedule", "cosine"}, {"--schedule cosine"}},
      {"a switch", {"--offload-optimizer"}, {"--offload-optimizer (the run's: without it)"}},
      {"model and seed",
       {"--hidden", "32", "--seed", "8"},
       {"--hidden 32 (the run's: --hidden 24,12)", "--seed 8 (the run's: --seed 7)"}},
      {"the subset", {"--train-limit", "256"}, {"--train-limit 256"}},
      {"precision", {"--precision", "fp64"}, {"--precision fp64"}},
  };
  fs::remove(data / "train-images-idx3-ubyte");  // a mistake must be found before the data
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    const CliResult r = cli(with({"--resume", ckpt, "--max-steps", "6", "--quiet"}, row.flags));
    EXPECT_EQ(r.status, 2) << r.err;
    expect_words(r.err, row.words);
    expect_words(r.err, {"--resume " + ckpt, "leave these flags out"});
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// A record edited by hand, or a folder without a readable checkpoint, is refused before the data
// is read (exit 2, naming the file), whether or not --data is given: never a crash, and never the
// default data folder's error instead.
TEST(Resume, BrokenFlagRecordsAreNamedBeforeTheData) {
  const fs::path data = make_dataset("resume-broken", 384, 64);
  const fs::path ckpt = data / "ckpt";
  ASSERT_EQ(cli(with(recipe(data), {"--max-steps", "3", "--checkpoint", ckpt.string()})).status, 0);
  struct Row {
    std::string name;
    nlohmann::json flags;
    std::string words;
  };
  const std::vector<Row> table{
      {"a switch recorded as an empty list",
       {{"--no-shuffle", nlohmann::json::array()}},
       "not an object of non-empty string lists"},
      {"a value that is no list", {{"--lr", "0.001"}}, "'flags'"},
      {"a number", {{"--lr", nlohmann::json::array({0.001})}}, "'flags'"},
  };
  // A copy of the checkpoint folder whose descriptions record `flags`; the resume's result.
  const fs::path broken = data / "broken";
  const auto resume_recording = [&](const nlohmann::json& flags) {
    fs::remove_all(broken);
    fs::copy(ckpt, broken);
    for (const auto& entry : fs::directory_iterator(broken)) {
      if (entry.path().extension() != ".json") continue;
      nlohmann::json j = nlohmann::json::parse(slurp(entry.path()));
      j["flags"] = flags;
      std::ofstream(entry.path(), std::ios::trunc) << j.dump();
    }
    return cli({"--resume", broken.string(), "--quiet"});
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    const CliResult r = resume_recording(row.flags);
    EXPECT_EQ(r.status, 2) << r.err;
    expect_words(r.err, {broken.string(), row.words, "no older intact checkpoint"});
  }
  // Records that parse but hold what the command line refuses: named as the checkpoint's.
  const std::vector<Row> refused{
      {"an empty value", {{"--data", {""}}}, "--data: the value is empty (--data: from the"},
      {"a flag its optimizer does not take",
       {{"--optimizer", {"adam"}}, {"--momentum", {"0.5"}}},
       "(--optimizer, --momentum: from the"},
      {"a value the program's own check refuses",
       {{"--hidden", {"32,"}}},
       "--hidden: '' in '32,' is not an integer"},
      {"two flags the program's own check finds at odds",
       {{"--model", {"cnn"}}, {"--norm", {"none"}}, {"--zero", {"3"}}},
       "(--zero, --model: from the"},
  };
  for (const Row& row : refused) {
    SCOPED_TRACE(row.name);
    const CliResult r = resume_recording(row.flags);
    EXPECT_EQ(r.status, 2) << r.err;
    expect_words(r.err, {row.words, "checkpoint in " + broken.string() + ")"});
  }
  fs::create_directories(data / "empty");
  const CliResult r = cli({"--resume", (data / "empty").string(), "--quiet"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err, {"no checkpoint (step-*.json) in it"});
}

// A newest checkpoint whose flags record is broken is passed over for the model's settings too:
// the run names its damage and the older intact checkpoint, not a difference the broken one
// records (its config edited to another --hidden).
TEST(Resume, TheModelsSettingsComeFromTheCheckpointTheFlagsCameFrom) {
  const fs::path data = make_dataset("resume-newest-broken", 384, 64);
  const fs::path ckpt = data / "ckpt";
  ASSERT_EQ(cli(with(recipe(data), {"--max-steps", "4", "--checkpoint", ckpt.string(),
                                    "--checkpoint-every", "2"}))
                .status,
            0);
  const fs::path newest = ckpt / "step-0000000004.json";
  nlohmann::json j = nlohmann::json::parse(slurp(newest));
  j["flags"] = "garbage";
  j["config"]["hidden"] = {64};
  std::ofstream(newest, std::ios::trunc) << j.dump();
  const CliResult r = cli({"--resume", ckpt.string(), "--max-steps", "6", "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {newest.string(), "'flags' is \"garbage\"", "step-0000000002 is intact"});
  EXPECT_EQ(r.err.find("hidden"), std::string::npos) << r.err;
}

// Other data under the same name, or a cosine run made longer, is refused after the data is read
// (exit 1), naming the data's hash or the horizon; a constant schedule may run longer.
TEST(Resume, OtherDataAndAMovedCosineHorizonAreRefused) {
  const fs::path data = make_dataset("resume-horizon", 384, 64);
  const std::string cosine = (data / "cosine").string(), constant = (data / "constant").string();
  ASSERT_EQ(cli(with(recipe(data), {"--epochs", "1", "--schedule", "cosine", "--checkpoint", cosine,
                                    "--max-steps", "5"}))
                .status,
            0);
  CliResult r = cli({"--resume", cosine, "--max-steps", "0", "--quiet"});  // the whole epoch
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"cosine schedule decays to 0 at step 5", "this run's at step 16",
                       "keeps the length it began with"});
  ASSERT_EQ(cli(with(recipe(data), {"--epochs", "1", "--checkpoint", constant, "--max-steps", "5"}))
                .status,
            0);
  r = cli({"--resume", constant, "--epochs", "2", "--max-steps", "20", "--quiet"});
  EXPECT_EQ(r.status, 0) << r.err;
  write_fixture(data, "train", 384, 99);  // other samples, the same count
  r = cli({"--resume", constant, "--epochs", "3", "--max-steps", "0", "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"data_hash"});
}

// A checkpoint without the record of its flags (written before they were kept) resumes as before:
// the command gives the flags, and every resolved setting that differs is named.
TEST(Resume, ACheckpointWithoutItsFlagsResumesAsBefore) {
  const fs::path data = make_dataset("resume-older", 384, 64);
  const std::string ckpt = (data / "ckpt").string();
  const std::string whole = (data / "whole.safetensors").string();
  ASSERT_EQ(cli(with(recipe(data), {"--max-steps", "6", "--save", whole})).status, 0);
  ASSERT_EQ(cli(with(recipe(data), {"--max-steps", "3", "--checkpoint", ckpt})).status, 0);
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    if (entry.path().extension() != ".json") continue;
    nlohmann::json j = nlohmann::json::parse(slurp(entry.path()));
    ASSERT_TRUE(j.contains("flags"));
    j.erase("flags");
    for (const char* later : {"device_type", "data_hash", "horizon"}) j["config"].erase(later);
    std::ofstream(entry.path(), std::ios::trunc) << j.dump(2);
  }
  // The model's settings are compared first, before the model is built; then the rest.
  CliResult r = cli({"--resume", ckpt, "--data", data.string(), "--max-steps", "6", "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"hidden = [24,12], this run has [512,256,128]"});
  r = cli({"--resume", ckpt, "--data", data.string(), "--hidden", "24,12", "--max-steps", "6",
           "--quiet"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"accum_steps = 3, this run has 4", "lr = 0.003, this run has 0.001",
                       "seed = 7, this run has 0"});
  // Another training subset is named as such (D13), not as a position the plan does not reach.
  std::vector<std::string> subset = recipe(data);
  *(std::find(subset.begin(), subset.end(), "--train-limit") + 1) = "192";
  r = cli(with(subset, {"--resume", ckpt, "--max-steps", "6"}));
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"train_samples = 384, this run has 192"});
  EXPECT_EQ(r.err.find("position"), std::string::npos) << r.err;
  const std::string resumed = (data / "resumed.safetensors").string();
  r = cli(with(recipe(data), {"--resume", ckpt, "--max-steps", "6", "--save", resumed}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(resumed), slurp(whole));
}

}  // namespace
}  // namespace accrue::testing
