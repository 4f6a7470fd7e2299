#include "engine/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/logging.h"
#include "nn/init.h"
#include "optim/adam.h"
#include "optim/grad_clip.h"

namespace ztrain {

// Where one parameter lives: layer, index in the layer's Params(), offset in its flat buffer.
struct Engine::Slot {
  nn::ParamSpec spec;
  size_t layer = 0;
  int64_t offset = 0;
};

// One layer's flat buffers. Every buffer has `padded` elements; padding is zero and stays so
// (its gradient is zero, so Adam leaves it at zero).
struct Engine::LayerState {
  int64_t padded = 0;
  Buffer params, grads, exp_avg, exp_avg_sq;
  std::vector<size_t> owned;  // indices into slots_
};

namespace {
constexpr int64_t kParamAlignment = 16;  // elements: each parameter starts on a 64-byte line
int64_t AlignUp(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double MeanOf(const Tensor& t) {
  double sum = 0.0;
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
  return sum / static_cast<double>(t.numel());
}
}  // namespace

Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers)
    : config_(std::move(config)),
      layers_(std::move(layers)),
      host_(&tracker_),
      raw_host_(nullptr),
      activations_(raw_host_, &tracker_),
      ops_(kernels::MakeCpuOps()),
      schedule_(optim::MakeLrSchedule(config_.scheduler, config_.optimizer.lr)) {
  ZTRAIN_CHECK(!layers_.empty(), "the model has no layers");
  BuildStorage();
  InitParameters();
}

Engine::~Engine() = default;

void Engine::BuildStorage() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto state = std::make_unique<LayerState>();
    std::vector<nn::ParamSpec> specs = layers_[l]->Params();
    std::vector<Tensor> params, grads;
    std::vector<int64_t> offsets;
    for (const nn::ParamSpec& spec : specs) {
      if (!spec.tied_to.empty()) {
        offsets.push_back(-1);
        continue;
      }
      ZTRAIN_CHECK(slot_by_name_.count(spec.name) == 0, "parameter name '", spec.name,
                   "' is used twice; parameter names must be unique in the model");
      offsets.push_back(state->padded);
      state->padded = AlignUp(state->padded + NumElements(spec.shape), kParamAlignment);
    }
    state->params = Buffer(host_, DType::kF32, {state->padded}, MemoryCategory::kParameters);
    state->grads = Buffer(host_, DType::kF32, {state->padded}, MemoryCategory::kGradients);
    state->exp_avg = Buffer(host_, DType::kF32, {state->padded}, MemoryCategory::kOptimizerState);
    state->exp_avg_sq =
        Buffer(host_, DType::kF32, {state->padded}, MemoryCategory::kOptimizerState);
    for (Buffer* b : {&state->params, &state->grads, &state->exp_avg, &state->exp_avg_sq}) b->Zero();
    const Tensor flat_p = state->params.AsTensor(DType::kF32, {state->padded});
    const Tensor flat_g = state->grads.AsTensor(DType::kF32, {state->padded});
    for (size_t i = 0; i < specs.size(); ++i) {
      const nn::ParamSpec& spec = specs[i];
      if (offsets[i] < 0) {
        auto it = slot_by_name_.find(spec.tied_to);
        ZTRAIN_CHECK(it != slot_by_name_.end(), "layer ", layers_[l]->Name(), " ties '",
                     spec.name, "' to '", spec.tied_to, "', which no earlier layer declares");
        const Slot& owner = slots_[it->second];
        ZTRAIN_CHECK(owner.spec.shape == spec.shape, "tied parameter '", spec.name, "' has shape ",
                     ShapeToString(spec.shape), " but '", spec.tied_to, "' has ",
                     ShapeToString(owner.spec.shape));
        params.push_back(Parameter(spec.tied_to));
        grads.push_back(Gradient(spec.tied_to));
        continue;
      }
      slot_by_name_[spec.name] = slots_.size();
      state->owned.push_back(slots_.size());
      slots_.push_back({spec, l, offsets[i]});
      params.push_back(flat_p.Flat(offsets[i], spec.shape));
      grads.push_back(flat_g.Flat(offsets[i], spec.shape));
    }
    layers_[l]->Bind(std::move(params), std::move(grads));
    states_.push_back(std::move(state));
  }
}

void Engine::InitParameters() {
  for (const Slot& s : slots_) nn::InitParam(s.spec, config_.training.seed, Parameter(s.spec.name));
}

const Engine::Slot& Engine::FindSlot(const std::string& name) const {
  auto it = slot_by_name_.find(name);
  ZTRAIN_CHECK(it != slot_by_name_.end(), "no parameter named '", name, "'");
  return slots_[it->second];
}

Tensor Engine::Parameter(const std::string& name) const {
  const Slot& s = FindSlot(name);
  return states_[s.layer]->params.AsTensor(DType::kF32, {states_[s.layer]->padded})
      .Flat(s.offset, s.spec.shape);
}

Tensor Engine::Gradient(const std::string& name) const {
  const Slot& s = FindSlot(name);
  return states_[s.layer]->grads.AsTensor(DType::kF32, {states_[s.layer]->padded})
      .Flat(s.offset, s.spec.shape);
}

std::vector<std::string> Engine::ParameterNames() const {
  std::vector<std::string> names;
  for (const Slot& s : slots_) names.push_back(s.spec.name);
  return names;
}

int64_t Engine::NumParameters() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += NumElements(s.spec.shape);
  return n;
}

