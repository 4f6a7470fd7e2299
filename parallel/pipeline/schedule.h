#pragma once
// Pipeline schedules as data (DESIGN.md "pipeline"): the instruction list each stage runs for
// one optimizer step, generated up front and testable without a model.
//
// A step runs `micro_batches` micro-batches (gradient_accumulation_steps) through `stages`
// stages. Stage s receives micro-batch m's activation from stage s-1 (the first stage loads the
// tokens instead), runs its forward, sends its output to stage s+1 (the last stage computes the
// loss instead); backward goes the other way with activation gradients. Every list ends with
// kReduceGrads then kOptimizerStep.
//   kGPipe  all forwards (0..m-1), then all backwards (0..m-1): stage s holds m micro-batches'
//           activations at the peak.
//   k1F1B   warm-up of min(p-s-1, m) forwards, then one forward and one backward in turn, then
//           the remaining backwards (PipeDream-Flush / Megatron's non-interleaved schedule):
//           stage s holds at most p-s micro-batches' activations.
// Each kForward of micro-batch m is preceded by kLoadMicroBatch(m) and, except on the first
// stage, kRecvActivation(m), and followed, except on the last stage, by kSendActivation(m).
// Each kBackward(m) is preceded, except on the last stage, by kRecvGrad(m) and followed,
// except on the first stage, by kSendGrad(m). Sends are asynchronous: the executor issues
// them and goes on, and waits for all of them before kReduceGrads.
#include <string>
#include <vector>

namespace ztrain::pipeline {

enum class ScheduleKind { kGPipe, k1F1B };

// "gpipe" / "1f1b" (config values), and back.
// Throws ztrain::Error naming the accepted values for any other name.
ScheduleKind ParseScheduleKind(const std::string& name);
const char* ScheduleKindName(ScheduleKind kind);

enum class OpType {
  kLoadMicroBatch,
  kRecvActivation,
  kForward,
  kSendActivation,
  kRecvGrad,
  kBackward,
  kSendGrad,
  kReduceGrads,
  kOptimizerStep,
};
const char* OpTypeName(OpType op);

struct Instruction {
  OpType op;
  int micro_batch = -1;  // -1 for kReduceGrads and kOptimizerStep
  bool operator==(const Instruction&) const = default;
};

// The instructions stage `stage` (0-based) of `stages` runs for one step of `micro_batches`.
// Throws ztrain::Error for stages < 1, stage outside [0, stages) or micro_batches < 1.
std::vector<Instruction> MakeSchedule(ScheduleKind kind, int stages, int stage, int micro_batches);

// "F0 F1 B0 ..." for messages and tests: forwards and backwards only, unless `all`, which adds
// the loads, receives, sends, kReduceGrads and kOptimizerStep
// ("Load0 RecvAct0 F0 SendAct0 RecvGrad0 B0 SendGrad0 ReduceGrads OptimizerStep").
std::string ScheduleToString(const std::vector<Instruction>& schedule, bool all = false);

// The most micro-batches whose forward ran and whose backward has not, at any point of the
// list: the activations the stage holds at its peak.
int PeakActivations(const std::vector<Instruction>& schedule);

// Runs every stage's list on a model of time: kForward takes `forward_time`, kBackward
// `backward_time`, everything else no time; a forward waits for the previous stage's forward
// of the same micro-batch, a backward for the next stage's backward of it; each stage runs its
// list in order, one instruction at a time. Used by the tests and bench/pipeline_bench.
struct Timeline {
  double makespan = 0.0;     // when the last stage's last instruction ends
  std::vector<double> busy;  // per stage: time spent in forward and backward
  // Per stage, per instruction of its list: start and end times.
  std::vector<std::vector<double>> start, end;
  // Idle share of the timeline: 1 - sum(busy) / (stages * makespan).
  double IdleFraction() const;
};
// Throws ztrain::Error naming the stuck instructions when the lists deadlock (a send without
// its matching receive, a cycle).
Timeline Simulate(ScheduleKind kind, int stages, int micro_batches, double forward_time = 1.0,
                  double backward_time = 2.0);

// The same model on explicit lists, lists[s] for stage s (hand-written or altered lists, in
// tests). A message is matched to receives in the order it was sent on its link, as p2p send
// and receive are. Besides deadlocks this throws ztrain::Error for a list the model cannot
// time: a send or receive toward a stage that does not exist, a receive whose oldest pending
// message is another micro-batch, a forward before its activation was received, a backward
// before its forward or its gradient, a send before the computation it sends.
Timeline Simulate(const std::vector<std::vector<Instruction>>& lists, double forward_time = 1.0,
                  double backward_time = 2.0);

}  // namespace ztrain::pipeline
