// The engine's parameters by name, whole (Note [Whole parameters], engine/whole_params.h),
// and their names and counts.
#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "engine/whole_params.h"
#include "nn/init.h"
#include "parallel/zero/frozen_regions.h"

namespace ztrain {

Tensor EngineImpl::Parameter(const std::string& name) const {
  const Slot& s = table_->Find(name);
  ZTRAIN_CHECK(!zero_.shard_parameters, "parameter '", name,
               "' is not kept whole at ZeRO stage 3: each rank "
               "holds only its shard; use ForEachFullParameter (collective)");
  if (s.frozen()) return frozen_->View(frozen_->held(s.layer), s.spec, s.offset);
  return held_->HeldTensor(s.layer).Flat(s.offset, s.spec.shape);
}

Shape EngineImpl::ParameterShape(const std::string& name) const {
  return table_->Find(name).spec.shape;
}

bool EngineImpl::Trainable(const std::string& name) const { return !table_->Find(name).frozen(); }

void EngineImpl::InitialValues(const std::string& name, int64_t begin, int64_t count,
                               float* out) const {
  nn::InitParam(table_->Find(name).spec, config_.training.seed, Tensor(out, DType::kF32, {count}),
                begin);
}

Tensor EngineImpl::Gradient(const std::string& name) const {
  const Slot& s = table_->Find(name);
  ZTRAIN_CHECK(!zero_.shard_gradients, "gradient '", name, "' is not kept whole at ZeRO stage ",
               zero_.stage, ": each rank holds only its reduced shard");
  ZTRAIN_CHECK(!s.frozen(), "parameter '", name, "' is frozen: it has no gradient");
  return states_[s.layer]
      ->grads.AsTensor(DType::kF32, {states_[s.layer]->layout.padded})
      .Flat(s.offset, s.spec.shape);
}

void EngineImpl::ForEachFullParameter(const WholeParameters::Fn& fn, bool trainable_only) {
  whole_->ForEach(fn, trainable_only);
}

void EngineImpl::SetFullParameters(const WholeParameters::Fn& fill) { whole_->SetAll(fill); }

void EngineImpl::SetHeldParameters(const HeldParameterFill& fill,
                                   const std::function<bool(const std::string&)>& only) {
  whole_->SetHeld(fill, only);
}

std::vector<std::string> EngineImpl::ParameterNames() const {
  std::vector<std::string> names;
  for (const Slot& s : table_->slots()) names.push_back(s.spec.name);
  return names;
}

int64_t EngineImpl::NumParameters() const { return table_->NumParameters(); }

int64_t EngineImpl::NumTrainableParameters() const {
  return table_->NumParameters(/*trainable_only=*/true);
}

int64_t EngineImpl::PaddedParameters() const {
  int64_t n = 0;
  for (const auto& st : states_) n += st->layout.padded;
  return n;
}

}  // namespace ztrain
