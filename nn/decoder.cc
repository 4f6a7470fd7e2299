#include "nn/decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/error.h"
#include "data/random.h"

namespace ztrain::nn {

Decoder::Decoder(const ModelConfig& model,
                 const std::function<void(const std::string& name, const Tensor& out)>& fill)
    : model_(model),
      ops_(kernels::MakeCpuOps()),
      host_(nullptr),
      cache_(host_, &tracker_),
      layers_(BuildModel(model)) {
  std::map<std::string, Tensor> owned;
  int blocks = 0;
  constexpr int64_t kAlign = 16;  // floats: 64 bytes, except inside a packed run
  for (const std::unique_ptr<Layer>& layer : layers_) {
    const std::vector<ParamSpec> specs = layer->Params();
    std::vector<int64_t> offsets;
    int64_t end = 0;
    for (const ParamSpec& spec : specs) {
      if (!spec.packed) end = (end + kAlign - 1) / kAlign * kAlign;
      offsets.push_back(end);
      if (spec.tied_to.empty()) end += NumElements(spec.shape);
    }
    storage_.emplace_back(host_, DType::kF32, Shape{std::max<int64_t>(end, 1)},
                          MemoryCategory::kParameters);
    const Tensor all = storage_.back().AsTensor(DType::kF32, {std::max<int64_t>(end, 1)});
    std::vector<Tensor> params, grads;
    for (size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& spec = specs[i];
      if (!spec.tied_to.empty()) {
        const auto it = owned.find(spec.tied_to);
        ZTRAIN_ASSERT(it != owned.end(), "tied parameter ", spec.name, " before ", spec.tied_to);
        params.push_back(it->second);
      } else {
        const Tensor t = all.Flat(offsets[i], spec.shape);
        fill(spec.name, t);
        owned.emplace(spec.name, t);
        params.push_back(t);
      }
      grads.emplace_back();
    }
    layer->Bind(std::move(params), std::move(grads));
    blocks = std::max(blocks, layer->BlockIndex() + 1);
  }
  kv_.resize(static_cast<size_t>(blocks));
}

Decoder::~Decoder() = default;

int64_t Decoder::cache_bytes() const {
  int64_t bytes = 0;
  for (const KvCache& c : kv_) bytes += static_cast<int64_t>(c.k.nbytes() + c.v.nbytes());
  return bytes;
}

void Decoder::Reset() {
  for (KvCache& c : kv_) c.length = 0;
  length_ = 0;
}

std::vector<float> Decoder::Step(std::span<const int32_t> tokens) {
  const auto t = static_cast<int64_t>(tokens.size());
  ZTRAIN_CHECK_T(ConfigError, t >= 1, "a decoding step needs at least one token");
  ZTRAIN_CHECK_T(ConfigError, length_ + t <= model_.max_seq_len, "the sequence would hold ",
                 length_ + t, " tokens, more than model.max_seq_len ", model_.max_seq_len,
                 "; ask for fewer new tokens or a shorter prompt");
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  DecodeStep step{Tensor(ids.data(), DType::kI32, {1, t}), length_, model_.max_seq_len, &kv_,
                  &host_};
  Shape shape = {1, t};
  Buffer input;
  std::vector<float> logits;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Shape out_shape = layers_[l]->DecodeOutputShape(shape);
    Buffer output(cache_, DType::kF32, out_shape, MemoryCategory::kActivations);
    LayerContext ctx(*ops_, cache_);
    const Tensor in = l == 0 ? step.tokens : input.AsTensor(DType::kF32, shape);
    layers_[l]->Decode(step, in, output.AsTensor(DType::kF32, out_shape), ctx);
    ctx.Release();
    input = std::move(output);
    shape = out_shape;
  }
  const float* last = input.data<float>() + (t - 1) * shape.back();
  length_ += t;
  return {last, last + model_.vocab_size};
}

int32_t SampleToken(std::span<const float> logits, const SamplingOptions& o, double draw) {
  const auto n = static_cast<int64_t>(logits.size());
  if (o.temperature <= 0) {  // greedy: the first of the largest
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[order[i]] - logits[order[0]]) / o.temperature);
    sum += p[i];
  }
  // Nucleus: the smallest prefix of the sorted tokens whose probability reaches top_p.
  int64_t keep = 0;
  double mass = 0;
  while (keep < k && (keep == 0 || mass < o.top_p * sum)) mass += p[keep++];
  double target = draw * mass;
  for (int64_t i = 0; i < keep; ++i) {
    target -= p[i];
    if (target < 0) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> Generate(Decoder& decoder, std::span<const int32_t> prompt,
                              const SamplingOptions& o, const std::function<void(int32_t)>& on_token) {
  ZTRAIN_CHECK_T(ConfigError, !prompt.empty(), "generation needs a prompt of at least one token");
  ZTRAIN_CHECK_T(ConfigError, o.temperature >= 0 && o.top_p > 0 && o.top_p <= 1 && o.top_k >= 0,
                 "sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0; got ",
                 o.temperature, ", ", o.top_p, ", ", o.top_k);
  decoder.Reset();
  data::Xoshiro256 rng(o.seed);
  std::vector<int32_t> out;
  std::vector<float> logits = decoder.Step(prompt);
  const size_t ids = o.vocab_limit > 0 ? std::min(logits.size(), static_cast<size_t>(o.vocab_limit))
                                       : logits.size();
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const double draw = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
    const int32_t token = SampleToken(std::span<const float>(logits.data(), ids), o, draw);
    out.push_back(token);
    if (on_token) on_token(token);
    const bool stop = std::find(o.stop_tokens.begin(), o.stop_tokens.end(), token) !=
                      o.stop_tokens.end();
    if (stop || i + 1 == o.max_new_tokens) break;
    logits = decoder.Step(std::span<const int32_t>(&token, 1));
  }
  return out;
}

}  // namespace ztrain::nn
