// Note [Deferred optimizer step]: with the parameter shards on NVMe the engine steps each layer
// as the next forward reads it. Every way of reaching the parameters and the optimizer state in
// between — an evaluation, whole parameters, a checkpoint, another OptimizerStep, a custom
// loop — must see the model of a step taken at once: bit for bit the in-memory stage 3 run
// (the same arithmetic on the same operands).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "nn/gpt2.h"
#include "run/checkpointer.h"
#include "test_model.h"
#include "tests/temp_dir.h"

namespace ztrain {
namespace {

// Parameters (and with `optimizer` m and v, in tiles smaller than a layer) on NVMe under
// `nvme`; in memory when it is empty.
Config MakeConfig(const std::string& nvme, const std::string& precision = "fp32",
                  bool optimizer = false) {
  nlohmann::json j = testing::TinyConfigJson(2, 16, 2, 11, 8);
  j["gradient_clipping"] = 0.5;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["scheduler"] = {{"type", "WarmupCosineLR"},
                    {"params", {{"warmup_num_steps", 2}, {"total_num_steps", 20}}}};
  j["zero_optimization"] = {{"stage", 3}, {"stage3_param_persistence_threshold", 0}};
  if (!nvme.empty()) {
    j["zero_optimization"]["offload_param"] = {
        {"device", "nvme"}, {"nvme_path", nvme}, {"max_in_cpu", 0}, {"buffer_count", 2}};
    if (optimizer) {
      j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                     {"nvme_path", nvme},
                                                     {"pipeline_read", true},
                                                     {"pipeline_write", true}};
      j["zero_optimization"]["sub_group_size"] = 300;
    }
  }
  if (precision == "bf16") j["bf16"] = {{"enabled", true}};
  j["train_micro_batch_size_per_gpu"] = 2;
  j["gradient_accumulation_steps"] = 2;
  j.erase("train_batch_size");
  return ParseConfig(j);
}

std::map<std::string, std::vector<float>> Parameters(Engine& e) {
  std::map<std::string, std::vector<float>> out;
  e.ForEachFullParameter([&](const std::string& name, const Tensor& t) {
    out[name].assign(t.data<float>(), t.data<float>() + t.numel());
  });
  return out;
}

StepStats Step(Engine& e, int step) {
  testing::OwnedBatch a(2, 8, 11, 100 + 2 * step), b(2, 8, 11, 101 + 2 * step);
  const std::vector<nn::MicroBatch> mbs = {a.mb, b.mb};
  return e.TrainStep(mbs);
}

void ExpectSameStep(const StepStats& got, const StepStats& want) {
  EXPECT_EQ(got.loss, want.loss) << "step " << want.step;
  EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << want.step;
  EXPECT_EQ(got.lr, want.lr) << "step " << want.step;
}

// (precision, optimizer state on NVMe too)
class DeferredStepTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  Config Swapped(const std::string& nvme) const {
    return MakeConfig(nvme, std::get<0>(GetParam()), std::get<1>(GetParam()));
  }
  Config Memory() const { return MakeConfig("", std::get<0>(GetParam())); }
};

TEST_P(DeferredStepTest, StepsEvaluationAndWholeParametersMatchMemory) {
  testing::TempDir nvme;
  Engine memory(Memory(), nn::BuildGpt2(Memory().model));
  Engine swapped(Swapped(nvme.path()), nn::BuildGpt2(Memory().model));
  for (int step = 0; step < 3; ++step) ExpectSameStep(Step(swapped, step), Step(memory, step));
  // Steps are pending now; an evaluation gathers (and so steps) every layer.
  testing::OwnedBatch eval(2, 8, 11, 7);
  EXPECT_EQ(swapped.EvalLoss(eval.mb), memory.EvalLoss(eval.mb));
  for (int step = 3; step < 5; ++step) ExpectSameStep(Step(swapped, step), Step(memory, step));
  EXPECT_EQ(Parameters(swapped), Parameters(memory));  // with the last step pending
  ExpectSameStep(Step(swapped, 5), Step(memory, 5));
  EXPECT_EQ(Parameters(swapped), Parameters(memory));
}

TEST_P(DeferredStepTest, ACustomLoopStepsTwiceOnTheSameGradients) {
  testing::TempDir nvme;
  Engine memory(Memory(), nn::BuildGpt2(Memory().model));
  Engine swapped(Swapped(nvme.path()), nn::BuildGpt2(Memory().model));
  for (Engine* e : {&memory, &swapped}) {
    testing::OwnedBatch batch(2, 8, 11, 3);
    e->ZeroGrad();
    e->ForwardBackward(batch.mb, 0.5f);
    StepStats stats;
    const double norm = e->GradNorm();
    e->OptimizerStep(norm, stats);
    e->OptimizerStep(norm, stats);  // the same gradients again: the first step is pending
    e->ZeroGrad();
    e->ForwardBackward(batch.mb, 0.5f);
    e->OptimizerStep(e->GradNorm(), stats);
  }
  EXPECT_EQ(Parameters(swapped), Parameters(memory));
}

TEST_P(DeferredStepTest, ACheckpointTakenWithStepsPendingResumesBitForBit) {
  testing::TempDir nvme, dir;
  Config cfg = Swapped(nvme.path());
  cfg.checkpoint.dir = dir.path();
  Engine swapped(cfg, nn::BuildGpt2(cfg.model));
  for (int step = 0; step < 3; ++step) Step(swapped, step);
  Checkpointer(cfg, swapped, nullptr).Save(3, data::LoaderState{});
  std::vector<StepStats> after;
  for (int step = 3; step < 5; ++step) after.push_back(Step(swapped, step));

  Config memory_cfg = Memory();
  memory_cfg.checkpoint.dir = dir.path();
  Engine resumed(memory_cfg, nn::BuildGpt2(memory_cfg.model));
  EXPECT_EQ(Checkpointer(memory_cfg, resumed, nullptr).Resume("latest").step, 3);
  for (int step = 3; step < 5; ++step) ExpectSameStep(Step(resumed, step), after[step - 3]);
  EXPECT_EQ(Parameters(resumed), Parameters(swapped));
}

INSTANTIATE_TEST_SUITE_P(PrecisionAndOptimizer, DeferredStepTest,
                         ::testing::Combine(::testing::Values("fp32", "bf16"), ::testing::Bool()));

}  // namespace
}  // namespace ztrain
