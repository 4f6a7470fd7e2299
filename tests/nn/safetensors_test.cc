// safetensors files: the exact bytes the format prescribes, byte-exact round trips, and a
// named IoError for every rule a malformed file breaks.
#include "nn/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "staged_gpt2.h"

namespace ztrain::nn {
namespace {

using ztrain::testing::ExpectErrorWith;
using ztrain::testing::ReadAll;
using ztrain::testing::ScratchDir;
using ztrain::testing::WriteAll;

// A file by hand: 8-byte little-endian header length, the header (padded with spaces to a
// multiple of 8 unless pad is false), then the data.
std::string RawFile(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  return out + header + data;
}

uint64_t LengthField(const std::vector<char>& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return n;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Expects reading `bytes` as a safetensors file to fail naming the file and `rule`.
  void ExpectBroken(const std::string& bytes, const std::string& rule) {
    const std::string path = dir_.File("broken.safetensors");
    WriteAll(path, bytes);
    ExpectErrorWith<IoError>([&] { ReadSafetensorsHeader(path); },
                             {path, "breaks the format", rule});
  }
  ScratchDir dir_;
};

TEST_F(SafetensorsTest, RoundTripWritesTheExactLayout) {
  std::vector<float> a(6), scalar = {3.5f};
  std::iota(a.begin(), a.end(), 1.0f);
  const std::vector<uint16_t> b = {0x3f80, 0xc000, 0x7fc0};
  const std::vector<uint8_t> u8 = {1, 2, 3, 4, 5};
  const std::vector<int64_t> i64 = {-7};
  const std::vector<SafetensorsTensor> tensors = {
      {"a", "F32", {2, 3}, a.data(), 24},   {"scalar_0d", "F32", {}, scalar.data(), 4},
      {"b", "BF16", {3}, b.data(), 6},      {"u8", "U8", {5}, u8.data(), 5},
      {"empty", "F32", {0, 4}, nullptr, 0}, {"i64", "I64", {1}, i64.data(), 8}};
  const std::string path = dir_.File("t.safetensors");
  WriteSafetensors(path, tensors, {{"k", "v"}, {"format", "pt"}});

  // Compact JSON, metadata first, tensors back to back in the order given.
  const std::string json = R"({"__metadata__":{"format":"pt","k":"v"},)"
                           R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                           R"("scalar_0d":{"dtype":"F32","shape":[],"data_offsets":[24,28]},)"
                           R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[28,34]},)"
                           R"("u8":{"dtype":"U8","shape":[5],"data_offsets":[34,39]},)"
                           R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[39,39]},)"
                           R"("i64":{"dtype":"I64","shape":[1],"data_offsets":[39,47]}})";
  ASSERT_NE(json.size() % 8, 0u) << "the case must need alignment padding";
  const std::vector<char> bytes = ReadAll(path);
  const uint64_t n = LengthField(bytes);
  EXPECT_EQ(n, json.size() + (8 - json.size() % 8));
  EXPECT_EQ(std::string(bytes.data() + 8, json.size()), json);
  EXPECT_EQ(std::string(bytes.data() + 8 + json.size(), n - json.size()),
            std::string(n - json.size(), ' '));
  ASSERT_EQ(bytes.size(), 8 + n + 47);

  const SafetensorsHeader h = ReadSafetensorsHeader(path);
  EXPECT_EQ(h.header_bytes, static_cast<int64_t>(n));
  EXPECT_EQ(h.data_start % 8, 0);
  EXPECT_EQ(h.data_bytes, 47);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
  ASSERT_EQ(h.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    EXPECT_EQ(h.tensors[i].name, t.name);
    EXPECT_EQ(h.tensors[i].dtype, t.dtype);
    EXPECT_EQ(h.tensors[i].shape, t.shape);
    const std::vector<char> back = ReadSafetensorsTensor(path, h, t.name);
    ASSERT_EQ(static_cast<int64_t>(back.size()), t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(back.data(), t.data, back.size()), 0) << t.name;
  }
  EXPECT_EQ(h.Find("i64")->begin, 39);
  EXPECT_EQ(h.Find("i64")->end, 47);
  EXPECT_EQ(h.Find("missing"), nullptr);
  EXPECT_THROW(ReadSafetensorsTensor(path, h, "missing"), IoError);
}

// The bytes of the reference implementation's own serialisation tests.
TEST_F(SafetensorsTest, MatchesTheReferenceSerialisation) {
  const std::string path = dir_.File("t.safetensors");
  WriteSafetensors(path, {}, {});
  const std::vector<char> empty = ReadAll(path);
  EXPECT_EQ(std::string(empty.begin(), empty.end()), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));

  const std::vector<float> v = {0, 1, 2, 3, 4, 5};
  const SafetensorsTensor t{"attn0", "F32", {1, 1, 2, 3}, v.data(), 24};
  WriteSafetensors(path, {&t, 1}, {});
  const std::vector<char> bytes = ReadAll(path);
  ASSERT_EQ(bytes.size(), 8u + 72 + 24);
  EXPECT_EQ(LengthField(bytes), 72u);
  EXPECT_EQ(std::string(bytes.data() + 8, 72),
            R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})"
            "       ");
  EXPECT_EQ(std::memcmp(bytes.data() + 80, v.data(), 24), 0);
}

