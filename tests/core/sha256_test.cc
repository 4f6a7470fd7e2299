// core/sha256.h against the system's sha256sum (coreutils) on lengths around the 55/56/64-byte
// padding boundaries, a file fed in odd-sized pieces, and FIPS 180-2's "abc" example.
#include "core/sha256.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace ztrain {
namespace {

std::string SystemSha256(const std::string& path) {
  const std::string cmd = "sha256sum '" + path + "'";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[65] = {};
  const size_t n = p != nullptr ? std::fread(buf, 1, 64, p) : 0;
  if (p != nullptr) pclose(p);
  return std::string(buf, n);
}

TEST(Sha256Test, KnownDigest) {
  Sha256 sha;
  sha.Update("abc");
  EXPECT_EQ(sha.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, EqualsSha256sumAcrossPaddingBoundariesAndPieces) {
  char tmpl[] = "/tmp/ztrain_sha_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::mt19937 rng(3);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{55}, size_t{56}, size_t{63}, size_t{64},
                         size_t{65}, size_t{119}, size_t{120}, size_t{1000003}}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string path = dir + "/f" + std::to_string(n);
    std::ofstream(path, std::ios::binary) << bytes;
    const std::string want = SystemSha256(path);
    ASSERT_EQ(want.size(), 64u);
    EXPECT_EQ(Sha256File(path), want) << n << " bytes";
    Sha256 pieces;  // the same bytes in pieces of 1..97 bytes
    for (size_t at = 0; at < n;) {
      const size_t take = std::min<size_t>(n - at, 1 + rng() % 97);
      pieces.Update(std::string_view(bytes).substr(at, take));
      at += take;
    }
    EXPECT_EQ(pieces.HexDigest(), want) << n << " bytes in pieces";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ztrain
