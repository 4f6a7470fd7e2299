#include "engine/engine.h"

#include <algorithm>
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

// Note [ZeRO in the engine]
// Each layer has one flat parameter buffer and a mirroring full gradient buffer of `padded`
// elements, a multiple of dp * 16, so the layer splits into dp equal shards of `shard`
// elements; rank r's shard is [r * shard, (r + 1) * shard). Padding is zero and stays zero.
// The optimizer owns the range `opt_begin` + [0, opt_len): the whole layer at stage 0, the
// rank's shard at stage >= 1; m and v cover only that range. At stage >= 1 the reduced
// gradient of the range lands in `grad_shard` (reduce-scatter) and the updated range is
// all-gathered back into the full parameters. Gradients are pre-scaled by 1/dp through the
// loss weight, so the sum-reduction yields the gradient of the global-batch mean.
// Stage 2 keeps no full gradient buffers: a layer's full buffer is allocated (zeroed) just
// before its backward in every micro-batch, reduce-scattered right after it, added into
// `grad_shard` and freed once the next layer's backward has run — at most two layers' full
// gradients (plus those of layers whose weights are tied into later layers, which must live
// through the whole backward) exist at a time.
struct Engine::LayerState {
  int64_t padded = 0;
  int64_t shard = 0;
  int64_t opt_begin = 0, opt_len = 0;
  Buffer params, grads, exp_avg, exp_avg_sq;
  Buffer grad_shard;          // stage >= 1: this rank's reduced gradient range
  Buffer grad_recv;           // stage 2: a micro-batch's reduced range, added to grad_shard
  comm::WorkPtr reduction;    // the gradient reduction in flight
  std::vector<size_t> owned;  // indices into slots_
  std::vector<size_t> bound;  // the slot of each of the layer's Params() (ties resolved)
  bool tie_owner = false;     // a later layer uses one of this layer's parameters
  Tensor Flat(const Buffer& b, int64_t n) const { return b.AsTensor(DType::kF32, {n}); }
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

Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers,
               comm::Communicator* dp)
    : config_(std::move(config)),
      layers_(std::move(layers)),
      host_(&tracker_),
      raw_host_(nullptr),
      activations_(raw_host_, &tracker_),
      self_comm_(dp ? nullptr : comm::MakeSelfCommunicator()),
      dp_(dp ? dp : self_comm_.get()),
      stage_(config_.zero.stage),
      ops_(kernels::MakeCpuOps()),
      schedule_(optim::MakeLrSchedule(config_.scheduler, config_.optimizer.lr)) {
  ZTRAIN_CHECK(!layers_.empty(), "the model has no layers");
  ZTRAIN_CHECK(stage_ >= 0 && stage_ <= 2, "zero_optimization.stage ", stage_,
               " is not built yet; use stage 0, 1 or 2");
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
    const int64_t n_dp = dp_->size();
    state->padded = AlignUp(state->padded, kParamAlignment * n_dp);
    state->shard = state->padded / n_dp;
    state->opt_begin = stage_ >= 1 ? dp_->rank() * state->shard : 0;
    state->opt_len = stage_ >= 1 ? state->shard : state->padded;
    state->params = Buffer(host_, DType::kF32, {state->padded}, MemoryCategory::kParameters);
    if (stage_ <= 1) {
      state->grads = Buffer(host_, DType::kF32, {state->padded}, MemoryCategory::kGradients);
    }
    state->exp_avg = Buffer(host_, DType::kF32, {state->opt_len}, MemoryCategory::kOptimizerState);
    state->exp_avg_sq =
        Buffer(host_, DType::kF32, {state->opt_len}, MemoryCategory::kOptimizerState);
    if (stage_ >= 1) {
      state->grad_shard = Buffer(host_, DType::kF32, {state->shard}, MemoryCategory::kGradients);
      state->grad_shard.Zero();
    }
    for (Buffer* b : {&state->params, &state->grads, &state->exp_avg, &state->exp_avg_sq}) b->Zero();
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
        state->bound.push_back(it->second);
        states_[owner.layer]->tie_owner = true;
        continue;
      }
      slot_by_name_[spec.name] = slots_.size();
      state->owned.push_back(slots_.size());
      state->bound.push_back(slots_.size());
      slots_.push_back({spec, l, offsets[i]});
    }
    states_.push_back(std::move(state));
    BindLayer(l);
  }
}

