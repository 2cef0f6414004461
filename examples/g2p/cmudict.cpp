// Reading and checking CMUdict (see cmudict.h).
#include "cmudict.h"

#include <functional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/file.h"

namespace accrue::g2p {

const std::vector<std::string>& phoneme_symbols() {
  static const std::vector<std::string> symbols = [] {
    const char* vowels[] = {"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER",
                            "EY", "IH", "IY", "OW", "OY", "UH", "UW"};
    const char* consonants[] = {"B",  "CH", "D", "DH", "F",  "G", "HH", "JH", "K", "L", "M", "N",
                                "NG", "P",  "R", "S",  "SH", "T", "TH", "V",  "W", "Y", "Z", "ZH"};
    std::vector<std::string> out;
    for (const char* v : vowels) {
      for (const char* stress : {"0", "1", "2"}) out.push_back(std::string(v) + stress);
    }
    for (const char* c : consonants) out.emplace_back(c);
    return out;
  }();
  return symbols;
}

namespace {

bool is_word_character(char c) {
  return (c >= 'A' && c <= 'Z') || c == '\'';
}

// "WORD(3)" -> "WORD"; the suffix must be "(" a number from 1, without leading zeros ")", so
// that one alternate has one spelling.
std::string strip_alternate(const std::string& word,
                            const std::function<void(const std::string&)>& fail) {
  const size_t open = word.find('(');
  if (open == std::string::npos) return word;
  if (open == 0 || word.back() != ')' || open + 2 >= word.size() || word[open + 1] == '0') {
    fail("malformed alternate suffix in '" + word + "'");
  }
  for (size_t i = open + 1; i + 1 < word.size(); ++i) {
    if (word[i] < '0' || word[i] > '9') fail("malformed alternate suffix in '" + word + "'");
  }
  return word.substr(0, open);
}

}  // namespace

// CMUdict 0.7b is 3.7 MB; its longest word has 34 letters and its longest pronunciation 32
// phonemes. A file or an entry far beyond that is not a pronouncing dictionary: refused before a
// model's context is sized by it.
constexpr uint64_t kMaxDictionaryBytes = 256 << 20;
constexpr size_t kMaxEntryLength = 64;

Lexicon read_cmudict(const std::string& path) {
  const std::vector<uint8_t> bytes =
      read_file_bytes(path, kMaxDictionaryBytes, "a pronouncing dictionary");
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  const std::set<std::string> known(phoneme_symbols().begin(), phoneme_symbols().end());
  Lexicon lex;
  std::unordered_map<std::string, size_t> index;
  std::unordered_map<std::string, int64_t> first_line;  // each entry's key ("WORD(1)")
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    const auto fail = [&](const std::string& what) {
      throw FileError(str_cat(path, ": line ", number, ": ", what));
    };
    // A byte-order mark before the first line, Windows line ends and blank lines are the
    // editor's, not the dictionary's.
    if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    for (unsigned char c : line) {
      // Non-ASCII bytes occur in the package's words ("D\xEF\xBF\xBDJ\xEF\xBF\xBD", a
      // replacement character where an accent was): such a word is skipped below.
      if (c < 0x20 || c == 0x7f) fail(str_cat("control byte ", int(c)));
    }
    if (line.rfind(";;;", 0) == 0) continue;
    const size_t sep = line.find("  ");
    if (sep == std::string::npos) fail("no two-space separator between word and phonemes");
    const std::string raw = line.substr(0, sep);
    if (raw.empty() || raw.find(' ') != std::string::npos) fail("empty or spaced word");
    const std::string word = strip_alternate(raw, fail);
    // A repeated entry would count its word twice in training and in the splits' scores.
    const auto [seen, fresh] = first_line.emplace(raw, number);
    if (!fresh) fail(str_cat("'", raw, "' again (first on line ", seen->second, ")"));
    if (word.size() > kMaxEntryLength) {
      fail(str_cat("a word of ", word.size(), " characters (", kMaxEntryLength, " at most)"));
    }
    Pronunciation phonemes;
    size_t at = sep + 2;
    while (at <= line.size()) {
      const size_t end = std::min(line.find(' ', at), line.size());
      const std::string p = line.substr(at, end - at);
      if (p.empty()) fail("empty phoneme (doubled or trailing space)");
      if (!known.count(p)) fail("unknown phoneme '" + p + "'");
      phonemes.push_back(p);
      at = end + 1;
    }
    if (phonemes.empty()) fail("no phonemes");
    if (phonemes.size() > kMaxEntryLength) {
      fail(str_cat(phonemes.size(), " phonemes (", kMaxEntryLength, " at most)"));
    }
    bool keep = true;
    for (char c : word) keep = keep && is_word_character(c);
    if (!keep) {
      ++lex.skipped;
      continue;
    }
    auto it = index.find(word);
    if (it == index.end()) {
      if (raw != word) fail("alternate '" + raw + "' before its word");
      index.emplace(word, lex.words.size());
      lex.words.push_back(Word{word, {phonemes}});
    } else {
      lex.words[it->second].pronunciations.push_back(phonemes);
    }
    ++lex.entries;
  }
  if (lex.entries == 0) throw FileError(str_cat(path, ": no dictionary entries"));
  return lex;
}

Split split_of(const std::string& spelling) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : spelling) {
    h ^= c;
    h *= 1099511628211ull;
  }
  switch (h % 20) {
    case 0:
      return Split::kTest;
    case 1:
      return Split::kValidation;
    default:
      return Split::kTrain;
  }
}

}  // namespace accrue::g2p
