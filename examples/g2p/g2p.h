// accrue-g2p: grapheme-to-phoneme conversion (spelling -> pronunciation) on CMUdict with a small
// GPT (nn/transformer.h), handed to the training engine (train/engine.h). Each sample is one
// sequence "<bos> letters <sep> phonemes <eos>", right-padded in its micro-batch; the loss counts
// only the phoneme and <eos> targets, so samples carry different numbers of loss tokens and the
// engine seeds each window's backward with 1 / (its target tokens), known from the plan. The
// evaluation decodes greedily, in batches, and reports the phoneme and word error rates.
// Read next: g2p.cpp.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cmudict.h"
#include "nn/transformer.h"
#include "train/config.h"
#include "train/engine.h"

namespace accrue::g2p {

// The token ids: <bos>, <sep>, <eos>, then the apostrophe and A-Z, then phoneme_symbols().
// Padding reuses <eos> as input; its targets are ignored.
struct Vocabulary {
  static constexpr int32_t kBos = 0, kSep = 1, kEos = 2, kFirstLetter = 3;
  static constexpr int32_t kFirstPhoneme = kFirstLetter + 27;  // after the apostrophe and A-Z
  std::vector<std::string> symbols;
  std::map<std::string, int32_t> phoneme_ids;
  Vocabulary();
  int32_t letter(char c) const;  // -1 when not a word character
  // What a decoded token reads as: a phoneme's symbol; any other token in angle brackets ("<B>"
  // for the letter B, "<eos>"), which no pronunciation holds, so it scores as an error (the
  // letter B and the phoneme B are spelled alike).
  std::string decoded(int32_t id) const;
  int64_t size() const { return static_cast<int64_t>(symbols.size()); }
};

// A word's prompt "<bos> letters <sep>", and a full training sequence with its phonemes and
// <eos>.
std::vector<int32_t> prompt(const Vocabulary& v, const std::string& spelling);
std::vector<int32_t> sequence(const Vocabulary& v, const std::string& spelling,
                              const Pronunciation& phonemes);

// The engine's settings plus G2P's own. The defaults are the recipe of scripts/train-g2p.sh.
struct Config : train::Config {
  Config();
  std::string data = "data/cmudict/dict.txt";
  int64_t layers = 4, heads = 4, width = 128;
  std::string eval = "both";         // the splits evaluated each epoch: validation, test, both
  int64_t eval_limit = 0;            // 0: every word of a split; else its first N
  std::vector<std::string> predict;  // --predict WORD...: pronounce with the model of --init
};

// The splits, as sequences and words.
struct Data {
  Vocabulary vocab;
  std::vector<std::vector<int32_t>> train;  // full sequences
  std::vector<Word> validation, test;
  int64_t context = 0;  // the longest input (sequence length - 1) over every split
  std::string longest;  // its word
  int64_t skipped = 0;
};
// train_limit > 0: that many training sequences, drawn evenly over the file with `seed` (a
// seeded sample kept in file order; the file is alphabetical, so its first N would be A to D).
Data load_data(const std::string& path, int64_t train_limit, uint64_t seed = 0);

// The loss tokens of a full sequence: its phonemes and <eos> (everything after <sep>).
int64_t target_tokens(const std::vector<int32_t>& sequence);

// A right-padded micro-batch of sequences: input int32 [b, T] (padding <eos>), target int32 [b T]
// (the next token where it is a phoneme or <eos>, else kIgnoreLabel). T: the longest input of
// the batch, or pad_to when larger (the memory budget's probes pad to the context).
train::Samples make_samples(const std::vector<const std::vector<int32_t>*>& seqs, int64_t pad_to,
                            Device device);

// The model a run saved (--save): its sizes from the file's metadata, checked against its
// tensors and this program's vocabulary (FileError naming the file otherwise); float32, on the
// CPU, in evaluation mode.
std::unique_ptr<nn::GPT> load_saved_model(const std::string& path);

// How decode() runs the model: with each block's keys and values cached (a step computes the new
// positions only), or over the whole prefix at every step (the reference the cache is tested
// against).
enum class Decoding { kCached, kWholePrefix };

// Greedy decoding of many words at once: each prompt grows by its argmax token until <eos> or
// the context is full. Deterministic. Returns the phonemes of each word (without <eos>).
std::vector<Pronunciation> decode(nn::GPT& model, const Vocabulary& v,
                                  const std::vector<std::string>& spellings, Device device,
                                  Decoding how = Decoding::kCached);

// Edit distance between two phoneme sequences (insertions, deletions, substitutions cost 1).
int64_t edit_distance(const Pronunciation& a, const Pronunciation& b);

// The error counts of predictions against a word's pronunciations: the best reference (fewest
// edits), with and without stress digits, and whether the prediction is one of them.
struct Errors {
  double edits = 0, reference = 0, edits_no_stress = 0, reference_no_stress = 0;
  double correct = 0, words = 0;
};
Errors score(const Pronunciation& predicted, const Word& word);

train::Task make_task(const Config& config);
train::Summary train(const Config& config, std::ostream& out,
                     const train::Callbacks& callbacks = {});

// Parses argv (the engine's flags and --data, --layers, --heads, --width, --eval,
// --eval-limit, --predict); -1 to go on, else the exit status (0 after --help, 2 after a mistake).
int parse_args(int argc, const char* const* argv, Config& config, std::ostream& out,
               std::ostream& err);

// --predict: loads --init (sizes and vocabulary from its metadata) and prints "WORD  PH ON ES".
void predict(const Config& config, std::ostream& out);

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace accrue::g2p
