// The equivalence rule for pipeline (and tensor) parallel layouts, on real ranks under
// mpirun: the ranks form the dp x pp x tp grid, each trains its slice of every global batch,
// and every rank also trains the whole batch in a single-process engine beside it; the losses
// and gradient norms at every step, the final weights and the eval loss must agree within
// Note [Equivalence tolerances] (tests/rounding_model.h). Options:
//   mpirun -np 4 layout_equivalence_test --pp 2 --schedule gpipe --stage 2 --gas 4
//   mpirun -np 8 layout_equivalence_test --pp 2 --tp 2 --stage 1
// --pp P and --tp T (default 1), --schedule 1f1b|gpipe, --partition parameters|uniform,
// --stage Z, --gas G, --offload nvme (optimizer state on NVMe, and at stage 3 the
// parameters too, under a fresh directory), --precision bf16|fp16 (both runs in it);
// dp is the world size / (pp x tp). --device cuda runs the parallel engine on GPU 0 (every
// rank: one GPU suffices) against the single process on the CPU, its collectives staged
// through the host over MPI (staging_communicator.h); it exits 77 (skipped) without a GPU.
// --staging stages a CPU run's collectives the same way, which checks the staging itself.
// --packed trains on packed documents (Note [Packed documents]) in both runs; --sp turns on
// sequence parallelism (Note [Sequence parallelism]) in the parallel run. --cp C splits every
// sequence over C ranks (Note [Context parallelism]; with --ring by ring attention, Note [Ring
// attention]); dp is then world / (pp x tp x cp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "engine/engine.h"
#include "estimate/estimate.h"
#include "kernels/ops.h"
#include "nn/family.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/process_grid.h"
#include "parallel/tensor/megatron_linears.h"
#include "side_by_side.h"
#include "staging_communicator.h"
#include "test_model.h"
#include "tests/estimate/estimate_check.h"
#include "tests/parallel/rank_output.h"

