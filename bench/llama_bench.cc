// Llama ~110M train step on the CPU (12 layers, 768 wide, 12 heads, 4 KV heads, SwiGLU
// intermediate 2048, vocab 32000 with its own LM head; B=4, T=64) in fp32 and then in bf16,
// against references measured in the same run (bench/step_bench.h): the fp32 step against
// the OpenBLAS SGEMM peak (target >= 75%) and against the same step in PyTorch
// (bench/pytorch_llama_step.py, target >= 1.8x faster), the bf16 step against oneDNN's bf16
// matmul peak (target >= 55%) and PyTorch's bf16 autocast step.
//
//   OMP_NUM_THREADS=2 build/bench/llama_bench [--steps N] [--batch B] [--seq T] [--layers L]
//                     [--precision fp32|bf16] [--device cuda] [--python PATH] [--no-torch]
//
// --precision fp32 times fp32 only; the default, bf16, times both.
#include "bench/step_bench.h"
#include "kernels/cpu/blas_kernel.h"

int main(int argc, char** argv) {
  ztrain::kernels::RestartWithBestBlasKernel(argv);  // Note [BLAS kernel]
  ztrain::bench::StepBenchOptions o;
  o.family = "Llama";
  o.model = {{"type", "llama"},     {"n_layer", 12},
             {"n_head", 12},        {"n_kv_head", 4},
             {"n_embd", 768},       {"intermediate_size", 2048},
             {"vocab_size", 32000}, {"padded_vocab_size", 32000},
             {"max_seq_len", 2048}, {"tie_word_embeddings", false}};
  o.torch_script = "pytorch_llama_step.py";
  o.precisions = {"fp32", "bf16"};
  o.targets = {.fp32_of_gemm_peak = 0.75, .bf16_of_onednn_peak = 0.55, .speedup_over_torch = 1.8};
  if (!ztrain::bench::ParseStepBenchArgs(argc, argv, o)) return 2;
  return ztrain::bench::RunStepBench(o);
}
