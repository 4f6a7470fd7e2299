// quant_bench: QLoRA's cost on the CPU, against references measured in the same run.
//
//   OMP_NUM_THREADS=2 build/bench/quant_bench [--rows R] [--cols C] [--steps N] [--batch B]
//                     [--seq T] [--layers L] [--precision bf16|fp32]
//                     [--targets all-linear|q_proj,v_proj,...]
//
// 1. Dequantize (CpuOps::Dequantize, kernels/quant.h) of one R x C weight (default 4096 x 4096,
//    a Llama-7B projection) in NF4 with double quantization, NF4, FP4 and INT8, into the compute
//    dtype, against STREAM copy on arrays of the output's size: the bytes it moves (the blob
//    read, the output written) per second over copy's. It writes 2 (bf16) or 4 (fp32) bytes a
//    weight from 0.5-1 byte read, so it is bounded by the store bandwidth as copy is.
// 2. QuantizeInto of the same weight (what loading a checkpoint into a quantized base costs),
//    in weights per second, and the time that rate gives for a 7B base.
// 3. A train step of the Llama ~110M model of llama_bench (B=4, T=256 by default) with LoRA on
//    every linear (r 16) on the base in the compute dtype, then the same step with the base in
//    NF4 with double quantization (QLoRA), the two engines stepping in turn: the QLoRA step over
//    the LoRA step, target <= 1.3x. Each linear's weight is dequantized once in forward and once for the
//    input's gradient in backward; the figures say what that costs against the GEMMs.
// Each figure is the best of several runs after a warm-up (bench/bench_util.h).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/config.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/quant.h"
#include "nn/adapters.h"
#include "nn/family.h"

namespace {

using ztrain::DType;
using ztrain::Tensor;
using ztrain::bench::BestOf;
using ztrain::bench::GBs;
namespace kernels = ztrain::kernels;

struct Options {
  int64_t rows = 4096, cols = 4096;
  int steps = 4, batch = 4, seq = 256, layers = 12;
  std::string precision = "bf16";
  std::string targets = "all-linear";  // lora.target_modules: all-linear or a comma list
};

bool Parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "quant_bench: %s needs a value\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "--rows") {
      o.rows = std::atoll(v);
    } else if (a == "--cols") {
      o.cols = std::atoll(v);
    } else if (a == "--steps") {
      o.steps = std::atoi(v);
    } else if (a == "--batch") {
      o.batch = std::atoi(v);
    } else if (a == "--seq") {
      o.seq = std::atoi(v);
    } else if (a == "--layers") {
      o.layers = std::atoi(v);
    } else if (a == "--precision") {
      o.precision = v;
    } else if (a == "--targets") {
      o.targets = v;
    } else {
      std::fprintf(stderr, "quant_bench: unknown argument %s\n", a.c_str());
      return false;
    }
  }
  if (o.rows <= 0 || o.cols <= 0 || o.steps <= 0 || o.batch <= 0 || o.seq <= 0 ||
      o.layers <= 0 || (o.precision != "bf16" && o.precision != "fp32")) {
    std::fprintf(stderr, "quant_bench: sizes must be positive and --precision bf16 or fp32\n");
    return false;
  }
  return true;
}

struct Format {
  const char* name;
  kernels::QuantFormat format;
};
const Format kFormats[] = {{"nf4+dq", {kernels::QuantType::kNf4, true}},
                           {"nf4", {kernels::QuantType::kNf4, false}},
                           {"fp4", {kernels::QuantType::kFp4, false}},
                           {"int8", {kernels::QuantType::kInt8, false}}};

void BenchKernels(const Options& o, DType out_dtype) {
  const int64_t n = o.rows * o.cols;
  const double out_bytes = static_cast<double>(n) * ztrain::DTypeSize(out_dtype);
  std::vector<float> w(static_cast<size_t>(n));
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (float& x : w) x = dist(gen);
  const kernels::QuantGeometry g = kernels::QuantGeometry::Whole(o.rows, o.cols);
  ztrain::bench::FloatArray out(static_cast<size_t>(n));
  kernels::CpuOps ops;
  // STREAM copy over arrays of the output's bytes, before and after; the higher counts.
  const size_t copy_floats = static_cast<size_t>(out_bytes / 4);
  double copy = ztrain::bench::StreamCopyGBs(copy_floats);
  struct Row {
    const char* name;
    double blob_bytes, dequant_s, quantize_s;
  };
  std::vector<Row> rows;
  for (const Format& f : kFormats) {
    const int64_t total = kernels::LayoutOf(f.format, g).total;
    std::vector<uint8_t> blob(static_cast<size_t>(total));
    const double quantize_s =
        BestOf(2, [&] { kernels::QuantizeInto(f.format, g, w.data(), blob.data()); });
    const Tensor blob_t(blob.data(), DType::kU8, {total});
    const Tensor out_t(out.data(), out_dtype, {o.rows, o.cols});
    const double dequant_s = BestOf(10, [&] { ops.Dequantize(blob_t, f.format, g, out_t); });
    rows.push_back({f.name, static_cast<double>(total), dequant_s, quantize_s});
  }
  copy = std::max(copy, ztrain::bench::StreamCopyGBs(copy_floats));
  std::printf("\nDequantize %lld x %lld into %s (%d threads), STREAM copy %.1f GB/s same run:\n",
              static_cast<long long>(o.rows), static_cast<long long>(o.cols),
              std::string(ztrain::DTypeName(out_dtype)).c_str(), omp_get_max_threads(), copy);
  for (const Row& r : rows) {
    const double moved = r.blob_bytes + out_bytes;
    std::printf(
        "  %-7s %5.3f B/weight  dequantize %6.2f ms  %5.1f GB/s moved = %.2fx STREAM copy   "
        "quantize %6.0f M weights/s (a 7B base: %.0f s)\n",
        r.name, r.blob_bytes / n, r.dequant_s * 1e3, GBs(moved, r.dequant_s),
        GBs(moved, r.dequant_s) / copy, n / r.quantize_s * 1e-6, 7e9 / (n / r.quantize_s));
  }
}

