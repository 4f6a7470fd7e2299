// Note [Packed documents] against its definition (Llama-family and GPT-2 models): a sample
// packed from several documents
// trains exactly what the same documents give run one by one (each alone, from position 0,
// its last target being the next document's start and so not taken), with the loss the mean
// over the real targets of all of them (Note [Loss over real targets]); and a step's loss and
// gradients do not depend on how its samples are cut into micro-batches, however unevenly
// their real targets fall (transformers' gradient-accumulation fix).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/loss_target.h"
#include "data/documents.h"
#include "engine/engine.h"
#include "nn/family.h"
#include "test_model.h"

namespace ztrain {
namespace {

constexpr int32_t kStart = 1;  // the token before each document
constexpr int kVocab = 11;
constexpr int64_t kT = 16;

// A host micro-batch that owns its arrays; positions only when packed.
struct HostBatch {
  std::vector<int32_t> tokens, targets, positions;
  nn::MicroBatch mb;
  int64_t documents = 0;
  // Rows of T + 1 tokens, marked as the trainer marks them (data::MarkDocuments) when packed.
  HostBatch(const std::vector<std::vector<int32_t>>& windows, bool packed) {
    const auto rows = static_cast<int64_t>(windows.size());
    const auto t = static_cast<int64_t>(windows[0].size()) - 1;
    for (const std::vector<int32_t>& w : windows) {
      tokens.insert(tokens.end(), w.begin(), w.end() - 1);
      targets.insert(targets.end(), w.begin() + 1, w.end());
    }
    mb.tokens = Tensor(tokens.data(), DType::kI32, {rows, t});
    mb.targets = Tensor(targets.data(), DType::kI32, {rows, t});
    if (!packed) return;
    positions.resize(tokens.size());
    documents = data::MarkDocuments({kStart, -1, ""}, rows, t, tokens.data(), targets.data(),
                                    positions.data());
    mb.positions = Tensor(positions.data(), DType::kI32, {rows, t});
  }
};

// Documents of the given lengths, each the start token then random others.
std::vector<std::vector<int32_t>> Documents(const std::vector<int>& lengths, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(kStart + 1, kVocab - 1);
  std::vector<std::vector<int32_t>> docs;
  for (int n : lengths) {
    std::vector<int32_t> doc = {kStart};
    for (int i = 1; i < n; ++i) doc.push_back(d(rng));
    docs.push_back(doc);
  }
  return docs;
}

// The window packing `docs`, then the next document's start token (its last target).
std::vector<int32_t> Pack(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<int32_t> w;
  for (const auto& d : docs) w.insert(w.end(), d.begin(), d.end());
  w.push_back(kStart);
  return w;
}

std::map<std::string, std::vector<float>> Gradients(Engine& engine) {
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : engine.ParameterNames()) {
    const Tensor g = engine.Gradient(name);
    out[name].assign(g.data<float>(), g.data<float>() + g.numel());
  }
  return out;
}

// fp32 sums in another order: a few ulps of the largest gradient of each tensor.
void ExpectSameGradients(const std::map<std::string, std::vector<float>>& got,
                         const std::map<std::string, std::vector<float>>& want) {
  for (const auto& [name, w] : want) {
    const std::vector<float>& g = got.at(name);
    float scale = 0.0f;
    for (float x : w) scale = std::max(scale, std::fabs(x));
    ASSERT_GT(scale, 0.0f) << name << " has no gradient";
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(g[i], w[i], 2e-5f * scale) << name << "[" << i << "]";
    }
  }
}

// The tiny Llama with `model` merged in, or the tiny GPT-2 for {"type": "gpt2"}.
Config PackedConfig(const nlohmann::json& model) {
  nlohmann::json j = model.value("type", "") == "gpt2"
                         ? testing::TinyConfigJson(2, 8, 2, kVocab, kT)
                         : testing::TinyLlamaConfigJson(2, kVocab, kT);
  j["model"].update(model);
  j["data"]["packed_documents"] = true;
  j["data"]["document_start_token"] = kStart;
  return ParseConfig(j);
}