double Engine::TrainFlopsPerToken(int64_t seq_len) const {
  double f = 0.0;
  for (const auto& layer : layers_) f += layer->ForwardFlopsPerToken(seq_len);
  return 3.0 * f;
}

void Engine::ZeroGrad() {
  for (auto& s : states_) ops_->Zero(s->grads.AsTensor(DType::kF32, {s->padded}));
}

double Engine::ForwardBackward(const nn::MicroBatch& mb, float loss_weight, StepStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const size_t n_layers = layers_.size();
  std::vector<nn::LayerContext> ctx;
  ctx.reserve(n_layers);
  // outputs[i] is layer i's output, kept until layer i+1's backward has used it.
  std::vector<Buffer> outputs(n_layers);
  Tensor input = mb.tokens;
  std::vector<Tensor> out_views(n_layers);
  for (size_t i = 0; i < n_layers; ++i) {
    ctx.emplace_back(*ops_, activations_);
    const Shape shape = layers_[i]->OutputShape(input.shape());
    outputs[i] = Buffer(activations_, DType::kF32, shape, MemoryCategory::kActivations);
    out_views[i] = outputs[i].AsTensor(DType::kF32, shape);
    layers_[i]->Forward(mb, input, out_views[i], ctx[i]);
    input = out_views[i];
  }
  const Tensor losses = out_views.back();
  const double loss = MeanOf(losses);
  const auto forward_done = std::chrono::steady_clock::now();
  // d(objective)/d(loss per token): the objective is loss_weight * mean(losses).
  Buffer dout(activations_, DType::kF32, losses.shape(), MemoryCategory::kActivations);
  {
    float* d = dout.data<float>();
    const float v = loss_weight / static_cast<float>(losses.numel());
    for (int64_t i = 0; i < losses.numel(); ++i) d[i] = v;
  }
  for (size_t i = n_layers; i-- > 0;) {
    const Tensor layer_in = i == 0 ? mb.tokens : out_views[i - 1];
    Buffer din;
    Tensor din_view;
    if (i > 0) {
      din = Buffer(activations_, DType::kF32, layer_in.shape(), MemoryCategory::kActivations);
      din_view = din.AsTensor(DType::kF32, layer_in.shape());
    }
    layers_[i]->Backward(mb, layer_in, dout.AsTensor(DType::kF32, out_views[i].shape()), din_view,
                         ctx[i]);
    ctx[i].Release();
    outputs[i].Reset();
    dout = std::move(din);
  }
  if (stats) {
    stats->forward_seconds += SecondsBetween(start, forward_done);
    stats->backward_seconds += SecondsBetween(forward_done, std::chrono::steady_clock::now());
  }
  return loss;
}

double Engine::EvalLoss(const nn::MicroBatch& mb) {
  Tensor input = mb.tokens;
  Buffer previous;
  for (const auto& layer : layers_) {
    nn::LayerContext ctx(*ops_, activations_);
    const Shape shape = layer->OutputShape(input.shape());
    Buffer out(activations_, DType::kF32, shape, MemoryCategory::kActivations);
    const Tensor out_view = out.AsTensor(DType::kF32, shape);
    layer->Forward(mb, input, out_view, ctx);
    previous = std::move(out);  // frees the input of this layer
    input = out_view;
  }
  return MeanOf(input);
}

double Engine::GradNorm() const {
  std::vector<Tensor> grads;
  for (const auto& s : states_) grads.push_back(s->grads.AsTensor(DType::kF32, {s->padded}));
  return optim::GlobalNorm(grads);
}

void Engine::OptimizerStep(double grad_norm, StepStats& stats) {
  const double lr = schedule_->LrAt(step_);
  const float coef = optim::ClipCoefficient(grad_norm, config_.gradient_clipping);
  ++step_;
  for (const Slot& s : slots_) {
    LayerState& st = *states_[s.layer];
    const optim::AdamStepArgs args =
        optim::AdamArgsFor(config_.optimizer, lr, step_, coef, s.spec.weight_decay);
    optim::AdamStep(args, st.params.data<float>() + s.offset, st.grads.data<float>() + s.offset,
                    st.exp_avg.data<float>() + s.offset, st.exp_avg_sq.data<float>() + s.offset,
                    NumElements(s.spec.shape));
  }
  stats.step = step_;
  stats.lr = lr;
  stats.clip_coef = coef;
  stats.grad_norm = grad_norm;
}

StepStats Engine::TrainStep(std::span<const nn::MicroBatch> micro_batches) {
  ZTRAIN_CHECK(!micro_batches.empty(), "TrainStep needs at least one micro-batch");
  const auto start = std::chrono::steady_clock::now();
  StepStats stats;
  ZeroGrad();
  const float weight = 1.0f / static_cast<float>(micro_batches.size());
  double loss_sum = 0.0;
  for (const nn::MicroBatch& mb : micro_batches) {
    loss_sum += ForwardBackward(mb, weight, &stats);
    stats.tokens += mb.tokens.numel();
  }
  stats.loss = loss_sum / static_cast<double>(micro_batches.size());
  const auto optimizer_start = std::chrono::steady_clock::now();
  const double norm = GradNorm();
  ZTRAIN_CHECK(std::isfinite(norm), "gradient norm is ", norm, " at step ", step_ + 1,
               " (loss ", stats.loss, "); lower optimizer.params.lr or set gradient_clipping");
  OptimizerStep(norm, stats);
  const auto end = std::chrono::steady_clock::now();
  stats.optimizer_seconds = SecondsBetween(optimizer_start, end);
  stats.seconds = SecondsBetween(start, end);
  return stats;
}

}  // namespace ztrain
