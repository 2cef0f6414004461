// JSON as accrue reads it from files (a safetensors header, a checkpoint's description): parsed
// with nlohmann::json, refusing what that library would take silently or could not take safely.
// A key given twice in one object is an error (the library keeps the last); so is a NUL byte (the
// library would stop reading there), and nesting deeper than kMaxJsonDepth (copying, comparing or
// printing a value recurses once per level, so a file of a few hundred KiB of brackets would
// overflow the stack). Values quoted in errors are cut short (brief_json). Read next:
// optim/safetensors.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace accrue::optim {

// Far deeper than any file accrue writes (a checkpoint's description nests 3 levels).
constexpr int kMaxJsonDepth = 64;

// A value as an error message quotes it: its JSON text, cut after 64 characters (a file's value
// may be a megabyte long; the message stays one short line).
inline std::string brief_json(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 64)
    text = text.substr(0, 64) + "... (" + std::to_string(text.size()) + " characters)";
  return text;
}

// The JSON text [first, last); throws std::invalid_argument saying what is wrong (a syntax error
// as nlohmann::json words it, a repeated key, nesting too deep). The caller names the file.
template <typename Iterator>
nlohmann::json parse_strict_json(Iterator first, Iterator last) {
  std::vector<std::set<std::string>> keys;  // the keys seen in each open object
  const auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      if (depth >= kMaxJsonDepth) {
        throw std::invalid_argument("nested more than " + std::to_string(kMaxJsonDepth) +
                                    " levels deep");
      }
      if (event == Event::object_start) keys.emplace_back();
    } else if (event == Event::object_end) {
      keys.pop_back();
    } else if (event == Event::key && !keys.back().insert(parsed.get<std::string>()).second) {
      throw std::invalid_argument("the key " + brief_json(parsed) + " appears twice in one object");
    }
    return true;
  };
  // nlohmann::json stops at a NUL byte as at the end of the text, so what follows one would go
  // unread; JSON text never holds one (a string escapes it as \u0000).
  const Iterator nul = std::find(first, last, '\0');
  if (nul != last) {
    throw std::invalid_argument("a NUL byte at offset " +
                                std::to_string(std::distance(first, nul)));
  }
  try {
    return nlohmann::json::parse(first, last, check);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(e.what());
  }
}

}  // namespace accrue::optim
