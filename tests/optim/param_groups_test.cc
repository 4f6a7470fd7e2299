// Note [Parameter groups]: which group each parameter joins, and the errors for globs that
// select nothing.
#include "optim/param_groups.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace ztrain::optim {
namespace {

ParamGroupRule Rule(std::string name, std::vector<std::string> params, int ndim,
                    std::optional<double> decay, double lr_scale = 1.0) {
  ParamGroupRule r;
  r.name = std::move(name);
  r.params = std::move(params);
  r.ndim = ndim;
  r.weight_decay = decay;
  r.lr_scale = lr_scale;
  return r;
}

TEST(ParamGroupsTest, DefaultRulesKeepDecayOffOneDimensionalParameters) {
  OptimizerConfig c;
  c.weight_decay = 0.1;
  const ParamGroups g(c);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].name, "default");
  EXPECT_EQ(g[1].name, "no_decay");
  EXPECT_EQ(g[2].name, "frozen");
  EXPECT_EQ(g[0].weight_decay, 0.1);
  EXPECT_EQ(g[1].weight_decay, 0.0);
  EXPECT_EQ(g.Assign("h.0.attn.c_attn.weight", 2, true), 0u);
  EXPECT_EQ(g.Assign("h.0.attn.c_attn.bias", 1, true), 1u);
  EXPECT_EQ(g.Assign("layers.0.input_layernorm.weight", 1, true), 1u);
  EXPECT_EQ(g.Assign("layers.0.self_attn.q_proj.weight", 2, false), g.frozen());
  EXPECT_FALSE(g[g.frozen()].trainable);
}

TEST(ParamGroupsTest, FirstMatchingRuleWinsAndBothConditionsMustHold) {
  OptimizerConfig c;
  c.weight_decay = 0.1;
  c.param_groups = {Rule("embeddings", {"embed_tokens.weight", "wte.*"}, 0, std::nullopt, 0.1),
                    Rule("mlp_biases", {"layers.*.mlp.*"}, 1, 0.0), Rule("rest_1d", {}, 1, 0.01)};
  const ParamGroups g(c);
  EXPECT_EQ(g.Assign("embed_tokens.weight", 2, true), 1u);
  EXPECT_EQ(g.Assign("wte.weight", 2, true), 1u);
  EXPECT_EQ(g.Assign("layers.3.mlp.up_proj.bias", 1, true), 2u);
  EXPECT_EQ(g.Assign("layers.3.mlp.up_proj.weight", 2, true), 0u);  // ndim 2: not mlp_biases
  EXPECT_EQ(g.Assign("layers.3.attn.o_proj.bias", 1, true), 3u);
  EXPECT_EQ(g.Assign("xembed_tokens.weight", 2, true), 0u);  // a glob matches the whole name
  EXPECT_EQ(g[1].weight_decay, 0.1);  // left out: optimizer.params.weight_decay
  EXPECT_EQ(g[1].lr_scale, 0.1);
  EXPECT_EQ(g[3].weight_decay, 0.01);
}

TEST(ParamGroupsTest, NoRulesDecayEverything) {
  OptimizerConfig c;
  c.weight_decay = 0.1;
  c.param_groups.clear();
  const ParamGroups g(c);
  EXPECT_EQ(g.Assign("h.0.ln_1.bias", 1, true), 0u);
  EXPECT_EQ(g[0].weight_decay, 0.1);
}

TEST(ParamGroupsTest, GlobThatSelectsNothingIsAnErrorNamingIt) {
  OptimizerConfig c;
  c.param_groups = {Rule("no_decay", {}, 1, 0.0), Rule("emb", {"wte.weight", "embed.*"}, 0, 0.0),
                    Rule("base", {"layers.*.q_proj.weight"}, 0, 0.0)};
  const ParamGroups g(c);
  const std::vector<std::string> trainable = {"wte.weight", "layers.0.q_proj.lora_A.weight"};
  const std::vector<std::string> frozen = {"layers.0.q_proj.weight"};
  try {
    g.CheckEveryGlobMatches(trainable, frozen);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("optimizer.param_groups[1] (\"emb\"): 'embed.*' matches no parameter"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("'layers.*.q_proj.weight' matches only frozen parameters "
                        "('layers.0.q_proj.weight')"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find("'wte.weight' matches"), std::string::npos) << what;  // it matches
  }
  c.param_groups.pop_back();
  c.param_groups[1].params = {"wte.weight"};
  EXPECT_NO_THROW(ParamGroups(c).CheckEveryGlobMatches(trainable, frozen));
}

}  // namespace
}  // namespace ztrain::optim
