// Pipeline schedules: every stage's list runs each micro-batch forward then backward once,
// sends and receives pair up across neighbours in order, 1F1B bounds the activations a stage
// holds, the simulated bubble matches (p-1)/(m+p-1), and broken lists are refused.
#include "parallel/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace ztrain::pipeline {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B};

std::vector<std::vector<Instruction>> AllStages(ScheduleKind kind, int stages, int micro_batches) {
  std::vector<std::vector<Instruction>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(MakeSchedule(kind, stages, s, micro_batches));
  return lists;
}

// The micro-batches of `op` instructions, in list order.
std::vector<int> MicroBatchesOf(const std::vector<Instruction>& list, OpType op) {
  std::vector<int> out;
  for (const Instruction& in : list) {
    if (in.op == op) out.push_back(in.micro_batch);
  }
  return out;
}

// Position of `in` in the list, or -1.
int IndexOf(const std::vector<Instruction>& list, Instruction in) {
  auto it = std::find(list.begin(), list.end(), in);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

// The message of the ztrain::Error that `fn` throws, or "" when it throws none.
std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Calls `check(kind, stages, micro_batches)` over a grid that includes p = 1, m = 1, m < p.
void ForEachShape(const std::function<void(ScheduleKind, int, int)>& check) {
  for (ScheduleKind kind : kKinds) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE(testing::Message() << ScheduleKindName(kind) << " p=" << p << " m=" << m);
        check(kind, p, m);
      }
    }
  }
}

TEST(PipelineScheduleTest, EveryMicroBatchRunsForwardThenBackwardOnce) {
  ForEachShape([](ScheduleKind kind, int p, int m) {
    for (int s = 0; s < p; ++s) {
      const std::vector<Instruction> list = MakeSchedule(kind, p, s, m);
      std::vector<int> forwards = MicroBatchesOf(list, OpType::kForward);
      std::vector<int> backwards = MicroBatchesOf(list, OpType::kBackward);
      std::sort(forwards.begin(), forwards.end());
      std::sort(backwards.begin(), backwards.end());
      std::vector<int> all(m);
      for (int i = 0; i < m; ++i) all[i] = i;
      EXPECT_EQ(forwards, all) << "stage " << s;
      EXPECT_EQ(backwards, all) << "stage " << s;
      for (int i = 0; i < m; ++i) {
        EXPECT_LT(IndexOf(list, {OpType::kForward, i}), IndexOf(list, {OpType::kBackward, i}))
            << "stage " << s << " micro-batch " << i;
      }
      ASSERT_GE(list.size(), 2u);
      EXPECT_EQ(list[list.size() - 2], (Instruction{OpType::kReduceGrads, -1}));
      EXPECT_EQ(list.back(), (Instruction{OpType::kOptimizerStep, -1}));
      EXPECT_EQ(MicroBatchesOf(list, OpType::kReduceGrads).size(), 1u);
      EXPECT_EQ(MicroBatchesOf(list, OpType::kOptimizerStep).size(), 1u);
    }
  });
}

TEST(PipelineScheduleTest, ComputeIsWrappedInLoadsReceivesAndSends) {
  ForEachShape([](ScheduleKind kind, int p, int m) {
    for (int s = 0; s < p; ++s) {
      const bool first = s == 0, last = s == p - 1;
      const std::vector<Instruction> list = MakeSchedule(kind, p, s, m);
      // Every instruction is one that belongs next to a forward or backward, or the last two.
      size_t wrapped = 2;
      for (size_t i = 0; i < list.size(); ++i) {
        const int mb = list[i].micro_batch;
        if (list[i].op == OpType::kForward) {
          size_t before = i;
          if (!first) {
            EXPECT_EQ(list[--before], (Instruction{OpType::kRecvActivation, mb}));
          }
          EXPECT_EQ(list[--before], (Instruction{OpType::kLoadMicroBatch, mb}));
          if (!last) {
            EXPECT_EQ(list[i + 1], (Instruction{OpType::kSendActivation, mb}));
          }
          wrapped += 2 + !first + !last;
        }
        if (list[i].op == OpType::kBackward) {
          if (!last) {
            EXPECT_EQ(list[i - 1], (Instruction{OpType::kRecvGrad, mb}));
          }
          if (!first) {
            EXPECT_EQ(list[i + 1], (Instruction{OpType::kSendGrad, mb}));
          }
          wrapped += 1 + !first + !last;
        }
      }
      EXPECT_EQ(wrapped, list.size()) << "stage " << s << ": " << ScheduleToString(list, true);
    }
  });
}

