#pragma once
// The target that takes no loss: Hugging Face's ignore_index (-100). The data marks a packed
// document's first token with it (Note [Packed documents], data/documents.h); the loss ops
// give it a loss of 0 and no gradient (kernels/ops.h), and the engine divides the step's loss
// by the other targets (Note [Loss over real targets], engine/engine_step.cc).
#include <cstdint>

namespace ztrain {

inline constexpr int32_t kIgnoreTarget = -100;

}  // namespace ztrain
