// The step executor: every train step runs a schedule, every evaluation the forward of one
// micro-batch through the stages, both over the same layer loops (RunForward, RunBackward).
//
// Note [One step executor]
// TrainStep runs pipeline::MakeSchedule's instruction list for this rank's pipeline stage. A
// model without pipeline parallelism is a pipeline of one stage: its list is 1F1B's (each
// forward followed by its backward, so one micro-batch's activations live at a time; GPipe
// would keep them all) with no sends or receives, and it is the same arithmetic in the same
// order as a loop over the micro-batches. The instructions are executed by one switch
// (RunInstruction) over the step's state (ScheduleRun): receives wait at once, sends are left
// in flight until ReduceGrads, the last stage turns its per-token losses into the backward's
// start, the last backward launches the gradient reductions, and OptimizerStep finishes the
// step. EvalLoss is a forward of one micro-batch through the stages with no backward after it:
// each layer's context and input go as soon as it ran. The ZeRO parts run as hooks on the
// layer loops: the gatherer around each layer's forward and backward (BeforeLayer,
// AfterLayer; recomputation runs inside the backward's position), the reducer after each
// layer's backward (Ready) and at the end of the last (Finish), and activation checkpointing
// after a checkpointed layer's forward (KeepInput) and before its backward (RestoreInput,
// Recompute).
#include <algorithm>
#include <array>
#include <chrono>

#include "engine/activation_checkpointing.h"
#include "engine/engine_impl.h"
#include "engine/engine_state.h"
#include "parallel/pipeline/schedule.h"

namespace ztrain {
namespace {

int ActivationTag(int micro_batch) { return 2 * micro_batch; }
int GradTag(int micro_batch) { return 2 * micro_batch + 1; }

double SumOf(const std::vector<float>& values) {
  double sum = 0.0;
  for (const float v : values) sum += v;
  return sum;
}

double MeanOf(const std::vector<float>& values) {
  return SumOf(values) / static_cast<double>(values.size());
}

// The targets of a host micro-batch that take a loss (all but kIgnoreTarget).
int64_t RealTargets(const nn::MicroBatch& mb) {
  const int32_t* t = mb.targets.data<int32_t>();
  return mb.targets.numel() - std::count(t, t + mb.targets.numel(), kIgnoreTarget);
}

// The divisor of one micro-batch's mean loss: its real targets, or 1 when it has none (its
// losses are then all 0).
int64_t LossDivisor(const nn::MicroBatch& mb, bool computes) {
  return computes ? std::max<int64_t>(RealTargets(mb), 1) : mb.targets.numel();
}

// Tokens that start a document in a host micro-batch (position 0), or 0 without positions.
int64_t Documents(const nn::MicroBatch& mb) {
  if (!mb.positions.defined()) return 0;
  const int32_t* p = mb.positions.data<int32_t>();
  return std::count(p, p + mb.positions.numel(), 0);
}

}  // namespace

// One train step's state while its schedule runs.
struct EngineImpl::ScheduleRun {
  std::span<const nn::MicroBatch> micro_batches;
  float weight = 1.0f;                 // the loss weight: 1 / (micro-batches x dp)
  // With ignored targets (Note [Loss over real targets]): the global batch's real targets,
  // which every loss is divided by; 0 when every target is real (each micro-batch's mean).
  int64_t real_targets = 0;
  size_t last_backward = 0;            // the instruction whose backward launches the reductions
  std::vector<MicroBatchRun> runs;     // per micro-batch, from its forward to its backward
  std::vector<Buffer> received_grads;  // the gradient of the stage's output, per micro-batch
  std::vector<Buffer> din;             // the gradient of the stage's input, until sent
  struct Sent {
    Buffer buffer;
    comm::WorkPtr work;
  };
  std::vector<Sent> sends;  // in flight
  double loss_sum = 0.0;    // the per-micro-batch mean losses, or their sums (real_targets)
  StepStats stats;
};

StepStats EngineImpl::TrainStep(std::span<const nn::MicroBatch> host_batches) {
  ZTRAIN_CHECK(!host_batches.empty(), "TrainStep needs at least one micro-batch");
  ScheduleRun s;
  if (config_.data.packed_documents) {
    const TargetCounts counts = CountOverDp(host_batches);
    s.real_targets = counts.targets;
    s.stats.documents = counts.documents;
  }
  const StagedBatches staged = StageBatches(host_batches);
  const auto start = std::chrono::steady_clock::now();
  const double wait_before = comm_wait_seconds_;
  const double swap_before = SwapWaitSeconds();
  const int m = static_cast<int>(staged.batches.size());
  const pipeline::ScheduleKind kind = pp_->size() == 1
                                          ? pipeline::ScheduleKind::k1F1B
                                          : pipeline::ParseScheduleKind(config_.pipeline_schedule);
  const std::vector<pipeline::Instruction> list =
      pipeline::MakeSchedule(kind, pp_->size(), pp_->rank(), m);
  s.micro_batches = staged.batches;
  s.weight = 1.0f / static_cast<float>(m * dp_->size());
  s.runs.resize(static_cast<size_t>(m));
  s.received_grads.resize(static_cast<size_t>(m));
  s.din.resize(static_cast<size_t>(m));
  std::vector<bool> phases;  // the order of forwards and backwards, for the stage 3 plan
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].op == pipeline::OpType::kForward) phases.push_back(false);
    if (list[i].op == pipeline::OpType::kBackward) {
      phases.push_back(true);
      s.last_backward = i;
    }
  }
  ZeroGrad();
  if (gatherer_) gatherer_->Start(phases);
  for (size_t i = 0; i < list.size(); ++i) {
    // Sends that finished free their buffers (Wait reports a failure).
    std::erase_if(s.sends, [&](ScheduleRun::Sent& sent) {
      if (!sent.work->Done()) return false;
      WaitFor(*sent.work);
      return true;
    });
    RunInstruction(list[i], i, s);
  }
  StepStats& stats = s.stats;
  for (const nn::MicroBatch& mb : s.micro_batches) stats.tokens += mb.tokens.numel() * dp_->size();
  stats.seconds = SecondsBetween(start, std::chrono::steady_clock::now());
  stats.comm_wait_seconds = comm_wait_seconds_ - wait_before;
  stats.swap_wait_seconds = SwapWaitSeconds() - swap_before;
  return stats;
}