// The Llama of llama_bench with LoRA on every linear, the base quantized or not.
ztrain::Config StepConfig(const Options& o, bool quantized) {
  nlohmann::json j = ztrain::DefaultConfigJson();
  j["model"] = {{"type", "llama"},     {"n_layer", o.layers},
                {"n_head", 12},        {"n_kv_head", 4},
                {"n_embd", 768},       {"intermediate_size", 2048},
                {"vocab_size", 32000}, {"padded_vocab_size", 32000},
                {"max_seq_len", 2048}, {"tie_word_embeddings", false}};
  j["data"] = {{"seq_len", o.seq}};
  j["train_micro_batch_size_per_gpu"] = o.batch;
  j["gradient_accumulation_steps"] = 1;
  j.erase("train_batch_size");
  j["device"] = "cpu";
  if (o.precision == "bf16") j["bf16"] = {{"enabled", true}};
  nlohmann::json targets = o.targets;
  if (o.targets != "all-linear") {
    targets = nlohmann::json::array();
    for (size_t at = 0; at <= o.targets.size();) {
      const size_t comma = std::min(o.targets.find(',', at), o.targets.size());
      targets.push_back(o.targets.substr(at, comma - at));
      at = comma + 1;
    }
  }
  j["lora"] = {{"r", 16}, {"lora_alpha", 32}, {"target_modules", targets}};
  if (quantized) {
    j["quantization"] = {{"load_in_4bit", true},
                         {"bnb_4bit_quant_type", "nf4"},
                         {"bnb_4bit_use_double_quant", true},
                         {"bnb_4bit_compute_dtype", o.precision == "bf16" ? "bfloat16" : "float32"}};
  }
  return ztrain::ParseConfig(j);
}

struct StepRun {
  double best_s = 1e30, forward_s = 0, backward_s = 0;
  int64_t param_bytes = 0;  // the tracker's parameters: base, adapters, embeddings
};

// One engine of the comparison and its best step.
struct StepEngine {
  StepEngine(const Options& o, bool quantized)
      : cfg(StepConfig(o, quantized)),
        engine(cfg, ztrain::nn::BuildModel(cfg.model, ztrain::nn::MakeWholeLinears(),
                                           ztrain::nn::AdapterPlan(cfg))) {}
  void Step(const ztrain::nn::MicroBatch& mb) {
    const ztrain::StepStats st = engine.TrainStep({&mb, 1});
    if (st.seconds < run.best_s) {
      run.best_s = st.seconds;
      run.forward_s = st.forward_seconds;
      run.backward_s = st.backward_seconds;
    }
  }
  ztrain::Config cfg;
  ztrain::Engine engine;
  StepRun run;
};

void BenchStep(const Options& o) {
  std::printf("\nLlama %d layers (768 wide, SwiGLU 2048, vocab 32000), LoRA r 16 on %s, "
              "B=%d T=%d, %s compute, %d threads:\n",
              o.layers, o.targets.c_str(), o.batch, o.seq, o.precision.c_str(),
              omp_get_max_threads());
  std::vector<int32_t> tokens(static_cast<size_t>(o.batch) * o.seq), targets(tokens.size());
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, 31999);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = tok(rng), targets[i] = tok(rng);
  const ztrain::nn::MicroBatch mb{Tensor(tokens.data(), DType::kI32, {o.batch, o.seq}),
                                  Tensor(targets.data(), DType::kI32, {o.batch, o.seq})};
  // Both engines live at once and step in turn after a warm-up each, so that neither runs in
  // a quieter moment of the machine or on a warmer heap than the other (timed one after the
  // other, the first engine's steps came out up to 25% slower than the same engine timed alone).
  StepEngine lora(o, false), qlora(o, true);
  lora.engine.TrainStep({&mb, 1});
  qlora.engine.TrainStep({&mb, 1});
  for (int s = 0; s < o.steps; ++s) {
    lora.Step(mb);
    qlora.Step(mb);
  }
  const auto print = [](const char* name, StepEngine& e) {
    e.run.param_bytes = e.engine.memory().Snapshot().Current(ztrain::MemoryCategory::kParameters);
    const StepRun& r = e.run;
    std::printf("  %-28s step %7.1f ms (forward %6.1f, backward %6.1f)  parameters %s\n", name,
                r.best_s * 1e3, r.forward_s * 1e3, r.backward_s * 1e3,
                ztrain::FormatBytes(r.param_bytes).c_str());
  };
  print("LoRA, base in compute dtype", lora);
  print("QLoRA, base nf4+dq", qlora);
  std::printf("  QLoRA step / LoRA step: %.2fx (target <= 1.3x); parameter bytes %.3fx\n",
              qlora.run.best_s / lora.run.best_s,
              static_cast<double>(qlora.run.param_bytes) / static_cast<double>(lora.run.param_bytes));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, o)) return 2;
  BenchKernels(o, o.precision == "bf16" ? DType::kBF16 : DType::kF32);
  BenchStep(o);
  return 0;
}
