// accrue-g2p's data, task, decoding, scores and flags (see g2p.h).
#include "g2p.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>

#include "core/error.h"
#include "ops/autograd.h"
#include "ops/ops.h"
#include "optim/safetensors.h"
#include "train/flags.h"
#include "train/run.h"
#include "train/sample_order.h"

namespace accrue::g2p {

Vocabulary::Vocabulary() {
  symbols = {"<bos>", "<sep>", "<eos>", "'"};
  for (char c = 'A'; c <= 'Z'; ++c) symbols.emplace_back(1, c);
  if (symbols.size() != static_cast<size_t>(kFirstPhoneme)) {
    throw std::logic_error("[g2p] the vocabulary's phonemes must start at kFirstPhoneme");
  }
  for (const std::string& p : phoneme_symbols()) {
    phoneme_ids[p] = static_cast<int32_t>(symbols.size());
    symbols.push_back(p);
  }
}

std::string Vocabulary::decoded(int32_t id) const {
  const std::string& s = symbols.at(static_cast<size_t>(id));
  if (id >= kFirstPhoneme || s.front() == '<') return s;
  return "<" + s + ">";
}

int32_t Vocabulary::letter(char c) const {
  if (c == '\'') return kFirstLetter;
  if (c >= 'A' && c <= 'Z') return kFirstLetter + 1 + (c - 'A');
  return -1;
}

std::vector<int32_t> prompt(const Vocabulary& v, const std::string& spelling) {
  std::vector<int32_t> out{Vocabulary::kBos};
  for (char c : spelling) {
    const int32_t id = v.letter(c);
    if (id < 0) throw ValueError(str_cat("'", spelling, "' has a character other than A-Z and '"));
    out.push_back(id);
  }
  out.push_back(Vocabulary::kSep);
  return out;
}

std::vector<int32_t> sequence(const Vocabulary& v, const std::string& spelling,
                              const Pronunciation& phonemes) {
  std::vector<int32_t> out = prompt(v, spelling);
  for (const std::string& p : phonemes) out.push_back(v.phoneme_ids.at(p));
  out.push_back(Vocabulary::kEos);
  return out;
}

Data load_data(const std::string& path, int64_t train_limit, uint64_t seed) {
  const Lexicon lex = read_cmudict(path);
  Data d;
  d.skipped = lex.skipped;
  for (const Word& w : lex.words) {
    for (const Pronunciation& p : w.pronunciations) {
      const int64_t input = static_cast<int64_t>(w.spelling.size() + p.size()) + 2;
      if (input > d.context) d.context = input, d.longest = w.spelling;
    }
    switch (split_of(w.spelling)) {
      case Split::kTrain:
        for (const Pronunciation& p : w.pronunciations) {
          d.train.push_back(sequence(d.vocab, w.spelling, p));
        }
        break;
      case Split::kValidation:
        d.validation.push_back(w);
        break;
      case Split::kTest:
        d.test.push_back(w);
        break;
    }
  }
  if (train_limit > 0 && static_cast<size_t>(train_limit) < d.train.size()) {
    std::vector<std::vector<int32_t>> subset;
    for (size_t i : train::seeded_subset(d.train.size(), static_cast<size_t>(train_limit), seed)) {
      subset.push_back(std::move(d.train[i]));
    }
    d.train = std::move(subset);
  }
  if (d.train.empty()) {
    throw FileError(
        str_cat(path, ": none of its ", lex.words.size(),
                " words falls in the training split (split_of, examples/g2p/cmudict.h)"));
  }
  return d;
}

int64_t edit_distance(const Pronunciation& a, const Pronunciation& b) {
  std::vector<int64_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int64_t diagonal = row[0];
    row[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int64_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

namespace {

Pronunciation without_stress(Pronunciation p) {
  for (std::string& s : p) {
    if (!s.empty() && s.back() >= '0' && s.back() <= '9') s.pop_back();
  }
  return p;
}

// The best reference: fewest edits, then the first.
void best(const Pronunciation& predicted, const std::vector<Pronunciation>& refs, double& edits,
          double& length) {
  int64_t best_edits = -1;
  for (const Pronunciation& r : refs) {
    const int64_t e = edit_distance(predicted, r);
    if (best_edits < 0 || e < best_edits) best_edits = e, length = static_cast<double>(r.size());
  }
  edits = static_cast<double>(best_edits);
}

constexpr int64_t kDecodeBatch = 256;

}  // namespace

int64_t target_tokens(const std::vector<int32_t>& sequence) {
  const auto sep = std::find(sequence.begin(), sequence.end(), Vocabulary::kSep);
  return static_cast<int64_t>(sequence.end() - sep) - 1;
}

train::Samples make_samples(const std::vector<const std::vector<int32_t>*>& seqs, int64_t pad_to,
                            Device device) {
  int64_t t = pad_to;
  for (const auto* s : seqs) t = std::max<int64_t>(t, static_cast<int64_t>(s->size()) - 1);
  const int64_t b = static_cast<int64_t>(seqs.size());
  std::vector<int32_t> input(static_cast<size_t>(b * t), Vocabulary::kEos);
  std::vector<int32_t> target(static_cast<size_t>(b * t), kIgnoreLabel);
  for (int64_t i = 0; i < b; ++i) {
    const std::vector<int32_t>& s = *seqs[static_cast<size_t>(i)];
    const auto sep = std::find(s.begin(), s.end(), Vocabulary::kSep) - s.begin();
    for (int64_t j = 0; j + 1 < static_cast<int64_t>(s.size()); ++j) {
      input[static_cast<size_t>(i * t + j)] = s[static_cast<size_t>(j)];
      if (j >= sep) target[static_cast<size_t>(i * t + j)] = s[static_cast<size_t>(j + 1)];
    }
  }
  return train::Samples{Tensor::from_vector<int32_t>({b, t}, input, device),
                        Tensor::from_vector<int32_t>({b * t}, target, device)};
}

Errors score(const Pronunciation& predicted, const Word& word) {
  Errors e;
  best(predicted, word.pronunciations, e.edits, e.reference);
  std::vector<Pronunciation> plain;
  for (const Pronunciation& p : word.pronunciations) plain.push_back(without_stress(p));
  best(without_stress(predicted), plain, e.edits_no_stress, e.reference_no_stress);
  e.correct = std::find(word.pronunciations.begin(), word.pronunciations.end(), predicted) !=
                      word.pronunciations.end()
                  ? 1
                  : 0;
  e.words = 1;
  return e;
}

std::vector<Pronunciation> decode(nn::GPT& model, const Vocabulary& v,
                                  const std::vector<std::string>& spellings, Device device,
                                  Decoding how) {
  NoGradGuard no_grad;
  const int64_t context = model.config().block_size;
  std::vector<Pronunciation> out(spellings.size());
  // Batches of words of similar lengths (sorted, stably; the outputs go back in place), so
  // little of each step is padding.
  std::vector<size_t> by_length(spellings.size());
  for (size_t i = 0; i < by_length.size(); ++i) by_length[i] = i;
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](size_t a, size_t b) { return spellings[a].size() < spellings[b].size(); });
  for (size_t start = 0; start < spellings.size(); start += kDecodeBatch) {
    const size_t n = std::min<size_t>(kDecodeBatch, spellings.size() - start);
    std::vector<std::vector<int32_t>> rows;
    std::vector<bool> done(n, false);
    for (size_t i = 0; i < n; ++i) {
      const std::string& word = spellings[by_length[start + i]];
      rows.push_back(prompt(v, word));
      if (static_cast<int64_t>(rows[i].size()) > context) {
        throw ValueError(str_cat("'", word, "' needs ", rows[i].size(),
                                 " tokens of context, the model has ", context));
      }
    }
    // Open rows hold at most `context` tokens; each step feeds positions [from, t), t the
    // longest open row's length (finished rows ride along, truncated, their outputs unread;
    // shorter rows are padded). Without the cache `from` is 0. With it the cache holds every
    // open row's tokens before `from`: the lowest position a row wrote since the last step (a
    // shorter row's new token replaces a padding whose keys and values are cached).
    nn::KVCache cache;
    if (how == Decoding::kCached) cache = model.make_cache(static_cast<int64_t>(n), device);
    int64_t from = 0;
    for (;;) {
      int64_t t = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!done[i]) t = std::max<int64_t>(t, static_cast<int64_t>(rows[i].size()));
      }
      if (t == 0) break;
      const int64_t width = t - from;
      std::vector<int32_t> input(n * static_cast<size_t>(width), Vocabulary::kEos);
      for (size_t i = 0; i < n; ++i) {
        const int64_t len = std::min<int64_t>(static_cast<int64_t>(rows[i].size()), t);
        if (len > from) {
          std::copy(rows[i].begin() + from, rows[i].begin() + len,
                    input.begin() + static_cast<int64_t>(i) * width);
        }
      }
      const Tensor tokens =
          Tensor::from_vector<int32_t>({static_cast<int64_t>(n), width}, input, device);
      const Tensor logits =
          how == Decoding::kCached ? model.forward_cached(tokens, from, cache) : model(tokens);
      const std::vector<int32_t> next = argmax(logits).to(Device::cpu()).to_vector<int32_t>();
      int64_t lowest_written = t;
      for (size_t i = 0; i < n; ++i) {
        if (done[i]) continue;
        const int64_t last = static_cast<int64_t>(rows[i].size()) - 1;
        const int32_t token =
            next[static_cast<size_t>(static_cast<int64_t>(i) * width + last - from)];
        if (token == Vocabulary::kEos) {
          done[i] = true;
          continue;
        }
        rows[i].push_back(token);
        lowest_written = std::min(lowest_written, last + 1);
        // The context is full: this was the last token the model can predict.
        if (static_cast<int64_t>(rows[i].size()) > context) done[i] = true;
      }
      if (how == Decoding::kCached) from = lowest_written;
    }
    for (size_t i = 0; i < n; ++i) {
      const auto sep = std::find(rows[i].begin(), rows[i].end(), Vocabulary::kSep);
      for (auto it = sep + 1; it != rows[i].end(); ++it) {
        // A letter or special where a phoneme belongs counts as an error against every
        // reference.
        out[by_length[start + i]].push_back(v.decoded(*it));
      }
    }
  }
  return out;
}

