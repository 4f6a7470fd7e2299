// Engine: the narrow face (engine.h), each method handed to EngineImpl (engine_impl.h).
#include "engine/engine.h"
#include "engine/engine_impl.h"

namespace ztrain {

using Fn = std::function<void(const std::string&, const Tensor&)>;

Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
               InitialParameters initial)
    : impl_(std::make_unique<EngineImpl>(std::move(config), std::move(layers), groups, initial)) {}
Engine::Engine(Config config, std::vector<std::unique_ptr<nn::Layer>> layers, ParallelGroups groups,
               ShapeOnly shape_only)
    : impl_(
          std::make_unique<EngineImpl>(std::move(config), std::move(layers), groups, shape_only)) {}
Engine::~Engine() = default;

StepStats Engine::TrainStep(std::span<const nn::MicroBatch> mb) { return impl_->TrainStep(mb); }
double Engine::EvalLoss(const nn::MicroBatch& mb) { return impl_->EvalLoss(mb); }
void Engine::ZeroGrad() { impl_->ZeroGrad(); }
double Engine::ForwardBackward(const nn::MicroBatch& mb, float loss_weight, StepStats* stats) {
  return impl_->ForwardBackward(mb, loss_weight, stats);
}
double Engine::GradNorm() { return impl_->GradNorm(); }
double Engine::MeanOverDp(double value) { return impl_->MeanOverDp(value); }
void Engine::OptimizerStep(double grad_norm, StepStats& stats) {
  impl_->OptimizerStep(grad_norm, stats);
}

Tensor Engine::Parameter(const std::string& name) const { return impl_->Parameter(name); }
Tensor Engine::Gradient(const std::string& name) const { return impl_->Gradient(name); }
Shape Engine::ParameterShape(const std::string& name) const { return impl_->ParameterShape(name); }
bool Engine::Trainable(const std::string& name) const { return impl_->Trainable(name); }
void Engine::ForEachFullParameter(const Fn& fn, bool trainable_only) {
  impl_->ForEachFullParameter(fn, trainable_only);
}
void Engine::SetFullParameters(const Fn& fill) { impl_->SetFullParameters(fill); }
void Engine::SetHeldParameters(const HeldParameterFill& fill,
                               const std::function<bool(const std::string&)>& only) {
  impl_->SetHeldParameters(fill, only);
}
void Engine::InitialValues(const std::string& name, int64_t begin, int64_t count,
                           float* out) const {
  impl_->InitialValues(name, begin, count, out);
}
std::vector<std::string> Engine::ParameterNames() const { return impl_->ParameterNames(); }
std::vector<std::pair<std::string, Shape>> Engine::ModelParameters() const {
  return impl_->ModelParameters();
}
void Engine::ForEachModelParameter(const Fn& fn, bool trainable_only) {
  impl_->ForEachModelParameter(fn, trainable_only);
}
std::vector<Engine::ParamGroupUse> Engine::ParamGroupUses() const {
  return impl_->ParamGroupUses();
}
int64_t Engine::NumParameters() const { return impl_->NumParameters(); }
int64_t Engine::NumTrainableParameters() const { return impl_->NumTrainableParameters(); }
double Engine::TrainFlopsPerToken(int64_t seq_len) const {
  return impl_->TrainFlopsPerToken(seq_len);
}

void Engine::SaveState(checkpoint::ShardWriter& writer) { impl_->SaveState(writer); }
void Engine::LoadState(const checkpoint::ModelIndex& index, int64_t step) {
  impl_->LoadState(index, step);
}
nlohmann::json Engine::LossScalerState() const { return impl_->LossScalerState(); }
void Engine::RestoreLossScaler(const nlohmann::json& state) { impl_->RestoreLossScaler(state); }
void Engine::UseGemmPlan(const kernels::GemmPlan& plan) { impl_->UseGemmPlan(plan); }
const kernels::GemmPlan& Engine::gemm_plan() const { return impl_->gemm_plan(); }

int64_t Engine::step() const { return impl_->step(); }
int Engine::dp_rank() const { return impl_->dp_rank(); }
int Engine::dp_size() const { return impl_->dp_size(); }
comm::Communicator& Engine::dp() { return impl_->dp(); }
int Engine::pp_rank() const { return impl_->pp_rank(); }
int Engine::pp_size() const { return impl_->pp_size(); }
comm::Communicator& Engine::pp() { return impl_->pp(); }
int Engine::tp_rank() const { return impl_->tp_rank(); }
int Engine::tp_size() const { return impl_->tp_size(); }
const Config& Engine::config() const { return impl_->config(); }
Device Engine::device() const { return impl_->device(); }
MemoryTracker& Engine::memory() { return impl_->memory(); }
const MemoryTracker& Engine::device_memory() const { return impl_->device_memory(); }
const MemoryTracker& Engine::host_memory() const { return impl_->host_memory(); }
const MemoryTracker& Engine::pinned_memory() const { return impl_->pinned_memory(); }
int64_t Engine::PaddedParameters() const { return impl_->PaddedParameters(); }
int64_t Engine::swap_file_bytes() const { return impl_->swap_file_bytes(); }
kernels::Ops& Engine::ops() { return impl_->ops(); }
const std::vector<std::unique_ptr<nn::Layer>>& Engine::layers() const { return impl_->layers(); }

}  // namespace ztrain
