// A research model built on ztrain: its own Layer (a learned per-channel gate,
// y = x * sigmoid(g)) mixed with ztrain's GPT-2 layers, trained through the Engine API on
// the built-in synthetic corpus. Exits non-zero if the gate's gradient is wrong or the
// loss does not fall.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/config.h"
#include "data/data_loader.h"
#include "data/synthetic_corpus.h"
#include "engine/engine.h"
#include "nn/gpt2.h"

namespace {

using ztrain::Shape;
using ztrain::Tensor;

// y[n, c] = x[n, c] * sigmoid(g[c]); g starts at zero (a half-open gate).
class ChannelGate final : public ztrain::nn::Layer {
 public:
  explicit ChannelGate(int64_t channels) : c_(channels) {}
  std::string Name() const override { return "gate"; }
  std::vector<ztrain::nn::ParamSpec> Params() const override {
    ztrain::nn::ParamSpec g;
    g.name = "gate.logit";
    g.shape = {c_};
    g.init = ztrain::nn::Init::kZeros;  // 1-dimensional: no weight decay by default
    return {g};
  }
  Shape OutputShape(const Shape& in) const override { return in; }
  void Forward(const ztrain::nn::MicroBatch&, const Tensor& x, const Tensor& y,
               ztrain::nn::LayerContext&) override {
    const float* g = param(0).data<float>();
    for (int64_t i = 0; i < x.numel(); ++i)
      y.data<float>()[i] = x.data<float>()[i] * Sigmoid(g[i % c_]);
  }
  void Backward(const ztrain::nn::MicroBatch&, const Tensor& x, const Tensor& dy,
                const Tensor& dx, ztrain::nn::LayerContext&) override {
    const float* g = param(0).data<float>();
    float* dg = grad(0).data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float s = Sigmoid(g[i % c_]);
      dx.data<float>()[i] = dy.data<float>()[i] * s;
      dg[i % c_] += dy.data<float>()[i] * x.data<float>()[i] * s * (1.0f - s);
    }
  }

 private:
  static float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
  int64_t c_;
};

}  // namespace

int main() {
  nlohmann::json j = ztrain::DefaultConfigJson();
  j["model"]["n_layer"] = 2;
  j["training"]["steps"] = 60;
  const ztrain::Config config = ztrain::ParseConfig(j);
  const ztrain::ModelConfig& m = config.model;

  // GPT-2's layers on the single-process linears, with the custom layer between two blocks.
  const auto linears = ztrain::nn::MakeWholeLinears();
  std::vector<std::unique_ptr<ztrain::nn::Layer>> layers;
  layers.push_back(ztrain::nn::Gpt2Embedding(m, linears));
  layers.push_back(ztrain::nn::Gpt2Block(m, 0, linears));
  layers.push_back(std::make_unique<ChannelGate>(m.n_embd));
  layers.push_back(ztrain::nn::Gpt2Block(m, 1, linears));
  layers.push_back(ztrain::nn::Gpt2Head(m, linears));
  ztrain::Engine engine(config, std::move(layers));

  ztrain::data::SyntheticCorpusOptions corpus;
  corpus.vocab_size = m.vocab_size;
  ztrain::data::LoaderOptions opts;
  opts.batch_size = config.train_micro_batch_size_per_gpu;
  opts.seq_len = config.data.seq_len;
  opts.vocab_size = m.vocab_size;
  ztrain::data::DataLoader loader(
      ztrain::data::MakeSyntheticSource(corpus, ztrain::data::Split::kTrain), opts);

  // The custom layer's gradient against a finite difference of the loss.
  ztrain::data::Batch b = loader.NextBatch();
  ztrain::nn::MicroBatch mb{b.tokens, b.targets};
  engine.ZeroGrad();
  engine.ForwardBackward(mb, 1.0f);
  float* g0 = engine.Parameter("gate.logit").data<float>();
  const double analytic = engine.Gradient("gate.logit").data<float>()[0];
  const float saved = *g0;
  *g0 = saved + 1e-2f;
  const double up = engine.EvalLoss(mb);
  *g0 = saved - 1e-2f;
  const double down = engine.EvalLoss(mb);
  *g0 = saved;
  const double fd = (up - down) / 2e-2;
  std::printf("gate gradient: analytic %.6g, finite difference %.6g\n", analytic, fd);
  if (std::fabs(analytic - fd) > 0.05 * std::fabs(fd) + 1e-4) return 1;

  double first = 0, last = 0;
  for (int64_t step = 1; step <= config.training.steps; ++step) {
    ztrain::data::Batch batch = loader.NextBatch();
    ztrain::nn::MicroBatch micro{batch.tokens, batch.targets};
    const ztrain::StepStats s = engine.TrainStep({&micro, 1});
    if (step == 1) first = s.loss;
    last = s.loss;
  }
  std::printf("custom model: loss %.4f -> %.4f over %lld steps\n", first, last,
              static_cast<long long>(config.training.steps));
  return last < first - 1.0 ? 0 : 1;
}
