// A small CMUdict-shaped fixture for the G2P tests: words of 1-8 letters with 1-8 phonemes,
// drawn from a fixed generator, some with alternates, written as dict.txt lines.
#pragma once

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "cmudict.h"
#include "distributed/communicator.h"

namespace accrue::testing {

inline std::filesystem::path g2p_scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("accrue-g2p-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// `words` distinct words; with fixed_length, every word has 5 letters and 4 phonemes and no
// alternates (every sequence as long as every other).
inline std::string write_g2p_fixture(const std::filesystem::path& dir, int words, uint64_t seed = 1,
                                     bool fixed_length = false) {
  std::mt19937_64 rng(seed);
  const auto& symbols = g2p::phoneme_symbols();
  std::set<std::string> seen;
  std::ofstream out(dir / "dict.txt");
  // At least one word in each of the validation and test splits: a run refuses an empty one.
  const auto has = [&](g2p::Split split) {
    for (const std::string& w : seen)
      if (g2p::split_of(w) == split) return true;
    return false;
  };
  while (static_cast<int>(seen.size()) < words || !has(g2p::Split::kValidation) ||
         !has(g2p::Split::kTest)) {
    const int letters = fixed_length ? 5 : 1 + static_cast<int>(rng() % 8);
    std::string w;
    for (int i = 0; i < letters; ++i) w += static_cast<char>('A' + rng() % 26);
    if (!seen.insert(w).second) continue;
    const int prons = fixed_length ? 1 : (rng() % 5 == 0 ? 2 : 1);
    for (int p = 0; p < prons; ++p) {
      out << w << (p ? "(" + std::to_string(p) + ")" : "") << " ";
      // The phonemes follow the letters (a learnable map), the length varies on its own.
      const int n = fixed_length ? 4 : 1 + static_cast<int>((letters + p + rng() % 3) % 8);
      for (int i = 0; i < n; ++i) {
        out << " "
            << symbols[(static_cast<size_t>(w[static_cast<size_t>(i) % w.size()]) * 7 + p) %
                       symbols.size()];
      }
      out << "\n";
    }
  }
  return (dir / "dict.txt").string();
}

// One fixture of 200 words for every rank of `comm` (the ranks' settings, the data path
// included, must agree), in the temporary folder `name`, written by rank 0.
inline std::filesystem::path shared_g2p_fixture(distributed::Communicator& comm,
                                                const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  if (comm.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write_g2p_fixture(dir, 200);
  }
  comm.barrier();
  return dir;
}

}  // namespace accrue::testing
