#include "nn/safetensors.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "nn/model_file_util.h"

namespace ztrain::nn {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little endian; a big-endian host would need byte swaps");

// ordered_json keeps the header's key order: tensors are written in the order given, and a
// reader keeps header order among zero-sized tensors at the same offset.
using Json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit
constexpr int64_t kAlignment = 8;

struct DTypeInfo {
  std::string_view name;
  int64_t size;
};
// The dtypes of the safetensors specification with their element sizes.
constexpr DTypeInfo kDTypes[] = {{"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1},
                                 {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
                                 {"BF16", 2},    {"I32", 4}, {"U32", 4}, {"F32", 4},
                                 {"F64", 8},     {"I64", 8}, {"U64", 8}};

// Bytes of `shape` elements of `elem` bytes each, or -1 when that overflows int64.
int64_t ByteCount(const Shape& shape, int64_t elem) {
  int64_t bytes = elem;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return -1;
  return bytes;
}

std::string ShapeJson(const Shape& shape) { return Json(shape).dump(); }

// ---- Writing -------------------------------------------------------------------------------

void CheckArgument(const SafetensorsTensor& t, const std::string& path,
                   std::set<std::string>& names) {
  ZTRAIN_CHECK(!t.name.empty() && t.name != kMetadataKey && names.insert(t.name).second,
               "cannot write safetensors file '", path, "': tensor name '", t.name,
               "' is empty, reserved or repeated");
  const int64_t elem = SafetensorsDTypeSize(t.dtype);
  ZTRAIN_CHECK(elem > 0, "cannot write safetensors file '", path, "': tensor '", t.name,
               "' has unknown dtype '", t.dtype, "'");
  ZTRAIN_CHECK(ByteCount(t.shape, elem) == t.nbytes && (t.data != nullptr || t.nbytes == 0),
               "cannot write safetensors file '", path, "': tensor '", t.name, "' is ", t.dtype,
               ShapeJson(t.shape), " but has ", t.nbytes, " bytes of data");
}

// The JSON header, padded with spaces so that 8 + its length is a multiple of 8.
std::string HeaderText(std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = Json(metadata);
  int64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();  // compact; throws on invalid UTF-8
  text.append((kAlignment - text.size() % kAlignment) % kAlignment, ' ');
  return text;
}

// ---- Reading -------------------------------------------------------------------------------

template <typename... Args>
void Require(bool ok, const std::string& path, const Args&... rule) {
  ZTRAIN_CHECK_T(IoError, ok, "safetensors file '", path, "' breaks the format: ", rule...);
}

// Reads and checks N, the header length, against the file and the alignment rule.
int64_t ReadHeaderLength(const detail::InputFile& f) {
  unsigned char raw[8];
  Require(f.ReadAt(0, raw, sizeof raw), f.path(), "truncated: the file is ", f.size(),
          " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[i];
  Require(n <= kMaxHeaderBytes, f.path(), "header length ", n, " exceeds the limit of ",
          kMaxHeaderBytes, " bytes");
  const int64_t len = static_cast<int64_t>(n);
  Require(8 + len <= f.size(), f.path(), "header length ", n, " points past the end of the file (",
          f.size(), " bytes; truncated?)");
  Require((8 + len) % kAlignment == 0, f.path(), "the data region starts at byte ", 8 + len,
          ", not 8-byte aligned (pad the header with spaces)");
  return len;
}

// Parses the header's JSON; a repeated top-level key is an error, not "last one wins".
Json ParseHeaderJson(const detail::InputFile& f, int64_t n) {
  std::string text(static_cast<size_t>(n), '\0');
  Require(f.ReadAt(8, text.data(), text.size()), f.path(), "truncated header");
  Require(!text.empty() && text[0] == '{', f.path(), "the header does not start with '{'");
  std::set<std::string> keys;
  std::string repeated;
  const Json::parser_callback_t note_repeats = [&](int depth, Json::parse_event_t event,
                                                   Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key &&
        !keys.insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, note_repeats);
  } catch (const Json::parse_error& e) {
    Require(false, f.path(), "the header is not valid UTF-8 JSON (", e.what(), ")");
  }
  Require(j.is_object(), f.path(), "the header is not a JSON object");
  Require(repeated.empty(), f.path(), "the header names '", repeated, "' twice");
  return j;
}

std::map<std::string, std::string> ParseMetadata(const Json& j, const std::string& path) {
  Require(j.is_object(), path, "__metadata__ is not an object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : j.items()) {
    Require(value.is_string(), path, "__metadata__ value of '", key, "' is not a string");
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

// A JSON array of non-negative integers, each at most int64's maximum.
bool ReadInts(const Json& j, Shape& out) {
  if (!j.is_array()) return false;
  out.clear();
  for (const Json& v : j) {
    if (!v.is_number_unsigned() ||
        v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
      return false;
    out.push_back(static_cast<int64_t>(v.get<uint64_t>()));
  }
  return true;
}

// One tensor's entry: its dtype is known and its byte range matches dtype and shape.
SafetensorsEntry ParseEntry(const std::string& name, const Json& j, const std::string& path) {
  Require(j.is_object(), path, "entry '", name, "' is not an object");
  SafetensorsEntry e;
  e.name = name;
  Require(j.contains("dtype") && j["dtype"].is_string(), path, "tensor '", name,
          "' has no dtype string");
  e.dtype = j["dtype"].get<std::string>();
  const int64_t elem = SafetensorsDTypeSize(e.dtype);
  Require(elem > 0, path, "tensor '", name, "' has unknown dtype '", e.dtype, "'");
  Require(j.contains("shape") && ReadInts(j["shape"], e.shape), path, "tensor '", name,
          "' has no shape of non-negative integers");
  Shape offsets;
  Require(j.contains("data_offsets") && ReadInts(j["data_offsets"], offsets) &&
              offsets.size() == 2 && offsets[0] <= offsets[1],
          path, "tensor '", name, "' has no data_offsets [begin, end] with begin <= end");
  e.begin = offsets[0];
  e.end = offsets[1];
  const int64_t need = ByteCount(e.shape, elem);
  Require(need >= 0, path, "tensor '", name, "': ", e.dtype, ShapeJson(e.shape),
          " overflows a 64-bit byte count");
  Require(e.end - e.begin == need, path, "wrong size: tensor '", name, "' has data_offsets [",
          e.begin, ", ", e.end, "] (", e.end - e.begin, " bytes) but ", e.dtype, ShapeJson(e.shape),
          " needs ", need, " bytes");
  return e;
}

// The tensors, sorted by offset, tile the data region exactly: from 0, without gaps or
// overlaps, up to the end of the file.
void CheckTiling(std::vector<SafetensorsEntry>& tensors, int64_t data_bytes,
                 const std::string& path) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t covered = 0;
  std::string previous = "the start of the data";
  for (const SafetensorsEntry& e : tensors) {
    Require(e.begin <= covered, path, "gap: data bytes [", covered, ", ", e.begin, ") between ",
            previous, " and tensor '", e.name, "' belong to no tensor");
    Require(e.begin >= covered, path, "overlap: tensor '", e.name, "' starts at data byte ",
            e.begin, ", inside ", previous, " which ends at ", covered);
    covered = e.end;
    previous = "tensor '" + e.name + "'";
  }
  Require(covered <= data_bytes, path, "truncated: the tensors need ", covered,
          " data bytes but the file holds ", data_bytes);
  Require(covered >= data_bytes, path, "trailing bytes: the data region has ", data_bytes,
          " bytes but the tensors cover only ", covered);
}

}  // namespace

int64_t SafetensorsDTypeSize(std::string_view dtype) {
  for (const DTypeInfo& d : kDTypes)
    if (d.name == dtype) return d.size;
  return 0;
}

std::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kU16:
      return "U16";
    case DType::kU8:
      return "U8";
  }
  ZTRAIN_ASSERT(false, "unknown dtype");
}

const SafetensorsEntry* SafetensorsHeader::Find(std::string_view name) const {
  for (const SafetensorsEntry& e : tensors)
    if (e.name == name) return &e;
  return nullptr;
}

void WriteSafetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const SafetensorsTensor& t : tensors) CheckArgument(t, path, names);
  std::string header;
  try {
    header = HeaderText(tensors, metadata);
  } catch (const Json::exception& e) {
    ZTRAIN_CHECK(false, "cannot write safetensors file '", path,
                 "': tensor names and metadata must be valid UTF-8 (", e.what(), ")");
  }
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  detail::AtomicFileWriter out(path, "safetensors file");
  out.Write(length, sizeof length);
  out.Write(header.data(), header.size());
  for (const SafetensorsTensor& t : tensors) out.Write(t.data, static_cast<size_t>(t.nbytes));
  out.Commit();
}

