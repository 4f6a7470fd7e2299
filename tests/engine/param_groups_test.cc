// Note [Parameter groups] through the engine: a group's lr scale and weight decay change the
// update of its elements as AdamW's formula says and nothing else; a glob that selects nothing
// is refused before anything is allocated; the log's counts cover the model once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "test_model.h"

namespace ztrain {
namespace {

using nlohmann::json;

json Config(double lr, json groups, int stage = 0) {
  json j = testing::TinyConfigJson(2, 16, 2, 11, 8);
  j["optimizer"]["params"]["lr"] = lr;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  if (!groups.is_null()) j["optimizer"]["param_groups"] = std::move(groups);
  j["zero_optimization"]["stage"] = stage;
  j.erase("scheduler");  // a constant lr: the first step moves the parameters
  return j;
}

void Train(Engine& engine, int steps) {
  for (int step = 0; step < steps; ++step) {
    testing::OwnedBatch batch(2, 8, 11, 300 + step);
    engine.TrainStep({&batch.mb, 1});
  }
}

std::vector<float> Values(Engine& engine, const std::string& name) {
  std::vector<float> out;
  engine.ForEachFullParameter([&](const std::string& n, const Tensor& t) {
    if (n == name) out.assign(t.data<float>(), t.data<float>() + t.numel());
  });
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// lr_scale 0.5 on every group is the run at half the lr, bit for bit (halving is exact).
TEST(EngineParamGroupsTest, LrScaleIsTheLrTimesTheScale) {
  const json halved =
      json::array({{{"name", "no_decay"}, {"ndim", 1}, {"weight_decay", 0.0}, {"lr_scale", 0.5}},
                   {{"name", "rest"}, {"params", "*"}, {"lr_scale", 0.5}}});
  const ztrain::Config a_cfg = ParseConfig(Config(2e-3, halved));
  const ztrain::Config b_cfg = ParseConfig(Config(1e-3, json()));
  Engine a(a_cfg, nn::BuildGpt2(a_cfg.model)), b(b_cfg, nn::BuildGpt2(b_cfg.model));
  Engine initial(b_cfg, nn::BuildGpt2(b_cfg.model));
  Train(a, 3);
  Train(b, 3);
  for (const std::string& name : b.ParameterNames()) {
    EXPECT_TRUE(SameBits(Values(a, name), Values(b, name))) << name;
    EXPECT_FALSE(SameBits(Values(initial, name), Values(b, name))) << name << " did not train";
  }
}

// Decoupled decay moves p by -lr * weight_decay * p0 on top of the Adam update, so the run
// that decays everything ([] rules) differs from the default (no decay on 1-D parameters)
// only in the 1-D parameters, by lr * weight_decay * p0: zero for the zero-initialised
// biases, lr * weight_decay for the norm weights (initialised to 1).
TEST(EngineParamGroupsTest, WeightDecayFollowsTheGroup) {
  const double lr = 1e-2, wd = 0.1;
  const ztrain::Config d_cfg = ParseConfig(Config(lr, json()));
  const ztrain::Config all_cfg = ParseConfig(Config(lr, json::array()));
  Engine initial(d_cfg, nn::BuildGpt2(d_cfg.model));
  Engine by_default(d_cfg, nn::BuildGpt2(d_cfg.model));
  Engine decay_all(all_cfg, nn::BuildGpt2(all_cfg.model));
  Train(by_default, 1);
  Train(decay_all, 1);
  int norms = 0;
  for (const std::string& name : initial.ParameterNames()) {
    SCOPED_TRACE(name);
    const std::vector<float> p0 = Values(initial, name), a = Values(by_default, name),
                             b = Values(decay_all, name);
    if (initial.ParameterShape(name).size() > 1) {
      EXPECT_TRUE(SameBits(a, b));  // decayed in both runs
      continue;
    }
    for (size_t i = 0; i < p0.size(); ++i) {
      // a - b = lr * wd * p0 up to the rounding of two float steps (|p| <= 2: ulp 2.4e-7).
      EXPECT_NEAR(a[i] - b[i], lr * wd * p0[i], 1e-6) << i;
    }
    if (p0[0] == 1.0f) ++norms;
  }
  EXPECT_EQ(norms, 5);  // ln_1, ln_2 of two blocks and ln_f: the test saw the decay act
}

// lr_scale 0 holds a group still, at every ZeRO stage (the group is a property of the
// parameter, whichever rank's shard holds it).
TEST(EngineParamGroupsTest, LrScaleZeroHoldsTheGroupStill) {
  const json still = json::array({{{"name", "no_decay"}, {"ndim", 1}, {"weight_decay", 0.0}},
                                  {{"name", "embeddings"}, {"params", "w?e"}, {"lr_scale", 0.0}}});
  for (int stage : {0, 3}) {
    SCOPED_TRACE(stage);
    const ztrain::Config cfg = ParseConfig(Config(1e-2, still, stage));
    Engine initial(cfg, nn::BuildGpt2(cfg.model)), trained(cfg, nn::BuildGpt2(cfg.model));
    Train(trained, 2);
    EXPECT_TRUE(SameBits(Values(initial, "wte"), Values(trained, "wte")));
    EXPECT_TRUE(SameBits(Values(initial, "wpe"), Values(trained, "wpe")));
    EXPECT_FALSE(
        SameBits(Values(initial, "h.0.mlp.c_fc.weight"), Values(trained, "h.0.mlp.c_fc.weight")));
  }
}

TEST(EngineParamGroupsTest, GlobThatSelectsNothingIsRefusedNamingIt) {
  const json typo =
      json::array({{{"name", "emb"}, {"params", json::array({"wte", "wpe.weight"})}}});
  const ztrain::Config cfg = ParseConfig(Config(1e-3, typo));
  try {
    Engine engine(cfg, nn::BuildGpt2(cfg.model));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "optimizer.param_groups[0] (\"emb\"): 'wpe.weight' matches no parameter"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineParamGroupsTest, UsesCountEveryParameterOnce) {
  const ztrain::Config cfg = ParseConfig(Config(1e-3, json()));
  Engine engine(cfg, nn::BuildGpt2(cfg.model));
  const std::vector<Engine::ParamGroupUse> uses = engine.ParamGroupUses();
  ASSERT_EQ(uses.size(), 3u);  // default, no_decay, frozen
  int64_t elements = 0, one_dim = 0, one_dim_elements = 0;
  for (const auto& u : uses) elements += u.elements;
  for (const std::string& name : engine.ParameterNames()) {
    const Shape s = engine.ParameterShape(name);
    if (s.size() == 1) {
      ++one_dim;
      one_dim_elements += NumElements(s);
    }
  }
  EXPECT_EQ(elements, engine.NumParameters());
  EXPECT_EQ(uses[1].group.name, "no_decay");
  EXPECT_EQ(uses[1].tensors, one_dim);
  EXPECT_EQ(uses[1].elements, one_dim_elements);
  EXPECT_EQ(uses[2].tensors, 0);
  EXPECT_EQ(uses[0].group.weight_decay, 0.1);
}

}  // namespace
}  // namespace ztrain
