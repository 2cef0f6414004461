// The engine's command-line flags, declared once with CLI11, so every example gets the same
// flags, defaults and validation and adds only its own (the data, the model):
//   CLI::App app{"accrue-x: train ..."};
//   train::Flags flags(app, config);          // --device ... --quiet
//   app.add_option("--data", data, "...");    // the example's own
//   return train::parse_command_line(app, argc, argv, "accrue-x", out, err, [&] {
//     flags.check();                          // throws ValueError: one line, exit 2
//     ...the example's own checks...
//   });
// Read next: engine.h.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "train/config.h"

namespace accrue::train {

class Flags {
 public:
  // Declares every shared flag on app, bound to config.
  Flags(CLI::App& app, Config& config);
  // After parsing: with --resume DIR, takes the flags that shape the run from its checkpoint
  // (config.h ResumeRule; a different value given is refused, every difference named);
  // resolves the device and checks the combination before any data is read (the batch
  // arithmetic on the launcher's world size, the learning rate it scales to, exclusive flags,
  // output paths). Throws ValueError or FileError with one line naming the flag.
  void check();
  // check(), then the program's own checks of its flags, whose errors also say which flags came
  // from the checkpoint: for parse_command_line.
  std::function<void()> checked(std::function<void()> more);
  // The files the program reads as its data (resolved after the flags are: --data may come from
  // a checkpoint); check() refuses an output that names one.
  void data_files_are(std::function<std::vector<std::string>()> files) {
    data_files_ = std::move(files);
  }

 private:
  void check_settings();  // check()'s checks after the resumed flags are taken
  void checking_resumed_flags(const std::function<void()>& checks) const;
  void add_device_flags();
  void add_batch_flags();
  void add_optimizer_flags();
  void add_parallel_flags();
  void add_output_flags();
  void check_no_empty_values() const;
  void take_resumed_flags();
  void record_run_flags();
  void check_each_flag_takes_effect() const;
  void check_batches(int world_size) const;
  void check_outputs();
  void check_inputs() const;
  CLI::App& app_;
  Config& c_;
  void read_typed_values();
  // The text of the flags the configuration holds typed (read_typed_values() parses them).
  std::string device_, cuda_graphs_ = "auto", precision_, loss_scale_, accum_schedule_,
                       memory_budget_, lr_scaling_, schedule_, pipeline_schedule_, weight_decay_,
                       bucket_kib_, zero_reduce_, zero_prefetch_;
  bool no_shuffle_ = false;
  std::vector<std::string> taken_from_checkpoint_;  // the flags take_resumed_flags() set
  std::function<std::vector<std::string>()> data_files_;
};

// A CLI11 transform for an integer flag: a whole decimal integer in [low, high] (no '+', hex,
// octal or spaces: "010" is ten), else a one-line error naming the value and the range.
CLI::Validator int_in(int64_t low, int64_t high);

// "512,256,128" -> {512, 256, 128}: positive integers up to max, comma-separated. Throws
// ValueError naming the flag, the bad item and an example.
std::vector<int64_t> parse_size_list(const std::string& flag, const std::string& text, int64_t max,
                                     const std::string& example);

// Parses argv with app, then runs check. Returns -1 to go on, else the exit status main()
// should return: 0 after --help, 2 after a mistake (one line on err: "program: what").
int parse_command_line(CLI::App& app, int argc, const char* const* argv, const std::string& program,
                       std::ostream& out, std::ostream& err, const std::function<void()>& check);

}  // namespace accrue::train