void EngineImpl::RunInstruction(const pipeline::Instruction& in, size_t index, ScheduleRun& s) {
  const int stages = pp_->size(), stage = pp_->rank();
  const auto mb_index = static_cast<size_t>(std::max(in.micro_batch, 0));
  const nn::MicroBatch& mb = s.micro_batches[mb_index];
  MicroBatchRun& run = s.runs[mb_index];
  switch (in.op) {
    case pipeline::OpType::kLoadMicroBatch:  // the caller gave every micro-batch
      break;
    case pipeline::OpType::kRecvActivation:
    case pipeline::OpType::kSendActivation:
    case pipeline::OpType::kRecvGrad:
    case pipeline::OpType::kSendGrad:
      Communicate(in, s);
      break;
    case pipeline::OpType::kForward:
      run.dropout = DropoutFor(mb, static_cast<int>(mb_index));
      RunForward(mb,
                 stage == 0
                     ? mb.tokens
                     : run.received.AsTensor(act_dtype_, pipeline_->InputShape(mb.tokens.shape())),
                 run, &s.stats);
      if (stage == stages - 1) {
        const std::vector<float> losses = ToHost(run.out_views.back());
        s.loss_sum += s.real_targets > 0 ? SumOf(losses) : MeanOf(losses);
      }
      break;
    case pipeline::OpType::kBackward: {
      const Shape& shape = run.out_views.back().shape();
      Buffer dout = stage < stages - 1   ? std::move(s.received_grads[mb_index])
                    : s.real_targets > 0 ? LossGradient(shape, 1.0f, s.real_targets)
                                         : LossGradient(shape, s.weight, NumElements(shape));
      s.din[mb_index] =
          RunBackward(mb, std::move(dout), run, /*reduce=*/index == s.last_backward, &s.stats);
      run = MicroBatchRun();  // the micro-batch's activations are done with
      break;
    }
    case pipeline::OpType::kReduceGrads:
      for (ScheduleRun::Sent& sent : s.sends) WaitFor(*sent.work);
      s.sends.clear();
      SumStageTiedGradients();
      break;
    case pipeline::OpType::kOptimizerStep: {
      const double m = static_cast<double>(s.micro_batches.size());
      s.stats.loss = s.real_targets > 0 ? MeanOverDp(SumOverPipeline(s.loss_sum)) * dp_->size() /
                                              static_cast<double>(s.real_targets)
                                        : MeanOverDp(SumOverPipeline(s.loss_sum / m));
      const auto optimizer_start = std::chrono::steady_clock::now();
      FinishStep(s.stats);
      s.stats.optimizer_seconds = SecondsBetween(optimizer_start, std::chrono::steady_clock::now());
      break;
    }
  }
}