namespace ztrain {
namespace {

int g_pp = 1, g_tp = 1, g_cp = 1, g_stage = 0, g_gas = 4;
std::string g_schedule = "1f1b", g_partition = "parameters", g_offload = "none";
std::string g_nvme_dir;
// --checkpointing all|partition: activation checkpointing of every block in the parallel run
// (partition: DeepSpeed's partition_activations, the kept inputs split over the tp ranks).
std::string g_checkpointing = "none";
std::string g_precision = "fp32";
std::string g_device = "cpu";  // the parallel engine's; the single process is on the CPU
bool g_staging = false;
bool g_packed = false;
bool g_sequence_parallel = false;  // --sp: tensor_parallel.sequence_parallel (with --tp)
bool g_ring = false;               // --ring: context_parallel.algorithm "ring" (with --cp)
std::string g_family = "gpt2";  // --family llama: the tiny Llama of test_model.h
// --lora: LoRA on every linear of the blocks (PEFT's start: B = 0), every bias trained, the
// rest of the base frozen (Note [Adapters and frozen parameters]) — in both runs.
bool g_lora = false;
double g_lora_dropout = 0.0;  // --lora-dropout P (with --lora): Note [LoRA dropout]
// --quant nf4|nf4-dq|fp4|int8 (with --lora): the base quantized in both runs (Note [Quantized
// base]); the Llama then has n_embd 64, 4 heads of 32 and an MLP 128 wide, so that every
// tensor-parallel piece of a 4-bit weight holds whole blocks of 64.
std::string g_quant;
comm::Communicator* g_world = nullptr;

// Transformer blocks: 6 layers in all with embedding and head. 4 heads of 8 and a padded
// vocabulary of 16 split over tp = 2 and 4.
constexpr int kLayers = 4;

Config MakeConfig(int world_size, int64_t micro, bool reference, int gas = g_gas,
                  const std::string& schedule = g_schedule) {
  nlohmann::json j = g_family == "llama" ? testing::TinyLlamaConfigJson(kLayers, 11, 8)
                                          : testing::TinyConfigJson(kLayers, 32, 4, 11, 8);
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = gas;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 0.5;
  j["optimizer"]["params"]["weight_decay"] = 0.1;
  j["zero_optimization"]["stage"] = reference ? 0 : g_stage;
  if (g_packed) {
    j["data"]["packed_documents"] = true;
    j["data"]["document_start_token"] = testing::kPackedStart;
  }
  if (g_precision != "fp32") j[g_precision] = {{"enabled", true}};
  if (g_lora) {
    j["lora"] = {{"r", 2},         {"lora_alpha", 4},
                 {"target_modules", "all-linear"}, {"bias", "all"},
                 {"lora_dropout", g_lora_dropout}};
  }
  if (!g_quant.empty()) {
    j["quantization"] = testing::QuantizationJson(g_quant);
    if (g_family == "llama") {
      j["model"]["n_embd"] = 64;
      j["model"]["head_dim"] = 32;
      j["model"]["intermediate_size"] = 128;
    }
  }
  if (!reference) {
    if (g_device == "cuda") j["device"] = "cuda:0";
    j["pipeline"] = {{"stages", g_pp}, {"schedule", schedule}, {"partition", g_partition}};
    j["tensor_parallel"] = {{"size", g_tp}, {"sequence_parallel", g_sequence_parallel}};
    j["context_parallel"] = {{"size", g_cp}, {"algorithm", g_ring ? "ring" : "ulysses"}};
    if (g_checkpointing != "none") {
      j["activation_checkpointing"] = {{"enabled", true},
                                       {"partition_activations", g_checkpointing == "partition"}};
    }
    if (g_offload == "nvme") {
      const nlohmann::json nvme = {{"device", "nvme"}, {"nvme_path", g_nvme_dir}};
      j["zero_optimization"]["offload_optimizer"] = nvme;
      j["zero_optimization"]["sub_group_size"] = 3000;
      if (g_stage == 3) {
        j["zero_optimization"]["offload_param"] = nvme;
        j["zero_optimization"]["offload_param"]["max_in_cpu"] = 0;
      }
    }
  }
  return ParseConfig(j, world_size);
}

// The rank's groups in the grid of the world.
struct Layout {
  ProcessGrid grid;
  GridCommunicators comms;
  GridCoord coord;
  Layout()
      : grid(g_world->size(), g_world->size() / (g_pp * g_tp * g_cp), g_pp, g_tp, g_cp),
        comms(MakeGridCommunicators(*g_world, grid)),
        coord(grid.Coord(g_world->rank())) {}
  ParallelGroups groups() {
    return {&comms.gradients(), comms.pp.get(), comms.tp.get(), comms.cp.get()};
  }
  int dp() const { return grid.dp_size(); }
  // The model's layers for this layout: tensor-parallel ones under tp, attention exchanging
  // over the cp group under cp.
  std::vector<std::unique_ptr<nn::Layer>> Layers(const Config& c) {
    const nn::AdapterPlan plan(c);
    return g_tp > 1 || g_cp > 1
               ? tensor::BuildParallelModel(c.model, *comms.tp, plan, c.sequence_parallel,
                                            comms.cp.get(), Algorithm())
               : nn::BuildModel(c.model, nn::MakeWholeLinears(), plan);
  }
  // This rank's pieces of `whole` (Note [Context parallelism]), alive in `hold`.
  std::vector<nn::MicroBatch> Pieces(const std::vector<nn::MicroBatch>& whole,
                                     std::vector<std::unique_ptr<nn::ContextMicroBatch>>& hold) {
    return testing::Pieces(whole, coord.cp, g_cp, hold, Algorithm());
  }
  static nn::ContextAlgorithm Algorithm() {
    return g_ring ? nn::ContextAlgorithm::kRing : nn::ContextAlgorithm::kUlysses;
  }
};

// The single process's parameters, whole and in fp32 (a frozen one's Parameter() is in the
// compute dtype).
std::map<std::string, std::vector<float>> WholeValues(Engine& single) {
  std::map<std::string, std::vector<float>> values;
  single.ForEachFullParameter([&](const std::string& name, const Tensor& t) {
    values[name].assign(t.data<float>(), t.data<float>() + t.numel());
  });
  return values;
}

TEST(LayoutEquivalenceTest, LossesAndWeightsMatchOneProcess) {
  Layout layout;
  const int n_dp = layout.dp(), d = layout.coord.dp;
  const int64_t b = 2;  // rows per dp rank per micro-batch
  const Config config = MakeConfig(g_world->size(), b, false);
  Engine parallel(config, layout.Layers(config), layout.groups());
  const Config reference = MakeConfig(1, b * n_dp, true);
  Engine single(reference, nn::BuildModel(reference.model, nn::MakeWholeLinears(),
                                          nn::AdapterPlan(reference)));
  EXPECT_EQ(parallel.pp_size(), g_pp);
  EXPECT_EQ(parallel.pp_rank(), layout.coord.pp);
  // Every stage and slice starts from the single-process values, exactly.
  const std::map<std::string, std::vector<float>> initial = WholeValues(single);
  parallel.ForEachFullParameter([&](const std::string& name, const Tensor& a) {
    const std::vector<float>& e = initial.at(name);
    ASSERT_EQ(static_cast<size_t>(a.numel()), e.size()) << name;
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_EQ(a.data<float>()[i], e[static_cast<size_t>(i)]) << name << "[" << i << "] at init";
    }
  });
  constexpr int kSteps = 12;
  testing::EquivalenceCheck check = testing::CheckFor(single, b * n_dp, g_gas, kSteps);
  const double lr_sum =
      testing::TrainSideBySide(parallel, single, kSteps, g_gas, b, n_dp, d, check, g_packed,
                               layout.coord.cp, g_cp, Layout::Algorithm());
  // Every parameter this stage holds, the copy of a tied weight included, equals the single
  // process's (Note [Equivalence tolerances]); together the stages hold the whole model.
  const std::map<std::string, std::vector<float>> trained = WholeValues(single);
  const auto compare = [&](const std::string& name, const Tensor& a) {
    const std::vector<float>& e = trained.at(name);
    ASSERT_EQ(static_cast<size_t>(a.numel()), e.size()) << name;
    check.Values(name, a.data<float>(), e.data(), a.numel(), lr_sum);
  };
  parallel.ForEachFullParameter(compare);
  EXPECT_GT(check.tensors(), 0);
  const int64_t held = check.tensors();
  parallel.ForEachModelParameter(compare);
  const bool writer =
      layout.coord.dp == 0 && layout.coord.pp == 0 && layout.coord.tp == 0 && layout.coord.cp == 0;
  EXPECT_EQ(check.tensors() - held, writer ? static_cast<int>(single.ParameterNames().size()) : 0);
  testing::OwnedBatch eval(b, 8, 11, 99);
  if (g_packed) eval.Pack();
  std::vector<std::unique_ptr<nn::ContextMicroBatch>> hold;
  const double eval_loss = parallel.EvalLoss(layout.Pieces({eval.mb}, hold)[0]);
  check.Eval(eval_loss, single.EvalLoss(eval.mb), lr_sum);
  testing::ExpectWithinRounding(check, "layout_equivalence rank " +
                                           std::to_string(g_world->rank()));
}

// The memory estimate of each rank's stage (estimate/estimate.h) is honest against what the
// rank's tracker measured over construction and two steps (estimate_check.h's rule, with
// 256 bytes of absolute slack: these categories are a few KiB; a pipeline's send buffers
// live as long as the messages take, which the replay fixes, so its activations may differ
// by an output or two, within the 10%).
TEST(LayoutEquivalenceTest, MemoryEstimateIsHonest) {
  Layout layout;
  const Config config = MakeConfig(g_world->size(), 2, false);
  Engine e(config, layout.Layers(config), layout.groups());
  for (int step = 0; step < 2; ++step) {
    std::vector<testing::OwnedBatch> batches;
    std::vector<nn::MicroBatch> micro;
    for (int m = 0; m < g_gas; ++m) batches.emplace_back(2, 8, 11, 100 * step + m);
    for (auto& x : batches) {
      if (g_packed) x.Pack();  // as the trainer gives them: the estimate assumes positions
      micro.push_back(x.mb);
    }
    std::vector<std::unique_ptr<nn::ContextMicroBatch>> hold;
    e.TrainStep(layout.Pieces(micro, hold));
  }
  EstimateOptions options;
  options.gpu = g_device == "cuda";
  options.pp_stage = layout.coord.pp;
  testing::ExpectEstimateHonest(
      EstimateMemory(config, options), e.memory().Snapshot(),
      "rank " + std::to_string(g_world->rank()) + " (dp " + std::to_string(layout.coord.dp) +
          " pp " + std::to_string(layout.coord.pp) + " tp " + std::to_string(layout.coord.tp) + ")",
      256);
}

// Under 1F1B the first stage holds at most pp micro-batches' activations whatever the number
// of micro-batches; under GPipe it holds all of them.
TEST(LayoutEquivalenceTest, FirstStageActivationsStayBoundedUnder1F1B) {
  if (g_pp == 1) GTEST_SKIP() << "no pipeline";
  if (g_checkpointing != "none") GTEST_SKIP() << "the bounds are those of plain runs";
  Layout layout;
  auto peak = [&](int gas, const std::string& schedule) {
    const Config config = MakeConfig(g_world->size(), 2, false, gas, schedule);
    Engine e(config, layout.Layers(config), layout.groups());
    std::vector<testing::OwnedBatch> batches;
    std::vector<nn::MicroBatch> micro;
    for (int m = 0; m < gas; ++m) batches.emplace_back(2, 8, 11, 7 + m);
    for (auto& x : batches) micro.push_back(x.mb);
    std::vector<std::unique_ptr<nn::ContextMicroBatch>> hold;
    e.TrainStep(layout.Pieces(micro, hold));
    return e.memory().Peak(MemoryCategory::kActivations);
  };
  const int64_t f4 = peak(4, "1f1b"), f8 = peak(8, "1f1b");
  const int64_t g4 = peak(4, "gpipe"), g8 = peak(8, "gpipe");
  if (layout.coord.pp != 0) return;
  // 1F1B: about the same peak for 4 and 8 micro-batches (both above pp; a send still in
  // flight may hold one more output); GPipe: about twice.
  EXPECT_LT(static_cast<double>(f8), 1.1 * static_cast<double>(f4));
  EXPECT_GT(static_cast<double>(g8), 1.6 * static_cast<double>(g4));
  EXPECT_LT(static_cast<double>(f8), 0.75 * static_cast<double>(g8));
  std::printf(
      "first stage activation peak: 1f1b %lld / %lld bytes, gpipe %lld / %lld bytes "
      "(4 / 8 micro-batches)\n",
      static_cast<long long>(f4), static_cast<long long>(f8), static_cast<long long>(g4),
      static_cast<long long>(g8));
}

}  // namespace
}  // namespace ztrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--pp") ztrain::g_pp = std::atoi(argv[i + 1]);
    if (key == "--tp") ztrain::g_tp = std::atoi(argv[i + 1]);
    if (key == "--cp") ztrain::g_cp = std::atoi(argv[i + 1]);
    if (key == "--stage") ztrain::g_stage = std::atoi(argv[i + 1]);
    if (key == "--gas") ztrain::g_gas = std::atoi(argv[i + 1]);
    if (key == "--schedule") ztrain::g_schedule = argv[i + 1];
    if (key == "--partition") ztrain::g_partition = argv[i + 1];
    if (key == "--offload") ztrain::g_offload = argv[i + 1];
    if (key == "--checkpointing") ztrain::g_checkpointing = argv[i + 1];
    if (key == "--precision") ztrain::g_precision = argv[i + 1];
    if (key == "--family") ztrain::g_family = argv[i + 1];
    if (key == "--quant") ztrain::g_quant = argv[i + 1];
    if (key == "--lora-dropout") ztrain::g_lora_dropout = std::atof(argv[i + 1]);
    if (key == "--device") ztrain::g_device = argv[i + 1];
  }
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--lora") ztrain::g_lora = true;
    if (std::string(argv[i]) == "--staging") ztrain::g_staging = true;
    if (std::string(argv[i]) == "--packed") ztrain::g_packed = true;
    if (std::string(argv[i]) == "--sp") ztrain::g_sequence_parallel = true;
    if (std::string(argv[i]) == "--ring") ztrain::g_ring = true;
  }
  auto world = ztrain::comm::MakeMpiWorld(std::chrono::seconds(120));
  ztrain::g_world = world.get();
  if (ztrain::g_device == "cuda" && ztrain::kernels::CudaDeviceCount() == 0) {
    if (world->rank() == 0) std::printf("skipped: --device cuda and no CUDA device visible\n");
    return 77;  // SKIP_RETURN_CODE in tests/engine/CMakeLists.txt
  }
  std::unique_ptr<ztrain::comm::Communicator> staged;
  if (ztrain::g_staging || ztrain::g_device == "cuda") {
    staged = std::make_unique<ztrain::testing::StagingCommunicator>(*world);
    ztrain::g_world = staged.get();
  }
  if (ztrain::g_offload == "nvme") {  // one directory for the job; each rank gets rank<R> in it
    int32_t pid = world->rank() == 0 ? static_cast<int32_t>(getpid()) : 0;
    world->Broadcast(ztrain::Tensor(&pid, ztrain::DType::kI32, {1}), 0)->Wait();
    ztrain::g_nvme_dir = "/tmp/ztrain_layout_nvme_" + std::to_string(pid);
    std::filesystem::create_directories(ztrain::g_nvme_dir);
  }
  ztrain::testing::PrintFromRankZero(world->rank());  // every rank's result counts below
  int failed = RUN_ALL_TESTS();
  world->Barrier()->Wait();
  if (!ztrain::g_nvme_dir.empty() && world->rank() == 0) {
    if (!std::filesystem::is_empty(ztrain::g_nvme_dir)) {
      std::fprintf(stderr, "swap files left behind under %s\n", ztrain::g_nvme_dir.c_str());
      failed = 1;
    }
    std::filesystem::remove_all(ztrain::g_nvme_dir);
  }
  float any = static_cast<float>(failed);
  world->AllReduce(ztrain::Tensor(&any, ztrain::DType::kF32, {1}))->Wait();
  return any > 0 ? 1 : 0;
}
