// offload_bench: the ZeRO stage 3 train step with parameter shards (and optimizer state) in
// swap files against the same step in memory, alternating step by step in one process.
//
//   offload_bench [--dir DIR] [--steps N] [--layers L] [--embd C] [--heads H] [--seq T]
//                 [--batch B] [--vocab V] [--sub-group-size E] [--opt-buffers N]
//                 [--param-buffers N] [--zero KEY=VALUE]...
//
// Variants (one Engine each, dp = 1, ZeRO stage 3 with stage3_param_persistence_threshold 0,
// so no layer stays gathered between steps; the other stage3_* limits are DeepSpeed's
// defaults unless --zero sets them, e.g. --zero stage3_max_live_parameters=4000000):
//   memory      no offload: the reference
//   param       offload_param {device: nvme, max_in_cpu: 0}: every shard in the swap file
//   param+opt   and offload_optimizer {device: nvme, pipeline_read, pipeline_write} in tiles
//               of sub_group_size elements
//   unpipelined the same without pipeline_read / pipeline_write
// The order of the variants rotates from round to round, so load from elsewhere hits all
// alike. Printed per variant: the median and best step time, the median over rounds of the
// step's ratio to the memory step of its round, the medians of StepStats' forward / backward
// / optimizer parts, the bytes swapped per step (from the layer sizes and the engine's gather
// plan: every gather reads the layer's shard, every shard is written once after its deferred
// optimizer step, and m and v are read and written once, in whole tiles of each layer) next
// to the process's block I/O measured around the step (/proc/self/io), and those bytes over
// the step time and over the time the step gained. The swap directory's raw rate (the same I/O
// engine writing, then reading 256 MiB in DIR/offload_bench_probe.swp) is measured first as the
// reference. Swap files go to DIR/ztrain-offload_bench_<variant>/; the engines remove them, and the
// bench says whether any were left. On tmpfs the swap files live in memory (O_DIRECT falls
// back to buffered I/O before Linux 6.6), so the figures say little about a disk.

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/bench_util.h"
#include "core/error.h"
#include "engine/engine.h"
#include "nn/gpt2.h"
#include "offload/io/io_buffer.h"
#include "offload/io/io_engine.h"
#include "offload/io/swap_file.h"
#include "offload/optimizer_swapper.h"
#include "parallel/zero/gather_plan.h"

