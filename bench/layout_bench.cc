// Pipeline bubble and tensor-parallel step time on real ranks, each against its reference in
// the same run:
//   mpirun -np P build/bench/layout_bench --pp P [--micro-batches 1,2,4,8] [--steps N]
//   mpirun -np T build/bench/layout_bench --tp T [--steps N]
// common: [--layers L] [--width C] [--heads H] [--batch B] [--seq S]
//
// Pipeline: the ranks are the P stages of one pipeline (1F1B and GPipe). For each number of
// micro-batches m the measured bubble is 1 - sum over stages of busy time / (P x span), where
// busy is the stage's forward and backward compute (StepStats, which leaves out the time a
// stage waits for its neighbours) and span the step's pipelined part (its wall time less the
// optimizer step, slowest rank). It is printed next to the theory for equal stages,
// b = (P-1)/(m+P-1), and next to the theory for the stages as measured: with `imbalance` the
// busiest stage's compute over the mean stage's, the slowest stage sets the pace and the
// bubble is 1 - (1 - b) / imbalance. Each figure is the median over the timed steps.
//
// Tensor parallelism: the reference is the same model trained whole by one rank on the same
// micro-batch, every rank at the same time (so the cores are as loaded as in the tp run, each
// rank on its share); then the T ranks train it split. The ratio t(tp=T)/t(single) is 1/T at
// perfect scaling. Single and tp steps alternate, the ratio is the median of back-to-back
// pairs. Both use fp32 and one micro-batch per step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/rank_cores.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/process_grid.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain::bench {
namespace {

struct Options {
  int pp = 1, tp = 1, steps = 6, layers = 8, width = 256, heads = 8, batch = 4, seq = 64;
  std::vector<int> micro_batches = {1, 2, 4, 8};
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--pp") o.pp = v;
    else if (k == "--tp") o.tp = v;
    else if (k == "--steps") o.steps = v;
    else if (k == "--layers") o.layers = v;
    else if (k == "--width") o.width = v;
    else if (k == "--heads") o.heads = v;
    else if (k == "--batch") o.batch = v;
    else if (k == "--seq") o.seq = v;
    else if (k == "--micro-batches") {
      o.micro_batches.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string x; std::getline(list, x, ',');) o.micro_batches.push_back(std::atoi(x.c_str()));
    } else {
      ZTRAIN_CHECK(false, "unknown option ", k, "; see the comment at the top of layout_bench.cc");
    }
  }
  ZTRAIN_CHECK((o.pp > 1) != (o.tp > 1), "give either --pp P or --tp T (> 1)");
  return o;
}

Config MakeConfig(const Options& o, int world, int pp, int tp, int gas, const char* schedule) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "gpt2"},       {"n_layer", o.layers}, {"n_head", o.heads},
                {"n_embd", o.width},    {"vocab_size", 512},   {"padded_vocab_size", 512},
                {"max_seq_len", o.seq}};
  j["data"] = {{"seq_len", o.seq}};
  j["train_micro_batch_size_per_gpu"] = o.batch;
  j["gradient_accumulation_steps"] = gas;
  j.erase("train_batch_size");
  j["pipeline"] = {{"stages", pp}, {"schedule", schedule}, {"partition", "parameters"}};
  j["tensor_parallel"] = {{"size", tp}};
  return ParseConfig(j, world);
}

struct Batches {
  std::vector<std::vector<int32_t>> data;
  std::vector<nn::MicroBatch> mbs;
  Batches(int n, int64_t b, int64_t t) : data(static_cast<size_t>(2 * n)) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> tok(0, 511);
    for (auto& d : data) {
      d.resize(static_cast<size_t>(b * t));
      for (int32_t& x : d) x = tok(rng);
    }
    for (int i = 0; i < n; ++i) {
      mbs.push_back({Tensor(data[2 * i].data(), DType::kI32, {b, t}),
                     Tensor(data[2 * i + 1].data(), DType::kI32, {b, t})});
    }
  }
};

// Reduces a value over the world with `op`.
double Reduce(comm::Communicator& world, double value, comm::ReduceOp op) {
  float v = static_cast<float>(value);
  world.AllReduce(Tensor(&v, DType::kF32, {1}), op)->Wait();
  return v;
}

