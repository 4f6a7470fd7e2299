#pragma once
// JSON as users hand it over, read with answers in their own words: a syntax error names the
// file, the line and the column; a file that ends before its JSON does is called truncated;
// a binary file (a model's weights given as its config, say) is called binary, not "invalid
// JSON" with the parser's byte dump. Used for config files, Hugging Face config.json,
// adapter_config.json, indexes and tokenizer files.
#include <nlohmann/json.hpp>
#include <string>

namespace ztrain {

// `text` parsed into *out; or what is wrong with it as JSON, in words ("3:17: JSON syntax
// error: ..."; "is a binary file, not JSON"; "is empty, not JSON"), with *out left null.
// Returns "" when it parses. `callback` as nlohmann's (called during the one parse).
std::string ParseJson(const std::string& text, nlohmann::json* out,
                      const nlohmann::json::parser_callback_t& callback = nullptr);

// `text` parsed; on a problem throws E (ConfigError or IoError) "<label>: <problem>".
template <typename E>
nlohmann::json ParseJsonOrThrow(const std::string& text, const std::string& label,
                                const nlohmann::json::parser_callback_t& callback = nullptr) {
  nlohmann::json j;
  const std::string problem = ParseJson(text, &j, callback);
  if (!problem.empty()) {
    const bool at_line = problem[0] >= '0' && problem[0] <= '9';
    throw E(label + (at_line ? ":" : " ") + problem);
  }
  return j;
}

// The whole file at `path` (IoError naming `what` and the OS error when it cannot be read).
std::string ReadTextFile(const std::string& path, const std::string& what);

}  // namespace ztrain