namespace ztrain::bench {
namespace {

struct Options {
  std::string dir = "/tmp";
  int steps = 6;
  int layers = 6, embd = 384, heads = 6, seq = 128, batch = 4, vocab = 50257;
  int64_t sub_group_size = 4000000;
  int64_t opt_buffers = 4;    // offload_optimizer.buffer_count (DeepSpeed's default)
  int64_t param_buffers = 5;  // offload_param.buffer_count (DeepSpeed's default)
  nlohmann::json zero = nlohmann::json::object();  // extra zero_optimization keys
};

struct Variant {
  const char* name;
  bool param_nvme, opt_nvme, pipelined;
};
constexpr Variant kVariants[] = {{"memory", false, false, false},
                                 {"param", true, false, false},
                                 {"param+opt", true, true, true},
                                 {"unpipelined", true, true, false}};

constexpr const char* kUsage =
    "usage: offload_bench [--dir DIR] [--steps N] [--layers L] [--embd C] [--heads H] [--seq T]\n"
    "                     [--batch B] [--vocab V] [--sub-group-size E] [--opt-buffers N]\n"
    "                     [--param-buffers N] [--zero KEY=VALUE]...\n"
    "(the variants and what is printed: the comment at the top of bench/offload_bench.cc)\n";

// Every argument is an option with its value; --help prints the usage and exits. An unknown
// option, a missing value or a number that does not parse is an error naming it (nothing
// runs: a typo must not silently bench the defaults).
Options ParseOptions(int argc, char** argv) {
  Options o;
  auto small = [](int& field) {
    return [&field](int64_t n) {
      ZTRAIN_CHECK(n >= 0 && n <= 1 << 30, "a size of ", n, " is out of range");
      field = static_cast<int>(n);
    };
  };
  auto large = [](int64_t& field) { return [&field](int64_t n) { field = n; }; };
  const std::unordered_map<std::string, std::function<void(int64_t)>> numbers = {
      {"--steps", small(o.steps)},
      {"--layers", small(o.layers)},
      {"--embd", small(o.embd)},
      {"--heads", small(o.heads)},
      {"--seq", small(o.seq)},
      {"--batch", small(o.batch)},
      {"--vocab", small(o.vocab)},
      {"--sub-group-size", large(o.sub_group_size)},
      {"--opt-buffers", large(o.opt_buffers)},
      {"--param-buffers", large(o.param_buffers)}};
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    const bool known = numbers.count(name) > 0 || name == "--dir" || name == "--zero";
    ZTRAIN_CHECK(known, "unknown argument '", name, "'\n", kUsage);
    ZTRAIN_CHECK(i + 1 < argc, name, " needs a value\n", kUsage);
    const std::string value = argv[i + 1];
    if (name == "--dir") {
      o.dir = value;
    } else if (name == "--zero") {
      const size_t eq = value.find('=');
      ZTRAIN_CHECK(eq != std::string::npos, "--zero takes KEY=VALUE, got '", value, "'");
      const std::string v = value.substr(eq + 1);
      o.zero[value.substr(0, eq)] =
          nlohmann::json::accept(v) ? nlohmann::json::parse(v) : nlohmann::json(v);
    } else {
      char* end = nullptr;
      const long long n = std::strtoll(value.c_str(), &end, 10);
      ZTRAIN_CHECK(!value.empty() && *end == '\0', name, " takes a whole number, got '", value,
                   "'");
      numbers.at(name)(n);
    }
  }
  ZTRAIN_CHECK(o.steps >= 1 && o.batch >= 1 && o.seq >= 1 && o.seq <= 1024,
               "--steps and --batch must be >= 1 and --seq in [1, 1024]");
  return o;
}

Config MakeConfig(const Options& o, const Variant& v) {
  nlohmann::json j = DefaultConfigJson();
  j["model"] = {{"type", "gpt2"},        {"n_layer", o.layers},
                {"n_head", o.heads},     {"n_embd", o.embd},
                {"vocab_size", o.vocab}, {"padded_vocab_size", (o.vocab + 127) / 128 * 128},
                {"max_seq_len", 1024}};
  j["data"] = {{"seq_len", o.seq}};
  j["train_micro_batch_size_per_gpu"] = o.batch;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  j["gradient_clipping"] = 1.0;
  // Each variant its own job name: swap directories are <nvme_path>/ztrain-<job>/rank<R>.
  j["training"]["job_name"] = std::string("offload_bench_") + v.name;
  nlohmann::json& z = j["zero_optimization"];
  z = {{"stage3_param_persistence_threshold", 0}, {"sub_group_size", o.sub_group_size}};
  z.update(o.zero);  // --zero keys win
  z["stage"] = 3;
  if (v.param_nvme) {
    z["offload_param"] = {{"device", "nvme"},
                          {"nvme_path", o.dir},
                          {"max_in_cpu", 0},
                          {"buffer_count", o.param_buffers}};
  }
  if (v.opt_nvme) {
    z["offload_optimizer"] = {{"device", "nvme"},
                              {"nvme_path", o.dir},
                              {"pipeline_read", v.pipelined},
                              {"pipeline_write", v.pipelined},
                              {"buffer_count", o.opt_buffers}};
  }
  return ParseConfig(j, 1);
}

// Elements of every layer's flat buffer as the engine pads it at dp = 1 (each parameter
// starts on 16 elements), and the layers each layer's forward and backward need (its own and
// those it ties to), as the engine hands them to zero::PlanGathers.
struct LayerUnits {
  std::vector<int64_t> padded;
  std::vector<zero::UnitUse> uses;
};

LayerUnits UnitsOf(const Engine& e) {
  LayerUnits u;
  std::unordered_map<std::string, size_t> owner;
  for (size_t l = 0; l < e.layers().size(); ++l) {
    int64_t n = 0;
    zero::UnitUse use;
    for (const nn::ParamSpec& s : e.layers()[l]->Params()) {
      const size_t unit = s.tied_to.empty() ? l : owner.at(s.tied_to);
      if (s.tied_to.empty()) owner[s.name] = l, n = (n + NumElements(s.shape) + 15) / 16 * 16;
      if (std::find(use.begin(), use.end(), unit) == use.end()) use.push_back(unit);
    }
    u.padded.push_back(n);
    u.uses.push_back(use);
  }
  return u;
}

struct SwapBytes {
  int64_t read = 0, written = 0;
};

// The process's storage I/O so far (/proc/self/io read_bytes / write_bytes: what reached the
// block layer, O_DIRECT included); zero where the kernel does not account it.
SwapBytes ProcessIo() {
  SwapBytes b;
  std::FILE* f = std::fopen("/proc/self/io", "r");
  if (f == nullptr) return b;
  char key[64];
  long long value = 0;
  while (std::fscanf(f, "%63[^:]: %lld\n", key, &value) == 2) {
    if (std::strcmp(key, "read_bytes") == 0) b.read = value;
    if (std::strcmp(key, "write_bytes") == 0) b.written = value;
  }
  std::fclose(f);
  return b;
}

// Bytes a step of variant `v` reads from and writes to its swap files (one micro-batch).
SwapBytes SwapBytesPerStep(const Engine& e, const Variant& v) {
  if (!v.param_nvme && !v.opt_nvme) return {};
  const LayerUnits u = UnitsOf(e);
  std::vector<zero::UnitUse> positions = u.uses;  // forward, then backward
  positions.insert(positions.end(), u.uses.rbegin(), u.uses.rend());
  const ZeroConfig& z = e.config().zero;
  const zero::GatherPlan plan =
      zero::PlanGathers(u.padded, positions,
                        {.prefetch_bucket = z.stage3_prefetch_bucket_size,
                         .max_live = z.stage3_max_live_parameters,
                         .max_reuse_distance = z.stage3_max_reuse_distance,
                         .persistence_threshold = z.stage3_param_persistence_threshold});
  // Transfers are whole 4 KiB blocks; the optimizer moves whole tile records, the last one too.
  auto shard_bytes = [&](size_t unit) { return offload::AlignUp(4 * u.padded[unit]); };
  int64_t shards = 0, gathered = 0;
  for (size_t unit = 0; unit < u.padded.size(); ++unit) shards += shard_bytes(unit);
  for (const zero::GatherAction& a : plan.actions)
    for (size_t unit : a.fetch) gathered += shard_bytes(unit);
  SwapBytes b;
  // The optimizer step reads no shard: each is stepped as the next forward's gather reads it
  // (Note [Deferred optimizer step]), and written back.
  if (v.param_nvme) b.read += gathered, b.written += shards;
  // Each layer's m and v, in its tiles (at dp 1 a layer's optimizer range is all of it).
  const int64_t opt = offload::OptimizerSwapper::FileBytes(u.padded, z.sub_group_size);
  if (v.opt_nvme) b.read += opt, b.written += opt;
  return b;
}

// The swap directory's own rate: the engines' I/O options writing, then reading, 256 MiB in
// 16 MiB requests all in flight at once (best of 3).
struct DiskRate {
  std::string backend;
  bool direct = false;
  double write_gbs = 0.0, read_gbs = 0.0;
};

DiskRate MeasureDisk(const std::string& dir, const AioConfig& aio) {
  constexpr int64_t kRequest = 16 << 20, kRequests = 16;
  MemoryTracker tracker;
  HostAllocator host(&tracker);
  auto io = offload::IoEngine::Make(offload::IoOptionsFrom(aio));
  const std::string path = dir + "/offload_bench_probe.swp";
  DiskRate r;
  {
    auto file = offload::SwapFile::Create(*io, path, kRequest * kRequests);
    std::vector<offload::IoBuffer> bufs;
    for (int i = 0; i < kRequests; ++i) {
      bufs.emplace_back(host, kRequest);
      std::memset(bufs.back().data(), i + 1, kRequest);
    }
    auto pass = [&](bool read) {
      std::vector<offload::IoWorkPtr> works;
      for (int i = 0; i < kRequests; ++i) {
        works.push_back(read ? file->Read(i * kRequest, bufs[i], kRequest)
                             : file->Write(i * kRequest, bufs[i], kRequest));
      }
      for (auto& w : works) w->Wait();
    };
    const double bytes = static_cast<double>(kRequest * kRequests);
    r.write_gbs = GBs(bytes, BestOf(3, [&] { pass(false); }));
    r.read_gbs = GBs(bytes, BestOf(3, [&] { pass(true); }));
    r.backend = io->backend();
    r.direct = file->direct();
  }
  std::filesystem::remove(path);
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Steps {
  std::vector<double> total, fwd, bwd, opt, ratio;
  std::vector<double> user, sys;  // CPU seconds of the process (all threads) per step
  std::vector<double> swap_wait;  // StepStats::swap_wait_seconds
  SwapBytes io;                   // measured over all the timed steps
};

// The process's CPU time so far (all threads): user and system seconds.
std::pair<double, double> ProcessCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {seconds(u.ru_utime), seconds(u.ru_stime)};
}

void PrintDirectory(const Options& o) {
  const bool tmpfs = FileSystemName(o.dir) == "tmpfs";
  std::printf("swap directory %s (%s)%s\n", o.dir.c_str(), tmpfs ? "tmpfs" : "not tmpfs",
              tmpfs ? ": the swap files live in memory, O_DIRECT or not, so these figures say "
                      "little about a disk (use --dir on a real disk, e.g. /var/tmp)"
                    : "");
}

void PrintResults(const std::vector<std::unique_ptr<Engine>>& engines,
                  const std::vector<Steps>& steps, const DiskRate& disk) {
  std::printf("%-12s %8s %8s %6s %8s %8s %8s %8s %8s %8s\n", "variant", "median", "best", "ratio",
              "forward", "backward", "optim", "swapwait", "cpu user", "cpu sys");
  for (size_t v = 0; v < engines.size(); ++v) {
    const Steps& s = steps[v];
    std::printf("%-12s %6.0fms %6.0fms %5.2fx %6.0fms %6.0fms %6.0fms %6.0fms %6.0fms %6.0fms\n",
                kVariants[v].name, Median(s.total) * 1e3,
                *std::min_element(s.total.begin(), s.total.end()) * 1e3, Median(s.ratio),
                Median(s.fwd) * 1e3, Median(s.bwd) * 1e3, Median(s.opt) * 1e3,
                Median(s.swap_wait) * 1e3, Median(s.user) * 1e3, Median(s.sys) * 1e3);
  }
  std::printf(
      "median/best: step time over the timed steps; ratio: median over rounds of the "
      "step / the memory step of the same round; forward/backward/optim: StepStats "
      "medians; swapwait: time blocked on the swappers; cpu user/sys: the process's CPU "
      "time per step (all threads; the I/O's kernel work shows in sys)\n");
  std::printf("%-12s %9s %9s %9s %9s %10s %10s\n", "swap/step", "read", "written", "measured",
              "measured", "I/O rate", "exposed");
  const double base = Median(steps[0].total);
  for (size_t v = 1; v < engines.size(); ++v) {
    const Steps& s = steps[v];
    const SwapBytes b = SwapBytesPerStep(*engines[v], kVariants[v]);
    const double t = Median(s.total), ratio = Median(s.ratio), timed = s.total.size();
    const double bytes = static_cast<double>(b.read + b.written);
    std::printf("%-12s %7.0fMB %7.0fMB %7.0fMB %7.0fMB %5.2f GB/s", kVariants[v].name,
                b.read * 1e-6, b.written * 1e-6, s.io.read / timed * 1e-6,
                s.io.written / timed * 1e-6, GBs(bytes, t));
    // What the step gained over the memory step of its round; within a few per cent of it
    // the I/O is hidden (or lost in the noise).
    if (ratio > 1.03) std::printf(" %5.2f GB/s\n", GBs(bytes, (ratio - 1.0) * base));
    if (ratio <= 1.03) std::printf(" %10s\n", "hidden");
  }
  std::printf(
      "read/written: from the layer sizes and the gather plan; measured: the "
      "process's block I/O (/proc/self/io) per step; I/O rate: bytes / median step; "
      "exposed: bytes / ((ratio - 1) x memory median), the rate if no I/O overlapped "
      "compute.\nThe swap directory itself (%s, %s): write %.2f GB/s, read %.2f GB/s.\n",
      disk.backend.c_str(), disk.direct ? "O_DIRECT" : "buffered", disk.write_gbs, disk.read_gbs);
}

// Swap directories the engines should have removed.
void CheckLeftovers(const Options& o) {
  int left = 0;
  for (const Variant& v : kVariants) {
    const std::string job = o.dir + "/ztrain-offload_bench_" + v.name;
    if (std::filesystem::exists(job)) std::printf("left behind: %s\n", job.c_str()), ++left;
  }
  if (left == 0) std::printf("swap files: none left in %s\n", o.dir.c_str());
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  nn::MicroBatch mb;
  Batch(int64_t b, int64_t t, int vocab) : tokens(b * t), targets(b * t) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
    mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t});
    mb.targets = Tensor(targets.data(), DType::kI32, {b, t});
  }
};

