#include "estimate/tune.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <random>

#include "core/logging.h"
#include "core/sizes.h"
#include "engine/engine.h"
#include "estimate/estimate.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/onednn_matmul.h"
#include "kernels/ops.h"
#include "nn/gpt2.h"
#include "parallel/comm/communicator.h"

namespace ztrain {
namespace {

int64_t EstimatedPeak(const Config& config, int64_t micro_batch) {
  return EstimateMemory(WithMicroBatch(config, micro_batch)).device_total_peak;
}

// One train step of `config` on random tokens; the tracker's device peak (everything on the
// CPU backend, as the estimate counts it).
int64_t MeasuredPeak(const Config& config) {
  Engine engine(config, nn::BuildModel(config.model, nn::MakeWholeLinears(),
                                       nn::AdapterPlan(config)));
  const int64_t b = config.train_micro_batch_size_per_gpu, t = config.data.seq_len;
  const int64_t gas = config.gradient_accumulation_steps;
  std::vector<int32_t> tokens(static_cast<size_t>(gas * b * t));
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(config.model.vocab_size) - 1);
  for (int32_t& x : tokens) x = pick(rng);
  std::vector<nn::MicroBatch> micro;
  for (int64_t i = 0; i < gas; ++i) {
    const Tensor view(tokens.data() + i * b * t, DType::kI32, {b, t});
    micro.push_back({view, view});
  }
  engine.TrainStep(micro);
  return engine.memory().Snapshot().total_peak;
}

}  // namespace

Config WithMicroBatch(const Config& config, int64_t micro_batch) {
  // Parsed again, so that a size past Note [Size limits] is a ConfigError here too.
  nlohmann::json j = config.resolved;
  j["train_micro_batch_size_per_gpu"] = micro_batch;
  j.erase("train_batch_size");
  Config c = ParseConfig(j, config.world_size);
  c.device = config.device;
  c.auto_choices = config.auto_choices;
  return c;
}

TuneResult TuneMicroBatch(const Config& config, int64_t budget, int64_t max_micro_batch,
                          bool confirm) {
  ZTRAIN_CHECK_T(ConfigError, budget > 0, "the memory budget must be positive");
  TuneResult r;
  auto fits = [&](int64_t b) {
    int64_t peak = -1;  // past the config's size limits: does not fit
    try {
      peak = EstimatedPeak(config, b);
    } catch (const ConfigError&) {
    }
    r.tried.emplace_back(b, peak);
    return peak >= 0 && peak <= budget;
  };
  // Doubling while it fits, then bisection in (fit, fail).
  max_micro_batch = std::min(max_micro_batch, kMaxElements);
  int64_t fit = 0, fail = max_micro_batch + 1;
  for (int64_t b = 1; b <= max_micro_batch; b = b > max_micro_batch / 2 ? max_micro_batch + 1 : 2 * b) {
    if (!fits(b)) {
      fail = b;
      break;
    }
    fit = b;
  }
  if (fit > 0 && fail > fit + 1) {
    fail = std::min(fail, max_micro_batch + 1);
    while (fail - fit > 1) {
      const int64_t mid = fit + (fail - fit) / 2;
      (fits(mid) ? fit : fail) = mid;
    }
  }
  r.micro_batch = fit;
  if (fit == 0) return r;
  r.estimated_peak = EstimatedPeak(config, fit);
  if (!confirm) {
    r.unconfirmed = detail::StrCat("the config is for ", config.world_size, " ranks");
    return r;
  }
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const bool on_cpu = config.device == "cpu" || kernels::CudaDeviceCount() == 0;
  if (on_cpu && physical > 0 && r.estimated_peak > physical) {
    Log().warn("tune: not confirming micro-batch {} with a real step: its estimated {} is more "
               "than this machine's {} of memory",
               fit, FormatBytes(r.estimated_peak), FormatBytes(physical));
    r.unconfirmed = "its estimate is more than this machine's " + FormatBytes(physical);
    return r;
  }
  // The real step: step down while it does not fit after all.
  for (int64_t b = fit; b >= 1; b = b > 1 ? std::max<int64_t>(1, b * 9 / 10) : 0) {
    Log().info("tune: confirming train_micro_batch_size_per_gpu {} with one step", b);
    int64_t measured = -1;
    try {
      measured = MeasuredPeak(WithMicroBatch(config, b));
    } catch (const std::bad_alloc&) {
      Log().warn("tune: micro-batch {} does not fit this machine's memory (allocation failed); "
                 "the budget {} is more than it has",
                 b, FormatBytes(budget));
    }
    if (measured >= 0 && measured <= budget) {
      r.micro_batch = b;
      r.estimated_peak = EstimatedPeak(config, b);
      r.measured_peak = measured;
      r.confirmed = true;
      return r;
    }
    if (measured >= 0) {
      Log().warn("tune: micro-batch {} measured {} over the budget {}", b, FormatBytes(measured),
                 FormatBytes(budget));
    }
    if (b == 1) break;
  }
  r.micro_batch = 0;
  return r;
}

