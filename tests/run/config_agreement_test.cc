// Note [One config on every rank] (run/config_agreement.h) on real ranks under mpirun: the
// same config passes; a key that differs on one rank is refused on every rank, naming the key
// and each rank's value; the machine-dependent "auto"s are agreed on (the smallest micro-batch,
// bf16 only where every rank has it) instead of refused; the fp32 GEMM backends are rank 0's
// on every rank (Note [GEMMs chosen by measurement]).
#include "run/config_agreement.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "estimate/tune.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/onednn_matmul.h"
#include "tests/engine/test_model.h"
#include "tests/expect_error.h"
#include "tests/parallel/mpi_test_env.h"
#include "tests/scoped_env.h"
#include "tests/temp_dir.h"

namespace ztrain {
namespace {

using comm::test::World;

Config Tiny(int64_t micro) {
  nlohmann::json j = testing::TinyConfigJson();
  j["train_micro_batch_size_per_gpu"] = micro;
  j.erase("train_batch_size");
  return ParseConfig(j, World().size());
}

TEST(ConfigAgreementTest, TheSameConfigPasses) {
  Config c = Tiny(4);
  AgreeOnConfig(c, World());
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
}

TEST(ConfigAgreementTest, AKeyThatDiffersIsRefusedOnEveryRank) {
  const int last = World().size() - 1;
  nlohmann::json j = testing::TinyConfigJson();
  if (World().rank() == last) j["optimizer"]["params"]["lr"] = 0.25;  // an MPMD-started rank
  Config c = ParseConfig(j, World().size());
  testing::ExpectErrorWith<ConfigError>(
      [&] { AgreeOnConfig(c, World()); },
      {"optimizer.params.lr: differs between ranks: rank 0 has 0.003, rank " +
           std::to_string(last) + " has 0.25",
       "every rank must run the same config"});
}

TEST(ConfigAgreementTest, MachineAutosAreAgreedOn) {
  // Each rank "found" a micro-batch of 8 + its rank by its own memory, rank 0 the least.
  Config c = Tiny(8 + World().rank());
  c.auto_choices.push_back({"train_micro_batch_size_per_gpu", 8 + World().rank(), "memory"});
  AgreeOnConfig(c, World());
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.train_batch_size, 8 * World().size());
  EXPECT_EQ(c.auto_choices.back().value, 8);
  if (World().rank() > 0) {  // rank 0 found the least itself
    EXPECT_NE(c.auto_choices.back().reason.find("the smallest any rank found"), std::string::npos);
  }
  // bf16 "auto" stays on only where every rank computes it: the last rank does not.
  nlohmann::json j = testing::TinyConfigJson();
  j["bf16"] = {{"enabled", World().rank() != World().size() - 1}};
  Config b = ParseConfig(j, World().size());
  b.auto_choices.push_back({"bf16.enabled", b.precision.bf16, "hardware"});
  AgreeOnConfig(b, World());
  EXPECT_FALSE(b.precision.bf16);
  EXPECT_EQ(b.auto_choices.back().value, false);
}

// Each rank's cache (its own ZTRAIN_CACHE_DIR, as on nodes that do not share a home) says
// another thing: rank 0's oneDNN for every shape, the others' OpenBLAS. Every rank computes
// with rank 0's choice, so that the ranks' arithmetic is one (a tensor-parallel slice or a
// data-parallel replica on other kernels would drift apart in the last bits), and only rank 0
// reads its cache.
TEST(ConfigAgreementTest, EveryRankTakesRankZerosGemmBackends) {
  if (!kernels::cpu::OneDnnBuiltIn()) GTEST_SKIP() << "this build has no oneDNN";
  nlohmann::json j = testing::TinyConfigJson(1, 256, 4, 11, 256);
  j["train_micro_batch_size_per_gpu"] = 4;  // 1024 tokens: shapes of 0.1 GFLOP and more
  j.erase("train_batch_size");
  const Config c = ParseConfig(j, World().size());
  const testing::TempDir dir("ztrain_gemm_agree");
  const std::string mine = World().rank() == 0 ? "onednn" : "openblas";
  nlohmann::json entries = nlohmann::json::object();
  kernels::GemmPlan expected;
  for (const StepGemm& g : StepGemmShapes(c)) {
    entries[g.shape.ToString()] = {
        {"backend", mine}, {"openblas_gflops", 1.0}, {"onednn_gflops", 2.0}};
    if (g.shape.flops() >= kernels::kMeasuredFlops) {
      expected.Choose(g.shape, kernels::GemmBackend::kOneDnn);
    }
  }
  const nlohmann::json file = {{"format", "ztrain-gemm-choices"},
                               {"version", 1},
                               {"machines", {{kernels::GemmCacheKey(), entries}}}};
  const std::string cache = dir.File("gemm-choices.json");
  std::ofstream(cache) << file.dump();
  kernels::GemmPlan plan;
  {
    testing::ScopedEnv cache_dir("ZTRAIN_CACHE_DIR", dir.path().c_str()),
        by_hand("ZTRAIN_FP32_GEMM", nullptr);
    plan = ChooseStepGemms(c, &World());
  }
  ASSERT_FALSE(expected.choices().empty());
  EXPECT_EQ(plan.ToText(), expected.ToText()) << "rank " << World().rank();
  std::ifstream in(cache);
  EXPECT_EQ(nlohmann::json::parse(in), file) << "rank " << World().rank() << "'s cache changed";
}

}  // namespace
}  // namespace ztrain