namespace {

// This rank's share of the split's words (every world_size-th), decoded and scored; the loss of
// its sequences teacher-forced; everything summed over the ranks.
struct SplitResult {
  double loss = 0, tokens = 0;
  Errors errors;
};

SplitResult evaluate_split(nn::GPT& model, const Data& data, const std::vector<Word>& words,
                           int64_t limit, const train::Setup& setup) {
  const size_t count =
      limit > 0 ? std::min<size_t>(words.size(), static_cast<size_t>(limit)) : words.size();
  std::vector<const Word*> mine;
  for (size_t i = static_cast<size_t>(setup.rank); i < count;
       i += static_cast<size_t>(setup.world_size)) {
    mine.push_back(&words[i]);
  }
  std::vector<std::string> spellings;
  for (const Word* w : mine) spellings.push_back(w->spelling);
  const std::vector<Pronunciation> predicted = decode(model, data.vocab, spellings, setup.device);
  Errors e;
  for (size_t i = 0; i < mine.size(); ++i) {
    const Errors one = score(predicted[i], *mine[i]);
    e.edits += one.edits, e.reference += one.reference;
    e.edits_no_stress += one.edits_no_stress, e.reference_no_stress += one.reference_no_stress;
    e.correct += one.correct, e.words += one.words;
  }
  // Teacher-forced loss per target token over every pronunciation.
  std::vector<std::vector<int32_t>> seqs;
  for (const Word* w : mine) {
    for (const Pronunciation& p : w->pronunciations)
      seqs.push_back(sequence(data.vocab, w->spelling, p));
  }
  double loss = 0, tokens = 0;
  for (size_t start = 0; start < seqs.size(); start += kDecodeBatch) {
    std::vector<const std::vector<int32_t>*> batch;
    for (size_t i = start; i < std::min(seqs.size(), start + kDecodeBatch); ++i) {
      batch.push_back(&seqs[i]);
      tokens += static_cast<double>(target_tokens(seqs[i]));
    }
    const train::Samples b = make_samples(batch, 0, setup.device);
    loss += cross_entropy(cast(model(b.input), DType::kFloat64), b.target).item();
  }
  std::vector<double> sums{
      loss,      tokens, e.edits, e.reference, e.edits_no_stress, e.reference_no_stress,
      e.correct, e.words};
  Tensor total =
      Tensor::from_vector<double>({static_cast<int64_t>(sums.size())}, sums, setup.device);
  if (setup.comm != nullptr && setup.world_size > 1) setup.comm->all_reduce_sum(total);
  sums = total.to(Device::cpu()).to_vector<double>();
  SplitResult r;
  r.loss = sums[0], r.tokens = sums[1];
  r.errors = Errors{sums[2], sums[3], sums[4], sums[5], sums[6], sums[7]};
  return r;
}

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

nn::GPTConfig model_config(const Config& c, const Data& d) {
  nn::GPTConfig g;
  g.vocab_size = d.vocab.size();
  g.block_size = d.context;
  g.n_layer = c.layers;
  g.n_head = c.heads;
  g.n_embd = c.width;
  return g;
}

// The loss in the loss dtype over the target tokens that are not padding, and their count,
// counted on the device (the targets less the padding), so nothing waits for a host read.
nn::LossSum loss_of_logits(const Tensor& logits, const train::Samples& b, DType loss_dtype) {
  const Device device = b.target.device();
  const Tensor padding =
      equal_count(b.target, full(b.target.shape(), kIgnoreLabel, DType::kInt32, device));
  const Tensor targets = sub(scalar(static_cast<double>(b.target.numel()), loss_dtype, device),
                             cast(padding, loss_dtype));
  return nn::LossSum{cross_entropy(cast(logits, loss_dtype), b.target), targets};
}

}  // namespace

