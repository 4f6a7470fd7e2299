// The model-family registry: model.type's choices are the registered families, unknown types
// and keys a family does not take are refused by name, and each family's builder gives the
// layer list its docs promise.
#include "nn/family.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <typeinfo>

#include "core/config_schema.h"
#include "nn/gpt2.h"
#include "nn/llama.h"
#include "tests/expect_error.h"

namespace ztrain::nn {
namespace {

using ztrain::testing::ExpectErrorWith;

TEST(ModelFamilyTest, ModelTypeChoicesAreTheRegisteredFamilies) {
  std::vector<std::string> registered;
  for (const ModelFamily& f : ModelFamilies()) registered.push_back(f.type);
  const ConfigKey* key = ConfigSchema::Get().Find("model.type");
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(key->choices, registered);
  for (const std::string& type : registered) {
    EXPECT_NE(key->doc.find("`" + type + "`"), std::string::npos) << type;
  }
}

TEST(ModelFamilyTest, UnknownTypeNamesTheKnownOnes) {
  ExpectErrorWith<ConfigError>([] { FindModelFamily("mamba"); },
                               {"model.type 'mamba' is not known", "\"gpt2\", \"llama\""});
}

TEST(ModelFamilyTest, Gpt2RefusesLlamaKeysByName) {
  ModelConfig m;
  m.n_layer = 1;
  m.n_kv_head = 4;
  m.rope_scaling.type = "llama3";
  m.tie_word_embeddings = false;
  ExpectErrorWith<ConfigError>([&] { BuildModel(m); },
                               {"model.n_kv_head 4", "model.rope_scaling",
                                "model.tie_word_embeddings false", "model.type \"llama\""});
}

TEST(ModelFamilyTest, LlamaRefusesImpossibleHeadsAndSplits) {
  ModelConfig m;
  m.type = "llama";
  m.n_layer = 1;
  m.n_head = 6;
  m.n_kv_head = 4;
  m.head_dim = 5;
  ExpectErrorWith<ConfigError>([&] { CheckModel(m); },
                               {"model.n_kv_head 4 must divide model.n_head 6",
                                "model.head_dim 5 must be even"});
  m.n_kv_head = 3;
  m.head_dim = 4;
  ExpectErrorWith<ConfigError>([&] { CheckTensorParallelModel(m, 2); },
                               {"model.n_kv_head 3 does not divide by tensor_parallel.size 2",
                                "(1, 3)"});
}

TEST(ModelFamilyTest, SlidingWindowsAreTheLlamaFamilysAndPositive) {
  ModelConfig m;
  m.n_layer = 1;
  m.sliding_window = 64;
  ExpectErrorWith<ConfigError>([&] { CheckModel(m); },
                               {"model.sliding_window", "the Llama family has windows"});
  m.type = "llama";
  m.sliding_window = -4;
  ExpectErrorWith<ConfigError>([&] { CheckModel(m); },
                               {"model.sliding_window -4 must be positive, or 0"});
  m.sliding_window = 0;
  m.max_window_layers = 2;
  ExpectErrorWith<ConfigError>([&] { CheckModel(m); },
                               {"model.max_window_layers 2 needs model.sliding_window"});
  m.sliding_window = 16;
  CheckModel(m);  // layer 0 attends fully, the window from layer 2 on
  EXPECT_EQ(m.WindowOf(1), 0);
  EXPECT_EQ(m.WindowOf(2), 16);
}

// One block class for every family: the layers differ by their parameters only.
TEST(ModelFamilyTest, BothFamiliesBuildEmbeddingBlocksHead) {
  ModelConfig gpt2;
  gpt2.n_layer = 2;
  ModelConfig llama = gpt2;
  llama.type = "llama";
  for (const ModelConfig& m : {gpt2, llama}) {
    const LayerList layers = BuildModel(m);
    ASSERT_EQ(layers.size(), 4u);
    EXPECT_EQ(layers.front()->Name(), "embedding");
    EXPECT_EQ(layers[1]->BlockIndex(), 0);
    EXPECT_EQ(layers[2]->BlockIndex(), 1);
    EXPECT_EQ(layers.back()->Name(), "lm_head");
    EXPECT_EQ(typeid(*layers[1]), typeid(*BuildModel(gpt2)[1]));
  }
}

// transformers' default RoPE and its llama3 and linear scalings, computed by hand in double.
TEST(ModelFamilyTest, RopeInverseFrequenciesFollowTransformers) {
  ModelConfig m;
  m.type = "llama";
  m.n_head = 1;
  m.n_embd = 8;
  m.head_dim = 8;
  m.rope_theta = 500000.0;
  const auto plain = RopeInverseFrequencies(m);
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(plain[i], 1.0 / std::pow(500000.0, 2.0 * i / 8.0), 1e-6 * plain[i]);
  }
  m.rope_scaling.type = "linear";
  m.rope_scaling.factor = 4.0;
  const auto linear = RopeInverseFrequencies(m);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(linear[i], plain[i] / 4.0f);
  m.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  const auto llama3 = RopeInverseFrequencies(m);
  for (int i = 0; i < 4; ++i) {
    const double f = plain[i], wavelen = 2.0 * M_PI / f;
    double want = f;  // short wavelengths (< 64 / 4) keep their frequency
    if (wavelen > 64.0) {
      want = f / 8.0;
    } else if (wavelen >= 16.0) {
      const double smooth = (64.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1.0 - smooth) * f / 8.0 + smooth * f;
    }
    EXPECT_NEAR(llama3[i], want, 1e-6 * want) << i;
  }
}

}  // namespace
}  // namespace ztrain::nn
