// Data-parallel weak scaling and communication overlap on real ranks, in one run:
//   mpirun -np 2 build/bench/dp_bench [--stage S] [--steps N] [--model small|124m]
//       [--batch B] [--seq T] [--overlap-comm] [--reduce-bucket-size ELEMENTS|auto]
// The reference is the dp=1 step: every rank trains the model alone (a single-process
// engine) on its own micro-batch of B x T tokens, all ranks at the same time, so the cores are
// as loaded as in the dp run. The ranks also train one model data-parallel at each ZeRO stage
// (all stages by default, or --stage S) on the same per-rank batch, so the global batch is N
// times larger: t(dp=N)/t(dp=1) is 1.00 at perfect weak scaling and the throughput ratio N.
// dp=1 and dp=N steps alternate, so load from elsewhere on the machine hits both alike, and
// the time ratio is the median of the ratios of back-to-back pairs.
// The hidden fraction is 1 - wait/comm: `wait` is StepStats::comm_wait_seconds (the time the
// engine blocked on communication), `comm` the time of the same collectives issued alone,
// without compute, on the same communicator (their bytes are checked against the engine's).
// `wait` also counts the time a rank waits for a slower peer to reach a collective and any
// slowdown of the transfers by the compute beside them, so it can exceed `comm`.
// A step's time is its slowest rank's, its wait the mean over ranks; each figure is the
// median over the timed steps, after one warm-up step. Each rank computes on its share of the
// node's cores, as the ztrain launcher gives it. --overlap-comm and --reduce-bucket-size set
// the zero_optimization keys of the same names (the defaults are the config's).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/dp_collectives.h"
#include "bench/rank_cores.h"
#include "core/error.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/launch_env.h"

namespace ztrain::bench {
namespace {

constexpr int kCommReps = 7;

struct Options {
  int stage = -1;  // -1: every stage
  int steps = 10;
  std::string model = "small";
  int batch = 4;
  int seq = 64;
  bool overlap_comm = false;       // true: zero_optimization.overlap_comm at every stage
  std::string reduce_bucket_size;  // empty: the config's default
};

const char* Arg(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return nullptr;
}

int ArgInt(int argc, char** argv, const char* name, int fallback) {
  const char* v = Arg(argc, argv, name);
  return v ? std::atoi(v) : fallback;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  o.stage = ArgInt(argc, argv, "--stage", o.stage);
  o.steps = ArgInt(argc, argv, "--steps", o.steps);
  if (const char* m = Arg(argc, argv, "--model")) o.model = m;
  o.batch = ArgInt(argc, argv, "--batch", o.batch);
  o.seq = ArgInt(argc, argv, "--seq", o.seq);
  for (int i = 1; i < argc; ++i) o.overlap_comm |= std::strcmp(argv[i], "--overlap-comm") == 0;
  if (const char* b = Arg(argc, argv, "--reduce-bucket-size")) o.reduce_bucket_size = b;
  ZTRAIN_CHECK(o.model == "small" || o.model == "124m", "--model is '", o.model,
               "'; use small (4 layers, 256 wide) or 124m (GPT-2 124M)");
  ZTRAIN_CHECK(o.stage >= -1 && o.stage <= 3, "--stage is ", o.stage, "; use 0, 1, 2 or 3");
  ZTRAIN_CHECK(o.steps >= 1 && o.batch >= 1 && o.seq >= 1 && o.seq <= 1024,
               "--steps and --batch must be >= 1 and --seq in [1, 1024]");
  return o;
}

Config MakeConfig(const Options& o, int world_size, int stage) {
  nlohmann::json j = DefaultConfigJson();
  const bool full = o.model == "124m";
  j["model"] = {{"type", "gpt2"},          {"n_layer", full ? 12 : 4},
                {"n_head", full ? 12 : 4}, {"n_embd", full ? 768 : 256},
                {"vocab_size", 50257},     {"padded_vocab_size", 50304},
                {"max_seq_len", 1024}};
  j["data"] = {{"seq_len", o.seq}};
  j["train_micro_batch_size_per_gpu"] = o.batch;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  j["zero_optimization"] = {{"stage", stage}};
  if (o.overlap_comm) j["zero_optimization"]["overlap_comm"] = true;
  if (o.reduce_bucket_size == "auto") j["zero_optimization"]["reduce_bucket_size"] = "auto";
  if (!o.reduce_bucket_size.empty() && o.reduce_bucket_size != "auto") {
    j["zero_optimization"]["reduce_bucket_size"] = std::atoll(o.reduce_bucket_size.c_str());
  }
  return ParseConfig(j, world_size);
}

// This rank's micro-batch: random tokens, different on every rank as in data parallelism.
struct RankBatch {
  std::vector<int32_t> tokens, targets;
  nn::MicroBatch mb;
  RankBatch(int64_t b, int64_t t, int rank) : tokens(b * t), targets(b * t) {
    std::mt19937 rng(1 + rank);
    std::uniform_int_distribution<int> tok(0, 50256);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
    mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t});
    mb.targets = Tensor(targets.data(), DType::kI32, {b, t});
  }
};

