// Checkpoints in one process: resuming continues as if never stopped, on the same or another
// ZeRO stage and offload; a flipped byte, a truncated or missing rank file and a missing
// meta.json are named, `latest` falls back to the newest intact checkpoint, old ones are
// pruned, and a save that fails leaves `latest` as it was. (Resuming across dp, pp and tp
// sizes runs under mpirun: tests/launcher/checkpoint_cli_test.sh.)
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_export.h"
#include "checkpoint_test_util.h"
#include "core/error.h"
#include "engine/engine.h"
#include "estimate/tune.h"
#include "kernels/gemm_plan.h"
#include "nn/gpt2.h"
#include "nn/llmc_model_file.h"
#include "nn/safetensors.h"
#include "run/checkpointer.h"
#include "side_by_side.h"
#include "test_model.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;
using namespace checkpoint_test;

struct Case {
  const char* name;
  Layout save, load;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ResumeTest : public ::testing::TestWithParam<Case> {};

// 20 steps straight against 10 steps, a checkpoint, a new engine (perhaps another layout)
// resuming from it, and 10 more steps: within Note [Equivalence tolerances], and bit for bit
// when both halves run the straight run's layout (stage 0, no offload: the same arithmetic).
TEST_P(ResumeTest, ContinuesAsIfNeverStopped) {
  TempDir dir, nvme;
  const Case& c = GetParam();
  const Config straight_cfg = MakeConfig(Layout{}, dir.path);
  Engine straight(straight_cfg, nn::BuildGpt2(straight_cfg.model));
  const std::vector<StepStats> expected = Train(straight, 0, 20);

  const Config save_cfg = MakeConfig(c.save, dir.path, nvme.path);
  std::vector<StepStats> resumed;
  {
    Engine first(save_cfg, nn::BuildGpt2(save_cfg.model));
    resumed = Train(first, 0, 10);
    Checkpointer(save_cfg, first, nullptr).Save(10, data::LoaderState{0, 0, 1234});
  }
  const Config load_cfg = MakeConfig(c.load, dir.path, nvme.path);
  Engine second(load_cfg, nn::BuildGpt2(load_cfg.model));
  const ResumePoint point = Checkpointer(load_cfg, second, nullptr).Resume("latest");
  EXPECT_EQ(point.step, 10);
  EXPECT_EQ(point.data.position, 1234);
  EXPECT_EQ(second.step(), 10);
  for (const StepStats& s : Train(second, 10, 20)) resumed.push_back(s);
  testing::RoundingModel model =
      testing::ModelFor(straight_cfg, straight.NumParameters(), 4 * 8, 20);
  model.exact = c.save.stage == 0 && c.load.stage == 0 && c.save.offload == "none" &&
                c.load.offload == "none";
  testing::EquivalenceCheck check(model, straight_cfg.model.n_embd);
  double lr_sum = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const StepStats &got = resumed[i], &want = expected[i];
    check.Step(want.step, got.loss, want.loss, got.grad_norm, want.grad_norm, lr_sum);
    lr_sum += want.lr;
  }
  second.ForEachFullParameter([&](const std::string& name, const Tensor& a) {
    const Tensor e = straight.Parameter(name);
    check.Values(name, a.data<float>(), e.data<float>(), a.numel(), lr_sum);
  });
  testing::ExpectWithinRounding(check, c.name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ResumeTest,
                         ::testing::Values(Case{"Stage0", {0}, {0}}, Case{"Stage1", {1}, {1}},
                                           Case{"Stage2", {2}, {2}}, Case{"Stage3", {3}, {3}},
                                           Case{"Stage3To1", {3}, {1}}, Case{"Stage0To3", {0}, {3}},
                                           Case{"Stage2OptimizerCpu", {2, "cpu"}, {2, "cpu"}},
                                           Case{"Stage1OptimizerNvmeToNone", {1, "nvme"}, {1}},
                                           Case{"Stage3NvmeBoth", {3, "nvme"}, {3, "nvme"}},
                                           Case{"Stage3NoneToNvme", {3}, {3, "nvme"}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Note [GEMMs chosen by measurement]: a checkpoint records the fp32 GEMM backend of each
// shape, and a resume takes the saved run's over its own, so a run that measured oneDNN
// faster resumes bit for bit even where the resuming process chose OpenBLAS (or the cache was
// deleted). The plan sends every shape of the step to oneDNN; that it changes the arithmetic
// is checked first, or the comparison would prove nothing.
TEST(ResumeGemmPlanTest, AResumeComputesWithTheSavedRunsBackends) {
  TempDir dir;
  const Config cfg = MakeConfig(Layout{}, dir.path);
  Config batches = cfg;  // Train's micro-batches: 4 sequences of 8
  batches.train_micro_batch_size_per_gpu = 4;
  kernels::GemmPlan onednn;
  for (const StepGemm& g : StepGemmShapes(batches)) {
    onednn.Choose(g.shape, kernels::GemmBackend::kOneDnn);
  }
  auto fresh = [&](const kernels::GemmPlan& plan) {
    auto e = std::make_unique<Engine>(cfg, nn::BuildGpt2(cfg.model));
    e->UseGemmPlan(plan);
    return e;
  };
  const std::vector<StepStats> openblas = Train(*fresh({}), 0, 20);
  const std::vector<StepStats> expected = Train(*fresh(onednn), 0, 20);
  bool differs = false;
  for (size_t i = 0; i < expected.size(); ++i) {
    differs = differs || openblas[i].loss != expected[i].loss ||
              openblas[i].grad_norm != expected[i].grad_norm;
  }
  ASSERT_TRUE(differs) << "oneDNN and OpenBLAS agree to the bit here: the test cannot tell "
                          "which backend the resume used";

  std::vector<StepStats> resumed;
  {
    const std::unique_ptr<Engine> first = fresh(onednn);
    resumed = Train(*first, 0, 10);
    Checkpointer(cfg, *first, nullptr).Save(10, {});
  }
  Engine second(cfg, nn::BuildGpt2(cfg.model));  // OpenBLAS for every shape until resumed
  Checkpointer(cfg, second, nullptr).Resume("latest");
  EXPECT_EQ(second.gemm_plan(), onednn);
  for (const StepStats& s : Train(second, 10, 20)) resumed.push_back(s);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(resumed[i].loss, expected[i].loss) << "step " << i;
    EXPECT_EQ(resumed[i].grad_norm, expected[i].grad_norm) << "step " << i;
  }
}

TEST(CheckpointFaultTest, AFlippedByteIsNamedAndLatestFallsBack) {
  TwoCheckpoints t;
  EXPECT_EQ(checkpoint::ReadLatest(t.dir.path), 10);
  FlipByte(t.File(10, "rank0.bin"), 100);
  EXPECT_EQ(t.Resume("latest"), 5);  // the newest intact one, with a warning
  ztrain::testing::ExpectErrorWith<IoError>([&] { t.Resume("10"); },
                                            {"step10", "rank0.bin", "checksum", "corrupt"});
  EXPECT_EQ(t.Resume("step5"), 5);
}

TEST(CheckpointFaultTest, ATruncatedShardIsNamed) {
  TwoCheckpoints t;
  fs::resize_file(t.File(10, "rank0.bin"), 1000);
  ztrain::testing::ExpectErrorWith<IoError>([&] { t.Resume("10"); },
                                            {"rank0.bin", "1000 bytes", "truncated"});
  EXPECT_EQ(t.Resume("latest"), 5);
}

TEST(CheckpointFaultTest, AMissingRankFileOrMetaIsNamed) {
  TwoCheckpoints t;
  fs::remove(t.File(10, "rank0.bin"));
  ztrain::testing::ExpectErrorWith<IoError>([&] { t.Resume("10"); }, {"rank0.bin", "missing"});
  fs::remove(t.File(5, checkpoint::kMetaFile));
  ztrain::testing::ExpectErrorWith<IoError>([&] { t.Resume("5"); }, {"step5", "incomplete"});
  // Nothing intact is left.
  ztrain::testing::ExpectErrorWith<IoError>([&] { t.Resume("latest"); }, {"no intact checkpoint"});
}

// A job that always resumes starts from step 0 on its first launch; a named step that does
// not exist is an error.
TEST(CheckpointFaultTest, NothingToResumeStartsAfreshButANamedStepMustExist) {
  TempDir dir;
  const Config cfg = MakeConfig(Layout{}, dir.path + "/empty");
  Engine e(cfg, nn::BuildGpt2(cfg.model));
  Checkpointer ck(cfg, e, nullptr);
  const ResumePoint p = ck.Resume("latest");
  EXPECT_EQ(p.step, 0);
  EXPECT_TRUE(p.directory.empty());
  EXPECT_EQ(e.step(), 0);
  ztrain::testing::ExpectErrorWith<IoError>(
      [&] { ck.Resume("7"); }, {"no checkpoint step7", "never saved", "none is saved"});
}

TEST(CheckpointFaultTest, OldCheckpointsArePrunedAndPartialOnesIgnored) {
  TempDir dir;
  const Config cfg = MakeConfig(Layout{}, dir.path);
  Engine e(cfg, nn::BuildGpt2(cfg.model));
  Checkpointer ck(cfg, e, nullptr);
  fs::create_directories(dir.path + "/step99.partial");  // a save that crashed
  for (int s = 1; s <= 4; ++s) {
    Train(e, s - 1, s);
    ck.Save(s, {});
  }
  EXPECT_EQ(checkpoint::ListSteps(dir.path), (std::vector<int64_t>{4, 3}));  // keep_last 2
  EXPECT_FALSE(fs::exists(dir.path + "/step99.partial"));
  EXPECT_EQ(checkpoint::ReadLatest(dir.path), 4);
}

// Another model's checkpoints in the same checkpoint.dir are never pruned (nor counted in
// keep_last), and a run that does not resume is refused there before it saves over them.
TEST(CheckpointFaultTest, AnotherModelsCheckpointsAreNeitherPrunedNorSavedOver) {
  TempDir dir;
  const Config first = MakeConfig(Layout{}, dir.path);
  {
    Engine e(first, nn::BuildGpt2(first.model));
    Checkpointer ck(first, e, nullptr);
    for (int s = 1; s <= 2; ++s) {
      Train(e, s - 1, s);
      ck.Save(s, {});
    }
  }
  nlohmann::json j = first.resolved;
  j["model"]["n_embd"] = 24;  // another shape
  const Config other = ParseConfig(j);
  Engine e(other, nn::BuildGpt2(other.model));
  Checkpointer ck(other, e, nullptr);
  ztrain::testing::ExpectErrorWith<ConfigError>(
      [&] { ck.CheckFreshStart(); },
      {"holds checkpoints of another model", "step2 (model.n_embd 16 -> 24)", "step1"});
  for (int s = 3; s <= 5; ++s) {
    Train(e, s - 3, s - 2);
    ck.Save(s, {});
  }
  EXPECT_EQ(checkpoint::ListSteps(dir.path), (std::vector<int64_t>{5, 4, 2, 1}))
      << "keep_last 2 of this model's, none of the other's removed";
}

// In a child: a file size limit below the rank file's size makes the write fail (EFBIG).
// The save must throw, leave no step directory and keep `latest` at the earlier step.
int SaveOverTheFileSizeLimit(const std::string& dir) {
  const Config cfg = MakeConfig(Layout{}, dir);
  Engine e(cfg, nn::BuildGpt2(cfg.model));
  Checkpointer ck(cfg, e, nullptr);
  ck.Save(1, {});
  std::signal(SIGXFSZ, SIG_IGN);
  const rlimit small{4096, 4096};
  if (setrlimit(RLIMIT_FSIZE, &small) != 0) return 2;
  try {
    ck.Save(2, {});
    return 3;  // should have failed
  } catch (const IoError& err) {
    if (std::string(err.what()).find("was not saved") == std::string::npos) return 4;
  }
  if (checkpoint::ReadLatest(dir) != 1) return 5;
  if (fs::exists(dir + "/step2") || fs::exists(dir + "/step2.partial")) return 6;
  return 0;
}

TEST(CheckpointFaultDeathTest, AFailedSaveKeepsLatest) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  EXPECT_EXIT(std::_Exit(SaveOverTheFileSizeLimit(dir.path)), ::testing::ExitedWithCode(0), "");
}

// Export: the llm.c file loads back into ztrain with the same eval loss; the safetensors file
// follows the format's rules (ReadSafetensorsHeader checks them) with HF GPT-2's names, and
// its values are the model's (Conv1D weights transposed, vocabulary rows unpadded).
TEST(CheckpointExportTest, RoundTripsThroughLlmcAndSafetensors) {
  TempDir dir;
  const Config cfg = MakeConfig(Layout{3}, dir.path);  // saved sharded (ZeRO 3)
  Engine trained(cfg, nn::BuildGpt2(cfg.model));
  Train(trained, 0, 6);
  Checkpointer(cfg, trained, nullptr).Save(6, {});
  testing::OwnedBatch eval(4, 8, 11, 77);
  const double loss = trained.EvalLoss(eval.mb);

  TempDir out;  // an export never goes inside the checkpoint directory it reads
  const std::string llmc = out.path + "/export/model.bin";
  const ExportResult r = ExportCheckpoint(dir.path, "llmc", llmc, DType::kF32);
  EXPECT_EQ(r.step, 6);
  const Config plain = MakeConfig(Layout{}, dir.path);
  Engine loaded(plain, nn::BuildGpt2(plain.model));
  std::map<std::string, std::vector<float>> staged;
  for (const auto& [name, shape] : loaded.ModelParameters())
    staged[name].resize(NumElements(shape));
  nn::LoadLlmcModel(llmc, plain.model, [&](const std::string& name) {
    return Tensor(staged.at(name).data(), DType::kF32, loaded.ParameterShape(name));
  });
  loaded.SetFullParameters([&](const std::string& name, const Tensor& out) {
    std::memcpy(out.data(), staged.at(name).data(), out.nbytes());
  });
  EXPECT_EQ(loaded.EvalLoss(eval.mb), loss);
  ExportCheckpoint(dir.path, "llmc", out.path + "/export/model_bf16.bin", DType::kBF16);
  EXPECT_EQ(nn::ReadLlmcModelDType(out.path + "/export/model_bf16.bin"), DType::kBF16);

  const std::string st = out.path + "/hf/model.safetensors";
  ExportCheckpoint(dir.path + "/step6", "safetensors", st, DType::kF32);
  EXPECT_TRUE(fs::exists(out.path + "/hf/config.json"));
  const nn::SafetensorsHeader header = nn::ReadSafetensorsHeader(st);
  EXPECT_EQ(header.metadata.at("format"), "pt");
  EXPECT_EQ(header.tensors.size(), 2 + 12 * 2 + 2u);  // wte, wpe, 12 per block, ln_f
  const nn::SafetensorsEntry* wte = header.Find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->shape, (Shape{11, 16}));  // vocabulary 11, not the padded 16
  const std::vector<char> bytes = nn::ReadSafetensorsTensor(st, header, "transformer.wte.weight");
  EXPECT_EQ(std::memcmp(bytes.data(), loaded.Parameter("wte").data(), bytes.size()), 0);
  const std::vector<char> attn =
      nn::ReadSafetensorsTensor(st, header, "transformer.h.1.attn.c_attn.weight");
  const Tensor w = loaded.Parameter("h.1.attn.c_attn.weight");  // [3C, C]; HF has [C, 3C]
  const float* hf = reinterpret_cast<const float*>(attn.data());
  EXPECT_EQ(hf[5 * 48 + 40], w.data<float>()[40 * 16 + 5]);
  ztrain::testing::ExpectErrorWith<IoError>(
      [&] { ExportCheckpoint(dir.path + "/nowhere", "llmc", llmc, DType::kF32); },
      {"nowhere", "neither a checkpoint"});
}

}  // namespace
}  // namespace ztrain
