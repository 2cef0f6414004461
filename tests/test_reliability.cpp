// What a hostile user or a cluster does to a run (issue #22), one table per kind: outputs that are
// devices, links, sockets or each other; checkpoint folders of another run or locked by a live
// one; checkpoint descriptions edited by hand; a run stopped by a real signal and resumed; a file
// beyond `ulimit -f`; a finished run resumed; metrics continued across a resume. The multi-rank
// cases (ranks that disagree, a stop on two ranks, BatchNorm buffers) are in test_dist.cpp and
// tests/dist/. Every file is made here; every row names the words its message must contain.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "distributed/communicator.h"
#include "mnist_fixture.h"
#include "optim/safetensors.h"
#include "train/checkpoint.h"
#include "train/report.h"
#include "train/signals.h"

namespace accrue::testing {
namespace {

std::vector<nlohmann::json> records(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<int64_t> steps_in(const std::vector<nlohmann::json>& recs) {
  std::vector<int64_t> steps;
  for (const auto& r : recs) {
    if (r.contains("step")) steps.push_back(r["step"].get<int64_t>());
  }
  return steps;
}

std::vector<int64_t> one_to(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

bool is_root() {
  return ::geteuid() == 0;
}

// A device node made with mknod (as root, as CI runs; false where it is not allowed).
bool make_node(const fs::path& path, mode_t type, int major, int minor) {
  return ::mknod(path.c_str(), type | 0666, makedev(major, minor)) == 0;
}

// The short run of the cases: 512 samples, micro-batch 8 x k 2, one thread.
std::vector<std::string> short_run(const fs::path& data, const std::string& hidden = "16",
                                   const std::string& epochs = "1") {
  return {"--data",        data.string(), "--train-limit", "512", "--epochs",  epochs,
          "--micro-batch", "8",           "--accum-steps", "2",   "--threads", "1",
          "--hidden",      hidden,        "--quiet"};
}

// The same as a Config, for the runs driven through the engine's callbacks.
mnist::Config short_config(const fs::path& data) {
  mnist::Config c;
  c.data = data.string();
  c.hidden = {16};
  c.quiet = true;
  c.threads = 1;
  c.micro_batch = 8;
  c.accum_steps = 2;
  return c;
}

CliResult run(const fs::path& data, std::vector<std::string> more) {
  std::vector<std::string> args = short_run(data);
  args.insert(args.end(), more.begin(), more.end());
  return cli(args);
}

// ---- outputs ----

// Regular files through links: the link stays, its target is replaced. Folders, sockets and
// block devices are refused with exit 2 before any data is read.
TEST(Reliability, LinksAreFollowedAndNonFilesRefused) {
  const fs::path data = make_dataset("outputs", 512, 64);
  const fs::path dir = temp_dir("outputs-out");
  // A link to a regular file: the target gets the weights, the link stays a link.
  const fs::path target = dir / "real.safetensors";
  std::ofstream(target) << "old";
  fs::create_symlink(target, dir / "link.safetensors");
  CliResult r = run(data, {"--save", (dir / "link.safetensors").string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir / "link.safetensors"));
  EXPECT_NO_THROW(optim::read_safetensors(target.string()));
  // A dangling link: its target is created.
  fs::create_symlink(dir / "made.jsonl", dir / "dangling.jsonl");
  r = run(data, {"--metrics", (dir / "dangling.jsonl").string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir / "dangling.jsonl"));
  EXPECT_FALSE(records(dir / "made.jsonl").empty());

  // A socket and a folder: exit 2, before the data is read.
  const fs::path socket_path = dir / "sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", socket_path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  struct Row {
    std::vector<std::string> args;
    std::vector<std::string> words;
  };
  std::vector<Row> refused{
      {{"--metrics", socket_path.string()}, {"--metrics", "is a socket"}},
      {{"--save", socket_path.string()}, {"--save", "is a socket"}},
      {{"--metrics", dir.string()}, {"--metrics", "is a directory"}},
  };
  if (make_node(dir / "block", S_IFBLK, 7, 0)) {
    refused.push_back({{"--save", (dir / "block").string()}, {"--save", "is a block device"}});
  }
  for (const Row& row : refused) {
    SCOPED_TRACE(row.args[0] + " " + row.args[1]);
    const CliResult bad = cli({"--data", "/nonexistent-accrue", row.args[0], row.args[1]});
    EXPECT_EQ(bad.status, 2) << bad.err;
    expect_words(bad.err, row.words);
  }
  ::close(fd);
  fs::remove_all(dir);
}

// Character devices and FIFOs are written directly: /dev/null discards, /dev/full fails with
// exit 1 naming the file; a FIFO's reader gets every record, a FIFO without one is refused at
// once, and one whose reader leaves is a failed write, not death by SIGPIPE.
TEST(Reliability, DevicesAndFifosAreWrittenDirectly) {
  const fs::path data = make_dataset("streams", 512, 64);
  const fs::path dir = temp_dir("streams-out");
  CliResult r;
  // Character devices: made with mknod (root, as CI runs), else the system's own.
  fs::path null_device = dir / "null", full_device = dir / "full";
  if (!make_node(null_device, S_IFCHR, 1, 3) || !make_node(full_device, S_IFCHR, 1, 7)) {
    null_device = "/dev/null";
    full_device = "/dev/full";
  }
  fs::create_symlink(null_device, dir / "null-link");
  for (const fs::path& sink : {null_device, dir / "null-link"}) {
    r = run(data, {"--metrics", sink.string(), "--save", sink.string()});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(fs::is_character_file(sink)) << sink << " was replaced";
  }
  for (const char* flag : {"--metrics", "--save"}) {
    r = run(data, {flag, full_device.string()});
    EXPECT_EQ(r.status, 1) << flag << ": " << r.err;
    expect_words(r.err, {full_device.string(), "No space left on device"});
    EXPECT_TRUE(fs::is_character_file(full_device));
  }
  // A FIFO with a reader gets every record as it is written.
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string piped;
  std::thread reader([&] { piped = slurp(fifo); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the reader is there
  r = run(data, {"--metrics", fifo.string()});
  reader.join();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(piped.find("\"event\":\"summary\""), std::string::npos) << piped;
  // No reader: refused at once (never an open() that waits with signals unheard).
  r = run(data, {"--metrics", fifo.string()});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {fifo.string(), "no process is reading"});
  // A reader that leaves after 10 bytes: a failed write naming the file, not death by SIGPIPE.
  // The reader shrinks the pipe's buffer to one page, which the saved weights (51 KB) overflow,
  // so the writer is still writing when the reader has gone, whatever the timing.
  std::thread quitter([&] {
    const int in = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // no writer yet: no wait
    ::fcntl(in, F_SETPIPE_SZ, 4096);
    char ten[10];
    while (::read(in, ten, sizeof ten) <= 0) {  // EOF or EAGAIN until the run writes
    }
    ::close(in);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the reader is there
  r = run(data, {"--save", fifo.string()});
  quitter.join();
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {fifo.string(), "Broken pipe"});
  fs::remove_all(dir);
}

// Every output path is checked, and against the others, before the data is read.
TEST(Reliability, OutputPathsAreCheckedBeforeTheDataIsRead) {
  const fs::path dir = temp_dir("output-paths");
  std::ofstream(dir / "file") << "x";
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  fs::create_directories(dir / "ck");
  fs::create_symlink(dir / "loop-b", dir / "loop-a");
  fs::create_symlink(dir / "loop-a", dir / "loop-b");
  const std::string same = (dir / "out").string();
  struct Row {
    std::vector<std::string> args;
    std::vector<std::string> words;
  };
  std::vector<Row> table{
      {{"--checkpoint", (dir / "file").string()}, {"--checkpoint", "not a folder"}},
      {{"--checkpoint", (dir / "file/sub").string()}, {"--checkpoint", "not a folder"}},
      {{"--checkpoint", (dir / "loop-a").string()}, {"--checkpoint", "loop-a", "symbolic links"}},
      {{"--save", (dir / "loop-a").string()}, {"--save", "loop-a", "symbolic links"}},
      {{"--checkpoint", same, "--metrics", same}, {"--metrics", "--checkpoint", "the same file"}},
      {{"--save", same, "--metrics", same}, {"--metrics", "--save", "the same file"}},
      {{"--save", same, "--metrics", (dir / "." / "out").string()}, {"the same file"}},
      {{"--save", (dir / "file/w.safetensors").string()}, {"--save", "Not a directory"}},
      {{"--metrics", "rel-out", "--save", "./rel-out"}, {"--metrics", "--save", "the same file"}},
      {{"--metrics", "rel-ckpt", "--checkpoint", "./rel-ckpt/"}, {"the same file"}},
      {{"--checkpoint", (dir / "ck").string(), "--metrics",
        (dir / "ck/step-0000000032.json").string()},
       {"--metrics", "the checkpoint writer's own file"}},
      {{"--checkpoint", (dir / "ck").string(), "--save", (dir / "ck/.lock").string()},
       {"--save", "the checkpoint writer's own file"}},
      {{"--save", (dir / "file").string(), "--init", (dir / "file").string()},
       {"--save", "is the --init file"}},
      {{"--save", (dir / std::string(250, 'w')).string()},
       {"--save", "leave room for its temporary"}},
      {{"--checkpoint", (dir / "dangling").string()}, {"--checkpoint", "symbolic link to nothing"}},
      {{"--checkpoint", ""}, {"--checkpoint", "empty"}},
      {{"--save", ""}, {"--save", "empty"}},
      {{"--metrics", ""}, {"--metrics", "empty"}},
  };
  if (!is_root()) {  // root writes into any folder
    fs::create_directories(dir / "read-only");
    fs::permissions(dir / "read-only", fs::perms::owner_read | fs::perms::owner_exec);
    table.push_back(
        {{"--checkpoint", (dir / "read-only").string()}, {"--checkpoint", "Permission denied"}});
  }
  for (const Row& row : table) {
    std::vector<std::string> args = row.args;
    args.insert(args.end(), {"--data", "/nonexistent-accrue"});
    const CliResult r = cli(args);
    SCOPED_TRACE(row.args[0] + " " + row.args[1]);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.find("nonexistent-accrue"), std::string::npos) << "read data: " << r.err;
    expect_words(r.err, row.words);
  }
  fs::permissions(dir, fs::perms::all);
  fs::remove_all(dir);
}

// A write beyond `ulimit -f` fails like a full disk: exit 1 naming the file, the previous file
// intact, no temporary left (not death by SIGXFSZ, exit 153). Run as a child process: the limit
// is the process's.
TEST(Reliability, AFileBeyondUlimitFIsAFailedWriteNotADeath) {
  const fs::path data = make_dataset("ulimit", 512, 64);
  const fs::path dir = temp_dir("ulimit-out");
  for (const char* flag : {"--save", "--metrics", "--checkpoint"}) {
    const bool folder = std::string(flag) == "--checkpoint";
    const fs::path out = dir / (folder ? "ckpt" : "out");
    if (!folder) std::ofstream(out) << "previous";
    std::string command = "ulimit -f 4; '" ACCRUE_MNIST_BINARY "'";
    for (const std::string& a : short_run(data, "256")) command += " '" + a + "'";
    command +=
        std::string(" ") + flag + " '" + out.string() + "' 2>'" + (dir / "err").string() + "'";
    const int status = std::system(command.c_str());
    SCOPED_TRACE(flag);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 1);
    const std::string err = slurp(dir / "err");
    expect_words(err, {"File too large"});
    if (!folder) {
      EXPECT_EQ(slurp(out), "previous");
      expect_words(err, {out.string()});
    }
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
    }
  }
  fs::remove_all(dir);
}

// Minor cases: the fetch hint only where the script could put the files; temporaries a killed
// writer left beside an output go with the next good write.
TEST(Reliability, HintsAndLeftoverTemporaries) {
  const fs::path data = make_dataset("minor", 512, 64);
  const fs::path file = data / "not-a-folder";
  std::ofstream(file) << "x";
  for (const fs::path& where : {file, data / "missing"}) {
    const CliResult r = cli({"--data", where.string(), "--quiet"});
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.err.find("fetch the data") == std::string::npos, where == file) << r.err;
  }
  const fs::path save = data / "w.safetensors";
  std::ofstream(save.string() + ".tmp.Ab12Cd") << "left by a killed run";
  std::ofstream(save.string() + ".tmp.keep") << "not a temporary of ours";
  const CliResult r = run(data, {"--save", save.string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(save.string() + ".tmp.Ab12Cd"));
  EXPECT_TRUE(fs::exists(save.string() + ".tmp.keep"));
}

// ---- checkpoint folders ----

// A folder holding another run's checkpoints is refused (exit 2) unless --resume continues that
// run; a folder another live run holds is refused (exit 1); the lock dies with its process.
TEST(Reliability, ACheckpointFolderBelongsToOneRun) {
  const fs::path data = make_dataset("run-id", 512, 64);
  const std::string ckpt = (data / "ckpt").string();
  CliResult r = run(data, {"--checkpoint", ckpt, "--checkpoint-every", "4", "--max-steps", "12"});
  ASSERT_EQ(r.status, 0) << r.err;
  // A new run into the same folder, with fewer steps (it would have pruned the old run's).
  r = run(data, {"--checkpoint", ckpt, "--max-steps", "4"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err, {"--checkpoint", "holds checkpoints of another run", "--resume"});
  // Continuing that run into its own folder is fine.
  r = run(data, {"--checkpoint", ckpt, "--resume", ckpt, "--max-steps", "16"});
  EXPECT_EQ(r.status, 0) << r.err;
  // A live writer's lock.
  const fs::path other = data / "locked";
  {
    train::CheckpointLock held(other.string());
    r = run(data, {"--checkpoint", other.string()});
    EXPECT_EQ(r.status, 1) << r.err;
    expect_words(r.err, {"--checkpoint", "another run is writing into it"});
  }
  // A writer killed with SIGKILL leaves no lock behind (the kernel drops it) and its
  // temporaries go when the next run takes the folder.
  std::ofstream(other / "step-0000000002.json.tmp.AbCdEf") << "{";
  const pid_t child = ::fork();
  if (child == 0) {
    train::CheckpointLock lock(other.string());
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_NO_THROW(train::CheckpointLock(other.string()));
  EXPECT_FALSE(fs::exists(other / "step-0000000002.json.tmp.AbCdEf"));
}

// Integers are decimal: "010" is ten steps, not eight (CLI11 reads a leading 0 as octal).
TEST(Reliability, ALeadingZeroIsDecimal) {
  const fs::path data = make_dataset("octal", 512, 64);
  const fs::path metrics = data / "m.jsonl";
  const CliResult r = run(data, {"--max-steps", "010", "--metrics", metrics.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(records(metrics).back()["steps"], 10);
}

// Resuming elsewhere into a folder holding later checkpoints of the same run is refused (the
// new ones would be pruned at once); resuming into the folder itself with a damaged newest
// checkpoint names the damage (exit 1), not "another run".
TEST(Reliability, ResumeFoldersAreCheckedAgainstEachOther) {
  const fs::path data = make_dataset("resume-folders", 512, 64);
  const std::string a = (data / "a").string(), b = (data / "b").string();
  ASSERT_EQ(run(data, {"--checkpoint", a, "--checkpoint-every", "4", "--max-steps", "8"}).status,
            0);
  fs::copy(a, b);
  ASSERT_EQ(run(data, {"--checkpoint", b, "--resume", b, "--max-steps", "12"}).status, 0);
  CliResult r = run(data, {"--resume", a, "--checkpoint", b, "--max-steps", "10"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err, {"--checkpoint " + b, "later checkpoint of the same run"});
  std::ofstream(data / "b" / "step-0000000012.json", std::ios::trunc) << "{";
  std::ofstream(data / "b" / "step-notes.tmp.keep") << "a user's file";
  r = run(data, {"--resume", b, "--checkpoint", b, "--max-steps", "16"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"step-0000000012.json", "not JSON", "step-0000000008 is intact"});
  EXPECT_TRUE(fs::exists(data / "b" / "step-notes.tmp.keep"));
}

// A checkpoint folder of another layout is refused before the data is read (D2, D11): stage
// folders for a run without --pipeline, a run's own checkpoints or another run's stage for a
// pipelined one (launched as 2 ranks: the launcher's environment), with advice that names the
// folder itself.
TEST(Reliability, ACheckpointFolderOfAnotherLayoutIsRefused) {
  const fs::path data = make_dataset("ckpt-layout", 512, 64);
  const fs::path single = data / "single", piped = data / "piped";
  ASSERT_EQ(run(data, {"--checkpoint", single.string(), "--max-steps", "2"}).status, 0);
  fs::create_directories(piped);
  fs::copy(single, piped / "stage-1");  // another run's checkpoints as a stage's
  CliResult r = run(data, {"--checkpoint", piped.string(), "--max-steps", "2"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err, {"--checkpoint " + piped.string(), "a pipelined run's checkpoints (stage-1)",
                       "--resume " + piped.string()});
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  r = run(data, {"--checkpoint", piped.string(), "--pipeline", "2", "--max-steps", "2"});
  const CliResult into_single =
      run(data, {"--checkpoint", single.string(), "--pipeline", "2", "--max-steps", "2"});
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err, {"(its stage-1): holds checkpoints of another run",
                       "continue that run with --resume " + piped.string() + ","});
  EXPECT_EQ(into_single.status, 2) << into_single.err;
  expect_words(into_single.err, {"a run without --pipeline", "--pipeline 2"});
  EXPECT_FALSE(fs::exists(single / "stage-0"));
  // ZeRO-3's per-rank folders: refused for a run without --zero 3, and a run's own checkpoints
  // for one with it; --resume of the folder alone reads the flags of rank 0's.
  const fs::path sharded = data / "sharded";
  fs::create_directories(sharded);
  fs::copy(single, sharded / "rank-0-of-2");
  r = run(data, {"--checkpoint", sharded.string(), "--max-steps", "2"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(
      r.err, {"--checkpoint " + sharded.string(),
              "a ZeRO-3 run's per-rank checkpoints (rank-0-of-2)", "--resume " + sharded.string()});
  r = run(data, {"--checkpoint", single.string(), "--zero", "3", "--max-steps", "2"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_words(r.err, {"a run without --zero 3", "one per rank"});
  // Its flags (a run without --zero: the copy above) read, the engine names the layout.
  r = run(data, {"--resume", sharded.string(), "--max-steps", "3"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {"--resume " + sharded.string(), "per-rank checkpoints (rank-0-of-2",
                       "this run has --zero 0"});
}

// Every field of a checkpoint's JSON is checked: exit 1 naming the file and the field, and the
// older intact checkpoint.
// A run of 10 steps checkpointed at steps 5 and 10 in data / "ckpt"; its folder.
fs::path checkpointed_run(const fs::path& data) {
  const fs::path ckpt = data / "ckpt";
  const CliResult r =
      run(data, {"--checkpoint", ckpt.string(), "--checkpoint-every", "5", "--max-steps", "10"});
  EXPECT_EQ(r.status, 0) << r.err;
  return ckpt;
}

TEST(Reliability, EditedCheckpointDescriptionsAreRefused) {
  const fs::path data = make_dataset("ckpt-json", 512, 64);
  const fs::path ckpt = checkpointed_run(data);
  CliResult r;
  const fs::path json = ckpt / "step-0000000010.json";
  const std::string good = slurp(json);
  struct Row {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> words;
  };
  const std::vector<Row> table{
      {"step as a string",
       [](auto& j) { j["position"]["step"] = "10"; },
       {"'step'", "not an integer"}},
      {"step 1e30", [](auto& j) { j["position"]["step"] = 1e30; }, {"'step'", "not an integer"}},
      {"step 10 -> 3", [](auto& j) { j["position"]["step"] = 3; }, {"'step' is 3", "[10, 10]"}},
      {"window -3", [](auto& j) { j["position"]["window"] = -3; }, {"'window' is -3"}},
      {"epoch -1", [](auto& j) { j["position"]["epoch"] = -1; }, {"'epoch' is -1"}},
      {"window moved",
       [](auto& j) { j["position"]["window"] = 3; },
       {"position step 10, epoch 0, window 3", "not one this run reaches"}},
      {"epoch moved", [](auto& j) { j["position"]["epoch"] = 1; }, {"not one this run reaches"}},
      {"epoch 1e9", [](auto& j) { j["position"]["epoch"] = 1000000000; }, {"epoch 1000000000"}},
      {"skipped > step", [](auto& j) { j["position"]["skipped"] = 11; }, {"'skipped' is 11"}},
      {"skipped edited",
       [](auto& j) { j["position"]["skipped"] = 2; },
       {"with 2 skipped", "applied 10 updates"}},
      {"position missing", [](auto& j) { j.erase("position"); }, {"'position'"}},
      {"epoch loss a string",
       [](auto& j) { j["position"]["epoch_loss"] = "1.5"; },
       {"'epoch_loss' is", "1.5", "a number, or \"nan\""}},
      {"epoch loss not finite (null)",
       [](auto& j) { j["position"]["epoch_loss"] = nullptr; },
       {"'epoch_loss' is null"}},
      {"epoch loss missing",
       [](auto& j) { j["position"].erase("epoch_loss"); },
       {"'epoch_loss' is missing"}},
      {"epoch items -1",
       [](auto& j) { j["position"]["epoch_items"] = -1; },
       {"'epoch_items' is -1"}},
      {"epoch items 2^63 - 1",
       [](auto& j) { j["position"]["epoch_items"] = INT64_MAX; },
       {"position epoch_items is 9223372036854775807, but the 10 windows of epoch 0 before it "
        "hold 160 items"}},
      {"config a list", [](auto& j) { j["config"] = nlohmann::json::array(); }, {"'config'"}},
      {"tensors elsewhere", [](auto& j) { j["tensors"] = "../x.safetensors"; }, {"'tensors'"}},
      {"bytes a string", [](auto& j) { j["bytes"] = "many"; }, {"'bytes'", "not an integer"}},
      {"hash a number", [](auto& j) { j["fnv1a"] = 5; }, {"'fnv1a'", "not a string"}},
      {"format", [](auto& j) { j["format"] = "other"; }, {"format \"other\""}},
      {"run id a number", [](auto& j) { j["run_id"] = 7; }, {"'run_id'"}},
      {"best a string", [](auto& j) { j["best"] = "x"; }, {"best", "not {value"}},
      {"best value a string",
       [](auto& j) {
         j["best"] = {{"key", "k"}, {"value", "0.5"}, {"step", 5}, {"evaluations_since", 0}};
       },
       {"best", "not {value"}},
      {"best after the position",
       [](auto& j) {
         j["best"] = {{"key", "k"}, {"value", 0.5}, {"step", 11}, {"evaluations_since", 0}};
       },
       {"best: 'step' is 11", "[0, 10]"}},
      {"best without its key",
       [](auto& j) {
         j["best"] = {{"value", 0.5}, {"step", 5}, {"evaluations_since", 0}};
       },
       {"'key' is missing"}},
      {"flags not lists",
       [](auto& j) {
         j["flags"] = {{"--lr", "0.1"}};
       },
       {"'flags'"}},
      {"not an object", [](auto& j) { j = nlohmann::json::array(); }, {"not an object"}},
      {"nested 100 deep",
       [](auto& j) {
         nlohmann::json deep = 1;
         for (int i = 0; i < 100; ++i) deep = nlohmann::json::array({deep});
         j["config"]["lr"] = deep;
       },
       {"not JSON", "nested more than 64 levels"}},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    nlohmann::json j = nlohmann::json::parse(good);
    row.edit(j);
    std::ofstream(json, std::ios::trunc) << j.dump();
    r = run(data, {"--resume", ckpt.string(), "--max-steps", "12"});
    EXPECT_EQ(r.status, 1) << r.err;
    expect_words(r.err, {json.string(), "step-0000000005 is intact"});
    expect_words(r.err, row.words);
  }
  std::ofstream(json, std::ios::trunc) << good;
  r = run(data, {"--resume", ckpt.string(), "--max-steps", "12"});
  EXPECT_EQ(r.status, 0) << r.err;
}

// A run whose losses overflow (a skipped step's loss is NaN, and the epoch's sum with it) resumes
// from its own checkpoint: the sum is written "nan" (JSON has no NaN; it was null, which the
// reader refused as damage).
TEST(Reliability, ARunWhoseLossesOverflowResumesFromItsOwnCheckpoint) {
  const fs::path data = make_dataset("ckpt-nan-loss", 512, 64);
  const fs::path ckpt = data / "ckpt";
  const std::vector<std::string> diverging = {"--optimizer", "sgd", "--lr", "1e15", "--clip", "0"};
  std::vector<std::string> first = diverging;
  first.insert(first.end(),
               {"--checkpoint", ckpt.string(), "--checkpoint-every", "2", "--max-steps", "4"});
  CliResult r = run(data, first);
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(ckpt / "step-0000000004.json"));
  EXPECT_EQ(j["position"]["epoch_loss"], "nan") << j["position"];
  r = run(data, {"--resume", ckpt.string(), "--max-steps", "6"});
  EXPECT_EQ(r.status, 0) << r.err;
}

// A checkpoint's tensors hold what a run writes: finite weights and moments, second moments that
// are not negative, only the model's and the optimizer's tensors. Edited ones (with the file's
// size and hash in the description made to match) are refused naming the tensor: exit 1, and the
// older intact checkpoint.
TEST(Reliability, EditedCheckpointTensorsAreRefused) {
  const fs::path data = make_dataset("ckpt-tensors", 512, 64);
  const fs::path ckpt = checkpointed_run(data);
  CliResult r;
  const fs::path json = ckpt / "step-0000000010.json",
                 tensors = ckpt / "step-0000000010.safetensors";
  const std::string good_json = slurp(json), good_tensors = slurp(tensors);
  const auto first_value = [](float v) {
    return [v](std::map<std::string, Tensor>& m, const std::string& name) {
      m.at(name).data<float>()[0] = v;
    };
  };
  struct Row {
    std::string name;
    std::function<void(std::map<std::string, Tensor>&)> edit;
    std::vector<std::string> words;
  };
  const std::vector<Row> table{
      {"nan weight",
       [&](auto& m) { first_value(NAN)(m, "model/layers.0.weight"); },
       {"'model/layers.0.weight' holds nan at element 0"}},
      {"inf first moment",
       [&](auto& m) { first_value(INFINITY)(m, "optimizer/exp_avg"); },
       {"'optimizer/exp_avg' holds inf"}},
      {"negative second moment",
       [&](auto& m) { first_value(-1)(m, "optimizer/exp_avg_sq"); },
       {"'optimizer/exp_avg_sq' holds -1", "not negative"}},
      {"a stray tensor",
       [](auto& m) { m.emplace("junk", Tensor::zeros({1})); },
       {"'junk' belongs to neither the model nor the optimizer"}},
      {"a stray optimizer tensor",
       [](auto& m) { m.emplace("optimizer/junk_state", Tensor::zeros({3})); },
       {"optimizer state has 'junk_state' (float32[3] on cpu), which this optimizer does not "
        "keep"}},
      {"steps as float32",
       [](auto& m) { m.at("optimizer/steps") = Tensor::from_vector<float>({}, {1e30f}); },
       {"'optimizer/steps' is float32[]", "not one int32"}},
      {"a tensor the model lacks",
       [](auto& m) { m.emplace("model/extra", Tensor::zeros({1})); },
       {"has 'extra'", "which the model does not"}},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.name);
    std::ofstream(tensors, std::ios::trunc | std::ios::binary) << good_tensors;
    std::map<std::string, Tensor> m = optim::read_safetensors(tensors.string());
    row.edit(m);
    optim::save_safetensors(tensors.string(), {m.begin(), m.end()});
    const std::string bytes = slurp(tensors);
    uint64_t hash = 1469598103934665603ull;  // FNV-1a, as the checkpoint writes it
    for (unsigned char b : bytes) hash = (hash ^ b) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    nlohmann::json j = nlohmann::json::parse(good_json);
    j["bytes"] = bytes.size();
    j["fnv1a"] = hex;
    std::ofstream(json, std::ios::trunc) << j.dump();
    r = run(data, {"--resume", ckpt.string(), "--max-steps", "12"});
    EXPECT_EQ(r.status, 1) << r.err;
    expect_words(r.err, row.words);
    expect_words(r.err, {"step-0000000005 is intact"});
  }
  std::ofstream(json, std::ios::trunc) << good_json;
  std::ofstream(tensors, std::ios::trunc | std::ios::binary) << good_tensors;
  r = run(data, {"--resume", ckpt.string(), "--max-steps", "12"});
  EXPECT_EQ(r.status, 0) << r.err;
}

// ---- stopping and resuming ----

// A real SIGTERM (SIGINT, SIGUSR1) raised during step 3: the window in progress finishes, the
// run writes a checkpoint at step 4 and its metrics, and ends with status 75; --resume then
// continues bit for bit, its metrics continuing the file.
TEST(Reliability, ASignalStopsAfterTheWindowWithACheckpoint) {
  const fs::path data = make_dataset("signal", 512, 64);
  mnist::Config c = short_config(data);
  c.epochs = 2;
  c.max_steps = 40;
  c.seed = 3;
  c.save = (data / "whole.safetensors").string();
  train_recorded(c, std::cout);
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) {
    SCOPED_TRACE(train::signal_name(signal));
    const fs::path ckpt = data / ("ckpt-" + std::to_string(signal));
    mnist::Config s = c;
    s.save = (data / "resumed.safetensors").string();
    s.checkpoint = ckpt.string();
    s.metrics = (data / ("m-" + std::to_string(signal) + ".jsonl")).string();
    train::Callbacks callbacks;
    callbacks.on_step = [&](const train::StepEvent& e) {
      if (e.step == 3) ::raise(signal);
    };
    try {
      mnist::train(s, std::cout, callbacks);
      ADD_FAILURE() << "the run did not stop";
    } catch (const train::Stopped& e) {
      expect_words(e.what(), {"stopped by " + train::signal_name(signal), "after step 4",
                              "--resume " + ckpt.string()});
    }
    EXPECT_TRUE(fs::exists(ckpt / "step-0000000004.json"));
    EXPECT_FALSE(fs::exists(s.save)) << "an unfinished run saves no final weights";
    EXPECT_EQ(steps_in(records(s.metrics)), one_to(4));
    s.resume = ckpt.string();
    train_recorded(s, std::cout);
    EXPECT_EQ(read_file_bytes(s.save), read_file_bytes(c.save));
    EXPECT_EQ(steps_in(records(s.metrics)), one_to(40)) << "the records continue, none twice";
    fs::remove(s.save);
  }
  // Through the command line: the documented status, and without --checkpoint the metrics.
  const std::string metrics = (data / "cli.jsonl").string();
  mnist::Config s = c;
  s.save.clear();
  s.metrics = metrics;
  train::Callbacks callbacks;
  callbacks.on_step = [](const train::StepEvent& e) {
    if (e.step == 2) ::raise(SIGTERM);
  };
  EXPECT_THROW(mnist::train(s, std::cout, callbacks), train::Stopped);
  EXPECT_EQ(steps_in(records(metrics)), one_to(3));
}

// The program: SIGTERM from outside (as a cluster sends it) ends a long run with status 75, a
// checkpoint and one line saying how to continue.
TEST(Reliability, SigtermEndsTheProgramWithStatus75) {
  const fs::path data = make_dataset("sigterm", 512, 64);
  const fs::path ckpt = data / "ckpt";
  // The signal once the run holds its checkpoint folder's lock (its handlers are in place by
  // then), and a second of training later.
  std::string command = "'" ACCRUE_MNIST_BINARY "'";
  for (const std::string& a : short_run(data, "16", "100000")) command += " '" + a + "'";
  command += " --checkpoint '" + ckpt.string() + "' 2>'" + (data / "err").string() +
             "' & pid=$!; n=0; while [ ! -e '" + (ckpt / ".lock").string() +
             "' ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done; sleep 1; " +
             "kill -TERM $pid; wait $pid";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), train::kExitStopped);
  const std::string err = slurp(data / "err");
  expect_words(err, {"stopped by SIGTERM after step", "continue with --resume " + ckpt.string()});
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  bool checkpoint = false;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    checkpoint |= e.path().extension() == ".json";
  }
  EXPECT_TRUE(checkpoint);
}

// The program: a refused command line writes nothing, not even ACCRUE_PROFILE's trace at exit
// (it once wrote it to the very path refused: a data file, or a good file --save also named).
TEST(Reliability, ARefusedCommandWritesNoProfileTrace) {
  const fs::path data = make_dataset("refused-trace", 64, 16);
  const fs::path labels = data / "train-labels-idx1-ubyte", good = data / "good.safetensors";
  std::ofstream(good) << "the user's weights";
  for (const auto& [trace, more] : std::vector<std::pair<fs::path, std::string>>{
           {labels, ""}, {good, " --save '" + good.string() + "'"}}) {
    const std::string before = slurp(trace);
    const std::string command = "ACCRUE_PROFILE=1 ACCRUE_PROFILE_JSON='" + trace.string() +
                                "' '" ACCRUE_MNIST_BINARY "' --data '" + data.string() + "'" +
                                more + " 2>'" + (data / "err").string() + "'";
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 2);
    const std::string err = slurp(data / "err");
    expect_words(err, {"ACCRUE_PROFILE_JSON " + trace.string()});
    EXPECT_EQ(err.find("[profile] wrote"), std::string::npos) << err;
    EXPECT_EQ(slurp(trace), before) << trace;
  }
}

// Checkpoints republish the metrics file, so a run killed later keeps its records up to the
// checkpoint; a resumed run continues the file from the checkpoint's step.
TEST(Reliability, MetricsSurviveAKillAndContinueOnResume) {
  const fs::path data = make_dataset("metrics-resume", 512, 64);
  const fs::path ckpt = data / "ckpt";
  const fs::path metrics = data / "m.jsonl";
  mnist::Config c = short_config(data);
  c.max_steps = 10;
  c.checkpoint = ckpt.string();
  c.checkpoint_every = 4;
  c.metrics = metrics.string();
  std::vector<std::vector<int64_t>> seen;
  train::Callbacks callbacks;
  callbacks.on_checkpoint = [&](const train::CheckpointEvent&) {
    seen.push_back(steps_in(records(metrics)));
  };
  mnist::train(c, std::cout, callbacks);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[0], one_to(4));
  EXPECT_EQ(seen[1], one_to(8));
  // Resumed from step 10 (the last checkpoint) with records 1-10 and a summary in the file.
  c.resume = ckpt.string();
  c.max_steps = 14;
  mnist::train(c, std::cout);
  const auto recs = records(metrics);
  EXPECT_EQ(steps_in(recs), one_to(14));
  EXPECT_EQ(std::count_if(recs.begin(), recs.end(),
                          [](const auto& r) { return r.value("event", "") == "summary"; }),
            1);
  // The samples count on from where the checkpoint was (16 per step).
  EXPECT_EQ(recs.back()["steps"], 14);
  for (const auto& r : recs) {
    if (r.contains("step")) {
      EXPECT_EQ(r["samples"], 16 * r["step"].get<int64_t>()) << r;
    }
  }
  // The epoch cut short by --max-steps 10 is reported once, by the run that finished it.
  EXPECT_EQ(std::count_if(recs.begin(), recs.end(),
                          [](const auto& r) { return r.value("event", "") == "epoch"; }),
            1);
  // A metrics file that is not JSON Lines is not overwritten by a resume.
  const std::string kept = slurp(metrics);
  std::ofstream(metrics, std::ios::trunc) << "not json\n" << kept;
  c.max_steps = 16;
  const std::string before = slurp(metrics);
  expect_error<FileError>([&] { mnist::train(c, std::cout); }, {metrics.string(), "not JSON"});
  EXPECT_EQ(slurp(metrics), before);
}

// A resume continues only its own run's metrics, whole up to the checkpoint (D14), and drops
// the end of the run it continues: the summary and the pipeline record before it (D15). A file
// refused is left as it was.
TEST(Reliability, MetricsOfAnotherRunOrWithMissingStepsAreRefused) {
  const fs::path data = make_dataset("metrics-other", 512, 64);
  const fs::path ckpt = data / "ckpt", mine = data / "mine.jsonl", other = data / "other.jsonl";
  ASSERT_EQ(
      run(data, {"--checkpoint", ckpt.string(), "--metrics", mine.string(), "--max-steps", "6"})
          .status,
      0);
  ASSERT_EQ(run(data, {"--metrics", other.string(), "--max-steps", "6"}).status, 0);
  const std::string others = slurp(other);
  CliResult r =
      run(data, {"--resume", ckpt.string(), "--metrics", other.string(), "--max-steps", "8"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {other.string(), "starts run", "not the resumed run"});
  EXPECT_EQ(slurp(other), others);
  // Step 3's record taken out of the run's own file.
  std::string lines = slurp(mine), without;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"step\":3,") == std::string::npos) without += line + "\n";
  }
  ASSERT_NE(without, lines);
  std::ofstream(mine, std::ios::trunc) << without;
  r = run(data, {"--resume", ckpt.string(), "--metrics", mine.string(), "--max-steps", "8"});
  EXPECT_EQ(r.status, 1) << r.err;
  expect_words(r.err, {mine.string(), "is step 4 after step 2"});
  EXPECT_EQ(slurp(mine), without);
  // The end of a pipelined run: its pipeline record and summary go, the steps stay.
  const fs::path piped = data / "piped.jsonl";
  std::ofstream(piped) << "{\"event\":\"run\",\"run_id\":\"r\"}\n"
                       << "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":1}\n"
                       << "{\"event\":\"pipeline\",\"stages\":2}\n"
                       << "{\"event\":\"summary\",\"steps\":2}\n";
  train::MetricsLog log(piped.string());
  ASSERT_TRUE(log.continue_from(2, 0, "r"));
  log.emit({{"step", 3}, {"loss", 1}});
  log.commit();
  const std::string continued = slurp(piped);
  EXPECT_EQ(continued.find("pipeline"), std::string::npos) << continued;
  EXPECT_EQ(continued.find("summary"), std::string::npos) << continued;
  EXPECT_NE(continued.find("\"step\":3"), std::string::npos) << continued;
  // Files no run writes, refused by name and left as they were: brackets nested 200,000 deep
  // (parsed and copied as they were, they overflowed the stack), a step past int64, a file too
  // large to hold (sparse: refused from its size, before a byte is read).
  const fs::path hostile = data / "hostile.jsonl";
  const std::string run_line = "{\"event\":\"run\",\"run_id\":\"r\"}\n";
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {run_line + "{\"event\":" + std::string(200000, '[') + std::string(200000, ']') + "}\n",
       {"line 2 is not JSON", "nested more than 64 levels"}},
      {run_line + "{\"step\":18446744073709551615,\"loss\":1}\n",
       {"line 2 has step 18446744073709551615, beyond any run"}},
      {"", {"bytes, more than a metrics log to continue can be"}},
  };
  for (const auto& [text, words] : rows) {
    std::ofstream(hostile, std::ios::trunc) << text;
    if (text.empty()) fs::resize_file(hostile, (uint64_t(1) << 30) + 1);
    const auto size = fs::file_size(hostile);
    train::MetricsLog refused(hostile.string());
    std::vector<std::string> expected = words;
    expected.push_back(hostile.string());
    expected.push_back("give --metrics another file");
    expect_error<FileError>([&] { refused.continue_from(2, 0, "r"); }, expected);
    EXPECT_EQ(fs::file_size(hostile), size);
  }
  fs::remove(hostile);
}

// The watchdog says which rank was stopped: a wait whose own polls stopped for a second or more,
// and half the limit, was a suspended rank (SIGSTOP, a debugger), not another rank (D17).
TEST(Reliability, TheWatchdogTellsASuspendedRankFromASlowOne) {
  const std::string slow = distributed::watchdog_message(1, "MPI allreduce", 7, 3, 0.001);
  expect_words(slow, {"[watchdog] rank 1: MPI allreduce (wait 7) did not complete within 3 s",
                      "another rank is stopped"});
  const std::string suspended = distributed::watchdog_message(1, "MPI allreduce", 7, 3, 41.6);
  expect_words(suspended, {"rank 1: MPI allreduce", "this rank itself did not run for 42 s"});
  EXPECT_EQ(suspended.find("another rank"), std::string::npos) << suspended;
  // A second's pause of a wait of 600 s is the machine, not a suspension.
  expect_words(distributed::watchdog_message(0, "MPI barrier", 1, 600, 1.5), {"another rank"});
}

// A finished run resumed evaluates the model it loaded and says nothing is left to train.
TEST(Reliability, ResumingAFinishedRunEvaluatesIt) {
  const fs::path data = make_dataset("finished", 512, 64);
  const fs::path ckpt = data / "ckpt";
  mnist::Config c = short_config(data);
  c.epochs = 1;
  c.checkpoint = ckpt.string();
  const Recorded done = train_recorded(c, std::cout);
  c.resume = ckpt.string();
  c.quiet = false;
  std::ostringstream out;
  const Recorded again = train_recorded(c, out);
  EXPECT_EQ(again.test_accuracy, done.test_accuracy);
  EXPECT_GT(again.test_accuracy, 0.0);
  EXPECT_EQ(again.steps, done.steps);
  expect_words(out.str(), {"nothing left to train"});
  // Resumed into another folder, the finished run's position is written there, so that folder
  // resumes too.
  const fs::path elsewhere = data / "elsewhere";
  c.checkpoint = elsewhere.string();
  c.quiet = true;
  EXPECT_EQ(train_recorded(c, std::cout).steps, done.steps);
  c.resume = elsewhere.string();
  std::ostringstream from_elsewhere;
  c.quiet = false;
  EXPECT_EQ(train_recorded(c, from_elsewhere).test_accuracy, done.test_accuracy);
  expect_words(from_elsewhere.str(),
               {"resumed from " + elsewhere.string(), "nothing left to train"});
}

}  // namespace
}  // namespace accrue::testing
