// The equivalence rule for data parallelism and ZeRO, on real ranks under mpirun: every rank
// trains its slice of each global batch with the dp engine and, beside it, the whole batch
// with a single-process engine; the losses at every step and the final weights must agree.
// Run with any number of ranks; the stage, accumulation and any other zero_optimization key
// come from the command line; --offload-param / --offload-optimizer cpu|nvme put the state in
// pinned memory or in swap files under a fresh directory:
//   mpirun -np 4 zero_equivalence_test --stage 3 --gas 2 --zero stage3_max_live_parameters=0
//   mpirun -np 2 zero_equivalence_test --stage 3 --offload-param nvme --zero max_in_cpu=2000
// --device cuda runs both engines on the rank's GPU (by local rank) with the dp group on NCCL
// when every local rank has a GPU; with fewer GPUs than local ranks the ranks share them (rank
// r on GPU r mod count; NCCL refuses two ranks on one GPU), their dp group staged through the
// host over MPI (staging_communicator.h). It exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "engine/engine.h"
#include "nn/family.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/comm/nccl/nccl_communicator.h"
#include "parallel/launch_env.h"
#include "side_by_side.h"
#include "staging_communicator.h"
#include "test_model.h"
#include "tests/parallel/rank_output.h"

namespace ztrain {
namespace {

int g_stage = 0, g_gas = 1;
nlohmann::json g_zero = nlohmann::json::object();  // extra zero_optimization keys
std::string g_offload_param = "none", g_offload_optimizer = "none";
std::string g_nvme_dir;  // made by main when a device is nvme
comm::Communicator* g_world = nullptr;  // MPI: the test's own host-memory messages
comm::Communicator* g_dp = nullptr;     // the parallel engines' group (NCCL with --device cuda)
std::string g_device = "cpu";           // "cpu" or "cuda:<local rank>"
std::string g_skip;                     // why every test skips, when it does
std::string g_precision = "fp32";       // --precision bf16|fp16: both engines in it
std::string g_family = "gpt2";          // --family llama: the tiny Llama of test_model.h
bool g_lora =
    false;  // --lora: PEFT-initialised adapters on every linear, biases trained (both runs)
// --lora-dropout P (with --lora): the adapters' lora_dropout (Note [LoRA dropout]).
double g_lora_dropout = 0.0;
// --quant nf4|nf4-dq|fp4|int8 (with --lora): the base quantized (both runs), Note [Quantized
// base] in nn/adapters.h.
nlohmann::json g_quant = nullptr;

int64_t ZeroKey(const std::string& key, int64_t fallback) {
  return g_zero.contains(key) ? g_zero[key].get<int64_t>() : fallback;
}

// Ψ with each layer padded to dp x 16 elements, and the padded size of each layer.
std::vector<int64_t> PaddedLayerSizes(const Engine& e, int n) {
  std::vector<int64_t> sizes;
  for (const auto& layer : e.layers()) {
    int64_t m = 0;
    for (const nn::ParamSpec& s : layer->Params()) {
      if (s.tied_to.empty()) m = (m + NumElements(s.shape) + 15) / 16 * 16;
    }
    sizes.push_back((m + 16 * n - 1) / (16 * n) * (16 * n));
  }
  return sizes;
}

nn::LayerList Build(const Config& c) {
  return nn::BuildModel(c.model, nn::MakeWholeLinears(), nn::AdapterPlan(c));
}

// The reference is always the plain single-process run: stage 0, no offload.
Config MakeConfig(int world_size, int64_t micro, bool reference = false) {
  // n_embd 24 makes flat buffers that do not divide evenly by 4 ranks: padding is exercised.
  nlohmann::json j = g_family == "llama" ? testing::TinyLlamaConfigJson(2, 11, 8)
                                          : testing::TinyConfigJson(2, 24, 2, 11, 8);
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = g_gas;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 0.5;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["zero_optimization"] = g_zero;
  j["zero_optimization"]["stage"] = reference ? 0 : g_stage;
  j["training"]["job_name"] = "zero_equivalence";
  j["device"] = g_device;
  if (g_precision != "fp32") j[g_precision] = {{"enabled", true}};
  if (g_lora) {
    j["lora"] = {{"r", 2},         {"lora_alpha", 4},
                 {"target_modules", "all-linear"}, {"bias", "all"},
                 {"lora_dropout", g_lora_dropout}};
  }
  if (!g_quant.is_null()) j["quantization"] = g_quant;
  if (!reference) {
    // Offload: the buffer and tile sizes come from --zero (e.g. sub_group_size=1000); the
    // keys below only name where the state goes.
    for (const auto& [section, device] : {std::pair{"offload_param", g_offload_param},
                                          std::pair{"offload_optimizer", g_offload_optimizer}}) {
      nlohmann::json o = {{"device", device}, {"pin_memory", true}};
      if (device == "nvme") o["nvme_path"] = g_nvme_dir;
      for (const char* key : {"buffer_count", "buffer_size", "max_in_cpu", "pipeline_read",
                              "pipeline_write"}) {
        const bool for_param = std::string(key).rfind("pipeline", 0) != 0;
        if (g_zero.contains(key) && for_param == (std::string(section) == "offload_param")) {
          o[key] = g_zero[key];
        }
      }
      j["zero_optimization"][section] = o;
    }
  }
  for (const char* key : {"buffer_count", "buffer_size", "max_in_cpu", "pipeline_read",
                          "pipeline_write"}) {
    j["zero_optimization"].erase(key);
  }
  return ParseConfig(j, world_size);
}

TEST(ZeroEquivalenceTest, LossesAndWeightsMatchOneProcess) {
  if (!g_skip.empty()) GTEST_SKIP() << g_skip;
  const int n = g_world->size(), r = g_world->rank();
  const int64_t b = 2;  // rows per rank per micro-batch
  Engine parallel(MakeConfig(n, b), Build(MakeConfig(n, b)), g_dp);
  Engine single(MakeConfig(1, b * n, true), Build(MakeConfig(1, b * n, true)));
  // The same global micro-batches on every rank; rank r takes rows [r*b, (r+1)*b), within
  // Note [Equivalence tolerances].
  constexpr int kSteps = 20;
  testing::EquivalenceCheck check = testing::CheckFor(single, b * n, g_gas, kSteps);
  const double lr_sum =
      testing::TrainSideBySide(parallel, single, kSteps, g_gas, b, n, r, check);
  std::map<std::string, std::vector<float>> expected;  // host values on any device
  single.ForEachFullParameter([&](const std::string& name, const Tensor& e) {
    expected[name].assign(e.data<float>(), e.data<float>() + e.numel());
  });
  parallel.ForEachFullParameter([&](const std::string& name, const Tensor& a) {
    const std::vector<float>& e = expected.at(name);
    ASSERT_EQ(static_cast<size_t>(a.numel()), e.size()) << name;
    check.Values(name, a.data<float>(), e.data(), a.numel(), lr_sum);
  });
  EXPECT_EQ(check.tensors(), static_cast<int64_t>(single.ParameterNames().size()));
  // Evaluation (stage 3 gathers forward only) agrees too.
  testing::OwnedBatch eval(b, 8, 11, 99);
  check.Eval(parallel.EvalLoss(eval.mb), single.EvalLoss(testing::Rows(eval.mb, 0, b)), lr_sum);
  testing::ExpectWithinRounding(check, "zero_equivalence rank " + std::to_string(r));
}

TEST(ZeroEquivalenceTest, BytesPerStepMatchTheZeroFormula) {
  if (!g_skip.empty()) GTEST_SKIP() << g_skip;
  if (g_lora) GTEST_SKIP() << "the formula of a fully trained model (lora_gradient_test: LoRA's)";
  if (g_precision != "fp32") GTEST_SKIP() << "the fp32 formula (16-bit gathers move half)";
  const int n = g_world->size();
  Engine parallel(MakeConfig(n, 2), nn::BuildModel(MakeConfig(n, 2).model), g_dp);
  const std::vector<int64_t> sizes = PaddedLayerSizes(parallel, n);
  int64_t padded = 0;  // Ψ with each layer padded to dp x 16 elements
  for (int64_t x : sizes) padded += x;
  testing::OwnedBatch batch(2, 8, 11, 5);
  std::vector<nn::MicroBatch> micro(g_gas, batch.mb);
  const comm::CommStats before = g_dp->stats();
  parallel.TrainStep(micro);
  const comm::CommStats after = g_dp->stats();
  const double moved = static_cast<double>(after.TotalBytes() - before.TotalBytes());
  // Stages 0 and 1 move 2Ψ(N-1)/N fp32 elements per rank and step (all-reduce, or
  // reduce-scatter + all-gather); stage 2 reduce-scatters every micro-batch, so
  // (gas + 1)Ψ(N-1)/N, which is 2Ψ(N-1)/N without accumulation. The scalar all-reduces
  // (loss, norm, stop flag) add a few bytes.
  // Stage 3 gathers in forward and backward and reduce-scatters, 3Ψ per micro-batch; the
  // LM head also gathers the tied embedding layer (sizes[0]) in forward and in backward.
  // With the default limits every layer of this tiny model is under the persistence
  // threshold: each is gathered once per step, (1 + gas)Ψ in all.
  // With reduce_scatter off, stages 1 and 2 all-reduce (2Ψ) where they reduce-scatter (Ψ).
  const double per_reduction = g_stage >= 1 && g_zero.value("reduce_scatter", true) == false ? 2 : 1;
  double elements = (g_stage == 2 ? g_gas * per_reduction + 1 : 1 + per_reduction) *
                    static_cast<double>(padded);
  if (g_stage == 3) {
    const bool persistent = ZeroKey("stage3_param_persistence_threshold", 100000) > sizes[0];
    const bool tight = ZeroKey("stage3_max_live_parameters", 1000000000) == 0;
    if (persistent) {
      elements = (1.0 + g_gas) * static_cast<double>(padded);
    } else if (tight) {
      elements = g_gas * (3.0 * static_cast<double>(padded) + 2.0 * static_cast<double>(sizes[0]));
    } else {
      elements = -1;  // prefetch and reuse: between the two, checked below
    }
  }
  const double scale = (n - 1.0) / n * 4.0;
  if (elements >= 0) {
    EXPECT_NEAR(moved, elements * scale, 0.01 * elements * scale) << "stage " << g_stage;
  } else {
    EXPECT_GE(moved, (1.0 + g_gas) * static_cast<double>(padded) * scale);
    EXPECT_LE(moved, g_gas * (3.0 * static_cast<double>(padded) + 2.0 * sizes[0]) * scale * 1.01);
  }
  if (g_stage == 0) {
    EXPECT_EQ(after.Bytes(comm::OpKind::kReduceScatter), before.Bytes(comm::OpKind::kReduceScatter));
  } else if (n > 1) {
    EXPECT_GT(after.Bytes(comm::OpKind::kAllGather), before.Bytes(comm::OpKind::kAllGather));
  }
}

TEST(ZeroEquivalenceTest, ModelStateIsShardedAsZeroSays) {
  if (!g_skip.empty()) GTEST_SKIP() << g_skip;
  if (g_lora) GTEST_SKIP() << "the formula of a fully trained model (lora_gradient_test: LoRA's)";
  if (g_precision != "fp32") GTEST_SKIP() << "the fp32 formula (16-bit copies add to it)";
  const int n = g_world->size();
  Engine parallel(MakeConfig(n, 2), nn::BuildModel(MakeConfig(n, 2).model), g_dp);
  Engine single(MakeConfig(1, 2, true), nn::BuildModel(MakeConfig(1, 2, true).model));
  // fp32: m + v are 8 bytes per parameter, the parameters and gradients 4 each.
  const int64_t full = single.memory().Current(MemoryCategory::kOptimizerState);
  const int64_t mine = parallel.memory().Current(MemoryCategory::kOptimizerState);
  const bool nvme = g_offload_param == "nvme" || g_offload_optimizer == "nvme";
  if (g_device != "cpu" && (g_offload_param != "none" || g_offload_optimizer != "none")) {
    GTEST_SKIP() << "offload on a GPU adds the host master and gradient copies "
                    "(cuda_engine_test checks them)";
  }
  EXPECT_EQ(parallel.memory().Peak(MemoryCategory::kSwapBuffers) > 0, nvme);
  if (g_offload_optimizer == "nvme") {
    EXPECT_EQ(mine, 0) << "m and v belong in the swap file";
    return;
  }
  if (g_offload_param == "nvme") {
    // Resident parameter bytes: the layers kept in memory (max_in_cpu) and the swap buffers
    // (buffer_count x buffer_size, each rounded up to the 4 KiB of O_DIRECT); nothing else
    // between steps, and the same after one.
    const int64_t kept = 4 * ZeroKey("max_in_cpu", 1000000000);
    const int64_t buffers =
        ZeroKey("buffer_count", 5) * (4 * ZeroKey("buffer_size", 100000000) + 4096);
    EXPECT_LE(parallel.memory().Current(MemoryCategory::kParameters), kept);
    testing::OwnedBatch batch(2, 8, 11, 5);
    std::vector<nn::MicroBatch> micro(g_gas, batch.mb);
    parallel.TrainStep(micro);
    EXPECT_LE(parallel.memory().Current(MemoryCategory::kParameters), kept);
    if (g_offload_optimizer == "none") {
      EXPECT_LE(parallel.memory().Peak(MemoryCategory::kSwapBuffers), buffers);
    }
    return;
  }
  // Padding to dp x 16 elements per layer adds at most 16 elements per layer and rank.
  const int64_t slack = static_cast<int64_t>(parallel.layers().size()) * 16 * 8;
  if (g_stage == 0) {
    EXPECT_NEAR(mine, full, slack * n);
  } else {
    EXPECT_NEAR(mine, full / n, slack);
  }
  // Stages 2 and 3 keep only the gradient shard between steps; stage 3 also the parameters'.
  const int64_t grads = parallel.memory().Current(MemoryCategory::kGradients);
  const int64_t params = parallel.memory().Current(MemoryCategory::kParameters);
  // Stage 1 has the full local gradients and the reduced shard.
  const int64_t expected_grads = g_stage >= 2 ? full / 2 / n : full / 2 + (g_stage == 1 ? full / 2 / n : 0);
  EXPECT_NEAR(grads, expected_grads, g_stage >= 2 ? slack : slack * n);
  EXPECT_NEAR(params, g_stage == 3 ? full / 2 / n : full / 2, g_stage == 3 ? slack : slack * n);
  if (g_stage != 3) return;

  // Stage 3 during a step: the gathered layers stay within stage3_max_live_parameters plus
  // the largest layer use (a block, or the LM head with its tied embedding), plus persistent
  // layers.
  testing::OwnedBatch batch(2, 8, 11, 5);
  std::vector<nn::MicroBatch> micro(g_gas, batch.mb);
  parallel.TrainStep(micro);
  EXPECT_EQ(parallel.memory().Current(MemoryCategory::kParameters), params)
      << "gathered parameters outlived the step";
  const std::vector<int64_t> sizes = PaddedLayerSizes(parallel, n);
  const int64_t threshold = ZeroKey("stage3_param_persistence_threshold", 100000);
  int64_t persistent = 0;
  for (int64_t s : sizes) persistent += s < threshold ? s : 0;
  int64_t largest_use = sizes.front() + sizes.back();
  for (int64_t s : sizes) largest_use = std::max(largest_use, s);
  const int64_t max_live = ZeroKey("stage3_max_live_parameters", 1000000000);
  const int64_t gathered = parallel.memory().Peak(MemoryCategory::kParameters) - params;
  EXPECT_GT(gathered, 0);
  EXPECT_LE(gathered, 4 * (std::min(max_live, int64_t{1} << 40) + largest_use + persistent));
  if (max_live == 0 && threshold == 0) {
    EXPECT_EQ(gathered, 4 * largest_use);
  }
}

}  // namespace
}  // namespace ztrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--lora") == 0) ztrain::g_lora = true;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--stage") == 0) ztrain::g_stage = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--gas") == 0) ztrain::g_gas = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--offload-param") == 0) ztrain::g_offload_param = argv[i + 1];
    if (std::strcmp(argv[i], "--offload-optimizer") == 0) ztrain::g_offload_optimizer = argv[i + 1];
    if (std::strcmp(argv[i], "--device") == 0) ztrain::g_device = argv[i + 1];
    if (std::strcmp(argv[i], "--precision") == 0) ztrain::g_precision = argv[i + 1];
    if (std::strcmp(argv[i], "--family") == 0) ztrain::g_family = argv[i + 1];
    if (std::strcmp(argv[i], "--quant") == 0) ztrain::g_quant = ztrain::testing::QuantizationJson(argv[i + 1]);
    if (std::strcmp(argv[i], "--lora-dropout") == 0) ztrain::g_lora_dropout = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--zero") == 0) {  // key=value, an integer or true/false
      const std::string kv = argv[i + 1];
      const size_t eq = kv.find('=');
      ztrain::g_zero[kv.substr(0, eq)] = nlohmann::json::parse(kv.substr(eq + 1));
    }
  }
  auto world = ztrain::comm::MakeMpiWorld(std::chrono::seconds(120));
  ztrain::g_world = world.get();
  ztrain::g_dp = world.get();
  std::unique_ptr<ztrain::comm::Communicator> device_dp;  // NCCL, or staged through the host
  if (ztrain::g_device == "cuda") {
    const ztrain::LaunchEnv env = ztrain::DetectLaunchEnv();
    const int gpus = ztrain::comm::VisibleCudaDevices();
    if (gpus == 0) {  // the same answer on every rank of one node
      ztrain::g_skip = "--device cuda needs a GPU, and none is visible";
    } else if (gpus < env.local_size) {
      ztrain::g_device = "cuda:" + std::to_string(env.local_rank % gpus);
      device_dp = std::make_unique<ztrain::testing::StagingCommunicator>(*world);
      ztrain::g_dp = device_dp.get();
    } else {
      ztrain::g_device = "cuda:" + std::to_string(env.local_rank);
      device_dp = ztrain::comm::MakeNcclCommunicator(*world, env.local_rank,
                                                     std::chrono::seconds(120));
      ztrain::g_dp = device_dp.get();
    }
  }
  // Swap files go to a directory of this run; each rank gets its own rank<R> below it, and
  // the engine removes them.
  if (ztrain::g_offload_param == "nvme" || ztrain::g_offload_optimizer == "nvme") {
    int32_t pid = world->rank() == 0 ? static_cast<int32_t>(getpid()) : 0;
    world->Broadcast(ztrain::Tensor(&pid, ztrain::DType::kI32, {1}), 0)->Wait();
    ztrain::g_nvme_dir = "/tmp/ztrain_zero_nvme_" + std::to_string(pid);
    std::filesystem::create_directories(ztrain::g_nvme_dir);
  }

  ztrain::testing::PrintFromRankZero(world->rank());
  int failed = RUN_ALL_TESTS();
  world->Barrier()->Wait();
  if (!ztrain::g_nvme_dir.empty() && world->rank() == 0) {
    // Every engine is gone: so must be every swap file and directory.
    if (!std::filesystem::is_empty(ztrain::g_nvme_dir)) {
      std::fprintf(stderr, "swap files left behind under %s\n", ztrain::g_nvme_dir.c_str());
      failed = 1;
    }
    std::filesystem::remove_all(ztrain::g_nvme_dir);
  }
  float any = static_cast<float>(failed);
  world->AllReduce(ztrain::Tensor(&any, ztrain::DType::kF32, {1}))->Wait();
  if (any == 0 && !ztrain::g_skip.empty()) return 77;  // SKIP_RETURN_CODE: every test skipped
  return any > 0 ? 1 : 0;
}