TEST(PipelineScheduleTest, SendsMatchReceivesOfTheNeighbourInOrder) {
  ForEachShape([](ScheduleKind kind, int p, int m) {
    const auto lists = AllStages(kind, p, m);
    EXPECT_TRUE(MicroBatchesOf(lists.front(), OpType::kRecvActivation).empty());
    EXPECT_TRUE(MicroBatchesOf(lists.front(), OpType::kSendGrad).empty());
    EXPECT_TRUE(MicroBatchesOf(lists.back(), OpType::kSendActivation).empty());
    EXPECT_TRUE(MicroBatchesOf(lists.back(), OpType::kRecvGrad).empty());
    for (int s = 0; s + 1 < p; ++s) {
      EXPECT_EQ(MicroBatchesOf(lists[s], OpType::kSendActivation),
                MicroBatchesOf(lists[s + 1], OpType::kRecvActivation))
          << "stages " << s << " -> " << s + 1;
      EXPECT_EQ(MicroBatchesOf(lists[s + 1], OpType::kSendGrad),
                MicroBatchesOf(lists[s], OpType::kRecvGrad))
          << "stages " << s + 1 << " -> " << s;
      EXPECT_EQ(MicroBatchesOf(lists[s], OpType::kSendActivation).size(), static_cast<size_t>(m));
    }
  });
}

TEST(PipelineScheduleTest, OneFOneBHoldsAtMostStagesAheadActivations) {
  ForEachShape([](ScheduleKind kind, int p, int m) {
    for (int s = 0; s < p; ++s) {
      const int expected = kind == ScheduleKind::kGPipe ? m : std::min(p - s, m);
      EXPECT_EQ(PeakActivations(MakeSchedule(kind, p, s, m)), expected) << "stage " << s;
    }
  });
}