// Gives layer l views of its parameters and of the full gradient buffers they accumulate
// into (its own, or an earlier layer's for tied parameters). At stage 2 it runs again before
// each backward, once the buffers of that micro-batch exist.
void Engine::BindLayer(size_t l) {
  std::vector<Tensor> params, grads;
  for (size_t slot : states_[l]->bound) {
    const Slot& s = slots_[slot];
    const LayerState& owner = *states_[s.layer];
    params.push_back(owner.Flat(owner.params, owner.padded).Flat(s.offset, s.spec.shape));
    // Stage 2 between backwards: no full gradient buffer exists, the view stays undefined.
    grads.push_back(owner.grads.data() == nullptr
                        ? Tensor()
                        : owner.Flat(owner.grads, owner.padded).Flat(s.offset, s.spec.shape));
  }
  layers_[l]->Bind(std::move(params), std::move(grads));
}

void Engine::AllocateFullGradients(size_t l) {
  LayerState& st = *states_[l];
  if (st.grads.data() != nullptr) return;
  st.grads = Buffer(activations_, DType::kF32, {st.padded}, MemoryCategory::kGradients);
  st.grads.Zero();
}

void Engine::FinishStage2Reduction(size_t l) {
  LayerState& st = *states_[l];
  st.reduction->Wait();
  st.reduction.reset();
  ops_->AddInPlace(st.Flat(st.grad_shard, st.shard), st.Flat(st.grad_recv, st.shard));
  st.grad_recv.Reset();
  st.grads.Reset();
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
  ZTRAIN_CHECK(stage_ <= 1, "gradient '", name, "' is not kept whole at ZeRO stage 2: each rank "
               "holds only its reduced shard");
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
  for (auto& s : states_) {
    if (stage_ <= 1) ops_->Zero(s->Flat(s->grads, s->padded));
    if (stage_ == 2) ops_->Zero(s->Flat(s->grad_shard, s->shard));
  }
}

double Engine::ForwardBackward(const nn::MicroBatch& mb, float loss_weight, StepStats* stats) {
  return ForwardBackwardImpl(mb, loss_weight, stats, /*reduce=*/false);
}

void Engine::LaunchGradientReduction(size_t layer) {
  LayerState& st = *states_[layer];
  const Tensor grads = st.Flat(st.grads, st.padded);
  if (stage_ == 0) {
    st.reduction = dp_->AllReduce(grads);
  } else if (stage_ == 1) {
    st.reduction = dp_->ReduceScatter(grads, st.Flat(st.grad_shard, st.shard));
  } else {
    st.grad_recv = Buffer(activations_, DType::kF32, {st.shard}, MemoryCategory::kCommunication);
    st.reduction = dp_->ReduceScatter(grads, st.Flat(st.grad_recv, st.shard));
  }
}

void Engine::WaitGradientReductions() {
  for (auto& st : states_) {
    if (st->reduction) st->reduction->Wait();
    st->reduction.reset();
  }
}

double Engine::MeanOverDp(double value) {
  if (dp_->size() == 1) return value;
  float v = static_cast<float>(value);
  dp_->AllReduce(Tensor(&v, DType::kF32, {1}))->Wait();
  return static_cast<double>(v) / dp_->size();
}