Config::Config() {
  epochs = 9;
  lr = 2e-3;
  optimizer = "adamw";
  weight_decay = 0.01;
  schedule = optim::ScheduleKind::kCosine;
  warmup = 200;
  clip = 1.0;
}

namespace {

// What the task's functions share: the dictionary's splits and the run's setup.
struct TaskState {
  Data data;
  train::Setup setup;
};

// --pipeline: the embeddings, each block, and the final LayerNorm with the head, which borrows
// the token embedding (tied) from the first layer.
std::vector<train::Layer> gpt_layers(nn::Module& model) {
  auto& gpt = dynamic_cast<nn::GPT&>(model);
  std::vector<train::Layer> layers;
  layers.push_back({"embeddings",
                    {&gpt.wte(), &gpt.wpe()},
                    [&gpt](const Tensor& idx) { return gpt.embed(idx); },
                    {}});
  for (size_t i = 0; i < gpt.n_blocks(); ++i) {
    layers.push_back({str_cat("h.", i),
                      {&gpt.block_module(i)},
                      [&gpt, i](const Tensor& x) { return gpt.block(i, x); },
                      {}});
  }
  layers.push_back({"ln_f + head",
                    {&gpt.ln_f()},
                    [&gpt](const Tensor& x) { return gpt.head(x); },
                    {gpt.wte().weight()}});
  return layers;
}

// The PER, the WER and the loss of the splits named (validation, test or both), the last named
// the headline.
train::Evaluation evaluate_splits(const TaskState& state, const Config& c, nn::Module& model,
                                  const std::string& splits) {
  auto& gpt = dynamic_cast<nn::GPT&>(model);
  train::Evaluation e{"test_per", "test PER", 0, true};
  e.lower_is_better = true;
  for (const std::string split : {"validation", "test"}) {
    if (splits != "both" && splits != split) continue;
    const SplitResult r =
        evaluate_split(gpt, state.data, split == "test" ? state.data.test : state.data.validation,
                       c.eval_limit, state.setup);
    const std::string k = split == "test" ? "test" : "val";
    e.details[k + "_loss"] = ratio(r.loss, r.tokens);
    e.details[k + "_per"] = ratio(r.errors.edits, r.errors.reference);
    e.details[k + "_per_no_stress"] = ratio(r.errors.edits_no_stress, r.errors.reference_no_stress);
    e.details[k + "_wer"] = 1.0 - ratio(r.errors.correct, r.errors.words);
    e.key = k + "_per";
    e.label = (split == "test" ? "test" : "validation") + std::string(" PER");
    e.value = ratio(r.errors.edits, r.errors.reference);
    e.held_out = split != "test";
  }
  return e;
}

// Task::prepare: the dictionary read into `state`, its splits checked, a line on what it holds.
int64_t prepare(TaskState& state, const Config& c, const train::Setup& setup) {
  state.setup = setup;
  state.data = load_data(c.data, c.train_limit, c.seed);
  const Data& d = state.data;
  // Every epoch scores the validation split and --eval may score the test split: an empty
  // one would print "PER 0.00%" for no words.
  const bool scores_test = c.eval != "validation";
  for (const auto& [name, words] : {std::pair{"validation", &d.validation}, {"test", &d.test}}) {
    if (words->empty() && (name == std::string("validation") || scores_test)) {
      throw FileError(str_cat(c.data, ": its ", name,
                              " split is empty (split_of, "
                              "examples/g2p/cmudict.h, puts one word in 20 there)"));
    }
  }
  if (setup.log) {
    setup.log(str_cat("CMUdict: ", d.train.size(), " training sequences, ", d.validation.size(),
                      " validation and ", d.test.size(), " test words, ", d.skipped,
                      " entries skipped (not letters and apostrophes); context ", d.context,
                      " tokens (", d.longest, ")"));
  }
  return static_cast<int64_t>(state.data.train.size());
}

}  // namespace