// The instructions that move activations and their gradients between neighbouring stages:
// receives wait at once (the next instruction needs them), sends stay in flight with their
// buffers until they finish or ReduceGrads.
void EngineImpl::Communicate(const pipeline::Instruction& in, ScheduleRun& s) {
  const int stage = pp_->rank();
  const auto mb_index = static_cast<size_t>(in.micro_batch);
  const nn::MicroBatch& mb = s.micro_batches[mb_index];
  MicroBatchRun& run = s.runs[mb_index];
  if (in.op == pipeline::OpType::kRecvActivation) {
    const Shape shape = pipeline_->InputShape(mb.tokens.shape());
    run.received = Buffer(memory_.activations(), act_dtype_, shape, MemoryCategory::kActivations);
    WaitFor(*pp_->Recv(run.received.AsTensor(act_dtype_, shape), stage - 1,
                       ActivationTag(in.micro_batch)));
  } else if (in.op == pipeline::OpType::kSendActivation) {
    // The stage's output is not needed by its own backward: it moves into the send.
    Buffer out = std::move(run.outputs.back());
    comm::WorkPtr w = pp_->Send(out.AsTensor(act_dtype_, run.out_views.back().shape()),
                                stage + 1, ActivationTag(in.micro_batch));
    s.sends.push_back({std::move(out), std::move(w)});
  } else if (in.op == pipeline::OpType::kRecvGrad) {
    const Shape shape = run.out_views.back().shape();
    Buffer& g = s.received_grads[mb_index];
    g = Buffer(memory_.activations(), act_dtype_, shape, MemoryCategory::kActivations);
    WaitFor(*pp_->Recv(g.AsTensor(act_dtype_, shape), stage + 1, GradTag(in.micro_batch)));
  } else {  // kSendGrad
    Buffer g = std::move(s.din[mb_index]);
    comm::WorkPtr w = pp_->Send(g.AsTensor(act_dtype_, pipeline_->InputShape(mb.tokens.shape())),
                                stage - 1, GradTag(in.micro_batch));
    s.sends.push_back({std::move(g), std::move(w)});
  }
}

double EngineImpl::EvalLoss(const nn::MicroBatch& host_mb) {
  const StagedBatches staged = StageBatches({&host_mb, 1});
  const nn::MicroBatch& mb = staged.batches[0];
  const int stages = pp_->size(), stage = pp_->rank();
  if (gatherer_) gatherer_->Start(1, /*backward=*/false);
  MicroBatchRun run;
  run.backward = false;
  Tensor input = mb.tokens;
  if (stage > 0) {
    const Shape shape = pipeline_->InputShape(mb.tokens.shape());
    run.received = Buffer(memory_.activations(), act_dtype_, shape, MemoryCategory::kActivations);
    input = run.received.AsTensor(act_dtype_, shape);
    WaitFor(*pp_->Recv(input, stage - 1, ActivationTag(0)));
  }
  RunForward(mb, input, run, nullptr);
  if (gatherer_) {  // the gathered buffers are gone: no layer may keep a view
    for (size_t l = 0; l < layers_.size(); ++l) BindLayer(l);
  }
  double loss = 0.0;
  if (stage < stages - 1) {
    WaitFor(*pp_->Send(run.out_views.back(), stage + 1, ActivationTag(0)));
  } else if (cp_ == nullptr) {
    loss =
        SumOf(ToHost(run.out_views.back())) / static_cast<double>(LossDivisor(host_mb, computes_));
  } else {  // the whole sequences' mean: each piece holds its own targets (packed: unequal)
    const float sum = AllReduceScalar(*cp_, static_cast<float>(SumOf(ToHost(run.out_views.back()))),
                                      comm::ReduceOp::kSum);
    const float count = AllReduceScalar(*cp_, static_cast<float>(LossDivisor(host_mb, computes_)),
                                        comm::ReduceOp::kSum);
    loss = static_cast<double>(sum) / static_cast<double>(count);
  }
  return SumOverPipeline(loss);
}