int Run(const Options& o) {
  PrintDirectory(o);
  const DiskRate disk = MeasureDisk(o.dir, MakeConfig(o, kVariants[0]).aio);
  std::vector<std::unique_ptr<Engine>> engines;
  for (const Variant& v : kVariants) {
    const Config cfg = MakeConfig(o, v);
    engines.push_back(std::make_unique<Engine>(cfg, nn::BuildGpt2(cfg.model)));
  }
  std::printf(
      "GPT-2 %d layers, %d wide, vocab %d, %lld parameters, B=%d T=%d fp32, ZeRO-3 "
      "dp=1, sub_group_size %lld; median of %d steps after 1 warm-up\n",
      o.layers, o.embd, o.vocab, static_cast<long long>(engines[0]->NumParameters()), o.batch,
      o.seq, static_cast<long long>(o.sub_group_size), o.steps);
  const Batch batch(o.batch, o.seq, o.vocab);
  const size_t n = engines.size();
  for (auto& e : engines) e->TrainStep({&batch.mb, 1});
  std::vector<Steps> steps(n);
  for (int r = 0; r < o.steps; ++r) {
    std::vector<double> t(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t v = (r + k) % n;
      const SwapBytes io_before = ProcessIo();
      const auto [user_before, sys_before] = ProcessCpu();
      const StepStats st = engines[v]->TrainStep({&batch.mb, 1});
      const auto [user_after, sys_after] = ProcessCpu();
      const SwapBytes io_after = ProcessIo();
      steps[v].user.push_back(user_after - user_before);
      steps[v].swap_wait.push_back(st.swap_wait_seconds);
      steps[v].sys.push_back(sys_after - sys_before);
      steps[v].io.read += io_after.read - io_before.read;
      steps[v].io.written += io_after.written - io_before.written;
      t[v] = st.seconds;
      steps[v].total.push_back(st.seconds), steps[v].fwd.push_back(st.forward_seconds);
      steps[v].bwd.push_back(st.backward_seconds), steps[v].opt.push_back(st.optimizer_seconds);
    }
    for (size_t v = 0; v < n; ++v) steps[v].ratio.push_back(t[v] / t[0]);
  }
  PrintResults(engines, steps, disk);
  engines.clear();
  CheckLeftovers(o);
  return 0;
}

}  // namespace
}  // namespace ztrain::bench

int main(int argc, char** argv) {
  try {
    return ztrain::bench::Run(ztrain::bench::ParseOptions(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_bench: %s\n", e.what());
    return 1;
  }
}