// Reduces one value per step over the ranks, in place.
void ReduceOverRanks(comm::Communicator& world, std::vector<float>& v, comm::ReduceOp op) {
  world.AllReduce(Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())}), op)->Wait();
}

struct Measured {
  double seconds = 0.0;    // median step (or collectives) time, slowest rank
  double comm_wait = 0.0;  // median StepStats::comm_wait_seconds, mean over ranks
  double forward = 0.0, backward = 0.0, optimizer = 0.0;  // medians, slowest rank
  double bytes = 0.0;         // bytes a rank moved on `world` in one step
  double tokens = 0.0;        // tokens per step over the whole job
  std::vector<double> steps;  // each timed step's seconds, slowest rank
};

// Times one engine's steps, each started on all ranks together, after one warm-up step that
// also counts the bytes a step moves. Finish() is collective.
class StepTimer {
 public:
  StepTimer(Engine& engine, const nn::MicroBatch& mb, comm::Communicator& world)
      : engine_(engine), mb_(mb), world_(world) {
    world_.Barrier()->Wait();
    const comm::CommStats before = world_.stats();
    const StepStats warm = engine_.TrainStep({&mb_, 1});
    bytes_ = static_cast<double>(world_.stats().TotalBytes() - before.TotalBytes());
    tokens_ = static_cast<double>(warm.tokens);
  }

  void Step() {
    world_.Barrier()->Wait();
    const StepStats st = engine_.TrainStep({&mb_, 1});
    for (double v : {st.seconds, st.forward_seconds, st.backward_seconds, st.optimizer_seconds}) {
      slowest_.push_back(static_cast<float>(v));
    }
    waits_.push_back(static_cast<float>(st.comm_wait_seconds / world_.size()));
  }

  Measured Finish() {
    ReduceOverRanks(world_, slowest_, comm::ReduceOp::kMax);
    ReduceOverRanks(world_, waits_, comm::ReduceOp::kSum);
    auto median_of = [&](size_t k) {
      std::vector<double> v;
      for (size_t i = k; i < slowest_.size(); i += 4) v.push_back(slowest_[i]);
      return Median(std::move(v));
    };
    Measured m;
    for (size_t i = 0; i < slowest_.size(); i += 4) m.steps.push_back(slowest_[i]);
    m.seconds = median_of(0);
    m.forward = median_of(1);
    m.backward = median_of(2);
    m.optimizer = median_of(3);
    m.comm_wait = Median({waits_.begin(), waits_.end()});
    m.bytes = bytes_;
    m.tokens = tokens_;
    return m;
  }

 private:
  Engine& engine_;
  const nn::MicroBatch& mb_;
  comm::Communicator& world_;
  double bytes_ = 0.0, tokens_ = 0.0;
  std::vector<float> slowest_;  // per step: seconds, forward, backward, optimizer
  std::vector<float> waits_;
};

