#include "nn/hf_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "nn/family.h"
#include "nn/model_file_util.h"

namespace ztrain::nn {
namespace {

namespace fs = std::filesystem;
using ztrain::detail::StrCat;
using nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Elements of a tensor dtype ztrain reads, as a ztrain DType.
bool ReadableDType(const std::string& name, DType* out) {
  if (name == "F32") *out = DType::kF32;
  else if (name == "BF16") *out = DType::kBF16;
  else if (name == "F16") *out = DType::kF16;
  else return false;
  return true;
}

using detail::ParseJsonFile;
using detail::WriteJsonFile;

std::string ShardName(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return name;
}

}  // namespace

namespace {
const json* Value(const json& hf, const char* key) {
  auto it = hf.find(key);
  return it == hf.end() || it->is_null() ? nullptr : &*it;
}
[[noreturn]] void WrongType(const char* key, const std::string& path, const char* type,
                            const json& v) {
  throw ConfigError(StrCat(path, ": ", key, " is ", v.dump(), "; transformers expects ", type));
}
}  // namespace

int64_t HfInt(const json& hf, const char* key, const std::string& path) {
  const json* v = Value(hf, key);
  ZTRAIN_CHECK_T(ConfigError, v != nullptr, path, ": config.json has no ", key,
                 "; a Hugging Face model's config.json gives it");
  if (!v->is_number_integer()) WrongType(key, path, "an integer", *v);
  return v->get<int64_t>();
}
int64_t HfInt(const json& hf, const char* key, const std::string& path, int64_t fallback) {
  return Value(hf, key) ? HfInt(hf, key, path) : fallback;
}
double HfNumber(const json& hf, const char* key, const std::string& path, double fallback) {
  const json* v = Value(hf, key);
  if (!v) return fallback;
  if (!v->is_number()) WrongType(key, path, "a number", *v);
  return v->get<double>();
}
bool HfBool(const json& hf, const char* key, const std::string& path, bool fallback) {
  const json* v = Value(hf, key);
  if (!v) return fallback;
  if (!v->is_boolean()) WrongType(key, path, "true or false", *v);
  return v->get<bool>();
}
std::string HfString(const json& hf, const char* key, const std::string& path,
                     const std::string& fallback) {
  const json* v = Value(hf, key);
  if (!v) return fallback;
  if (!v->is_string()) WrongType(key, path, "a string", *v);
  return v->get<std::string>();
}

std::string HfTorchDType(DType dtype) {
  return dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
}

bool IsHfModelDir(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec) &&
         fs::is_regular_file(fs::path(path) / "config.json", ec);
}

bool NamesHfModelDir(const std::string& path) {
  std::error_code ec;
  return !path.empty() && (path.back() == '/' || fs::is_directory(path, ec));
}

// `dir`'s JSON file `name` (`what` the directory is, for the message).
json ReadDirJson(const std::string& dir, const char* name, const char* what) {
  const std::string path = (fs::path(dir) / name).string();
  std::error_code ec;
  ZTRAIN_CHECK_T(ConfigError, fs::is_regular_file(path, ec), "'", dir, "' is a directory without ",
                 name, ": not ", what);
  try {
    return ParseJsonFile(path, name);
  } catch (const IoError& e) {
    throw ConfigError(e.what());
  }
}

json ReadHfConfig(const std::string& dir) {
  return ReadDirJson(dir, "config.json", "a Hugging Face model directory");
}

// ---- Reading -------------------------------------------------------------------------------

