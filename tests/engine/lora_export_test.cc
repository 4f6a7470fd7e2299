// A LoRA run's checkpoint out of the engine (checkpoint/checkpoint_export.h, nn/peft.h): exported
// as a PEFT adapter it is the trained tensors exactly (and loads back into an engine that
// evaluates as the trained one), and merged (--format hf --merge) it is the base with each
// scaling B A added — a model without adapters that evaluates as the adapted one did, within
// the rounding of W + s B A. Bad requests (a PEFT export of a full run, hf without --merge)
// are named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <string>

#include "checkpoint/checkpoint_export.h"
#include "engine/engine.h"
#include "nn/family.h"
#include "run/checkpointer.h"
#include "run/model_weights.h"
#include "test_model.h"
#include "tests/expect_error.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;

Engine Make(const Config& c) {
  return Engine(c, nn::BuildModel(c.model, nn::MakeWholeLinears(), nn::AdapterPlan(c)));
}

class LoraExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ztrain_lora_export_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Config MakeConfig(bool lora, const nlohmann::json& quantization = nullptr) const {
    nlohmann::json j = testing::TinyLlamaConfigJson();
    if (!quantization.is_null()) j["quantization"] = quantization;
    j["checkpoint"] = {{"dir", (dir_ / "ckpt").string()}};
    if (lora) {
      j["lora"] = {{"r", 2},
                   {"lora_alpha", 4},
                   {"target_modules", "all-linear"},
                   {"bias", "all"},
                   {"modules_to_save", {"norm"}}};
    }
    return ParseConfig(j);
  }
  fs::path dir_;
};

// Trains a LoRA run (on a base quantized as `quantization` says, when it is not null), saves
// it, and checks both exports against the trained engine.
void ExportsComputeTheTrainedModel(const fs::path& dir, const Config& cfg, const Config& plain) {
  Engine trained = Make(cfg);
  testing::OwnedBatch batch(2, 7, 11, 9);
  for (int step = 0; step < 5; ++step) {  // B leaves zero, so the adapters matter
    trained.TrainStep(std::span<const nn::MicroBatch>(&batch.mb, 1));
  }
  const double loss = trained.EvalLoss(batch.mb);
  Checkpointer(cfg, trained, nullptr).Save(5, {});
  const std::string ckpt = (dir / "ckpt").string();

  // The adapter: loaded over a fresh engine of the same base, it gives the same model.
  const ExportResult peft =
      ExportCheckpoint(ckpt, "peft", (dir / "adapter").string(), DType::kF32);
  EXPECT_EQ(peft.parameters, trained.NumTrainableParameters());
  Engine reloaded = Make(cfg);
  LoadPeftAdapter((dir / "adapter").string(), cfg, reloaded);
  EXPECT_EQ(reloaded.EvalLoss(batch.mb), loss);

  // Merged: a plain model (no adapters) that evaluates as the adapted one.
  ExportCheckpoint(ckpt, "hf", (dir / "merged").string(), DType::kF32, 5'000'000'000,
                   /*merge=*/true);
  Engine merged(plain, nn::BuildModel(plain.model));
  LoadModelWeights((dir / "merged").string(), plain.model, merged);
  EXPECT_NEAR(merged.EvalLoss(batch.mb), loss, 1e-6 * loss);
  EXPECT_NE(Engine(plain, nn::BuildModel(plain.model)).EvalLoss(batch.mb), loss)
      << "the merge changed nothing";

  testing::ExpectErrorWith<ConfigError>(
      [&] { ExportCheckpoint(ckpt, "hf", (dir / "x").string(), DType::kF32); },
      {"LoRA adapters", "--format peft", "--format hf --merge"});
}

TEST_F(LoraExportTest, PeftAndMergedExportsComputeTheTrainedModel) {
  ExportsComputeTheTrainedModel(dir_, MakeConfig(true), MakeConfig(false));
}

// QLoRA: the merged model is the DEQUANTIZED base plus the adapters (what the run computed
// with, and what PEFT's merge_and_unload of a bitsandbytes model gives), so it evaluates as
// the trained run did; the unquantized base plus the adapters would not.
TEST_F(LoraExportTest, AQloraRunMergesIntoItsDequantizedBase) {
  ExportsComputeTheTrainedModel(
      dir_,
      MakeConfig(true, {{"load_in_4bit", true},
                        {"bnb_4bit_quant_type", "nf4"},
                        {"bnb_4bit_use_double_quant", true}}),
      MakeConfig(false));
}

TEST_F(LoraExportTest, APeftExportOfAFullRunIsNamed) {
  const Config cfg = MakeConfig(false);
  Engine e = Make(cfg);
  Checkpointer(cfg, e, nullptr).Save(1, {});
  testing::ExpectErrorWith<ConfigError>(
      [&] {
        ExportCheckpoint((dir_ / "ckpt").string(), "peft", (dir_ / "a").string(), DType::kF32);
      },
      {"--format peft", "trained the whole model", "--format hf"});
}

}  // namespace
}  // namespace ztrain
