#include "optim/loss_scaler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace ztrain::optim {

LossScalerOptions LossScalerOptionsFrom(const PrecisionConfig& p) {
  return {.loss_scale = p.loss_scale,
          .initial_scale_power = p.initial_scale_power,
          .loss_scale_window = p.loss_scale_window,
          .hysteresis = p.hysteresis,
          .consecutive_hysteresis = p.consecutive_hysteresis,
          .min_loss_scale = p.min_loss_scale,
          .max_consecutive_skips = p.max_consecutive_skips};
}

namespace {

void CheckOptions(const LossScalerOptions& o) {
  ZTRAIN_CHECK_T(ConfigError, std::isfinite(o.loss_scale) && o.loss_scale >= 0,
                 "fp16.loss_scale must be a finite number >= 0 (0 = dynamic loss scaling), got ",
                 o.loss_scale);
  ZTRAIN_CHECK_T(ConfigError, o.max_consecutive_skips >= 0,
                 "max_consecutive_skips must be >= 0 (0 = no limit), got ",
                 o.max_consecutive_skips);
  if (o.loss_scale > 0) return;  // DeepSpeed ignores the dynamic keys under a static scale
  const double initial = std::ldexp(1.0, o.initial_scale_power);
  ZTRAIN_CHECK_T(ConfigError, std::isfinite(initial) && initial > 0, "fp16.initial_scale_power ",
                 o.initial_scale_power,
                 " gives no finite positive scale 2^power; use a power in [-1074, 1023], "
                 "usually 16");
  ZTRAIN_CHECK_T(ConfigError, o.loss_scale_window >= 1,
                 "fp16.loss_scale_window must be a positive integer, got ", o.loss_scale_window);
  ZTRAIN_CHECK_T(ConfigError, o.hysteresis >= 1,
                 "fp16.hysteresis must be a positive integer (1 = halve on every overflow), got ",
                 o.hysteresis);
  ZTRAIN_CHECK_T(ConfigError, std::isfinite(o.min_loss_scale) && o.min_loss_scale > 0,
                 "fp16.min_loss_scale must be a finite number > 0, got ", o.min_loss_scale);
}

// The value of `key` in a checkpoint's loss scaler state, checked for its JSON type.
const nlohmann::json& Field(const nlohmann::json& state, const char* key, bool integer) {
  ZTRAIN_CHECK(state.is_object() && state.contains(key), "loss scaler state: missing \"", key,
               "\"; the checkpoint is damaged or was not written by ztrain's LossScaler");
  const nlohmann::json& v = state.at(key);
  ZTRAIN_CHECK(integer ? v.is_number_integer() : v.is_number(), "loss scaler state: \"", key,
               "\" must be ", integer ? "an integer" : "a number", ", got ", v.dump());
  return v;
}

}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  CheckOptions(options_);
  scale_ = dynamic() ? std::ldexp(1.0, options_.initial_scale_power) : options_.loss_scale;
  cur_hysteresis_ = options_.hysteresis;
}

// Note [DeepSpeed dynamic loss scale], line for line.
void LossScaler::UpdateDynamic(bool overflow) {
  if (overflow) {
    if (options_.hysteresis == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2.0, options_.min_loss_scale);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
    return;
  }
  if (options_.consecutive_hysteresis) cur_hysteresis_ = options_.hysteresis;
  const int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
  if (stable > 0 && stable % options_.loss_scale_window == 0) {
    if (!options_.consecutive_hysteresis) cur_hysteresis_ = options_.hysteresis;
    scale_ *= 2.0;
  }
}

bool LossScaler::Update(bool overflow) {
  if (dynamic()) UpdateDynamic(overflow);
  ++cur_iter_;
  if (!overflow) {
    consecutive_skips_ = 0;
    return false;
  }
  ++skipped_steps_;
  ++consecutive_skips_;
  const int64_t limit = options_.max_consecutive_skips;
  if (limit > 0 && consecutive_skips_ >= limit) {
    const std::string scale =
        dynamic() ? detail::StrCat("dynamic fp16 loss scale now ", scale_,
                                   ", fp16.min_loss_scale = ", options_.min_loss_scale)
                  : detail::StrCat("static fp16 loss scale ", scale_);
    throw Error(detail::StrCat(
        consecutive_skips_,
        " optimizer steps in a row were skipped because the gradients held inf or NaN (", scale,
        "; max_consecutive_skips = ", limit,
        "). Training is not progressing: lower the learning rate, train in bf16 "
        "(bf16.enabled) instead of fp16, or check the data for bad samples."));
  }
  return true;
}

