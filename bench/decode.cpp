// accrue-decode: G2P's greedy decoding of a CMUdict split, with each block's keys and values
// cached and with the whole prefix recomputed at every step (g2p::Decoding), on the CPU with the
// threads given: the best of three timings of each, the speed-up, and every word the two
// decodings pronounce differently, with the gap between the two largest logits (of the whole
// prefix's forward) where they part: a near tie that the products' other rounding flips.
// Usage: accrue-decode CMUDICT MODEL.safetensors [validation|test] [THREADS]
#include <algorithm>
#include <chrono>
#include <functional>
#include <iomanip>
#include <iostream>

#include "accrue.h"
#include "core/threads.h"
#include "g2p.h"
#include "kernels/cpu/blas_core.h"

namespace {

using namespace accrue;

double seconds_of(const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The gap between the two largest logits for the token after `tokens` (the whole prefix).
double top_two_gap(nn::GPT& model, const std::vector<int32_t>& tokens) {
  const NoGradGuard no_grad;
  const int64_t t = static_cast<int64_t>(tokens.size());
  const Tensor logits = model(Tensor::from_vector<int32_t>({1, t}, tokens));
  std::vector<float> last = logits.narrow(t - 1, 1).to_vector<float>();
  std::partial_sort(last.begin(), last.begin() + 2, last.end(), std::greater<float>());
  return static_cast<double>(last[0]) - static_cast<double>(last[1]);
}

}  // namespace

int main(int argc, char** argv) {
  cpu::run_with_cpu_blas_kernels(argv);
  if (argc < 3 || argc > 5) {
    std::cerr << "usage: accrue-decode CMUDICT MODEL.safetensors [validation|test] [THREADS]\n";
    return 2;
  }
  const std::string split = argc > 3 ? argv[3] : "validation";
  if (split != "validation" && split != "test") {
    std::cerr << "accrue-decode: the split is validation or test, got '" << split << "'\n";
    return 2;
  }
  try {
    if (argc > 4) set_cpu_threads(std::stoi(argv[4]));
    const g2p::Data data = g2p::load_data(argv[1], 0);
    const std::unique_ptr<nn::GPT> model = g2p::load_saved_model(argv[2]);
    const std::vector<g2p::Word>& words = split == "validation" ? data.validation : data.test;
    std::vector<std::string> spellings;
    for (const g2p::Word& w : words) spellings.push_back(w.spelling);
    std::vector<g2p::Pronunciation> cached, whole;
    const double with_cache =
        seconds_of([&] { cached = g2p::decode(*model, data.vocab, spellings, Device::cpu()); });
    const double without = seconds_of([&] {
      whole =
          g2p::decode(*model, data.vocab, spellings, Device::cpu(), g2p::Decoding::kWholePrefix);
    });
    std::cout << std::fixed << std::setprecision(3) << split << ": " << spellings.size()
              << " words, " << cpu_threads() << " threads; the whole prefix " << without
              << " s, cached " << with_cache << " s: " << std::setprecision(2)
              << without / with_cache << "x\n";
    int64_t differ = 0;
    for (size_t i = 0; i < spellings.size(); ++i) {
      if (cached[i] == whole[i]) continue;
      ++differ;
      size_t j = 0;
      while (j < cached[i].size() && j < whole[i].size() && cached[i][j] == whole[i][j]) ++j;
      std::vector<int32_t> tokens = g2p::prompt(data.vocab, spellings[i]);
      for (size_t k = 0; k < j; ++k) tokens.push_back(data.vocab.phoneme_ids.at(whole[i][k]));
      std::string a, b;
      for (const auto& p : whole[i]) a += " " + p;
      for (const auto& p : cached[i]) b += " " + p;
      std::cout << "  " << spellings[i] << ": whole prefix" << a << " | cached" << b
                << " | logit gap at phoneme " << j << ": " << std::scientific
                << std::setprecision(2) << top_two_gap(*model, tokens) << std::fixed << "\n";
    }
    std::cout << differ << " of " << spellings.size() << " words differ\n";
  } catch (const std::exception& e) {
    std::cerr << "accrue-decode: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
