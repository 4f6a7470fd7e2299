// Activation checkpointing (Note [Activation checkpointing in the engine]): the part on its
// own — which layers it checkpoints, an input kept in host memory and brought back, a
// recompute that gives the backward what the forward gave it — and through the engine:
// checkpointed runs train the same model as plain runs, bit for bit (the recompute is the same
// arithmetic in the same order: Note [Equivalence tolerances], tests/rounding_model.h), with a
// measurably lower activation peak, at ZeRO stages 0 and 3, for every block, the first N
// blocks, and a list. activation_checkpointing_mpi_test.cc partitions inputs over real ranks.
#include "engine/activation_checkpointing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/memory_tracker.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "test_model.h"

namespace ztrain {
namespace {

TEST(ActivationCheckpointingPartTest, OptionsSelectTheListedBlocksAndWhereInputsWait) {
  ActivationCheckpointingConfig c;
  c.enabled = true;
  c.blocks = {1, 3};
  const std::vector<int> blocks = {-1, 0, 1, 2, 3, -1};  // embedding, 4 blocks, head
  using Options = ActivationCheckpointing::Options;
  Options o = ActivationCheckpointing::OptionsFor(c, blocks, /*on_device=*/false, 1);
  EXPECT_EQ(o.checkpointed, std::vector<bool>({false, false, true, false, true, false}));
  EXPECT_FALSE(o.offload_inputs);
  EXPECT_FALSE(o.partition_inputs);
  c.cpu_checkpointing = true;
  c.partition_activations = true;
  // On the CPU activations are host memory already; with one tp rank there is nothing to split.
  o = ActivationCheckpointing::OptionsFor(c, blocks, /*on_device=*/false, 1);
  EXPECT_FALSE(o.offload_inputs);
  EXPECT_FALSE(o.partition_inputs);
  o = ActivationCheckpointing::OptionsFor(c, blocks, /*on_device=*/true, 2);
  EXPECT_TRUE(o.offload_inputs);
  EXPECT_TRUE(o.partition_inputs);
  c.enabled = false;
  o = ActivationCheckpointing::OptionsFor(c, blocks, true, 2);
  EXPECT_EQ(o.checkpointed, std::vector<bool>(6, false));
}

TEST(ActivationCheckpointingPartTest, AKeptInputComesBackAsItWas) {
  MemoryTracker tracker;
  HostAllocator activations(&tracker), host(&tracker);
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  const std::unique_ptr<comm::Communicator> tp = comm::MakeSelfCommunicator();
  ActivationCheckpointing::Options o;
  o.checkpointed = {true};
  o.offload_inputs = true;
  ActivationCheckpointing part(o, *tp, *ops, activations, &host, [](comm::Work& w) { w.Wait(); });
  ASSERT_TRUE(part.moves_inputs());
  Buffer owner(activations, DType::kBF16, {3, 7}, MemoryCategory::kActivations);
  for (int i = 0; i < 21; ++i) owner.data<uint16_t>()[i] = static_cast<uint16_t>(1000 + 37 * i);
  const Tensor input = owner.AsTensor(DType::kBF16, {3, 7});
  Buffer kept;
  part.KeepInput(input, owner, kept);
  EXPECT_EQ(owner.data(), nullptr);  // the activation is gone
  ASSERT_EQ(kept.nbytes(), 42u);
  const Tensor back = part.RestoreInput(kept, input, owner);
  EXPECT_EQ(kept.data(), nullptr);
  ASSERT_EQ(back.shape(), (Shape{3, 7}));
  ASSERT_EQ(back.dtype(), DType::kBF16);
  for (int i = 0; i < 21; ++i) {
    EXPECT_EQ(static_cast<const uint16_t*>(back.data())[i], 1000 + 37 * i) << i;
  }
}

// A block's backward after a recompute is its backward after its own forward, bit for bit.
TEST(ActivationCheckpointingPartTest, ARecomputeGivesTheBackwardWhatTheForwardGaveIt) {
  nlohmann::json j = testing::TinyConfigJson(2, 16, 2, 11, 8);
  const Config config = ParseConfig(j);
  Engine e(config, nn::BuildGpt2(config.model));  // binds the layers' parameters
  nn::Layer& block = *e.layers()[1];
  ASSERT_GE(block.BlockIndex(), 0);
  testing::OwnedBatch batch(2, 8, 11, 5);
  MemoryTracker tracker;
  HostAllocator memory(&tracker);
  const Shape shape{2, 8, 16};
  std::vector<float> x(32 * 8), dy(32 * 8);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.1f * static_cast<float>(i));
    dy[i] = std::cos(0.3f * static_cast<float>(i));
  }
  const Tensor input(x.data(), DType::kF32, shape), dout(dy.data(), DType::kF32, shape);
  // dx after forward + backward, with or without dropping the context and recomputing.
  auto input_grad = [&](bool recompute) {
    const std::unique_ptr<comm::Communicator> tp = comm::MakeSelfCommunicator();
    ActivationCheckpointing part({{true}}, *tp, e.ops(), memory, nullptr, {});
    std::vector<float> y(x.size()), dx(x.size());
    const Tensor out(y.data(), DType::kF32, shape);
    nn::LayerContext ctx(e.ops(), memory);
    block.Forward(batch.mb, input, out, ctx);
    if (recompute) {
      ctx.Release();
      part.Recompute(block, batch.mb, input, out, ctx);
    }
    block.Backward(batch.mb, input, dout, Tensor(dx.data(), DType::kF32, shape), ctx);
    return dx;
  };
  const std::vector<float> plain = input_grad(false), recomputed = input_grad(true);
  EXPECT_EQ(std::memcmp(plain.data(), recomputed.data(), plain.size() * sizeof(float)), 0);
  double sum = 0.0;
  for (const float v : plain) sum += std::fabs(v);
  EXPECT_GT(sum, 0.0);  // a gradient, not zeros
}

