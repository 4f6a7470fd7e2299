// The equivalence rule for data parallelism and ZeRO, on real ranks under mpirun: every rank
// trains its slice of each global batch with the dp engine and, beside it, the whole batch
// with a single-process engine; the losses at every step and the final weights must agree.
// Run with any number of ranks; the stage and accumulation come from the command line:
//   mpirun -np 4 zero_equivalence_test --stage 1 --gas 2
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "test_model.h"

namespace ztrain {
namespace {

int g_stage = 0, g_gas = 1;
comm::Communicator* g_world = nullptr;

nn::MicroBatch Rows(const nn::MicroBatch& mb, int64_t begin, int64_t end) {
  return {mb.tokens.Slice(begin, end), mb.targets.Slice(begin, end)};
}

Config MakeConfig(int world_size, int64_t micro) {
  // n_embd 24 makes flat buffers that do not divide evenly by 4 ranks: padding is exercised.
  nlohmann::json j = testing::TinyConfigJson(2, 24, 2, 11, 8);
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = g_gas;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 0.5;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["zero_optimization"] = {{"stage", g_stage}};
  return ParseConfig(j, world_size);
}

TEST(ZeroEquivalenceTest, LossesAndWeightsMatchOneProcess) {
  const int n = g_world->size(), r = g_world->rank();
  const int64_t b = 2;  // rows per rank per micro-batch
  Engine parallel(MakeConfig(n, b), nn::BuildGpt2(MakeConfig(n, b).model), g_world);
  nlohmann::json single_json;
  Engine single(MakeConfig(1, b * n), nn::BuildGpt2(MakeConfig(1, b * n).model));
  for (int step = 0; step < 20; ++step) {
    // The same global micro-batches on every rank; rank r takes rows [r*b, (r+1)*b).
    std::vector<testing::OwnedBatch> global;
    std::vector<nn::MicroBatch> mine, all;
    for (int m = 0; m < g_gas; ++m) global.emplace_back(b * n, 8, 11, 1000 * step + m);
    for (auto& g : global) {
      mine.push_back(Rows(g.mb, r * b, (r + 1) * b));
      all.push_back(g.mb);
    }
    const StepStats p = parallel.TrainStep(mine);
    const StepStats s = single.TrainStep(all);
    ASSERT_NEAR(p.loss, s.loss, 1e-5 * std::fabs(s.loss)) << "step " << step;
    ASSERT_NEAR(p.grad_norm, s.grad_norm, 1e-5 * s.grad_norm) << "step " << step;
    ASSERT_EQ(p.tokens, s.tokens);
  }
  for (const std::string& name : single.ParameterNames()) {
    const Tensor a = parallel.Parameter(name), e = single.Parameter(name);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float x = a.data<float>()[i], y = e.data<float>()[i];
      ASSERT_NEAR(x, y, 1e-5 * (1.0 + std::fabs(y))) << name << "[" << i << "]";
    }
  }
}

TEST(ZeroEquivalenceTest, BytesPerStepMatchTheZeroFormula) {
  const int n = g_world->size();
  Engine parallel(MakeConfig(n, 2), nn::BuildGpt2(MakeConfig(n, 2).model), g_world);
  int64_t padded = 0;  // Ψ with each layer padded to dp x 16 elements
  for (const auto& layer : parallel.layers()) {
    int64_t m = 0;
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) m = (m + NumElements(s.shape) + 15) / 16 * 16;
    }
    padded += (m + 16 * n - 1) / (16 * n) * (16 * n);
  }
  testing::OwnedBatch batch(2, 8, 11, 5);
  std::vector<nn::MicroBatch> micro(g_gas, batch.mb);
  const comm::CommStats before = g_world->stats();
  parallel.TrainStep(micro);
  const comm::CommStats after = g_world->stats();
  const double moved = static_cast<double>(after.TotalBytes() - before.TotalBytes());
  // Stages 0 and 1 move 2Ψ(N-1)/N fp32 elements per rank and step (all-reduce, or
  // reduce-scatter + all-gather); stage 2 reduce-scatters every micro-batch, so
  // (gas + 1)Ψ(N-1)/N, which is 2Ψ(N-1)/N without accumulation. The scalar all-reduces
  // (loss, norm, stop flag) add a few bytes.
  const double passes = g_stage == 2 ? g_gas + 1 : 2;
  const double expected = passes * (n - 1) / n * 4.0 * static_cast<double>(padded);
  EXPECT_NEAR(moved, expected, 0.01 * expected) << "stage " << g_stage;
  if (g_stage == 0) {
    EXPECT_EQ(after.Bytes(comm::OpKind::kReduceScatter), before.Bytes(comm::OpKind::kReduceScatter));
  } else {
    EXPECT_GT(after.Bytes(comm::OpKind::kAllGather), before.Bytes(comm::OpKind::kAllGather));
  }
}

TEST(ZeroEquivalenceTest, OptimizerStateIsShardedAsZeroSays) {
  const int n = g_world->size();
  Engine parallel(MakeConfig(n, 2), nn::BuildGpt2(MakeConfig(n, 2).model), g_world);
  Engine single(MakeConfig(1, 2), nn::BuildGpt2(MakeConfig(1, 2).model));
  const int64_t full = single.memory().Current(MemoryCategory::kOptimizerState);
  const int64_t mine = parallel.memory().Current(MemoryCategory::kOptimizerState);
  // Padding to dp x 16 elements per layer adds at most 16 elements per layer and rank.
  const int64_t slack = static_cast<int64_t>(parallel.layers().size()) * 16 * 8;
  if (g_stage == 0) {
    EXPECT_NEAR(mine, full, slack * n);
  } else {
    EXPECT_NEAR(mine, full / n, slack);
  }
  // Stage 2 also keeps only the gradient shard between steps (fp32: half of m + v's bytes).
  const int64_t grads = parallel.memory().Current(MemoryCategory::kGradients);
  if (g_stage == 2) {
    EXPECT_NEAR(grads, full / 2 / n, slack);
  } else {
    EXPECT_GE(grads, full / 2);
  }
  EXPECT_GE(parallel.memory().Current(MemoryCategory::kParameters),
            single.memory().Current(MemoryCategory::kParameters));
}

}  // namespace
}  // namespace ztrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--stage") == 0) ztrain::g_stage = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--gas") == 0) ztrain::g_gas = std::atoi(argv[i + 1]);
  }
  auto world = ztrain::comm::MakeMpiWorld(std::chrono::seconds(120));
  ztrain::g_world = world.get();
  // Only rank 0 prints; every rank's result counts through the exit code.
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  float any = static_cast<float>(failed);
  world->AllReduce(ztrain::Tensor(&any, ztrain::DType::kF32, {1}))->Wait();
  return any > 0 ? 1 : 0;
}
