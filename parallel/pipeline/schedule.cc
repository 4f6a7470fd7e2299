// Pipeline schedules (schedule.h): the per-stage instruction lists of GPipe and 1F1B, and a
// discrete-event model that runs them, to measure the pipeline bubble and to catch lists that
// would hang or mismatch their messages before any rank runs them.
//
// Note [pipeline simulation]
// Each stage is a sequential process with its own clock; stages talk only through FIFO links,
// one per neighbour pair and direction (activations go up, gradients come down), matched in
// issue order as p2p send/recv are. A send appends (micro-batch, time) to its link and takes
// no time; a receive takes the link's oldest message and ends at max(own clock, send time):
// receives are where a stage waits. Links are unbounded and each has one reader, so the times
// do not depend on the order in which the stages are advanced (a Kahn process network): the
// simulator advances each stage as far as it can and sweeps until no stage moves. Any stage
// left with instructions then waits for a message that never comes: a deadlock.
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"

namespace ztrain::pipeline {
namespace {

// Appends a stage's instructions one forward or backward pass at a time, with the loads,
// receives and sends that go around it on this stage.
class ScheduleBuilder {
 public:
  ScheduleBuilder(int stages, int stage) : first_(stage == 0), last_(stage == stages - 1) {}

  void Forward(int micro_batch) {
    Add(OpType::kLoadMicroBatch, micro_batch);
    if (!first_) Add(OpType::kRecvActivation, micro_batch);
    Add(OpType::kForward, micro_batch);
    if (!last_) Add(OpType::kSendActivation, micro_batch);
  }

  void Backward(int micro_batch) {
    if (!last_) Add(OpType::kRecvGrad, micro_batch);
    Add(OpType::kBackward, micro_batch);
    if (!first_) Add(OpType::kSendGrad, micro_batch);
  }

  std::vector<Instruction> Finish() && {
    Add(OpType::kReduceGrads, -1);
    Add(OpType::kOptimizerStep, -1);
    return std::move(list_);
  }

 private:
  void Add(OpType op, int micro_batch) { list_.push_back({op, micro_batch}); }

  bool first_, last_;
  std::vector<Instruction> list_;
};

// "RecvGrad(3)", or "ReduceGrads" for the step-wide instructions.
std::string Describe(const Instruction& in) {
  if (in.micro_batch < 0) return OpTypeName(in.op);
  return detail::StrCat(OpTypeName(in.op), "(", in.micro_batch, ")");
}

// Per OpType, in declaration order: the name (OpTypeName) and the short token of
// ScheduleToString.
constexpr const char* kOpNames[] = {"LoadMicroBatch", "RecvActivation", "Forward",
                                    "SendActivation", "RecvGrad",       "Backward",
                                    "SendGrad",       "ReduceGrads",    "OptimizerStep"};
constexpr const char* kOpTokens[] = {"Load", "RecvAct",  "F",           "SendAct",      "RecvGrad",
                                     "B",    "SendGrad", "ReduceGrads", "OptimizerStep"};
constexpr size_t kOpCount = static_cast<size_t>(OpType::kOptimizerStep) + 1;
static_assert(std::size(kOpNames) == kOpCount && std::size(kOpTokens) == kOpCount);

std::string Token(const Instruction& in) {
  const char* name = kOpTokens[static_cast<size_t>(in.op)];
  return in.micro_batch < 0 ? name : detail::StrCat(name, in.micro_batch);
}

// The stage a send or receive on `stage` talks to (it may not exist); none for other ops.
std::optional<int> Peer(OpType op, int stage) {
  switch (op) {
    case OpType::kRecvActivation:
    case OpType::kSendGrad:
      return stage - 1;
    case OpType::kSendActivation:
    case OpType::kRecvGrad:
      return stage + 1;
    default:
      return std::nullopt;
  }
}

// What must already have run on the same stage, for the same micro-batch, before `op` can:
// without it the model's dependencies (a forward waits for the previous stage's forward, a
// backward for the next stage's backward) would not hold.
std::vector<OpType> Prerequisites(OpType op, bool first, bool last) {
  switch (op) {
    case OpType::kForward:
      if (first) return {};
      return {OpType::kRecvActivation};
    case OpType::kBackward:
      if (last) return {OpType::kForward};
      return {OpType::kForward, OpType::kRecvGrad};
    case OpType::kSendActivation:
      return {OpType::kForward};
    case OpType::kSendGrad:
      return {OpType::kBackward};
    default:
      return {};
  }
}

// Runs the lists on the model of Note [pipeline simulation].
class Simulator {
 public:
  Simulator(const std::vector<std::vector<Instruction>>& lists, double forward_time,
            double backward_time)
      : lists_(lists),
        forward_time_(forward_time),
        backward_time_(backward_time),
        stages_(static_cast<int>(lists.size())),
        next_(lists.size(), 0),
        clock_(lists.size(), 0.0),
        done_(lists.size()),
        activations_(lists.size()),
        grads_(lists.size()) {
    timeline_.busy.assign(lists.size(), 0.0);
    for (const auto& list : lists) {
      timeline_.start.emplace_back(list.size(), 0.0);
      timeline_.end.emplace_back(list.size(), 0.0);
    }
  }