// A building block for custom loops (one pipeline stage only): one micro-batch's forward and
// backward, the gradients accumulated without reduction.
double EngineImpl::ForwardBackward(const nn::MicroBatch& host_mb, float loss_weight,
                                   StepStats* stats) {
  ZTRAIN_CHECK(pp_->size() == 1,
               "ForwardBackward runs the whole model; a pipeline stage runs "
               "its part inside TrainStep");
  const StagedBatches staged = StageBatches({&host_mb, 1});
  const nn::MicroBatch& mb = staged.batches[0];
  if (gatherer_) gatherer_->Start(1, /*backward=*/true);
  const double wait_before = comm_wait_seconds_;
  MicroBatchRun run;
  run.dropout = DropoutFor(mb, 0);
  RunForward(mb, mb.tokens, run, stats);
  const Tensor losses = run.out_views.back();
  const int64_t real = LossDivisor(host_mb, computes_);
  const double loss = SumOf(ToHost(losses)) / static_cast<double>(real);
  RunBackward(mb, LossGradient(losses.shape(), loss_weight, real), run, /*reduce=*/false, stats);
  if (stats) stats->comm_wait_seconds += comm_wait_seconds_ - wait_before;
  return loss;
}

// Note [Loss over real targets]: targets equal to kIgnoreTarget (a packed document's
// first token, Note [Packed documents]) take no loss. The step's loss is then the sum of the
// global batch's losses over its real targets, counted across every micro-batch and dp rank,
// as transformers does since its gradient-accumulation fix (num_items_in_batch): a mean of
// per-micro-batch means would weigh a token by how full its micro-batch is, and differ
// between layouts. The count is one all-reduce of two int32 over dp before the first
// forward (the micro-batches are on every stage and tp rank already); without packed
// documents every target is real and each micro-batch's mean is weighted 1 / (m x dp), with
// no collective. ForwardBackward and EvalLoss divide by their micro-batch's real targets.
EngineImpl::TargetCounts EngineImpl::CountOverDp(std::span<const nn::MicroBatch> micro_batches) {
  std::array<int32_t, 2> counts{0, 0};
  for (const nn::MicroBatch& mb : micro_batches) {
    const int64_t targets = computes_ ? RealTargets(mb) : mb.targets.numel();
    const int64_t documents = computes_ ? Documents(mb) : 0;
    counts[0] += static_cast<int32_t>(targets);
    counts[1] += static_cast<int32_t>(documents);
  }
  if (dp_->size() > 1) {
    const Tensor host(counts.data(), DType::kI32, {2});
    if (!on_device()) {
      WaitFor(*dp_->AllReduce(host));
    } else {
      Buffer b(memory_.activations(), DType::kI32, {2}, MemoryCategory::kCommunication);
      const Tensor t = b.AsTensor(DType::kI32, {2});
      ops_->Copy(host, t);
      WaitFor(*dp_->AllReduce(t));
      ops_->Copy(t, host);
      ops_->Synchronize();
    }
  }
  return {counts[0], counts[1]};
}

Buffer EngineImpl::LossGradient(const Shape& shape, float loss_weight, int64_t count) {
  Buffer dout(memory_.activations(), DType::kF32, shape, MemoryCategory::kActivations);
  if (!computes_) return dout;
  const int64_t n = NumElements(shape);
  // fp16: the loss is multiplied by the loss scale (Note [Mixed precision in the engine]).
  // An ignored target's loss has no gradient whatever its entry here (the loss op zeroes it).
  const float scale = scaler_ ? static_cast<float>(scaler_->scale()) : 1.0f;
  const std::vector<float> d(static_cast<size_t>(n),
                             scale * loss_weight / static_cast<float>(count));
  CopyIn(d.data(), dout.AsTensor(DType::kF32, shape));
  ops_->Synchronize();  // before `d` goes
  return dout;
}

