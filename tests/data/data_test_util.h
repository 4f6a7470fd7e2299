#pragma once
// Helpers for data tests: a temporary directory (mkdtemp under /tmp, removed with its contents
// at scope exit), whole-file byte I/O, and an expectation on an error's type and message.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/expect_error.h"

namespace ztrain::data::test_util {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/ztrain_data_test_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

using ztrain::testing::ExpectErrorWith;

}  // namespace ztrain::data::test_util