train::Task make_task(const Config& c) {
  auto state = std::make_shared<TaskState>();
  train::Task task;
  task.program = "accrue-g2p";
  task.prepare = [state, c](const train::Setup& setup) { return prepare(*state, c, setup); };
  task.items = [state](int64_t i) {
    return target_tokens(state->data.train[static_cast<size_t>(i)]);
  };
  task.length = [state](int64_t i) {  // the input tokens: the sequence less its last token
    return static_cast<int64_t>(state->data.train[static_cast<size_t>(i)].size()) - 1;
  };
  // The training sequences of `index`, an int32 tensor on the host.
  const auto sequences = [state](const Tensor& index) {
    std::vector<const std::vector<int32_t>*> seqs;
    const int32_t* rows = index.data<int32_t>();
    for (int64_t i = 0; i < index.numel(); ++i) {
      seqs.push_back(&state->data.train[static_cast<size_t>(rows[i])]);
    }
    return seqs;
  };
  // Training micro-batches are padded on the host; the engine stages them to the device.
  task.host_samples = [sequences](const Tensor& index) {
    return make_samples(sequences(index), 0, Device::cpu());
  };
  // Outside the training loop (pipeline stages, the memory budget's probes) the index is on the
  // device: a host copy of it, a few bytes.
  task.samples = [state, sequences](const Tensor& index) {
    return make_samples(sequences(index.to(Device::cpu())), 0, state->setup.device);
  };
  task.largest_samples = [state, sequences](const Tensor& index) {
    return make_samples(sequences(index.to(Device::cpu())), state->data.context,
                        state->setup.device);
  };
  task.model = [state, c](DType master) -> std::unique_ptr<nn::Module> {
    return std::make_unique<nn::GPT>(model_config(c, state->data), master);
  };
  task.loss = [](nn::Module& model, const train::Samples& b, DType loss_dtype) {
    return loss_of_logits(model(b.input), b, loss_dtype);
  };
  task.layers = gpt_layers;
  task.loss_of_output = loss_of_logits;
  // After each epoch the validation split; after the last, the splits of --eval.
  // The validation split is held out: the best weights and early stopping follow its PER.
  task.validate = [state, c](nn::Module& model) {
    return evaluate_splits(*state, c, model, "validation");
  };
  task.evaluate = [state, c](nn::Module& model) {
    return evaluate_splits(*state, c, model, "validation");
  };
  task.evaluate_final = [state, c](nn::Module& model) {
    return evaluate_splits(*state, c, model, c.eval);
  };
  task.metadata = [state, c] {
    std::string vocab;
    for (const std::string& s : state->data.vocab.symbols) vocab += (vocab.empty() ? "" : " ") + s;
    return std::map<std::string, std::string>{
        {"accrue.g2p.vocab_size", std::to_string(state->data.vocab.size())},
        {"accrue.g2p.block_size", std::to_string(state->data.context)},
        {"accrue.g2p.n_layer", std::to_string(c.layers)},
        {"accrue.g2p.n_head", std::to_string(c.heads)},
        {"accrue.g2p.n_embd", std::to_string(c.width)},
        {"accrue.g2p.vocabulary", vocab}};
  };
  task.settings = {{"layers", c.layers}, {"heads", c.heads}, {"width", c.width}};
  task.data_files = {c.data};  // the same dictionary may be read from elsewhere
  // How --train-limit draws its subset (a checkpoint of the older first-N rule is refused).
  if (c.train_limit > 0) task.settings["train_subset"] = "seeded sample";
  task.reported = {{"model", "gpt"}, {"layers", c.layers}, {"heads", c.heads}, {"width", c.width}};
  return task;
}

