// Note [One config on every rank] (engine/config_agreement.h) on real ranks under mpirun: the
// same config passes; a key that differs on one rank is refused on every rank, naming the key
// and each rank's value; the machine-dependent "auto"s are agreed on (the smallest micro-batch,
// bf16 only where every rank has it) instead of refused.
#include "engine/config_agreement.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "test_model.h"
#include "tests/expect_error.h"
#include "tests/parallel/mpi_test_env.h"

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

}  // namespace
}  // namespace ztrain
