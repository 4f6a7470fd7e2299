#pragma once
// safetensors files, Hugging Face's tensor file format (github.com/huggingface/safetensors),
// which transformers, PyTorch (safetensors.torch), JAX and most inference engines read.
//
// Layout: an 8-byte little-endian unsigned header length N, then N bytes of UTF-8 JSON
//   {"__metadata__": {str: str, ...},
//    "<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
// then the data region: every tensor's bytes, little endian and row major, at
// [8 + N + begin, 8 + N + end). A 0-d tensor has shape [] and one element.
//
// WriteSafetensors writes the header compact (no whitespace), "__metadata__" first (only when
// there is metadata), tensors in the order given, and pads the header with spaces so that the
// data starts 8-byte aligned; the tensors lie back to back in that order. The file is
// written to a temporary and renamed into place (Note [atomic model files] in
// nn/model_file_util.h).
//
// ReadSafetensorsHeader checks every rule a loader relies on (see safetensors.cc) and is
// stricter than the reference reader in one way: it requires the 8-byte aligned data start
// that the reference writer produces and WriteSafetensors guarantees.
//
// Errors: IoError naming the file (and for a malformed file, the rule it breaks); invalid
// arguments to WriteSafetensors are Error naming the file and the tensor. Thread compatible.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace ztrain::nn {

// One tensor to write: `nbytes` bytes at `data`, little endian, row major.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // safetensors' dtype name: "F32", "BF16", "F16", "I32", ...
  Shape shape;
  const void* data = nullptr;
  int64_t nbytes = 0;
};

void WriteSafetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                      const std::map<std::string, std::string>& metadata);

// One tensor as a file's header describes it.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  int64_t begin = 0;  // byte offsets within the data region
  int64_t end = 0;
};

// A validated header.
struct SafetensorsHeader {
  int64_t header_bytes = 0;  // N, padding included
  int64_t data_start = 0;    // 8 + N: where the data region starts in the file
  int64_t data_bytes = 0;    // size of the data region (up to the end of the file)
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> tensors;  // in data order

  // The entry named `name`, or nullptr.
  const SafetensorsEntry* Find(std::string_view name) const;
};

// Bytes per element of a safetensors dtype ("F32" -> 4, "BF16" -> 2); 0 for an unknown name.
int64_t SafetensorsDTypeSize(std::string_view dtype);
// safetensors' name for a ztrain element type (kF32 -> "F32", kBF16 -> "BF16", ...).
std::string_view SafetensorsDTypeName(DType dtype);

SafetensorsHeader ReadSafetensorsHeader(const std::string& path);
// The raw bytes of tensor `name` in the file `header` was read from.
std::vector<char> ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader& header,
                                        std::string_view name);

}  // namespace ztrain::nn