train::Summary train(const Config& config, std::ostream& out, const train::Callbacks& callbacks) {
  train::Task task = make_task(config);
  return train::train(config, task, out, callbacks);
}

namespace {

int64_t metadata_size(const std::map<std::string, std::string>& m, const std::string& key,
                      const std::string& path) {
  const auto it = m.find("accrue.g2p." + key);
  if (it == m.end()) {
    throw FileError(str_cat(path, ": no accrue.g2p.", key,
                            " in its metadata (not a model saved by accrue-g2p --save)"));
  }
  const int64_t v = train::decimal_integer(it->second).value_or(0);
  if (v <= 0 || v > (1 << 20)) {
    throw FileError(
        str_cat(path, ": metadata accrue.g2p.", key, " = '", it->second, "' is not a size"));
  }
  return v;
}

// The model the metadata describes is built only once the file's tensors agree with it (the
// embeddings [V, C] and [T, C], n_layer blocks): sizes read from a file are checked against its
// contents before anything is allocated by them.
void check_sizes_match_tensors(const nn::GPTConfig& g, const std::map<std::string, Tensor>& tensors,
                               const std::string& path) {
  const auto expect = [&](const std::string& name, const Shape& shape) {
    const auto it = tensors.find(name);
    if (it == tensors.end() || it->second.shape() != shape) {
      throw FileError(str_cat(path, ": its metadata describes ", name, " ", shape_str(shape),
                              " but the file has ",
                              it == tensors.end() ? "no such tensor" : it->second.describe()));
    }
  };
  expect("transformer.wte.weight", {g.vocab_size, g.n_embd});
  expect("transformer.wpe.weight", {g.block_size, g.n_embd});
  int64_t blocks = 0;
  while (tensors.count(str_cat("transformer.h.", blocks, ".ln_1.weight")) != 0) ++blocks;
  if (blocks != g.n_layer) {
    throw FileError(str_cat(path, ": its metadata says n_layer ", g.n_layer, " but the file has ",
                            blocks, " blocks"));
  }
}

}  // namespace