int64_t ParseBytes(const std::string& text, const std::string& what) {
  size_t end = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit;
  for (size_t i = end; i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) {
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
    }
  }
  const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},          {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40},  {"kb", 1e3},       {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12},
      {"k", 0x1p10},    {"m", 0x1p20},     {"g", 0x1p30},   {"t", 0x1p40}};
  for (const auto& [name, scale] : units) {
    if (end > 0 && unit == name && value > 0 && std::isfinite(value)) {
      ZTRAIN_CHECK_T(ConfigError, value * scale < 0x1p62, what, " \"", text,
                     "\" is more than 2^62 bytes (4 EiB); write the memory of one rank or one "
                     "file, e.g. 80GiB");
      return static_cast<int64_t>(value * scale);
    }
  }
  throw ConfigError(detail::StrCat(
      what, " \"", text,
      "\" is not a size: a size is a number above 0 and a unit, B, KB, MB, "
      "GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024; K, M, G, T alone too), "
      "or plain bytes: e.g. 16GiB, 512MiB, 5GB or 4096"));
}

std::vector<StepGemm> StepGemmShapes(const Config& config) {
  const ModelConfig& m = config.model;
  const int64_t tokens = config.train_micro_batch_size_per_gpu *
                         (config.data.seq_len > 0 ? config.data.seq_len : m.max_seq_len);
  const int64_t c = m.n_embd, heads = int64_t{m.n_head} * m.head_size(),
                kv = int64_t{m.kv_heads()} * m.head_size(), f = m.mlp_hidden();
  const bool swiglu = m.type != "gpt2";  // the Llama builder: SwiGLU, gate and up apart
  struct Linear {
    const char* name;
    int64_t in, out, per_block;
  };
  const std::vector<Linear> linears = {
      {"attention q,k,v", c, heads + 2 * kv, 1},
      {"attention output", heads, c, 1},
      {swiglu ? "mlp gate, up" : "mlp up", c, f, swiglu ? 2 : 1},
      {"mlp down", f, c, 1},
      {"lm head", c, m.padded_vocab_size, 0},
  };
  std::vector<StepGemm> shapes;
  for (const Linear& l : linears) {
    const int64_t count = l.per_block > 0 ? l.per_block * m.n_layer : 1;
    shapes.push_back({l.name, "forward", {false, true, tokens, l.out, l.in}, count});
    shapes.push_back({l.name, "input gradient", {false, false, tokens, l.in, l.out}, count});
    shapes.push_back({l.name, "weight gradient", {true, false, l.out, l.in, tokens}, count});
  }
  return shapes;
}

kernels::GemmPlan ChooseStepGemms(const Config& config, comm::Communicator* world) {
  constexpr int64_t kPlanBytes = 8192;
  const kernels::Fp32GemmChoice by_hand = kernels::Fp32GemmByEnvironment();  // or throws
  std::string text;
  if (!world || world->rank() == 0) {
    std::vector<kernels::CountedShape> shapes;
    bool any_large = false;
    for (const StepGemm& g : StepGemmShapes(config)) {
      shapes.push_back({g.shape, g.count});
      any_large = any_large || g.shape.flops() >= kernels::kMeasuredFlops;
    }
    const std::string cache = kernels::GemmCachePath();
    if (by_hand != kernels::Fp32GemmChoice::kAuto) {
      Log().info("fp32 GEMMs: {} for every shape, as ZTRAIN_FP32_GEMM says",
                 by_hand == kernels::Fp32GemmChoice::kOneDnn ? "oneDNN" : "OpenBLAS");
    } else if (!kernels::cpu::OneDnnBuiltIn()) {
      Log().info("fp32 GEMMs: OpenBLAS (this build has no oneDNN to choose from)");
    } else if (!any_large) {
      Log().info(
          "fp32 GEMMs: OpenBLAS (every GEMM of this model's step is under {:g} GFLOP, "
          "not worth measuring)",
          kernels::kMeasuredFlops / 1e9);
    } else {
      Log().info(
          "fp32 GEMMs: choosing OpenBLAS or oneDNN for each of the step's {} shapes (measured "
          "once for this machine, cached in {})",
          shapes.size(), cache.empty() ? "nothing: no HOME" : cache);
      const kernels::GemmChoice c = kernels::ChooseFp32Gemms(shapes, cache);
      if (!c.cache_problem.empty()) Log().warn("fp32 GEMMs: {}", c.cache_problem);
      const int onednn = c.plan.OnOneDnn();
      Log().info(
          "fp32 GEMMs: oneDNN on {} of {} shapes, OpenBLAS on the rest ({} measured now, "
          "{} from the cache, {} too small to measure): the step's GEMMs take {:.1f} % "
          "less time than on OpenBLAS alone by the measurement{}",
          onednn, shapes.size(), c.measured, c.cached, c.small,
          c.openblas_seconds > 0 ? 100.0 * (1.0 - c.plan_seconds / c.openblas_seconds) : 0.0,
          cache.empty() ? "" : fmt::format("; delete {} to measure again", cache));
      text = c.plan.ToText();
      if (static_cast<int64_t>(text.size()) >= kPlanBytes) {
        Log().warn(
            "fp32 GEMMs: the plan of {} shapes is too long to send to the ranks; "
            "OpenBLAS for every shape",
            shapes.size());
        text.clear();
      }
    }
  }
  if (world && world->size() > 1) text = comm::AllGatherText(*world, text, kPlanBytes).front();
  return kernels::GemmPlan::FromText(text);
}

}  // namespace ztrain
