// Hugging Face GPT-2 safetensors exports: HF's names and shapes, no others, wte cut to the
// vocabulary, Conv1D weights transposed, bf16 rounded to nearest even.
#include "nn/model_export.h"
#include "nn/gpt2.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../expect_error.h"
#include "nn/safetensors.h"
#include "staged_gpt2.h"

namespace ztrain::nn {
namespace {

using ztrain::testing::ExpectErrorWith;
using ztrain::testing::ScratchDir;
using ztrain::testing::StagedGpt2;
using ztrain::testing::TinyGpt2Config;

// HF GPT2LMHeadModel's state dict for the tiny model (C = 8, V = 11, maxT = 8), written out
// by hand, without lm_head.weight (tied to wte).
std::map<std::string, Shape> ExpectedHfShapes() {
  std::map<std::string, Shape> s = {{"transformer.wte.weight", {11, 8}},
                                    {"transformer.wpe.weight", {8, 8}},
                                    {"transformer.ln_f.weight", {8}},
                                    {"transformer.ln_f.bias", {8}}};
  for (const std::string l : {"0", "1"}) {
    const std::string p = "transformer.h." + l + ".";
    s[p + "ln_1.weight"] = {8};
    s[p + "ln_1.bias"] = {8};
    s[p + "attn.c_attn.weight"] = {8, 24};
    s[p + "attn.c_attn.bias"] = {24};
    s[p + "attn.c_proj.weight"] = {8, 8};
    s[p + "attn.c_proj.bias"] = {8};
    s[p + "ln_2.weight"] = {8};
    s[p + "ln_2.bias"] = {8};
    s[p + "mlp.c_fc.weight"] = {8, 32};
    s[p + "mlp.c_fc.bias"] = {32};
    s[p + "mlp.c_proj.weight"] = {32, 8};
    s[p + "mlp.c_proj.bias"] = {8};
  }
  return s;
}

template <typename T>
std::vector<T> As(const std::vector<char>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

class HfGpt2ExportTest : public ::testing::Test {
 protected:
  HfGpt2ExportTest() : model_(TinyGpt2Config(), 7) {}
  // Exports as `dtype` and returns the validated header.
  SafetensorsHeader Export(DType dtype) {
    SaveHfGpt2Safetensors(path_, model_.model, model_.Lookup(), dtype);
    return ReadSafetensorsHeader(path_);
  }
  std::vector<float> F32(const SafetensorsHeader& h, const std::string& name) {
    return As<float>(ReadSafetensorsTensor(path_, h, name));
  }
  StagedGpt2 model_;
  ScratchDir dir_;
  std::string path_ = dir_.File("model.safetensors");
};

TEST_F(HfGpt2ExportTest, WritesExactlyHfNamesAndShapes) {
  const SafetensorsHeader h = Export(DType::kF32);
  std::map<std::string, Shape> got;
  for (const SafetensorsEntry& e : h.tensors) {
    EXPECT_EQ(e.dtype, "F32") << e.name;
    got[e.name] = e.shape;
  }
  EXPECT_EQ(got, ExpectedHfShapes());
  EXPECT_EQ(h.tensors.size(), 4u + 12 * 2);
  // HF's order: embeddings, then block by block, then the final layernorm.
  EXPECT_EQ(h.tensors[0].name, "transformer.wte.weight");
  EXPECT_EQ(h.tensors[2].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(h.tensors[14].name, "transformer.h.1.ln_1.weight");
  EXPECT_EQ(h.tensors.back().name, "transformer.ln_f.bias");
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("ztrain_n_layer"), "2");
  EXPECT_EQ(h.metadata.at("ztrain_vocab_size"), "11");
  EXPECT_EQ(h.metadata.at("ztrain_dtype"), "fp32");
}

TEST_F(HfGpt2ExportTest, CutsWteToTheVocabulary) {
  const SafetensorsHeader h = Export(DType::kF32);
  const std::vector<float>& wte = model_.values.at("wte");  // [16, 8]
  const std::vector<float> got = F32(h, "transformer.wte.weight");
  EXPECT_EQ(got, std::vector<float>(wte.begin(), wte.begin() + 11 * 8));
  EXPECT_EQ(F32(h, "transformer.wpe.weight"), model_.values.at("wpe"));
}

TEST_F(HfGpt2ExportTest, TransposesConv1DWeightsAndCopiesTheRest) {
  const SafetensorsHeader h = Export(DType::kF32);
  // c_attn: ztrain [3C, C] = [24, 8]; HF [C, 3C] = [8, 24]: hf[i][j] == ztrain[j][i].
  const std::vector<float>& attn = model_.values.at("h.1.attn.c_attn.weight");
  const std::vector<float> hf_attn = F32(h, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(hf_attn[0 * 24 + 1], attn[1 * 8 + 0]);
  EXPECT_EQ(hf_attn[2 * 24 + 17], attn[17 * 8 + 2]);
  EXPECT_EQ(hf_attn[7 * 24 + 23], attn[23 * 8 + 7]);
  // mlp.c_proj: ztrain [C, 4C] = [8, 32]; HF [4C, C] = [32, 8].
  const std::vector<float>& proj = model_.values.at("h.0.mlp.c_proj.weight");
  const std::vector<float> hf_proj = F32(h, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(hf_proj[30 * 8 + 5], proj[5 * 32 + 30]);
  EXPECT_EQ(hf_proj[1 * 8 + 0], proj[0 * 32 + 1]);
  // Every element of every Conv1D weight, and everything else unchanged.
  for (const HfTensor& t : HfGpt2Layout(model_.model)) {
    const std::vector<float>& src = model_.values.at(t.param);
    const std::vector<float> got = F32(h, t.hf_name);
    if (!t.transposed) {
      EXPECT_TRUE(std::equal(got.begin(), got.end(), src.begin())) << t.hf_name;
      continue;
    }
    const int64_t in = t.hf_shape[0], out = t.hf_shape[1];
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o)
        ASSERT_EQ(got[i * out + o], src[o * in + i]) << t.hf_name << " [" << i << ", " << o << "]";
  }
}

TEST_F(HfGpt2ExportTest, Bf16RoundsToNearestEven) {
  // Two exact ties between bf16 neighbours: 1 + 2^-8 rounds down to 1 (even), 1 + 3 * 2^-8
  // rounds up to 1 + 2^-6; truncation would give 1 and 1 + 2^-7.
  model_.values.at("ln_f.bias")[0] = BitsToFloat(0x3f808000u);
  model_.values.at("ln_f.bias")[1] = BitsToFloat(0x3f818000u);
  const SafetensorsHeader h = Export(DType::kBF16);
  EXPECT_EQ(h.metadata.at("ztrain_dtype"), "bf16");
  const std::vector<uint16_t> lnf =
      As<uint16_t>(ReadSafetensorsTensor(path_, h, "transformer.ln_f.bias"));
  EXPECT_EQ(lnf[0], 0x3f80);
  EXPECT_EQ(lnf[1], 0x3f82);
  for (const HfTensor& t : HfGpt2Layout(model_.model)) {
    const SafetensorsEntry* e = h.Find(t.hf_name);
    ASSERT_NE(e, nullptr) << t.hf_name;
    EXPECT_EQ(e->dtype, "BF16");
    EXPECT_EQ(e->shape, t.hf_shape);
    const std::vector<float>& src = model_.values.at(t.param);
    const std::vector<uint16_t> got = As<uint16_t>(ReadSafetensorsTensor(path_, h, t.hf_name));
    ASSERT_EQ(static_cast<int64_t>(got.size()), NumElements(t.hf_shape));
    const int64_t cols = t.hf_shape.size() == 2 ? t.hf_shape[1] : 1;
    for (size_t k = 0; k < got.size(); ++k) {
      const int64_t r = static_cast<int64_t>(k) / cols, c = static_cast<int64_t>(k) % cols;
      const float want = t.transposed ? src[c * t.hf_shape[0] + r] : src[k];
      ASSERT_EQ(got[k], FloatToBf16(want)) << t.hf_name << " element " << k;
    }
  }
}

TEST_F(HfGpt2ExportTest, RejectsWrongParametersAndDtypes) {
  const Shape wrong = {3, 3};
  std::vector<float> nine(9);
  const ParamLookup lookup = [&](const std::string& name) {
    return name == "h.0.mlp.c_fc.weight" ? Tensor(nine.data(), DType::kF32, wrong)
                                         : model_.Lookup()(name);
  };
  ExpectErrorWith<Error>([&] { SaveHfGpt2Safetensors(path_, model_.model, lookup, DType::kF32); },
                         {"h.0.mlp.c_fc.weight", "[32, 8]"});
  ExpectErrorWith<Error>(
      [&] { SaveHfGpt2Safetensors(path_, model_.model, model_.Lookup(), DType::kF16); },
      {"fp16", "fp32 or bf16"});
  EXPECT_TRUE(dir_.List().empty());
}

}  // namespace
}  // namespace ztrain::nn