std::unique_ptr<nn::GPT> load_saved_model(const std::string& path) {
  std::map<std::string, std::string> meta;
  const std::map<std::string, Tensor> tensors = optim::read_safetensors(path, &meta);
  const Vocabulary vocab;
  nn::GPTConfig g;
  g.vocab_size = metadata_size(meta, "vocab_size", path);
  g.block_size = metadata_size(meta, "block_size", path);
  g.n_layer = metadata_size(meta, "n_layer", path);
  g.n_head = metadata_size(meta, "n_head", path);
  g.n_embd = metadata_size(meta, "n_embd", path);
  std::string expected;
  for (const std::string& s : vocab.symbols) expected += (expected.empty() ? "" : " ") + s;
  if (g.vocab_size != vocab.size() || meta["accrue.g2p.vocabulary"] != expected) {
    throw FileError(str_cat(path, ": its vocabulary is not this program's"));
  }
  check_sizes_match_tensors(g, tensors, path);
  std::unique_ptr<nn::GPT> model;
  try {
    model = std::make_unique<nn::GPT>(g, DType::kFloat32);
  } catch (const ValueError& e) {
    throw FileError(str_cat(path, ": its metadata does not describe a model: ", e.what()));
  }
  optim::load_parameters(*model, path);
  model->eval();
  return model;
}

void predict(const Config& c, std::ostream& out) {
  const Vocabulary vocab;
  const std::unique_ptr<nn::GPT> built = load_saved_model(c.init);
  nn::GPT& model = *built;
  std::vector<std::string> words;
  for (std::string w : c.predict) {
    for (char& ch : w) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    words.push_back(w);
  }
  const std::vector<Pronunciation> p = decode(model, vocab, words, Device::cpu());
  for (size_t i = 0; i < words.size(); ++i) {
    out << words[i] << " ";
    for (const std::string& s : p[i]) out << " " << s;
    // The model ended the pronunciation at once: said, not an empty column.
    if (p[i].empty()) out << " (no phonemes: the model predicted <eos> first)";
    // decode() stops a word whose tokens fill the model's context: the pronunciation may go on.
    const int64_t context = model.config().block_size;
    if (static_cast<int64_t>(prompt(vocab, words[i]).size() + p[i].size()) > context) {
      out << " (cut short: the word and these phonemes fill the model's context of " << context
          << " tokens)";
    }
    out << "\n";
  }
}