HfCheckpoint::HfCheckpoint(std::string dir, const HfFiles& files)
    : dir_(std::move(dir)),
      config_name_(files.config),
      kind_(files.index ? "Hugging Face directory" : "PEFT adapter directory"),
      config_(ReadDirJson(
          dir_, files.config,
          files.index ? "a Hugging Face model directory" : "a PEFT adapter directory")) {
  const fs::path root(dir_);
  const char* kIndexName = files.index;
  const char* kSingleName = files.single;
  std::error_code ec;
  std::map<std::string, std::string> weight_map;  // from the index
  if (kIndexName && fs::is_regular_file(root / kIndexName, ec)) {
    const std::string index_path = (root / kIndexName).string();
    const json index = ParseJsonFile(index_path, "safetensors index");
    ZTRAIN_CHECK_T(IoError, index.contains("weight_map") && index["weight_map"].is_object(),
                   "safetensors index '", index_path, "' has no weight_map object");
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) {
      ZTRAIN_CHECK_T(IoError, file.is_string() &&
                                  fs::path(file.get<std::string>()).filename() == file.get<std::string>(),
                     "safetensors index '", index_path, "': tensor '", name,
                     "' maps to ", file.dump(), ", not a file name in the directory");
      weight_map[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
    files_.assign(files.begin(), files.end());
  } else {
    ZTRAIN_CHECK_T(IoError, fs::is_regular_file(root / kSingleName, ec),
                   kIndexName ? "Hugging Face directory '" : "PEFT adapter directory '", dir_,
                   kIndexName ? StrCat("' has neither ", kSingleName, " nor ", kIndexName)
                              : StrCat("' has no ", kSingleName),
                   "; ztrain reads safetensors weights (convert .bin / .pth files with "
                   "save_pretrained(..., safe_serialization=True))");
    files_.push_back(kSingleName);
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    const std::string path = (root / files_[f]).string();
    headers_.push_back(ReadSafetensorsHeader(path));
    inputs_.push_back(std::make_unique<detail::InputFile>(path, "safetensors file"));
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    for (const SafetensorsEntry& e : headers_[f].tensors) {
      const std::string path = (root / files_[f]).string();
      auto [it, fresh] = where_.emplace(e.name, Where{f, &e});
      ZTRAIN_CHECK_T(IoError, fresh, "Hugging Face directory '", dir_, "': tensor '", e.name,
                     "' is in both ", files_[it->second.file], " and ", files_[f]);
      if (!weight_map.empty()) {
        auto m = weight_map.find(e.name);
        ZTRAIN_CHECK_T(IoError, m != weight_map.end() && m->second == files_[f], path,
                       " holds tensor '", e.name, "', which ", kIndexName,
                       m == weight_map.end() ? " does not list" : StrCat(" puts in ", m->second));
      }
    }
  }
  for (const auto& [name, file] : weight_map) {
    ZTRAIN_CHECK_T(IoError, where_.count(name) != 0, (root / kIndexName).string(),
                   " lists tensor '", name, "' in ", file, ", which does not hold it");
  }
}

HfCheckpoint::~HfCheckpoint() = default;

const SafetensorsEntry* HfCheckpoint::Find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second.entry;
}

const HfCheckpoint::Where& HfCheckpoint::Locate(const std::string& name) const {
  auto it = where_.find(name);
  ZTRAIN_CHECK_T(IoError, it != where_.end(), "Hugging Face directory '", dir_,
                 "' has no tensor '", name, "'");
  return it->second;
}

const std::string& HfCheckpoint::FileOf(const std::string& name) const {
  return files_[Locate(name).file];
}

std::vector<std::string> HfCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, w] : where_) names.push_back(name);
  return names;
}

void HfCheckpoint::Read(const std::string& name, int64_t begin, int64_t count, float* out) const {
  const Where& w = Locate(name);
  DType dtype;
  ZTRAIN_CHECK_T(IoError, ReadableDType(w.entry->dtype, &dtype), files_[w.file], ": tensor '",
                 name, "' is ", w.entry->dtype, "; ztrain reads F32, BF16 and F16");
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  ZTRAIN_CHECK(begin >= 0 && count >= 0 && (begin + count) * elem <= w.entry->end - w.entry->begin,
               "elements [", begin, ", ", begin + count, ") are outside tensor '", name, "'");
  const int64_t offset = headers_[w.file].data_start + w.entry->begin + begin * elem;
  if (dtype == DType::kF32) {
    ZTRAIN_CHECK_T(IoError, inputs_[w.file]->ReadAt(offset, out, static_cast<size_t>(count) * 4),
                   files_[w.file], " ends inside tensor '", name, "'");
    return;
  }
  // 16-bit elements are widened in chunks through a small buffer.
  constexpr int64_t kChunk = 1 << 16;
  std::vector<uint16_t> raw(static_cast<size_t>(std::min(count, kChunk)));
  for (int64_t done = 0; done < count; done += kChunk) {
    const int64_t n = std::min(kChunk, count - done);
    ZTRAIN_CHECK_T(IoError,
                   inputs_[w.file]->ReadAt(offset + done * 2, raw.data(), static_cast<size_t>(n) * 2),
                   files_[w.file], " ends inside tensor '", name, "'");
    ConvertToFloat(raw.data(), dtype, out + done, static_cast<size_t>(n));
  }
}