double Engine::ForwardBackwardImpl(const nn::MicroBatch& mb, float loss_weight,
                                   StepStats* stats, bool reduce) {
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
  // Stage 2 reduces every micro-batch (Note [ZeRO in the engine]).
  reduce = reduce || stage_ == 2;
  if (stage_ == 2) {
    for (size_t l = 0; l < n_layers; ++l) {
      if (states_[l]->tie_owner) AllocateFullGradients(l);
    }
  }
  size_t in_flight = n_layers;  // stage 2: the layer whose reduce-scatter is outstanding
  for (size_t i = n_layers; i-- > 0;) {
    const Tensor layer_in = i == 0 ? mb.tokens : out_views[i - 1];
    if (stage_ == 2) {
      AllocateFullGradients(i);
      BindLayer(i);
    }
    Buffer din;
    Tensor din_view;
    if (i > 0) {
      din = Buffer(activations_, DType::kF32, layer_in.shape(), MemoryCategory::kActivations);
      din_view = din.AsTensor(DType::kF32, layer_in.shape());
    }
    layers_[i]->Backward(mb, layer_in, dout.AsTensor(DType::kF32, out_views[i].shape()), din_view,
                         ctx[i]);
    // A layer's gradients are final once its own backward ran: tied uses sit in later layers,
    // whose backward came first.
    if (reduce) LaunchGradientReduction(i);
    if (stage_ == 2) {
      if (in_flight < n_layers) FinishStage2Reduction(in_flight);
      in_flight = i;
    }
    ctx[i].Release();
    outputs[i].Reset();
    dout = std::move(din);
  }
  if (in_flight < n_layers) FinishStage2Reduction(in_flight);
  if (stage_ == 2) {
    // The full gradient buffers are gone: no layer may keep a view into them.
    for (size_t l = 0; l < n_layers; ++l) BindLayer(l);
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
  for (const auto& s : states_) {
    grads.push_back(stage_ >= 1 ? s->Flat(s->grad_shard, s->shard) : s->Flat(s->grads, s->padded));
  }
  if (stage_ == 0) return optim::GlobalNorm(grads);
  float sum = static_cast<float>(optim::GradSquaredSum(grads));
  dp_->AllReduce(Tensor(&sum, DType::kF32, {1}))->Wait();
  return std::sqrt(static_cast<double>(sum));
}

void Engine::GatherParameters() {
  std::vector<Buffer> sends;
  std::vector<comm::WorkPtr> works;
  for (auto& st : states_) {
    // The send buffer is a copy: the gathered output covers this rank's own range too.
    sends.emplace_back(activations_, DType::kF32, Shape{st->shard}, MemoryCategory::kCommunication);
    const Tensor send = sends.back().AsTensor(DType::kF32, {st->shard});
    ops_->Copy(st->Flat(st->params, st->padded).Flat(st->opt_begin, {st->shard}), send);
    works.push_back(dp_->AllGather(send, st->Flat(st->params, st->padded)));
  }
  for (auto& w : works) w->Wait();
}

void Engine::OptimizerStep(double grad_norm, StepStats& stats) {
  const double lr = schedule_->LrAt(step_);
  const float coef = optim::ClipCoefficient(grad_norm, config_.gradient_clipping);
  ++step_;
  for (const Slot& s : slots_) {
    // The part of this parameter inside the layer's optimizer range (Note [ZeRO in the engine]).
    LayerState& st = *states_[s.layer];
    const int64_t begin = std::max(s.offset, st.opt_begin);
    const int64_t end = std::min(s.offset + NumElements(s.spec.shape), st.opt_begin + st.opt_len);
    if (begin >= end) continue;
    const int64_t local = begin - st.opt_begin;
    const float* grad = stage_ >= 1 ? st.grad_shard.data<float>() + local
                                    : st.grads.data<float>() + begin;
    const optim::AdamStepArgs args =
        optim::AdamArgsFor(config_.optimizer, lr, step_, coef, s.spec.weight_decay);
    optim::AdamStep(args, st.params.data<float>() + begin, grad, st.exp_avg.data<float>() + local,
                    st.exp_avg_sq.data<float>() + local, end - begin);
  }
  if (stage_ >= 1 && dp_->size() > 1) GatherParameters();
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
  const float weight = 1.0f / static_cast<float>(micro_batches.size() * dp_->size());
  double loss_sum = 0.0;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const bool last = i + 1 == micro_batches.size();
    loss_sum += ForwardBackwardImpl(micro_batches[i], weight, &stats, /*reduce=*/last);
    stats.tokens += micro_batches[i].tokens.numel() * dp_->size();
  }
  WaitGradientReductions();
  stats.loss = MeanOverDp(loss_sum / static_cast<double>(micro_batches.size()));
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