int parse_args(int argc, const char* const* argv, Config& c, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "accrue-g2p: train a small GPT to pronounce English words (CMUdict), with gradient "
      "accumulation over token-normalised windows"};
  train::Flags flags(app, c);
  flags.data_files_are([&c] { return std::vector<std::string>{c.data}; });
  app.add_option("--data", c.data, "CMUdict's dict.txt (scripts/fetch-cmudict.sh)");
  app.add_option("--layers", c.layers, "Transformer blocks")->transform(train::int_in(1, 64));
  app.add_option("--heads", c.heads, "Attention heads per block")->transform(train::int_in(1, 64));
  app.add_option("--width", c.width, "Embedding width (a multiple of --heads)")
      ->transform(train::int_in(1, 8192));
  app.add_option("--eval", c.eval,
                 "Splits evaluated after the last epoch (validation, test, both); earlier epochs "
                 "evaluate the validation split")
      ->check(CLI::IsMember({"validation", "test", "both"}));
  app.add_option("--eval-limit", c.eval_limit, "Evaluate the first N words of each split (0: all)")
      ->transform(train::int_in(0, int64_t{1} << 30));
  app.add_option("--predict", c.predict,
                 "Pronounce these words with the model of --init (no training)");
  return train::parse_command_line(app, argc, argv, "accrue-g2p", out, err, flags.checked([&] {
    // --pipeline cuts the embeddings, each block and the head into stages (D10).
    if (c.pipeline > c.layers + 2) {
      throw ValueError(str_cat("--pipeline ", c.pipeline, " needs as many layers; --layers ",
                               c.layers, " makes ", c.layers + 2,
                               " (the embeddings, the blocks, the head)"));
    }
    if (c.width % c.heads != 0) {
      throw ValueError(str_cat("--width ", c.width, " is not a multiple of --heads ", c.heads));
    }
    // Each block's attention (4 C^2 + 4 C), MLP (8 C^2 + 5 C) and two LayerNorms (4 C): a lower
    // bound on the model, whose embeddings are sized by the data read later.
    train::check_model_fits(str_cat("--layers ", c.layers, " --width ", c.width),
                            c.layers * (12 * c.width * c.width + 13 * c.width), c);
    if (!c.predict.empty() && c.init.empty()) {
      throw ValueError("--predict needs --init MODEL.safetensors (a model saved with --save)");
    }
    const Vocabulary v;
    for (const std::string& w : c.predict) {
      for (char ch : w) {
        if (v.letter(static_cast<char>(std::toupper(static_cast<unsigned char>(ch)))) < 0) {
          throw ValueError("--predict '" + w + "': only letters and apostrophes");
        }
      }
      if (w.empty()) throw ValueError("--predict: an empty word");
    }
    // Predicting trains nothing: the model's sizes come from --init, and nothing is written.
    if (!c.predict.empty()) {
      for (const CLI::Option* option : app.get_options()) {
        const std::string name = option->get_name();
        if (option->count() > 0 && name != "--predict" && name != "--init" && name != "--help") {
          throw ValueError(name + " has no effect with --predict, which only reads --init");
        }
      }
    }
  }));
}

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Config config;
  const int status = parse_args(argc, argv, config, out, err);
  if (status >= 0) return status;
  return train::run_reporting_failure(
      "accrue-g2p", err,
      [&] {
        if (!config.predict.empty()) {
          predict(config, out);
        } else {
          train(config, out);
        }
      },
      [&](const FileError&) -> std::string {
        std::error_code ec;
        if (std::filesystem::exists(config.data, ec) || !config.predict.empty()) return "";
        return "accrue-g2p: fetch the data with scripts/fetch-cmudict.sh " +
               std::filesystem::path(config.data).parent_path().string();
      });
}

}  // namespace accrue::g2p
