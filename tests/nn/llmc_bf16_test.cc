// llm.c model files in bf16 (version 5): the layout train_gpt2.py writes, loading widens the
// rounded values back to fp32, and fp32 files (version 3) stay as they were.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "nn/llmc_model_file.h"
#include "staged_gpt2.h"

namespace ztrain::nn {
namespace {

using ztrain::testing::ExpectErrorWith;
using ztrain::testing::ReadAll;
using ztrain::testing::ScratchDir;
using ztrain::testing::StagedGpt2;
using ztrain::testing::TinyGpt2Config;
using ztrain::testing::WriteAll;

class LlmcBf16Test : public ::testing::Test {
 protected:
  LlmcBf16Test() : a_(TinyGpt2Config(), 1), b_(TinyGpt2Config(), 2) {}
  StagedGpt2 a_, b_;
  ScratchDir dir_;
  std::string path_ = dir_.File("model.bin");
};

TEST_F(LlmcBf16Test, WritesVersion5WithBf16ParametersInLlmcOrder) {
  SaveLlmcModel(path_, a_.model, a_.Lookup(), DType::kBF16);
  const std::vector<char> bytes = ReadAll(path_);
  ASSERT_EQ(bytes.size(), 1024 + 2 * static_cast<size_t>(a_.NumParameters()));
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  EXPECT_EQ(header[0], kLlmcModelMagic);
  EXPECT_EQ(header[1], 5);
  EXPECT_EQ(header[7], 16);  // Vp
  EXPECT_EQ(ReadLlmcModelDType(path_), DType::kBF16);
  EXPECT_EQ(ReadLlmcModelHeader(path_).n_layer, 2);
  size_t offset = 1024;
  for (const std::string& name : LlmcParamOrder(2)) {
    for (float v : a_.values.at(name)) {
      uint16_t stored;
      std::memcpy(&stored, bytes.data() + offset, 2);
      ASSERT_EQ(stored, FloatToBf16(v)) << name << " at byte " << offset;
      offset += 2;
    }
  }
  EXPECT_EQ(offset, bytes.size());
}

TEST_F(LlmcBf16Test, LoadsBf16AsTheRoundedFp32Values) {
  SaveLlmcModel(path_, a_.model, a_.Lookup(), DType::kBF16);
  LoadLlmcModel(path_, b_.model, b_.Lookup());
  for (const auto& [name, values] : a_.values) {
    const std::vector<float>& loaded = b_.values.at(name);
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(FloatBits(loaded[i]), FloatBits(Bf16ToFloat(FloatToBf16(values[i]))))
          << name << "[" << i << "]";
  }
}

TEST_F(LlmcBf16Test, Fp32StaysVersion3AndBitExact) {
  SaveLlmcModel(path_, a_.model, a_.Lookup());  // the default: fp32
  EXPECT_EQ(ReadLlmcModelDType(path_), DType::kF32);
  const std::vector<char> bytes = ReadAll(path_);
  ASSERT_EQ(bytes.size(), 1024 + 4 * static_cast<size_t>(a_.NumParameters()));
  int32_t version;
  std::memcpy(&version, bytes.data() + 4, 4);
  EXPECT_EQ(version, 3);
  LoadLlmcModel(path_, b_.model, b_.Lookup());
  EXPECT_EQ(a_.values, b_.values);
  SaveLlmcModel(dir_.File("explicit.bin"), b_.model, b_.Lookup(), DType::kF32);
  EXPECT_EQ(ReadAll(dir_.File("explicit.bin")), bytes);
}

TEST_F(LlmcBf16Test, OtherVersionsAndSizesAreNamed) {
  SaveLlmcModel(path_, a_.model, a_.Lookup(), DType::kBF16);
  const std::vector<char> good = ReadAll(path_);
  std::string bytes(good.begin(), good.end());
  bytes[4] = 4;  // version 4
  WriteAll(path_, bytes);
  ExpectErrorWith<IoError>([&] { LoadLlmcModel(path_, b_.model, b_.Lookup()); },
                           {path_, "version 4", "3 (fp32)", "5 (bf16)"});
  WriteAll(path_, std::string(good.begin(), good.end() - 2));
  ExpectErrorWith<IoError>([&] { LoadLlmcModel(path_, b_.model, b_.Lookup()); },
                           {path_, "4926 bytes but its header describes 4928", "truncated"});
  WriteAll(path_, std::string(good.begin(), good.end()) + "xx");
  ExpectErrorWith<IoError>([&] { LoadLlmcModel(path_, b_.model, b_.Lookup()); },
                           {path_, "4930 bytes", "longer than its model"});
  ExpectErrorWith<Error>(
      [&] { SaveLlmcModel(dir_.File("f16.bin"), a_.model, a_.Lookup(), DType::kF16); },
      {"fp32 or bf16", "fp16"});
  EXPECT_EQ(dir_.List(), std::vector<std::string>{"model.bin"});
}

}  // namespace
}  // namespace ztrain::nn