TEST_F(SafetensorsTest, ReplacesAtomicallyAndLeavesNoTemporary) {
  const std::string path = dir_.File("t.safetensors");
  const std::vector<float> v = {1, 2};
  const SafetensorsTensor ok{"x", "F32", {2}, v.data(), 8};
  WriteSafetensors(path, {&ok, 1}, {});
  WriteSafetensors(path, {&ok, 1}, {{"format", "pt"}});
  EXPECT_EQ(ReadSafetensorsHeader(path).metadata.at("format"), "pt");
  EXPECT_EQ(dir_.List(), std::vector<std::string>{"t.safetensors"});

  // Invalid arguments fail before anything is written.
  const SafetensorsTensor short_data{"y", "F32", {3}, v.data(), 8};
  const std::vector<SafetensorsTensor> repeated = {ok, ok};
  ExpectErrorWith<Error>(
      [&] {
        WriteSafetensors(dir_.File("u"), {&short_data, 1}, {});
      },
      {dir_.File("u"), "'y'", "8 bytes"});
  ExpectErrorWith<Error>([&] { WriteSafetensors(dir_.File("u"), repeated, {}); },
                         {"'x'", "repeated"});
  const SafetensorsTensor bad_dtype{"z", "F31", {2}, v.data(), 8};
  ExpectErrorWith<Error>(
      [&] {
        WriteSafetensors(dir_.File("u"), {&bad_dtype, 1}, {});
      },
      {"unknown dtype 'F31'"});
  EXPECT_EQ(dir_.List(), std::vector<std::string>{"t.safetensors"});
  ExpectErrorWith<IoError>(
      [&] {
        WriteSafetensors("/nonexistent/dir/t", {&ok, 1}, {});
      },
      {"/nonexistent/dir/t"});
}

TEST_F(SafetensorsTest, TruncatedFilesAreNamed) {
  const std::string path = dir_.File("t.safetensors");
  const std::vector<float> v = {1, 2, 3};
  const SafetensorsTensor t{"x", "F32", {3}, v.data(), 12};
  WriteSafetensors(path, {&t, 1}, {});
  const std::vector<char> good = ReadAll(path);
  ExpectBroken(std::string(good.begin(), good.end() - 3), "truncated");
  ExpectBroken(std::string(good.begin(), good.begin() + 5), "truncated");
  ExpectErrorWith<IoError>([&] { ReadSafetensorsHeader(dir_.File("missing")); },
                           {dir_.File("missing")});
}

TEST_F(SafetensorsTest, HeaderLengthMustFitTheFileAndAlignTheData) {
  std::string past = RawFile("{}", "");
  past[0] = static_cast<char>(200);  // length 200 in a 16-byte file
  ExpectBroken(past, "points past the end of the file");
  std::string huge = RawFile("{}", "");
  huge[7] = 1;  // 2^56 + 8
  ExpectBroken(huge, "exceeds the limit");
  ExpectBroken(RawFile(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a", false),
               "not 8-byte aligned");
}

TEST_F(SafetensorsTest, OffsetsMustTileTheData) {
  const std::string data(20, 'd');
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       data.substr(0, 12)),
               "overlap: tensor 'b' starts at data byte 4, inside tensor 'a'");
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                       data),
               "gap: data bytes [8, 12)");
  ExpectBroken(
      RawFile(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", data.substr(0, 12)),
      "gap: data bytes [0, 4)");
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data),
               "trailing bytes");
  // Listed out of order but tiling the data: valid, and returned in data order.
  const std::string path = dir_.File("t.safetensors");
  WriteAll(path, RawFile(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                         R"("a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})",
                         data.substr(0, 16)));
  const SafetensorsHeader h = ReadSafetensorsHeader(path);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
}

TEST_F(SafetensorsTest, EntriesMustMatchTheirDtypeAndShape) {
  const std::string data(8, 'd');
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
               "wrong size: tensor 'a' has data_offsets [0, 8] (8 bytes) but F32[3] needs 12");
  ExpectBroken(RawFile(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", data),
               "unknown dtype 'F31'");
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
               "shape of non-negative integers");
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data),
               "begin <= end");
  ExpectBroken(RawFile(R"({"a":{"dtype":"F32","shape":[2]}})", data), "data_offsets");
  ExpectBroken(RawFile(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],)"
                       R"("data_offsets":[0,8]}})",
                       data),
               "overflows");
}

TEST_F(SafetensorsTest, HeaderMustBeAJsonObjectWithStringMetadata) {
  const std::string data(4, 'd');
  const std::string a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  ExpectBroken(RawFile("[1, 2]", ""), "does not start with '{'");
  ExpectBroken(RawFile("{\"a\":", data), "not valid UTF-8 JSON");
  ExpectBroken(RawFile("{\"\xff\":1}", data), "not valid UTF-8 JSON");
  ExpectBroken(RawFile("{" + a + "," + a + "}", data), "names 'a' twice");
  ExpectBroken(RawFile(R"({"__metadata__":{"n":1},)" + a + "}", data),
               "__metadata__ value of 'n' is not a string");
  ExpectBroken(RawFile(R"({"a":[1]})", ""), "entry 'a' is not an object");
}

}  // namespace
}  // namespace ztrain::nn
