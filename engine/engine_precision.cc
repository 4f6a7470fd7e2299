// Mixed precision in the engine: the compute-dtype parameter copies, 16-bit gradients reduced
// in fp32, and fp16's loss scaling with skipped steps.
//
// Note [Mixed precision in the engine]
// bf16.enabled or fp16.enabled sets the compute dtype D (ComputeDType). The layers compute
// with D: their parameters are a D copy of the fp32 parameters (`lp`, the whole layer, at
// stages 0-2; at stage 3 each gather converts the rank's fp32 shard into its chunk of a D
// buffer and all-gathers that, so gathers move half the bytes; a shard offloaded to the host
// of a GPU keeps its D copy there, Note [Offloaded shards beside compute] in engine.cc) and
// their activations and activation gradients are D (LayerContext::dtype); layernorm
// statistics, attention's log-sum-exp, the logits' softmax and the losses stay fp32 (ops.h).
// The fp32 parameters are the master weights: AdamW updates them with fp32 m and v, sharded
// as the ZeRO stage says, and the parameter store rounds them into `lp` after every update
// (and after initialisation, loading and SetFullParameters). Checkpoints and whole-parameter
// values are the fp32 masters, so a mixed-precision checkpoint loads into an fp32 run and
// back.
//
// Gradients accumulate in G = data_types.grad_accum_dtype (fp32 by default with bf16, fp16
// with fp16, as DeepSpeed's fp16 ZeRO keeps them): the layers' backward adds into G buffers.
// A 16-bit G is converted to fp32 before it is reduced (Fp32Gradients) and the reduced fp32
// range lands in `grad_shard`, which then exists at stage 0 too, so the norm and AdamW always
// read fp32 (LayerState::Reduced). Stages 0 and 1 sum a step's micro-batches in G before the
// reduction; stages 2 and 3 reduce every micro-batch as it comes and sum in fp32, so there a
// 16-bit G only spans one micro-batch's backward.
//
// fp16 scales the loss by the LossScaler's scale S (DeepSpeed's DynamicLossScaler, optim/
// loss_scaler.h): the loss gradient is S / tokens, so every gradient is S times the true one.
// After the reductions the global norm of the scaled gradients is all-reduced over dp, pp and
// tp; an inf or NaN there is an overflow on some rank, seen by all. An overflow skips the
// update: the step counts (the step counter is DeepSpeed's global_steps: training.steps,
// checkpoints and the data position follow it) but the lr schedule and Adam's bias
// correction follow the updates taken, step - skipped; S is lowered after `hysteresis`
// overflows; `loss_scale_window` clean steps raise it. The
// update divides S out together with clipping (optim::UnscaleAndClipCoefficient, as ZeRO's
// unscale_and_clip_grads), and the reported norm is the unscaled one. Where DeepSpeed aborts
// at min_loss_scale, the scaler keeps skipping and stops the run with a clear error only after
// fp16.max_consecutive_skips skipped steps in a row.
#include <cmath>

#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "optim/grad_clip.h"

namespace ztrain {

Tensor EngineImpl::Fp32Gradients(size_t l, Buffer& staging) {
  LayerState& st = *states_[l];
  const Tensor grads = st.grads.AsTensor(grad_dtype_, {st.layout.padded});
  if (grad_dtype_ == DType::kF32) return grads;
  Tensor out;
  if (!zero_.shard_optimizer) {
    out = st.Flat(st.grad_shard, st.layout.padded);
  } else {
    staging = Buffer(memory_.activations(), DType::kF32, {st.layout.padded},
                     MemoryCategory::kCommunication);
    out = st.Flat(staging, st.layout.padded);
  }
  ops_->Copy(grads, out);
  return out;
}

void EngineImpl::FinishStep(StepStats& stats) {
  const double norm = GradNorm();
  if (scaler_) {
    stats.loss_scale = scaler_->scale();
    stats.skipped = scaler_->Update(!std::isfinite(norm));
    stats.skipped_steps = scaler_->skipped_steps();
    if (stats.skipped) {  // counted as a step, without an update
      stats.step = ++step_;
      stats.lr = schedule_->LrAt(step_ - scaler_->skipped_steps());
      stats.grad_norm = norm;
      return;
    }
  }
  ZTRAIN_CHECK(std::isfinite(norm), "gradient norm is ", norm, " at step ", step_ + 1, " (loss ",
               stats.loss, "); lower optimizer.params.lr or set gradient_clipping");
  OptimizerStep(norm, stats);
}

nlohmann::json EngineImpl::LossScalerState() const {
  return scaler_ ? scaler_->State() : nlohmann::json();
}

void EngineImpl::RestoreLossScaler(const nlohmann::json& state) {
  if (scaler_ && !state.is_null()) scaler_->Restore(state);
}

}  // namespace ztrain