void EngineImpl::RunForward(const nn::MicroBatch& mb, const Tensor& input, MicroBatchRun& run,
                            StepStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const size_t n_layers = layers_.size();
  run.input = input;
  run.ctx.reserve(n_layers);
  // outputs[i] is layer i's output, kept until layer i+1's backward has used it.
  run.outputs.resize(n_layers);
  run.out_views.resize(n_layers);
  Tensor x = input;
  for (size_t i = 0; i < n_layers; ++i) {
    run.ctx.emplace_back(*ops_, memory_.activations(), act_dtype_);
    if (run.dropout) run.ctx.back().set_dropout(*run.dropout);
    const Shape shape = layers_[i]->OutputShape(x.shape());
    const DType dtype = layers_[i]->OutputDType(act_dtype_);
    run.outputs[i] = Buffer(memory_.activations(), dtype, shape, MemoryCategory::kActivations);
    run.out_views[i] = run.outputs[i].AsTensor(dtype, shape);
    if (gatherer_) {
      gatherer_->BeforeLayer(i);
      BindLayer(i);
    }
    layers_[i]->Forward(mb, x, run.out_views[i], run.ctx[i]);
    if (gatherer_) gatherer_->AfterLayer();
    if (!run.backward) {  // evaluation: the layer's context and its input are done with
      if (i > 0) run.outputs[i - 1].Reset();
      run.ctx[i].Release();
    } else if (checkpointing_->checkpointed(i)) {  // only its input stays
      run.ctx[i].Release();
      if (i > 0 && checkpointing_->moves_inputs()) {
        run.kept_inputs.resize(std::max(run.kept_inputs.size(), i));
        checkpointing_->KeepInput(run.out_views[i - 1], run.outputs[i - 1], run.kept_inputs[i - 1]);
      }
    }
    x = run.out_views[i];
  }
  if (stats) stats->forward_seconds += SecondsBetween(start, std::chrono::steady_clock::now());
}

Buffer EngineImpl::RunBackward(const nn::MicroBatch& mb, Buffer dout, MicroBatchRun& run,
                               bool reduce, StepStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const size_t n_layers = layers_.size();
  // Stages 2 and 3 reduce every micro-batch (Note [ZeRO in the engine]).
  reduce = reduce || zero_.shard_gradients;
  ZTRAIN_ASSERT(!optimizer_->any_pending(),
                "a backward with optimizer steps pending (its forward gathers every "
                "trained layer)");
  if (zero_.shard_gradients) {
    for (size_t l = 0; l < n_layers; ++l) {
      if (table_->layer(l).tie_owner) AllocateFullGradients(l);
    }
  }
  for (size_t i = n_layers; i-- > 0;) {
    if (i > 0 && run.kept_inputs.size() > i - 1 && run.kept_inputs[i - 1].data() != nullptr) {
      // A checkpointed block's input kept in host memory or in parts.
      run.out_views[i - 1] = checkpointing_->RestoreInput(run.kept_inputs[i - 1],
                                                          run.out_views[i - 1], run.outputs[i - 1]);
    }
    const Tensor layer_in = i == 0 ? run.input : run.out_views[i - 1];
    if (gatherer_) gatherer_->BeforeLayer(i);
    if (zero_.shard_gradients) {
      AllocateFullGradients(i);
      BindLayer(i);
    }
    // The model's first layer takes token ids: it has no input gradient.
    Buffer din;
    Tensor din_view;
    if (i > 0 || pp_->rank() > 0) {
      din = Buffer(memory_.activations(), layer_in.dtype(), layer_in.shape(),
                   MemoryCategory::kActivations);
      din_view = din.AsTensor(layer_in.dtype(), layer_in.shape());
    }
    const Tensor& out = run.out_views[i];
    if (checkpointing_->checkpointed(i)) {
      checkpointing_->Recompute(*layers_[i], mb, layer_in, out, run.ctx[i]);
    }
    layers_[i]->Backward(mb, layer_in, dout.AsTensor(out.dtype(), out.shape()), din_view,
                         run.ctx[i]);
    if (gatherer_) gatherer_->AfterLayer();
    if (reduce) reducer_->Ready(i);
    run.ctx[i].Release();
    run.outputs[i].Reset();
    dout = std::move(din);
  }
  if (reduce) reducer_->Finish();
  if (zero_.shard_gradients) {
    // The full gradient (and gathered parameter) buffers are gone: no layer may keep a view.
    for (size_t l = 0; l < n_layers; ++l) BindLayer(l);
  }
  if (stats) stats->backward_seconds += SecondsBetween(start, std::chrono::steady_clock::now());
  return dout;
}

double EngineImpl::SwapWaitSeconds() const {
  return held_->wait_seconds() + moments_->wait_seconds();
}

}  // namespace ztrain
