#include "core/json_text.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace ztrain {
namespace {

using nlohmann::json;

// 1-based line and column of byte index `index` in `text`.
std::pair<size_t, size_t> LineColumn(const std::string& text, size_t index) {
  index = std::min(index, text.size());
  const size_t line = 1 + std::count(text.begin(), text.begin() + index, '\n');
  const size_t line_start = index == 0 ? std::string::npos : text.rfind('\n', index - 1);
  const size_t column = line_start == std::string::npos ? index + 1 : index - line_start;
  return {line, column};
}

// nlohmann's message without its "[json.exception...] parse error at ...: " prefix.
std::string SyntaxMessage(const json::parse_error& e) {
  const std::string what = e.what();
  const size_t start = what.find("parse error");
  const size_t colon = start == std::string::npos ? start : what.find(": ", start);
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

// A NUL byte, or many control bytes, in the first 4 KiB: not text.
bool LooksBinary(const std::string& text) {
  const size_t n = std::min<size_t>(text.size(), 4096);
  size_t control = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) return true;
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') ++control;
  }
  return n > 0 && control * 10 > n;
}

}  // namespace

std::string ParseJson(const std::string& text, json* out, const json::parser_callback_t& callback) {
  *out = json();
  if (LooksBinary(text)) return "is a binary file, not JSON";
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return "is empty, not JSON";
  try {
    *out = json::parse(text, callback);
  } catch (const json::parse_error& e) {
    const bool ended = e.byte >= text.size() ||
                       text.find_first_not_of(" \t\r\n", e.byte) == std::string::npos;
    const auto [line, column] = LineColumn(text, e.byte == 0 ? 0 : e.byte - 1);
    return detail::StrCat(line, ":", column, ": JSON syntax error: ", SyntaxMessage(e),
                          ended ? " (the file ends before its JSON does: truncated?)" : "");
  }
  return "";
}

std::string ReadTextFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  ZTRAIN_CHECK_T(IoError, in.good(), "cannot open ", what, " '", path, "': ",
                 std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  ZTRAIN_CHECK_T(IoError, !in.bad(), "cannot read ", what, " '", path, "'");
  return buffer.str();
}

}  // namespace ztrain
