// Training-state checkpoints (see checkpoint.h).
#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/file.h"
#include "optim/safetensors.h"

namespace accrue::train {

namespace fs = std::filesystem;

namespace {

std::string fnv1a_hex(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string stem(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010lld", static_cast<long long>(step));
  return buf;
}

// The steps of the checkpoints whose JSON exists in dir, newest first.
std::vector<int64_t> listed_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  fs::directory_iterator entries(dir, ec);
  if (ec) throw FileError(str_cat(dir, ": cannot list the checkpoints (", ec.message(), ")"));
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    long long step = 0;
    char tail[8] = {};
    if (std::sscanf(name.c_str(), "step-%lld.%7s", &step, tail) == 2 &&
        std::string(tail) == "json" && name == stem(step) + ".json") {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Reads one checkpoint; throws FileError naming its file and the problem.
Checkpoint read_checkpoint(const std::string& dir, int64_t step) {
  Checkpoint c;
  c.path = (fs::path(dir) / (stem(step) + ".json")).string();
  const std::vector<uint8_t> text = read_file_bytes(c.path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
    c.config = j.at("config");
    const auto& p = j.at("position");
    c.position = {p.at("step").get<int64_t>(), p.at("skipped").get<int64_t>(),
                  p.at("epoch").get<int64_t>(), p.at("window").get<int64_t>()};
  } catch (const std::exception& e) {
    throw FileError(c.path + ": not a valid checkpoint description (" + e.what() + ")");
  }
  const std::string tensors = (fs::path(dir) / j.value("tensors", "")).string();
  const std::vector<uint8_t> bytes = read_file_bytes(tensors);
  if (static_cast<int64_t>(bytes.size()) != j.value("bytes", int64_t{-1})) {
    throw FileError(str_cat(tensors, ": ", bytes.size(), " bytes, but ", c.path, " says ",
                            j.value("bytes", int64_t{-1}), " (truncated or replaced)"));
  }
  if (fnv1a_hex(bytes) != j.value("fnv1a", std::string())) {
    throw FileError(str_cat(tensors, ": its contents do not match the hash in ", c.path,
                            " (modified after it was written)"));
  }
  for (auto& [name, t] : optim::read_safetensors(tensors)) {
    if (name.rfind("model/", 0) == 0) c.model.emplace(name.substr(6), t);
    if (name.rfind("optimizer/", 0) == 0) c.optimizer.emplace(name.substr(10), t);
  }
  return c;
}

}  // namespace

void write_checkpoint(const std::string& dir, const nlohmann::json& config,
                      const TrainPosition& position,
                      const std::vector<nn::NamedTensor>& model_state,
                      const std::vector<nn::NamedTensor>& optimizer_state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw FileError(str_cat("--checkpoint ", dir, ": cannot create it (", ec.message(), ")"));
  std::vector<nn::NamedTensor> all;
  for (const auto& [name, t] : model_state) all.emplace_back("model/" + name, t);
  for (const auto& [name, t] : optimizer_state) all.emplace_back("optimizer/" + name, t);
  const std::string name = stem(position.step);
  const std::string tensors = (fs::path(dir) / (name + ".safetensors")).string();
  optim::save_safetensors(tensors, all, {{"format", "pt"}});
  const std::vector<uint8_t> bytes = read_file_bytes(tensors);
  nlohmann::json j;
  j["format"] = "accrue-checkpoint-1";
  j["tensors"] = name + ".safetensors";
  j["bytes"] = bytes.size();
  j["fnv1a"] = fnv1a_hex(bytes);
  j["config"] = config;
  j["position"] = {{"step", position.step},
                   {"skipped", position.skipped},
                   {"epoch", position.epoch},
                   {"window", position.window}};
  AtomicFile out((fs::path(dir) / (name + ".json")).string());
  out.write(j.dump(2) + "\n");
  out.commit();
  // Keep the newest two complete checkpoints.
  const std::vector<int64_t> steps = listed_steps(dir);
  for (size_t i = 2; i < steps.size(); ++i) {
    fs::remove(fs::path(dir) / (stem(steps[i]) + ".json"), ec);
    fs::remove(fs::path(dir) / (stem(steps[i]) + ".safetensors"), ec);
  }
}

Checkpoint read_latest_checkpoint(const std::string& dir) {
  const std::vector<int64_t> steps = listed_steps(dir);
  if (steps.empty()) {
    throw FileError("--resume " + dir + ": no checkpoint (step-*.json) in it");
  }
  try {
    return read_checkpoint(dir, steps.front());
  } catch (const FileError& e) {
    std::string older;
    for (size_t i = 1; i < steps.size() && older.empty(); ++i) {
      try {
        read_checkpoint(dir, steps[i]);
        older = stem(steps[i]);
      } catch (const FileError&) {
      }
    }
    throw FileError(std::string(e.what()) +
                    (older.empty() ? "; no older intact checkpoint"
                                   : "; " + older + " is intact: remove " + stem(steps.front()) +
                                         ".json to resume from it"));
  }
}

void check_compatible(const nlohmann::json& saved, const nlohmann::json& current,
                      const std::string& path) {
  for (auto it = current.begin(); it != current.end(); ++it) {
    const auto other = saved.find(it.key());
    if (other == saved.end() || *other != it.value()) {
      throw ValueError(str_cat("--resume: ", path, " was written with ", it.key(), " = ",
                               other == saved.end() ? "(absent)" : other->dump(), ", this run has ",
                               it.value().dump()));
    }
  }
}

}  // namespace accrue::train