// Median time of the step's collectives alone (one warm-up run first), slowest rank.
Measured TimeCollectives(StepCollectives& collectives, comm::Communicator& world) {
  collectives.Run();
  world.Barrier()->Wait();
  const comm::CommStats before = world.stats();
  std::vector<float> seconds;
  for (int r = 0; r < kCommReps; ++r) {
    world.Barrier()->Wait();
    Timer timer;
    collectives.Run();
    seconds.push_back(static_cast<float>(timer.Seconds()));
  }
  Measured m;
  m.bytes = static_cast<double>(world.stats().TotalBytes() - before.TotalBytes()) / kCommReps;
  ReduceOverRanks(world, seconds, comm::ReduceOp::kMax);
  m.seconds = Median({seconds.begin(), seconds.end()});
  return m;
}

struct StageResult {
  Measured ref, step, comm;
  double time_ratio = 0.0;  // median over step pairs of t(dp=N) / t(dp=1)
  bool overlap = false;     // zero_optimization.overlap_comm as resolved for the stage
};

// The dp engine at `stage`; throws Error, on every rank alike and before any collective, when
// the config or the engine refuses the stage.
std::unique_ptr<Engine> MakeDpEngine(const Options& o, int stage, comm::Communicator& world) {
  const Config cfg = MakeConfig(o, world.size(), stage);
  return std::make_unique<Engine>(cfg, nn::BuildGpt2(cfg.model), &world);
}

// The dp=1 and dp=N steps alternate, so that load from elsewhere hits both alike.
StageResult MeasureStage(const Options& o, Engine& single, std::unique_ptr<Engine> engine,
                         comm::Communicator& world, const nn::MicroBatch& mb) {
  StageResult r;
  {
    StepTimer ref(single, mb, world), dp(*engine, mb, world);
    for (int s = 0; s < o.steps; ++s) {
      ref.Step();
      dp.Step();
    }
    r.ref = ref.Finish();
    r.step = dp.Finish();
  }
  // Each pair ran back to back: its ratio is the least disturbed by load that drifts.
  std::vector<double> ratios;
  for (int s = 0; s < o.steps; ++s) ratios.push_back(r.step.steps[s] / r.ref.steps[s]);
  r.time_ratio = Median(std::move(ratios));
  const LayerLayout layout = LayoutOf(*engine, world.size());
  const ZeroConfig zero = engine->config().zero;
  r.overlap = zero.stage == 0 || zero.overlap_comm;  // stage 0 always overlaps
  engine.reset();  // its memory is freed before the collectives' buffers are allocated
  StepCollectives collectives(layout, zero, world);
  r.comm = TimeCollectives(collectives, world);
  return r;
}

void PrintHeader(const Options& o, const Config& cfg, const Engine& single, int n, int threads) {
  const LayerLayout layout = LayoutOf(single, n);
  int64_t total = 0;
  for (int64_t p : layout.padded) total += p;
  std::printf(
      "dp_bench: %d ranks x %d threads, GPT-2 %s (%d layers, %lld wide, %lld "
      "parameters), per-rank batch B=%d T=%d fp32, median of %d steps\n",
      n, threads, o.model.c_str(), cfg.model.n_layer, static_cast<long long>(cfg.model.n_embd),
      static_cast<long long>(single.NumParameters()), o.batch, o.seq, o.steps);
  // Backward reaches the first layer last: nothing is left to hide its gradients' reduction.
  std::printf(
      "the first layer (token + position embedding, tied to the LM head) holds %.0f%% of "
      "the gradients: their reduction starts when backward ends\n",
      100.0 * static_cast<double>(layout.padded[0]) / static_cast<double>(total));
  std::printf(
      "reduce_bucket_size %lld elements: %d gradient bucket(s) per backward; reference "
      "t(dp=1): every rank trains alone on its batch, at the same time\n",
      static_cast<long long>(cfg.zero.reduce_bucket_size),
      CountBuckets(layout, cfg.zero.reduce_bucket_size));
  std::printf(
      "stage overlap t(dp=1)ms t(dp=%d)ms time ratio tok/s ratio comm MiB  comm ms"
      "  wait ms  hidden\n",
      n);
}