nlohmann::json LossScaler::State() const {
  return {{"dynamic", dynamic()},
          {"cur_scale", scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_},
          {"skipped_steps", skipped_steps_},
          {"consecutive_skips", consecutive_skips_}};
}

void LossScaler::Restore(const nlohmann::json& state) {
  ZTRAIN_CHECK(state.is_object() && state.contains("dynamic") && state["dynamic"].is_boolean(),
               "loss scaler state: missing boolean \"dynamic\" in ", state.dump());
  const bool was_dynamic = state["dynamic"].get<bool>();
  ZTRAIN_CHECK(was_dynamic == dynamic(), "the checkpoint's loss scale is ",
               was_dynamic ? "dynamic" : "static", " but fp16.loss_scale = ", options_.loss_scale,
               " asks for a ", dynamic() ? "dynamic" : "static",
               " one; resume with the checkpoint's setting or start a new run");
  const double scale = Field(state, "cur_scale", false).get<double>();
  const int64_t iter = Field(state, "cur_iter", true).get<int64_t>();
  const int64_t last = Field(state, "last_overflow_iter", true).get<int64_t>();
  const int64_t hysteresis = Field(state, "cur_hysteresis", true).get<int64_t>();
  const int64_t skipped = Field(state, "skipped_steps", true).get<int64_t>();
  const int64_t consecutive = Field(state, "consecutive_skips", true).get<int64_t>();
  ZTRAIN_CHECK(std::isfinite(scale) && scale > 0 && iter >= 0 && last >= -1 && last < iter,
               "loss scaler state: inconsistent scale or iterations in ", state.dump());
  ZTRAIN_CHECK(hysteresis >= 1 && skipped >= consecutive && consecutive >= 0 && skipped <= iter,
               "loss scaler state: inconsistent hysteresis or skip counts in ", state.dump());
  if (dynamic()) scale_ = scale;
  cur_iter_ = iter;
  last_overflow_iter_ = last;
  cur_hysteresis_ = static_cast<int>(std::min<int64_t>(hysteresis, options_.hysteresis));
  skipped_steps_ = skipped;
  consecutive_skips_ = consecutive;
}

namespace {

constexpr int64_t kBlock = 65536;

struct Block {
  const void* data;
  DType dtype;
  int64_t begin, count;
};

// An all-ones exponent field is exactly inf or NaN, in each format.
bool BlockHasInfOrNan(const Block& b) {
  int found = 0;
  if (b.dtype == DType::kF32) {
    const float* p = static_cast<const float*>(b.data) + b.begin;
    for (int64_t i = 0; i < b.count; ++i) {
      found |= (std::bit_cast<uint32_t>(p[i]) & 0x7f800000u) == 0x7f800000u;
    }
  } else {
    const uint16_t mask = b.dtype == DType::kBF16 ? 0x7f80 : 0x7c00;
    const uint16_t* p = static_cast<const uint16_t*>(b.data) + b.begin;
    for (int64_t i = 0; i < b.count; ++i) found |= (p[i] & mask) == mask;
  }
  return found != 0;
}

}  // namespace

bool HasInfOrNan(std::span<const Tensor> tensors) {
  std::vector<Block> blocks;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t];
    const DType d = x.dtype();
    ZTRAIN_CHECK((d == DType::kF32 || d == DType::kBF16 || d == DType::kF16) &&
                     x.device().is_cpu() && x.defined(),
                 "HasInfOrNan: tensor ", t, " is ", DTypeName(d), " on ", x.device().ToString(),
                 x.defined() ? "" : " without data", "; expected fp32, bf16 or fp16 on cpu");
    for (int64_t begin = 0; begin < x.numel(); begin += kBlock) {
      blocks.push_back({x.data(), d, begin, std::min(kBlock, x.numel() - begin)});
    }
  }
  const int64_t nblocks = static_cast<int64_t>(blocks.size());
  int found = 0;
#pragma omp parallel for schedule(static) reduction(| : found) if (nblocks >= 4)
  for (int64_t b = 0; b < nblocks; ++b) found |= BlockHasInfOrNan(blocks[b]) ? 1 : 0;
  return found != 0;
}

}  // namespace ztrain::optim
