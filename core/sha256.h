#pragma once
// SHA-256 (FIPS 180-4), for content hashes users can check with `sha256sum`: the tokenizer a
// token corpus was made with (data/corpus.h). Not for secrets: no constant-time guarantees.
// A Sha256 is a value; not thread safe (one per thread).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ztrain {

class Sha256 {
 public:
  Sha256();
  void Update(std::string_view bytes);
  // The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string HexDigest();

 private:
  void Block(const unsigned char* p);

  std::array<uint32_t, 8> h_;
  std::array<unsigned char, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed
};

// The SHA-256 of the file at `path` as hex (IoError when it cannot be read).
std::string Sha256File(const std::string& path);

}  // namespace ztrain