void PrintRow(int stage, const StageResult& r, int n) {
  const Measured& ref = r.ref;
  const double wait = r.step.comm_wait, comm = r.comm.seconds;
  const double hidden = comm > 0.0 ? std::clamp(1.0 - wait / comm, 0.0, 1.0) : 0.0;
  std::printf("%5d %7s %9.1f %9.1f %9.2fx %10.2fx %8.1f %8.1f %8.1f %6.0f%%\n", stage,
              r.overlap ? "on" : "off", ref.seconds * 1e3, r.step.seconds * 1e3, r.time_ratio,
              r.step.tokens / ref.tokens / r.time_ratio, r.comm.bytes / (1 << 20), comm * 1e3,
              wait * 1e3, 100.0 * hidden);
  std::printf(
      "      forward / backward / optimizer ms: dp=1 %.1f / %.1f / %.1f, "
      "dp=%d %.1f / %.1f / %.1f\n",
      ref.forward * 1e3, ref.backward * 1e3, ref.optimizer * 1e3, n, r.step.forward * 1e3,
      r.step.backward * 1e3, r.step.optimizer * 1e3);
  // The standalone collectives must be the engine's: a mismatch means the engine changed.
  if (std::abs(r.comm.bytes - r.step.bytes) > 0.01 * r.step.bytes) {
    std::printf(
        "      note: the engine's step moved %.1f MiB per rank, the standalone "
        "collectives %.1f MiB: the comm column does not match this engine\n",
        r.step.bytes / (1 << 20), r.comm.bytes / (1 << 20));
  }
  if (wait == 0.0) {
    std::printf(
        "      note: comm_wait_seconds was 0 in every step: this engine does not "
        "report it yet, so 'hidden' is meaningless\n");
  }
}

int Run(const Options& o) {
  const int threads = ShareCoresAmongLocalRanks();
  auto world = comm::MakeMpiWorld(std::chrono::minutes(5));
  const int n = world->size(), rank = world->rank();
  ZTRAIN_CHECK(n >= 2, "data parallelism needs at least 2 ranks, got ", n,
               "; run under mpirun, e.g. mpirun -np 2 dp_bench");
  const RankBatch batch(o.batch, o.seq, rank);
  const Config cfg = MakeConfig(o, 1, 0);
  Engine single(cfg, nn::BuildGpt2(cfg.model));
  if (rank == 0) PrintHeader(o, cfg, single, n, threads);
  for (int stage = 0; stage <= 3; ++stage) {
    if (o.stage >= 0 && stage != o.stage) continue;
    std::unique_ptr<Engine> engine;
    try {
      engine = MakeDpEngine(o, stage, *world);
    } catch (const Error& e) {
      if (rank == 0) std::printf("%5d  not built: %s\n", stage, e.what());
      continue;
    }
    const StageResult r = MeasureStage(o, single, std::move(engine), *world, batch.mb);
    if (rank == 0) PrintRow(stage, r, n);
  }
  if (rank == 0) {
    std::printf(
        "time ratio = median over back-to-back step pairs of t(dp=%d)/t(dp=1) (ideal 1.00); "
        "tok/s ratio ideal %d.00; hidden = 1 - wait/comm, clamped to [0, 1]\n",
        n, n);
  }
  return 0;
}

}  // namespace
}  // namespace ztrain::bench

int main(int argc, char** argv) {
  try {
    return ztrain::bench::Run(ztrain::bench::ParseOptions(argc, argv));
  } catch (const ztrain::Error& e) {
    std::fprintf(stderr, "dp_bench: %s\n", e.what());
    return 1;
  }
}
