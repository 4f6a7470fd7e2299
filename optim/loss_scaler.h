#pragma once
// The fp16 loss scale, static or dynamic, with DeepSpeed's semantics (see Note [DeepSpeed
// dynamic loss scale]).
//
// A LossScaler owns a handful of numbers and nothing else. It is not thread safe: the engine
// holds one and calls Update once per optimizer step. Under data parallelism the caller
// all-reduces the overflow flag (a logical OR over ranks) before calling Update, so every
// rank's scaler goes through the same states. Fails with ztrain::ConfigError for invalid
// options (constructor), with ztrain::Error for a malformed or incompatible checkpoint state
// (Restore) and when max_consecutive_skips steps in a row overflowed (Update).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

#include "core/config.h"
#include "core/tensor.h"

namespace ztrain::optim {

// Note [DeepSpeed dynamic loss scale]
// Matched step by step against DeepSpeed's DynamicLossScaler.update_scale in
// deepspeedai/DeepSpeed, deepspeed/runtime/fp16/loss_scaler.py (master, commit 18fd4c97),
// with the fp16 keys mapped as deepspeed/runtime/precision_config.py
// (DeepSpeedFP16Config.dynamic_loss_scale_args) maps them: init_scale =
// 2^initial_scale_power, scale_window = loss_scale_window, delayed_shift = hysteresis,
// min_scale = min_loss_scale, scale_factor = 2. State: scale, cur_iter = 0,
// last_overflow_iter = -1, cur_hysteresis = hysteresis. One update, for step cur_iter:
//   overflow:
//     if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / 2, min_loss_scale)
//     else: cur_hysteresis -= 1                 (the scale is kept; never below 1 left)
//     last_overflow_iter = cur_iter
//   no overflow:
//     if consecutive_hysteresis: cur_hysteresis = hysteresis
//     stable = cur_iter - last_overflow_iter - 1   (clean steps before this one)
//     if stable > 0 and stable % loss_scale_window == 0:
//       if not consecutive_hysteresis: cur_hysteresis = hysteresis
//       scale *= 2
//   cur_iter += 1
// So the scale first doubles on the (window + 1)-th clean step after an overflow (or after
// the start), then every `window` clean steps. Releases of DeepSpeed before that file's
// `stable_interval` line tested (cur_iter - last_overflow_iter) % window == 0 instead, which
// doubles one step earlier; the current code agrees with the stage-0 FP16_Optimizer's
// _update_scale (deepspeed/runtime/fp16/fused_optimizer.py), and we follow it.
// Where ztrain differs: DeepSpeed raises "Current loss scale already at minimum" when a step
// overflows at min_loss_scale with no hysteresis left; ztrain keeps the scale at the
// minimum, skips and counts the step (the update above with raise_error_at_min_scale=False),
// and instead throws once max_consecutive_skips steps in a row were skipped, whatever the
// scale. A static scale (loss_scale > 0, DeepSpeed's LossScaler) never changes; an overflow
// still skips the step, as DeepSpeed's optimizers do.

// DeepSpeed's "fp16" keys, plus ztrain's limit on skips in a row.
struct LossScalerOptions {
  double loss_scale = 0;                // fp16.loss_scale: > 0 static scale, 0 dynamic
  int initial_scale_power = 16;         // fp16.initial_scale_power: dynamic starts at 2^this
  int64_t loss_scale_window = 1000;     // fp16.loss_scale_window (>= 1)
  int hysteresis = 2;                   // fp16.hysteresis: overflows before halving (>= 1)
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis: refill on clean steps
  double min_loss_scale = 1;            // fp16.min_loss_scale (> 0)
  // Update throws when this many steps in a row were skipped; 0 = never. 50 lies well above
  // the descent a healthy run makes at its start (17 overflows in a row take the default 2^16
  // with hysteresis 2 down to 1; 33 from 2^32), and far below the thousands of steps a run
  // stuck at its minimum scale would otherwise waste.
  int64_t max_consecutive_skips = 50;
};

// The options the config's fp16 section gives.
LossScalerOptions LossScalerOptionsFrom(const PrecisionConfig& precision);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);

  // The factor the loss (hence every gradient) is multiplied by before backward; gradients
  // are divided by it again before the optimizer step.
  double scale() const { return scale_; }
  bool dynamic() const { return options_.loss_scale == 0; }

  // Records whether this step's gradients overflowed (an inf or NaN anywhere, on any rank)
  // and updates the scale for the next step. Returns true when this step must be skipped
  // (exactly when `overflow`). Throws ztrain::Error, after updating the state, when this is
  // the max_consecutive_skips-th skipped step in a row.
  bool Update(bool overflow);

  int64_t skipped_steps() const { return skipped_steps_; }          // since the start of training
  int64_t consecutive_skips() const { return consecutive_skips_; }  // in a row, up to now

  // Everything Update changes, for checkpoints: {"dynamic", "cur_scale", "cur_iter",
  // "last_overflow_iter", "cur_hysteresis", "skipped_steps", "consecutive_skips"}.
  nlohmann::json State() const;
  // Continues from State() of a scaler built with the same options, so that the scale sequence
  // goes on as if training had not stopped. A static scale keeps the configured value (only
  // the counts are restored); cur_hysteresis is capped at the configured hysteresis. Throws
  // ztrain::Error naming the key for a missing or invalid field, or when the state is of a
  // dynamic scaler and the options are static, or the other way round.
  void Restore(const nlohmann::json& state);

 private:
  void UpdateDynamic(bool overflow);

  LossScalerOptions options_;
  double scale_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int cur_hysteresis_;
  int64_t skipped_steps_ = 0;
  int64_t consecutive_skips_ = 0;
};

// True when an element of any of the tensors is +-inf or NaN: the overflow check of a step's
// gradients before the flag is all-reduced. The tensors must be fp32, bf16 or fp16 on the
// host (ztrain::Error naming the tensor's index otherwise). Element by element: finite
// gradients are never an overflow, even where their fp32 sum would be (DeepSpeed's
// CheckOverflow tests float(x.float().sum()) and so would report those).
// OpenMP-parallel over blocks of elements; thread safe.
bool HasInfOrNan(std::span<const Tensor> tensors);
inline bool HasInfOrNan(const Tensor& tensor) { return HasInfOrNan(std::span(&tensor, 1)); }

}  // namespace ztrain::optim