  Timeline Run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int s = 0; s < stages_; ++s) {
        while (next_[s] < lists_[s].size() && Step(s)) moved = true;
      }
    }
    CheckAllRan();
    CheckAllReceived();
    return std::move(timeline_);
  }

 private:
  struct Message {
    int micro_batch;
    double time;
  };

  // The link that carries `op` (a send or receive) into stage `to`.
  std::deque<Message>& Link(OpType op, int to) {
    const bool activation = op == OpType::kSendActivation || op == OpType::kRecvActivation;
    return (activation ? activations_ : grads_)[to];
  }

  // Runs stage s's next instruction; false when it is a receive with no message yet.
  bool Step(int s) {
    const size_t i = next_[s];
    const Instruction& in = lists_[s][i];
    const int peer = Peer(in.op, s).value_or(s);
    ZTRAIN_CHECK(peer >= 0 && peer < stages_, "pipeline schedule: stage ", s, " has ", Describe(in),
                 " but there is no stage ", peer, " (", stages_,
                 " stages); sends and receives go to neighbouring stages only");
    CheckPrerequisites(s, in);
    double end = clock_[s];
    switch (in.op) {
      case OpType::kRecvActivation:
      case OpType::kRecvGrad: {
        std::deque<Message>& link = Link(in.op, s);
        if (link.empty()) return false;
        ZTRAIN_CHECK(link.front().micro_batch == in.micro_batch, "pipeline schedule: stage ", s,
                     " runs ", Describe(in), " but the oldest message from stage ", peer,
                     " is micro-batch ", link.front().micro_batch,
                     "; a stage must receive in the order its neighbour sends");
        end = std::max(end, link.front().time);
        link.pop_front();
        break;
      }
      case OpType::kSendActivation:
      case OpType::kSendGrad:
        Link(in.op, peer).push_back({in.micro_batch, clock_[s]});
        break;
      case OpType::kForward:
        end += forward_time_;
        timeline_.busy[s] += forward_time_;
        break;
      case OpType::kBackward:
        end += backward_time_;
        timeline_.busy[s] += backward_time_;
        break;
      default:
        break;
    }
    timeline_.start[s][i] = clock_[s];
    timeline_.end[s][i] = end;
    timeline_.makespan = std::max(timeline_.makespan, end);
    clock_[s] = end;
    done_[s].insert({in.op, in.micro_batch});
    ++next_[s];
    return true;
  }

  void CheckPrerequisites(int s, const Instruction& in) const {
    for (OpType before : Prerequisites(in.op, s == 0, s == stages_ - 1)) {
      ZTRAIN_CHECK(done_[s].count({before, in.micro_batch}) > 0, "pipeline schedule: stage ", s,
                   " runs ", Describe(in), " before ", Describe({before, in.micro_batch}), "; put ",
                   OpTypeName(before), " earlier in the list");
    }
  }

  void CheckAllRan() const {
    std::string stuck;
    for (int s = 0; s < stages_; ++s) {
      if (next_[s] == lists_[s].size()) continue;
      const Instruction& in = lists_[s][next_[s]];
      stuck += detail::StrCat(stuck.empty() ? "" : ", ", "stage ", s, " waits at ", Describe(in),
                              " (instruction ", next_[s], ") for stage ", *Peer(in.op, s));
    }
    ZTRAIN_CHECK(stuck.empty(), "pipeline schedule deadlocks: ", stuck,
                 "; every receive needs its matching send earlier in the neighbour's list");
  }

  void CheckAllReceived() const {
    std::string unreceived;
    auto list = [&](const std::deque<Message>& link, OpType send, int from) {
      for (const Message& msg : link) {
        unreceived += detail::StrCat(unreceived.empty() ? "" : ", ", "stage ", from, "'s ",
                                     Describe({send, msg.micro_batch}));
      }
    };
    for (int to = 0; to < stages_; ++to) {
      list(activations_[to], OpType::kSendActivation, to - 1);
      list(grads_[to], OpType::kSendGrad, to + 1);
    }
    ZTRAIN_CHECK(unreceived.empty(), "pipeline schedule: ", unreceived,
                 " never received; every send needs a matching receive on the other stage");
  }

  const std::vector<std::vector<Instruction>>& lists_;
  const double forward_time_, backward_time_;
  const int stages_;
  std::vector<size_t> next_;   // per stage: index of the next instruction to run
  std::vector<double> clock_;  // per stage: when its last instruction ended
  std::vector<std::set<std::pair<OpType, int>>> done_;  // per stage: what it has run
  // Messages in flight into stage s: activations from s-1, gradients from s+1.
  std::vector<std::deque<Message>> activations_, grads_;
  Timeline timeline_;
};

}  // namespace

