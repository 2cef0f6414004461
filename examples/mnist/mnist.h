// accrue-mnist: an MLP (nn::MLP) or the CNN of cnn.h on MNIST, handed to the training engine
// (train/engine.h). All that is MNIST lives here: the data folder and the model flags, the IDX
// files (idx.h), the splits (dataset.h), the model factory, the loss and the test accuracy;
// config, the loop, checkpoints, metrics and exit statuses are the engine's. Read next:
// mnist.cpp.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/engine.h"

namespace accrue::mnist {

// The engine's settings plus MNIST's own.
struct Config : train::Config {
  std::string data = "data/mnist";
  std::string model = "mlp";                   // or "cnn" (cnn.h)
  std::string norm = "none";                   // the CNN's normalisation: none, batch, group, layer
  std::vector<int64_t> hidden{512, 256, 128};  // the MLP's hidden layers
  // Training samples held out (drawn with --seed) as the validation split that --keep-best and
  // --early-stop choose by; 0: none.
  int64_t validation = 0;
};

// The task the engine trains: MNIST's training split (less --validation's held-out samples), the
// model, cross-entropy (a sum over the micro-batch's samples and their count), the accuracy on
// the test split, and on the held-out samples.
train::Task make_task(const Config& config);
// The four IDX files of the data folder `dir`: training and test images and labels.
std::vector<std::string> data_files(const std::string& dir);

// Trains and evaluates (train::train with make_task).
train::Summary train(const Config& config, std::ostream& out,
                     const train::Callbacks& callbacks = {});

// Parses argv into config: the engine's flags and --data, --model, --norm, --hidden. Returns -1
// to go on, else the exit status main() should return (0 after --help, 2 after a mistake, with
// one line on err saying what is wrong).
int parse_args(int argc, const char* const* argv, Config& config, std::ostream& out,
               std::ostream& err);

// parse_args + train, with errors turned into exit statuses (train/run.h).
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace accrue::mnist