// 4 blocks, C = 32, T = 32, a vocabulary of 11: the blocks' saved activations dominate the
// activation peak (the logits are small).
Config MakeConfig(int stage, const nlohmann::json& checkpointing) {
  nlohmann::json j = testing::TinyConfigJson(4, 32, 4, 11, 32);
  j["train_micro_batch_size_per_gpu"] = 4;
  j["gradient_accumulation_steps"] = 2;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  j["zero_optimization"] = {{"stage", stage}};
  if (!checkpointing.is_null()) j["activation_checkpointing"] = checkpointing;
  return ParseConfig(j);
}

struct Result {
  std::vector<double> losses, norms;
  int64_t activation_peak = 0;
};

Result Train(int stage, const nlohmann::json& checkpointing) {
  const Config config = MakeConfig(stage, checkpointing);
  Engine e(config, nn::BuildGpt2(config.model));
  Result r;
  for (int step = 0; step < 4; ++step) {
    testing::OwnedBatch a(4, 32, 11, 10 * step), b(4, 32, 11, 10 * step + 1);
    const StepStats s = e.TrainStep(std::vector<nn::MicroBatch>{a.mb, b.mb});
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
  }
  r.activation_peak = e.memory().Peak(MemoryCategory::kActivations);
  return r;
}

void ExpectSameTraining(const Result& got, const Result& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << what << " step " << i;
    EXPECT_EQ(got.norms[i], want.norms[i]) << what << " step " << i;
  }
}

TEST(ActivationCheckpointingTest, SameLossesWithALowerActivationPeak) {
  for (int stage : {0, 3}) {
    const Result plain = Train(stage, nullptr);
    const Result all = Train(stage, {{"enabled", true}});
    const Result first2 = Train(stage, {{"number_checkpoints", 2}});
    const std::string s = "stage " + std::to_string(stage);
    ExpectSameTraining(all, plain, s + " all blocks");
    ExpectSameTraining(first2, plain, s + " first 2");
    // Every block checkpointed keeps one block's internals at a time instead of four.
    EXPECT_LT(all.activation_peak, 0.6 * static_cast<double>(plain.activation_peak)) << s;
    EXPECT_LT(first2.activation_peak, plain.activation_peak) << s;
    EXPECT_LT(all.activation_peak, first2.activation_peak) << s;
    std::printf("%s activation peak: plain %lld, 2 blocks %lld, all %lld bytes\n", s.c_str(),
                static_cast<long long>(plain.activation_peak),
                static_cast<long long>(first2.activation_peak),
                static_cast<long long>(all.activation_peak));
  }
}

TEST(ActivationCheckpointingTest, AListOfBlocksAndCpuCheckpointingTrainTheSame) {
  const Result plain = Train(0, nullptr);
  ExpectSameTraining(Train(0, {{"blocks", {1, 3}}}), plain, "blocks 1, 3");
  // On the CPU backend activations are host memory already: nothing moves.
  ExpectSameTraining(Train(0, {{"enabled", true}, {"cpu_checkpointing", true}}), plain,
                     "cpu_checkpointing");
}

}  // namespace
}  // namespace ztrain