class PackedDocumentsTest : public ::testing::TestWithParam<nlohmann::json> {};

TEST_P(PackedDocumentsTest, PackedSampleTrainsItsDocumentsOneByOne) {
  const Config cfg = PackedConfig(GetParam());
  Engine engine(cfg, nn::BuildModel(cfg.model));
  const auto docs = Documents({5, 7, 4}, 3);
  HostBatch packed({Pack(docs)}, /*packed=*/true);
  EXPECT_EQ(packed.documents, 3);
  engine.ZeroGrad();
  const double packed_loss = engine.ForwardBackward(packed.mb, 1.0f);
  const auto packed_grads = Gradients(engine);
  // Each document alone: its own positions from 0, its last target (the next document's start)
  // not taken; weighted by its share of the real targets (13 = 16 - 3 starts).
  engine.ZeroGrad();
  double loss = 0.0;
  for (const auto& doc : docs) {
    std::vector<int32_t> w = doc;
    w.push_back(kStart);
    HostBatch alone({w}, /*packed=*/false);
    alone.targets.back() = kIgnoreTarget;
    const auto real = static_cast<float>(doc.size() - 1);
    loss += real / 13.0 * engine.ForwardBackward(alone.mb, real / 13.0f);
  }
  EXPECT_NEAR(packed_loss, loss, 1e-5 * loss);
  ExpectSameGradients(packed_grads, Gradients(engine));
}

// GPT-2: each token takes the position table's row of its document position.
INSTANTIATE_TEST_SUITE_P(
    Models, PackedDocumentsTest,
    ::testing::Values(
        nlohmann::json::object(), nlohmann::json{{"type", "gpt2"}},
        // dynamic NTK scales for the longest document
        // (7 < 8: none), not the window's 16 positions
        nlohmann::json{
            {"rope_scaling",
             {{"rope_type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 8}}}},
        nlohmann::json{{"sliding_window", 3}},
        nlohmann::json{
            {"n_kv_head", 1},
            {"rope_scaling",
             {{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 8}}}}));

// One step over two micro-batches of one sample each, with 4 and 1 document starts, against
// one micro-batch of both samples: the same loss, documents and update.
TEST(PackedDocumentsStepTest, LossIsTheMeanOverTheBatchsRealTargets) {
  const Config cfg = PackedConfig(nlohmann::json::object());
  const std::vector<int32_t> first = Pack(Documents({3, 4, 5, 4}, 5));
  std::vector<int32_t> second = Pack(Documents({16}, 6));
  second.back() = 7;  // the next document goes on: its last target is real
  HostBatch a({first}, true), b({second}, true), both({first, second}, true);
  Engine split(cfg, nn::BuildModel(cfg.model)), whole(cfg, nn::BuildModel(cfg.model));
  const std::vector<nn::MicroBatch> two = {a.mb, b.mb};
  const StepStats s = split.TrainStep(two);
  const StepStats w = whole.TrainStep({&both.mb, 1});
  EXPECT_EQ(s.documents, 5);
  EXPECT_EQ(w.documents, 5);
  EXPECT_NEAR(s.loss, w.loss, 1e-5 * w.loss);
  // A mean of the two micro-batches' means would weigh the second sample's 16 targets like
  // the first's 12: another loss.
  EXPECT_NEAR(s.grad_norm, w.grad_norm, 1e-5 * w.grad_norm);
  for (const std::string& name : whole.ParameterNames()) {
    const Tensor p = split.Parameter(name), q = whole.Parameter(name);
    for (int64_t i = 0; i < p.numel(); ++i) {
      ASSERT_NEAR(p.data<float>()[i], q.data<float>()[i], 1e-6) << name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace ztrain