std::vector<std::string> CheckHfTensors(const HfCheckpoint& ckpt,
                                        const std::vector<HfTensor>& layout,
                                        const HfFamily& family) {
  std::set<std::string> used;
  for (const HfTensor& t : layout) {
    const SafetensorsEntry* e = ckpt.Find(t.hf_name);
    ZTRAIN_CHECK_T(IoError, e != nullptr, ckpt.kind(), " '", ckpt.dir(), "' has no tensor '",
                   t.hf_name, "', which its ", ckpt.config_name(), " needs (",
                   ztrain::ShapeToString(t.hf_shape), ")");
    DType dtype;
    ZTRAIN_CHECK_T(IoError, ReadableDType(e->dtype, &dtype), ckpt.FileOf(t.hf_name),
                   ": tensor '", t.hf_name, "' is ", e->dtype,
                   "; ztrain reads F32, BF16 and F16 (a quantized checkpoint needs "
                   "dequantizing first)");
    ZTRAIN_CHECK_T(IoError, e->shape == t.hf_shape, ckpt.FileOf(t.hf_name), ": tensor '",
                   t.hf_name, "' is ", ztrain::ShapeToString(e->shape), " but ",
                   ckpt.config_name(), " gives ", ztrain::ShapeToString(t.hf_shape),
                   "; the weights and ", ckpt.config_name(), " disagree");
    used.insert(t.hf_name);
  }
  std::vector<std::string> unused;
  for (const std::string& name : ckpt.TensorNames()) {
    if (used.count(name)) continue;
    const bool buffer = std::any_of(family.buffers.begin(), family.buffers.end(),
                                    [&](const std::string& suffix) {
                                      return name.size() >= suffix.size() &&
                                             name.compare(name.size() - suffix.size(),
                                                          suffix.size(), suffix) == 0;
                                    });
    if (!buffer) unused.push_back(name);
  }
  return unused;
}

int64_t ReadHfParameter(const HfCheckpoint& ckpt, const HfTensor& t, int64_t begin,
                        int64_t count, float* out) {
  if (!t.transposed) {
    // The HF tensor is a row-major prefix of the parameter (rows beyond it are padding).
    const int64_t held = std::clamp<int64_t>(NumElements(t.hf_shape) - begin, 0, count);
    if (held > 0) ckpt.Read(t.hf_name, begin, held, out);
    std::fill(out + held, out + count, 0.0f);
    return held;
  }
  // Parameter [rows, cols] is HF [cols, rows] transposed: parameter rows r0..r1 are HF
  // columns r0..r1, read as one column band, row by row.
  const int64_t cols = t.param_shape[1];
  const int64_t hf_cols = t.hf_shape[1];
  const int64_t r0 = begin / cols, r1 = (begin + count - 1) / cols;
  const int64_t band = r1 - r0 + 1;
  std::vector<float> block(static_cast<size_t>(cols * band));
  for (int64_t c = 0; c < cols; ++c) ckpt.Read(t.hf_name, c * hf_cols + r0, band, &block[c * band]);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t p = begin + i;
    out[i] = block[static_cast<size_t>((p % cols) * band + (p / cols - r0))];
  }
  return count;
}

std::vector<char> HfTensorBytes(const HfTensor& t, const float* param, DType dtype) {
  const int64_t n = NumElements(t.hf_shape);
  std::vector<float> values;
  const float* src = param;  // a non-transposed HF tensor is a prefix of the parameter
  if (t.transposed) {
    const int64_t rows = t.param_shape[0], cols = t.param_shape[1];
    values.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) values[c * rows + r] = param[r * cols + c];
    src = values.data();
  }
  std::vector<char> bytes(static_cast<size_t>(n) * DTypeSize(dtype));
  if (dtype == DType::kF32) {
    std::copy(src, src + n, reinterpret_cast<float*>(bytes.data()));
  } else {
    ConvertFromFloat(src, bytes.data(), dtype, static_cast<size_t>(n));
  }
  return bytes;
}

// ---- Writing -------------------------------------------------------------------------------