ScheduleKind ParseScheduleKind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  throw Error(
      detail::StrCat("unknown pipeline schedule \"", name, "\"; use \"gpipe\" or \"1f1b\""));
}

const char* ScheduleKindName(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe ? "gpipe" : "1f1b";
}

const char* OpTypeName(OpType op) { return kOpNames[static_cast<size_t>(op)]; }

std::vector<Instruction> MakeSchedule(ScheduleKind kind, int stages, int stage, int micro_batches) {
  ZTRAIN_CHECK(stages >= 1, "pipeline schedule: stages is ", stages, "; it must be at least 1");
  ZTRAIN_CHECK(stage >= 0 && stage < stages, "pipeline schedule: stage ", stage, " is outside [0, ",
               stages, "); stages are numbered from 0");
  ZTRAIN_CHECK(micro_batches >= 1, "pipeline schedule: ", micro_batches,
               " micro-batches; gradient_accumulation_steps must be at least 1");
  const int m = micro_batches;
  ScheduleBuilder builder(stages, stage);
  if (kind == ScheduleKind::kGPipe) {
    for (int i = 0; i < m; ++i) builder.Forward(i);
    for (int i = 0; i < m; ++i) builder.Backward(i);
  } else {
    // Stage s runs ahead by the p-s-1 micro-batches that are still on their way to the last
    // stage, then each backward frees the activation the next forward needs.
    const int warmup = std::min(stages - stage - 1, m);
    for (int i = 0; i < warmup; ++i) builder.Forward(i);
    for (int i = 0; i + warmup < m; ++i) {
      builder.Forward(i + warmup);
      builder.Backward(i);
    }
    for (int i = m - warmup; i < m; ++i) builder.Backward(i);
  }
  return std::move(builder).Finish();
}

std::string ScheduleToString(const std::vector<Instruction>& schedule, bool all) {
  std::string out;
  for (const Instruction& in : schedule) {
    if (!all && in.op != OpType::kForward && in.op != OpType::kBackward) continue;
    if (!out.empty()) out += ' ';
    out += Token(in);
  }
  return out;
}

int PeakActivations(const std::vector<Instruction>& schedule) {
  int held = 0, peak = 0;
  for (const Instruction& in : schedule) {
    if (in.op == OpType::kForward) peak = std::max(peak, ++held);
    if (in.op == OpType::kBackward) --held;
  }
  return peak;
}

double Timeline::IdleFraction() const {
  if (busy.empty() || makespan <= 0.0) return 0.0;
  double total = 0.0;
  for (double b : busy) total += b;
  return 1.0 - total / (static_cast<double>(busy.size()) * makespan);
}

Timeline Simulate(const std::vector<std::vector<Instruction>>& lists, double forward_time,
                  double backward_time) {
  ZTRAIN_CHECK(!lists.empty(), "pipeline simulation: no stages; give one list per stage");
  ZTRAIN_CHECK(forward_time >= 0.0 && backward_time >= 0.0, "pipeline simulation: forward_time ",
               forward_time, " and backward_time ", backward_time, " must not be negative");
  return Simulator(lists, forward_time, backward_time).Run();
}

Timeline Simulate(ScheduleKind kind, int stages, int micro_batches, double forward_time,
                  double backward_time) {
  ZTRAIN_CHECK(stages >= 1, "pipeline simulation: stages is ", stages, "; it must be at least 1");
  std::vector<std::vector<Instruction>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(MakeSchedule(kind, stages, s, micro_batches));
  return Simulate(lists, forward_time, backward_time);
}

}  // namespace ztrain::pipeline