SafetensorsHeader ReadSafetensorsHeader(const std::string& path) {
  const detail::InputFile f(path, "safetensors file");
  SafetensorsHeader h;
  h.header_bytes = ReadHeaderLength(f);
  h.data_start = 8 + h.header_bytes;
  h.data_bytes = f.size() - h.data_start;
  const Json j = ParseHeaderJson(f, h.header_bytes);
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      h.metadata = ParseMetadata(value, path);
    } else {
      h.tensors.push_back(ParseEntry(key, value, path));
    }
  }
  CheckTiling(h.tensors, h.data_bytes, path);
  return h;
}

std::vector<char> ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader& header,
                                        std::string_view name) {
  const SafetensorsEntry* e = header.Find(name);
  ZTRAIN_CHECK_T(IoError, e != nullptr, "safetensors file '", path, "' has no tensor '", name, "'");
  std::vector<char> bytes(static_cast<size_t>(e->end - e->begin));
  const detail::InputFile f(path, "safetensors file");
  ZTRAIN_CHECK_T(IoError, f.ReadAt(header.data_start + e->begin, bytes.data(), bytes.size()),
                 "safetensors file '", path, "' ends inside tensor '", name,
                 "' (changed since its header was read?)");
  return bytes;
}

}  // namespace ztrain::nn
