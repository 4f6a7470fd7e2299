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
#include "tests/temp_dir.h"

namespace ztrain::data::test_util {

using TempDir = ztrain::testing::TempDir;

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
