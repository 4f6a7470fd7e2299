// The engine's pipeline parallelism: choosing the stage's layers, the shape of its input, the
// weights tied across stages, and collecting the whole model from every stage. The stage's
// instruction list runs in the step executor (engine_step.cc, Note [One step executor]).
//
// Note [Pipeline in the engine]
// Every rank builds the whole model as layers (cheap: a layer declares its parameters and
// owns no storage) and pipeline::PartitionLayers cuts it into pp contiguous ranges; the
// engine keeps its stage's layers, the layers before them (only to know the shape of the
// stage's input) and the parameter specs of all layers (to name and shape what other stages
// hold). A step runs pipeline::MakeSchedule's list for the stage: a forward of micro-batch m
// takes the tokens (first stage) or the activation received from stage s-1, keeps each
// layer's context until the backward of m, and sends the stage's output to stage s+1; the
// last stage computes the per-token losses instead and starts the backward from
// loss_weight / numel, exactly as the single process does. Backward receives the gradient of
// the stage's output and sends the gradient of its input back. Sends are issued and left in
// flight (their buffers kept) and all are waited for before the gradients are reduced;
// receives wait at once, since the next instruction needs them. Activations move on the pp
// group with tag 2m (forward) and 2m+1 (backward).
//
// ZeRO works per stage on the stage's dp group as without a pipeline: gradients are reduced
// by bucket during the last backward of the list (stages 0 and 1) or during every backward
// (stages 2 and 3), and at stage 3 the gather plan follows the list's order of forwards and
// backwards.
//
// A weight used on two stages (GPT-2's token embedding, owned by the first layer, tied into
// the LM head on the last stage) is held by both (pipeline::SplitStages, Note [Weights tied
// across stages] in parallel/pipeline/stage_split.h): the later stage stores a copy under the
// owner's name, initialised from the same (seed, name, index), so both start equal. Both
// layers lay the weight out at offset 0 of their flat buffer and are padded to the same
// size, so a dp rank's shard covers the same elements of it on both stages. After the
// gradients are reduced, the two stages exchange their gradient of it (over the pp group)
// and both add the other's: a + b is b + a in floating point, so both hold the same sum,
// take the same AdamW step and stay bitwise equal. The gradient norm counts the copy once.
// Everything else a step reports (the loss, the norm) is summed over the pp group.
#include <algorithm>
#include <string>

#include "core/logging.h"
#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "parallel/pipeline/stage_split.h"

namespace ztrain {
namespace {

constexpr int kTieTag = 30000;  // above every activation tag 2m, 2m+1 of a step

}  // namespace

void EngineImpl::SelectStage(std::vector<std::unique_ptr<nn::Layer>> model) {
  pipeline_ = std::make_unique<pipeline::StageModel>(
      std::move(model), pp_->size(), pp_->rank(),
      pp_->size() == 1 ? pipeline::PartitionMethod::kUniform
                       : pipeline::ParsePartitionMethod(config_.pipeline_partition));
  layers_ = pipeline_->TakeLayers();
  if (pp_->size() > 1 && computes_) Log().info("pipeline: {}", pipeline_->Describe());
}

double EngineImpl::SumOverPipeline(double value) {
  if (pp_->size() == 1) return value;
  return static_cast<double>(AllReduceScalar(*pp_, static_cast<float>(value)));
}

void EngineImpl::SumStageTiedGradients() {
  for (const pipeline::StageTie& tie : pipeline_->split().ties) {
    LayerState& st = *states_[tie.layer];
    // The tie's elements within the reduced range (all of them at stage 0).
    const int64_t n = std::clamp<int64_t>(tie.elements - st.layout.opt_begin, 0, st.layout.opt_len);
    if (n == 0) continue;  // the same on the peer: its shard covers the same elements
    const Tensor mine = st.Reduced().Flat(0, {n});
    Buffer theirs(memory_.activations(), DType::kF32, mine.shape(), MemoryCategory::kCommunication);
    comm::WorkPtr sent = pp_->Send(mine, tie.peer, kTieTag);
    comm::WorkPtr got = pp_->Recv(theirs.AsTensor(DType::kF32, mine.shape()), tie.peer, kTieTag);
    WaitFor(*sent);
    WaitFor(*got);
    ops_->AddInPlace(mine, theirs.AsTensor(DType::kF32, mine.shape()));
  }
}

std::vector<std::pair<std::string, Shape>> EngineImpl::ModelParameters() const {
  return pipeline_->Parameters();
}

void EngineImpl::CheckParamGroups() const {
  std::vector<std::string> trainable, frozen;
  for (const nn::ParamSpec& s : pipeline_->OwnedSpecs()) {
    (s.trainable ? trainable : frozen).push_back(s.name);
  }
  param_groups_.CheckEveryGlobMatches(trainable, frozen);
}

std::vector<EngineImpl::ParamGroupUse> EngineImpl::ParamGroupUses() const {
  std::vector<ParamGroupUse> uses;
  for (size_t g = 0; g < param_groups_.size(); ++g) uses.push_back({param_groups_[g], 0, 0});
  for (const nn::ParamSpec& s : pipeline_->OwnedSpecs()) {
    const Shape full = nn::FullShape(s);
    ParamGroupUse& use = uses[param_groups_.Assign(s.name, full.size(), s.trainable)];
    ++use.tensors;
    use.elements += NumElements(full);
  }
  return uses;
}

void EngineImpl::ForEachModelParameter(
    const std::function<void(const std::string&, const Tensor&)>& fn, bool trainable_only) {
  const bool lead = dp_->rank() == 0 && tp_->rank() == 0;  // one pipeline sends, one writes
  const bool writer = lead && pp_->rank() == 0;
  const bool sender = lead && pp_->rank() > 0;
  ForEachFullParameter(
      [&](const std::string& name, const Tensor& value) {
        if (table_->Find(name).stage_copy) return;  // the owner's stage sends it
        if (writer) fn(name, value);
        if (!sender) return;
        if (!on_device()) {
          WaitFor(*pp_->Send(value, 0, 0));
          return;
        }
        Buffer sent(memory_.activations(), DType::kF32, value.shape(), MemoryCategory::kWorkspace);
        const Tensor view = sent.AsTensor(DType::kF32, value.shape());
        CopyIn(value.data<float>(), view);
        WaitFor(*pp_->Send(view, 0, 0));
      },
      trainable_only);
  if (!writer) return;
  // The later stages' parameters, stage by stage in model order.
  for (int s = 1; s < pp_->size(); ++s) {
    const auto b = static_cast<size_t>(pipeline_->split().bounds[static_cast<size_t>(s)]);
    const auto e = static_cast<size_t>(pipeline_->split().bounds[static_cast<size_t>(s) + 1]);
    for (size_t l = b; l < e; ++l) {
      for (const nn::ParamSpec& spec : pipeline_->specs()[l]) {
        if (!spec.tied_to.empty() || (trainable_only && !spec.trainable)) continue;
        const Shape shape = nn::FullShape(spec);
        Buffer value(memory_.activations(), DType::kF32, shape, MemoryCategory::kWorkspace);
        const Tensor view = value.AsTensor(DType::kF32, shape);
        WaitFor(*pp_->Recv(view, s, 0));
        if (!on_device()) {
          fn(spec.name, view);
          continue;
        }
        std::vector<float> host = ToHost(view);
        fn(spec.name, Tensor(host.data(), DType::kF32, shape));
      }
    }
  }
}

}  // namespace ztrain