TEST(PipelineScheduleTest, HandCheckedOrders) {
  auto order = [](ScheduleKind kind, int p, int s, int m) {
    return ScheduleToString(MakeSchedule(kind, p, s, m));
  };
  EXPECT_EQ(order(ScheduleKind::k1F1B, 2, 0, 3), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(order(ScheduleKind::k1F1B, 2, 1, 3), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(order(ScheduleKind::kGPipe, 2, 0, 3), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(order(ScheduleKind::k1F1B, 4, 0, 6), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(order(ScheduleKind::k1F1B, 4, 2, 6), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(order(ScheduleKind::k1F1B, 4, 0, 2), "F0 F1 B0 B1");  // fewer micro-batches than stages
  EXPECT_EQ(order(ScheduleKind::k1F1B, 1, 0, 3), "F0 B0 F1 B1 F2 B2");
}

TEST(PipelineScheduleTest, FullListsNameEveryInstruction) {
  EXPECT_EQ(ScheduleToString(MakeSchedule(ScheduleKind::k1F1B, 2, 0, 2), true),
            "Load0 F0 SendAct0 Load1 F1 SendAct1 RecvGrad0 B0 RecvGrad1 B1 ReduceGrads "
            "OptimizerStep");
  EXPECT_EQ(ScheduleToString(MakeSchedule(ScheduleKind::k1F1B, 2, 1, 2), true),
            "Load0 RecvAct0 F0 B0 SendGrad0 Load1 RecvAct1 F1 B1 SendGrad1 ReduceGrads "
            "OptimizerStep");
}

TEST(PipelineScheduleTest, SimulatedBubbleIsStagesMinusOneOverMicroBatchesPlusStagesMinusOne) {
  for (double backward_time : {1.0, 2.0}) {
    ForEachShape([backward_time](ScheduleKind kind, int p, int m) {
      const Timeline t = Simulate(kind, p, m, 1.0, backward_time);
      EXPECT_NEAR(t.IdleFraction(), static_cast<double>(p - 1) / (m + p - 1), 1e-12)
          << "backward_time " << backward_time;
      EXPECT_DOUBLE_EQ(t.makespan, (m + p - 1) * (1.0 + backward_time));
      for (double busy : t.busy) EXPECT_DOUBLE_EQ(busy, m * (1.0 + backward_time));
    });
  }
}

// The timeline honours the model's dependencies, so the formula above is not luck.
TEST(PipelineScheduleTest, SimulatedComputeWaitsForTheNeighbours) {
  ForEachShape([](ScheduleKind kind, int p, int m) {
    const auto lists = AllStages(kind, p, m);
    const Timeline t = Simulate(kind, p, m, 1.0, 2.0);
    auto when = [&](const std::vector<std::vector<double>>& times, int s, OpType op, int mb) {
      return times[s][IndexOf(lists[s], {op, mb})];
    };
    for (int s = 0; s < p; ++s) {
      double clock = 0.0;
      for (size_t i = 0; i < lists[s].size(); ++i) {
        EXPECT_GE(t.start[s][i], clock) << "stage " << s << " runs two instructions at once";
        clock = t.end[s][i];
      }
      for (int mb = 0; mb < m; ++mb) {
        if (s > 0) {
          EXPECT_GE(when(t.start, s, OpType::kForward, mb),
                    when(t.end, s - 1, OpType::kForward, mb));
        }
        if (s + 1 < p) {
          EXPECT_GE(when(t.start, s, OpType::kBackward, mb),
                    when(t.end, s + 1, OpType::kBackward, mb));
        }
      }
    }
  });
}

TEST(PipelineScheduleTest, SimulatesTwoStagesByHand) {
  // p=2, m=3, forward 1, backward 2: stage 0 waits for stage 1's B0 (ends at 4) and B1 (7).
  const auto lists = AllStages(ScheduleKind::k1F1B, 2, 3);
  const Timeline t = Simulate(ScheduleKind::k1F1B, 2, 3, 1.0, 2.0);
  auto start = [&](int s, OpType op, int mb) { return t.start[s][IndexOf(lists[s], {op, mb})]; };
  EXPECT_EQ(start(0, OpType::kBackward, 0), 4.0);
  EXPECT_EQ(start(0, OpType::kForward, 2), 6.0);
  EXPECT_EQ(start(1, OpType::kForward, 1), 4.0);
  EXPECT_EQ(start(1, OpType::kForward, 2), 7.0);
  EXPECT_EQ(start(0, OpType::kBackward, 2), 10.0);
  EXPECT_EQ(t.makespan, 12.0);
  EXPECT_EQ(t.busy, (std::vector<double>{9.0, 9.0}));
  EXPECT_DOUBLE_EQ(t.IdleFraction(), 0.25);
}

// Moves `moved` to just after `after` in the list.
void MoveAfter(std::vector<Instruction>& list, Instruction moved, Instruction after) {
  list.erase(list.begin() + IndexOf(list, moved));
  list.insert(list.begin() + IndexOf(list, after) + 1, moved);
}

TEST(PipelineScheduleTest, CrossedWaitsDeadlock) {
  // Stage 0 waits for the gradient of micro-batch 0 before sending its activation.
  auto lists = AllStages(ScheduleKind::k1F1B, 2, 1);
  MoveAfter(lists[0], {OpType::kSendActivation, 0}, {OpType::kRecvGrad, 0});
  const std::string error = ErrorOf([&] { Simulate(lists); });
  EXPECT_NE(error.find("deadlocks"), std::string::npos) << error;
  EXPECT_NE(error.find("stage 0 waits at RecvGrad(0)"), std::string::npos) << error;
  EXPECT_NE(error.find("stage 1 waits at RecvActivation(0)"), std::string::npos) << error;
}

TEST(PipelineScheduleTest, MissingReceiveDeadlocks) {
  // Stage 1 forgets micro-batch 1 entirely: stage 0 waits for a gradient that never comes.
  auto lists = AllStages(ScheduleKind::kGPipe, 2, 2);
  std::erase_if(lists[1], [](const Instruction& in) { return in.micro_batch == 1; });
  const std::string error = ErrorOf([&] { Simulate(lists); });
  EXPECT_NE(error.find("stage 0 waits at RecvGrad(1)"), std::string::npos) << error;
}

TEST(PipelineScheduleTest, RefusesListsTheModelCannotTime) {
  const auto good = AllStages(ScheduleKind::k1F1B, 3, 3);
  auto expect_error = [](std::vector<std::vector<Instruction>> lists, const std::string& part) {
    const std::string error = ErrorOf([&] { Simulate(lists); });
    EXPECT_NE(error.find(part), std::string::npos) << "got: \"" << error << "\"";
  };
  auto extra_send = good;  // a send nobody receives
  extra_send[0].insert(extra_send[0].end() - 2, {OpType::kSendActivation, 2});
  expect_error(extra_send, "stage 0's SendActivation(2) never received");

  auto reordered = good;  // stage 1 receives micro-batch 1 before 0
  std::swap(reordered[1][IndexOf(reordered[1], {OpType::kRecvActivation, 0})],
            reordered[1][IndexOf(reordered[1], {OpType::kRecvActivation, 1})]);
  expect_error(reordered, "oldest message from stage 0 is micro-batch 0");

  auto unreceived = good;  // stage 1 computes micro-batch 0 without its input
  unreceived[1].erase(unreceived[1].begin() + IndexOf(unreceived[1], {OpType::kRecvActivation, 0}));
  expect_error(unreceived, "stage 1 runs Forward(0) before RecvActivation(0)");

  auto early_backward = good;  // the last stage runs backward 0 before its forward
  MoveAfter(early_backward[2], {OpType::kForward, 0}, {OpType::kBackward, 0});
  expect_error(early_backward, "stage 2 runs Backward(0) before Forward(0)");

  auto off_the_end = good;  // the last stage sends to a stage that does not exist
  off_the_end[2].insert(off_the_end[2].begin() + 3, {OpType::kSendActivation, 0});
  expect_error(off_the_end, "no stage 3");

  expect_error({}, "no stages");
}

TEST(PipelineScheduleTest, RejectsBadArguments) {
  EXPECT_THROW(MakeSchedule(ScheduleKind::k1F1B, 0, 0, 4), Error);
  EXPECT_THROW(MakeSchedule(ScheduleKind::k1F1B, 4, 4, 4), Error);
  EXPECT_THROW(MakeSchedule(ScheduleKind::k1F1B, 4, -1, 4), Error);
  EXPECT_THROW(MakeSchedule(ScheduleKind::kGPipe, 4, 0, 0), Error);
  EXPECT_THROW(Simulate(ScheduleKind::kGPipe, 0, 4), Error);
}

TEST(PipelineScheduleTest, NamesParseAndUnknownNamesListTheAcceptedOnes) {
  for (ScheduleKind kind : kKinds) EXPECT_EQ(ParseScheduleKind(ScheduleKindName(kind)), kind);
  EXPECT_EQ(ParseScheduleKind("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  const std::string error = ErrorOf([] { ParseScheduleKind("interleaved"); });
  EXPECT_NE(error.find("\"interleaved\""), std::string::npos) << error;
  EXPECT_NE(error.find("\"gpipe\""), std::string::npos) << error;
  EXPECT_NE(error.find("\"1f1b\""), std::string::npos) << error;
  EXPECT_STREQ(OpTypeName(OpType::kRecvActivation), "RecvActivation");
  EXPECT_STREQ(OpTypeName(OpType::kOptimizerStep), "OptimizerStep");
}

}  // namespace
}  // namespace ztrain::pipeline