HfModelWriter::HfModelWriter(std::string dir, const ModelConfig& model, DType dtype,
                             int64_t max_shard_bytes)
    : dir_(std::move(dir)), model_(model), dtype_(dtype),
      family_(&FindModelFamily(model.type).hf) {
  ZTRAIN_CHECK_T(ConfigError, dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
                 "a Hugging Face directory holds fp32, bf16 or fp16 tensors, not ",
                 DTypeName(dtype));
  ZTRAIN_CHECK_T(ConfigError, max_shard_bytes > 0, "the largest shard must be positive, not ",
                 max_shard_bytes);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  ZTRAIN_CHECK_T(IoError, !ec && fs::is_directory(dir_), "cannot create the directory '", dir_,
                 "': ", ec.message());
  layout_ = family_->layout(model_);
  // Shards cut in layout order: a tensor starts a new shard when it would pass the limit.
  int64_t in_shard = 0;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const int64_t bytes = NumElements(layout_[i].hf_shape) * static_cast<int64_t>(DTypeSize(dtype));
    if (shards_.empty() || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      shards_.emplace_back();
      in_shard = 0;
    }
    shards_.back().push_back(i);
    shard_of_.push_back(shards_.size() - 1);
    in_shard += bytes;
    total_bytes_ += bytes;
    by_param_[layout_[i].param] = i;
  }
  for (size_t k = 0; k < shards_.size(); ++k) {
    missing_.push_back(shards_[k].size());
    file_names_.push_back(shards_.size() == 1 ? kSingleName : ShardName(k, shards_.size()));
  }
  bytes_.resize(layout_.size());
  added_.assign(layout_.size(), false);
}

HfModelWriter::~HfModelWriter() = default;

void HfModelWriter::Add(const std::string& param, const float* values) {
  auto it = by_param_.find(param);
  ZTRAIN_CHECK(it != by_param_.end(), "the Hugging Face layout of model.type '", model_.type,
               "' has no parameter '", param, "'");
  const size_t i = it->second;
  ZTRAIN_CHECK(!added_[i], "parameter '", param, "' was written twice");
  added_[i] = true;
  bytes_[i] = HfTensorBytes(layout_[i], values, dtype_);
  const size_t k = shard_of_[i];
  if (--missing_[k] == 0) WriteShard(k);
}

void HfModelWriter::WriteShard(size_t k) {
  std::vector<SafetensorsTensor> tensors;
  for (size_t i : shards_[k]) {
    const HfTensor& t = layout_[i];
    tensors.push_back({t.hf_name, std::string(SafetensorsDTypeName(dtype_)), t.hf_shape,
                       bytes_[i].data(), static_cast<int64_t>(bytes_[i].size())});
  }
  WriteSafetensors((fs::path(dir_) / file_names_[k]).string(), tensors, {{"format", "pt"}});
  for (size_t i : shards_[k]) std::vector<char>().swap(bytes_[i]);
}

int HfModelWriter::Finish() {
  std::string missing;
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (!added_[i]) missing += (missing.empty() ? "" : ", ") + layout_[i].param;
  }
  ZTRAIN_CHECK(missing.empty(), "the Hugging Face directory '", dir_,
               "' misses parameters: ", missing);
  const fs::path root(dir_);
  std::error_code ec;
  if (shards_.size() > 1) {
    json weight_map = json::object();
    for (size_t i = 0; i < layout_.size(); ++i) {
      weight_map[layout_[i].hf_name] = file_names_[shard_of_[i]];
    }
    WriteJsonFile((root / kIndexName).string(),
                  {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map}});
  } else {
    fs::remove(root / kIndexName, ec);
  }
  // Weights of an earlier save that the new index does not name would be read by nothing,
  // but mislead a person reading the directory.
  const std::set<std::string> ours(file_names_.begin(), file_names_.end());
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model", 0) == 0 && e.path().extension() == ".safetensors" && !ours.count(name)) {
      fs::remove(e.path(), ec);
    }
  }
  json config = family_->write_config(model_, dtype_);
  WriteJsonFile((root / "config.json").string(), config);
  if (!fs::exists(root / "generation_config.json", ec)) {
    WriteJsonFile((root / "generation_config.json").string(), {{"_from_model_config", true}});
  }
  return static_cast<int>(shards_.size());
}

int CopyHfCompanionFiles(const std::string& from, const std::string& to) {
  if (!IsHfModelDir(from)) return 0;
  int copied = 0;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "tokenizer.model", "generation_config.json", "vocab.json",
                           "merges.txt"}) {
    const fs::path src = fs::path(from) / name;
    std::error_code ec;
    if (!fs::is_regular_file(src, ec)) continue;
    fs::copy_file(src, fs::path(to) / name, fs::copy_options::overwrite_existing, ec);
    ZTRAIN_CHECK_T(IoError, !ec, "cannot copy ", src.string(), " to ", to, ": ", ec.message());
    ++copied;
  }
  return copied;
}

}  // namespace ztrain::nn