void RunPipeline(const Options& o, comm::Communicator& world) {
  const int p = world.size();
  const ProcessGrid grid(p, 1, p, 1);
  GridCommunicators comms = MakeGridCommunicators(world, grid);
  const bool print = world.rank() == 0;
  if (print) {
    std::printf("layout_bench: pipeline of %d stages, GPT-2 %d layers x %d wide, B=%d T=%d, "
                "%d timed steps each (median)\n", p, o.layers, o.width, o.batch, o.seq, o.steps);
    std::printf("  %-9s %3s %10s %10s %14s %10s %14s %14s\n", "schedule", "m", "step ms",
                "bubble", "(p-1)/(m+p-1)", "imbalance", "with imbalance", "measured/that");
  }
  for (const char* schedule : {"1f1b", "gpipe"}) {
    for (int m : o.micro_batches) {
      const Config cfg = MakeConfig(o, p, p, 1, m, schedule);
      Engine e(cfg, nn::BuildGpt2(cfg.model), ParallelGroups{comms.dp.get(), comms.pp.get()});
      Batches batches(m, o.batch, o.seq);
      e.TrainStep(batches.mbs);  // warm-up
      std::vector<double> bubbles, spans, imbalance;
      for (int s = 0; s < o.steps; ++s) {
        world.Barrier()->Wait();
        const StepStats st = e.TrainStep(batches.mbs);
        const double span = Reduce(world, st.seconds - st.optimizer_seconds, comm::ReduceOp::kMax);
        const double busy = Reduce(world, st.forward_seconds + st.backward_seconds,
                                   comm::ReduceOp::kSum);
        const double busiest = Reduce(world, st.forward_seconds + st.backward_seconds,
                                      comm::ReduceOp::kMax);
        bubbles.push_back(1.0 - busy / (p * span));
        imbalance.push_back(busiest / (busy / p));
        spans.push_back(span);
      }
      const double theory = (p - 1.0) / (m + p - 1.0);
      const double bubble = Median(bubbles), skew = Median(imbalance);
      const double adjusted = 1.0 - (1.0 - theory) / skew;
      if (print) {
        std::printf("  %-9s %3d %10.1f %10.3f %14.3f %10.2f %14.3f %14.2f\n", schedule, m,
                    1e3 * Median(spans), bubble, theory, skew, adjusted, bubble / adjusted);
      }
    }
  }
}

void RunTensor(const Options& o, comm::Communicator& world) {
  const int t = world.size();
  const ProcessGrid grid(t, 1, 1, t);
  GridCommunicators comms = MakeGridCommunicators(world, grid);
  const Config single_cfg = MakeConfig(o, 1, 1, 1, 1, "1f1b");
  const Config tp_cfg = MakeConfig(o, t, 1, t, 1, "1f1b");
  Engine single(single_cfg, nn::BuildGpt2(single_cfg.model));
  Engine split(tp_cfg, tensor::BuildParallelModel(tp_cfg.model, *comms.tp),
               ParallelGroups{comms.dp.get(), comms.pp.get(), comms.tp.get()});
  Batches batches(1, o.batch, o.seq);
  single.TrainStep(batches.mbs);  // warm-up
  split.TrainStep(batches.mbs);
  std::vector<double> ratios, t_single, t_split;
  for (int s = 0; s < o.steps; ++s) {
    world.Barrier()->Wait();
    const double a = Reduce(world, single.TrainStep(batches.mbs).seconds, comm::ReduceOp::kMax);
    world.Barrier()->Wait();
    const double b = Reduce(world, split.TrainStep(batches.mbs).seconds, comm::ReduceOp::kMax);
    t_single.push_back(a);
    t_split.push_back(b);
    ratios.push_back(b / a);
  }
  if (world.rank() == 0) {
    std::printf("layout_bench: tensor parallel over %d ranks, GPT-2 %d layers x %d wide, %d "
                "heads, B=%d T=%d, %d steps (median)\n", t, o.layers, o.width, o.heads, o.batch,
                o.seq, o.steps);
    std::printf("  single rank %.1f ms, tp=%d %.1f ms: t(tp)/t(single) %.2f (perfect %.2f), "
                "speed-up %.2fx\n", 1e3 * Median(t_single), t, 1e3 * Median(t_split),
                Median(ratios), 1.0 / t, 1.0 / Median(ratios));
  }
}

}  // namespace
}  // namespace ztrain::bench

int main(int argc, char** argv) {
  using namespace ztrain::bench;
  try {
    const Options o = Parse(argc, argv);
    ShareCoresAmongLocalRanks();
    ztrain::SetLogLevel("warn");
    auto world = ztrain::comm::MakeMpiWorld(std::chrono::minutes(5));
    ZTRAIN_CHECK(world->size() == std::max(o.pp, o.tp), "run under mpirun with -np ",
                 std::max(o.pp, o.tp), " (got ", world->size(), " ranks)");
    if (o.pp > 1) RunPipeline(o, *world);
    if (o.tp > 1) RunTensor(o, *world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "layout_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
