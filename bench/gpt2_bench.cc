// GPT-2 124M train step (12 layers, 768 wide, vocab 50257 padded to 50304; B=4, T=64, fp32)
// against the OpenBLAS SGEMM peak and the same step in PyTorch (bench/pytorch_gpt2_step.py),
// both measured in the same run; with --device cuda on GPU 0, against cuBLAS's fp32 GEMM peak
// measured in the same run, plus tokens/s and MFU against the GPU's bf16 dense peak
// (--bf16-peak TFLOP/s, default 989: H100/H200 SXM). The step benchmark itself is shared with
// llama_bench (bench/step_bench.h).
//
//   build/bench/gpt2_bench [--steps N] [--batch B] [--seq T] [--layers L] [--device cuda]
//                          [--precision bf16|fp16] [--python PATH] [--no-torch]
//
// With --precision the same step is timed in fp32 and then in mixed precision in the same
// run: the report ends with the 16-bit step time against fp32's.
#include "bench/step_bench.h"
#include "kernels/cpu/blas_kernel.h"

int main(int argc, char** argv) {
  ztrain::kernels::RestartWithBestBlasKernel(argv);  // Note [BLAS kernel]
  ztrain::bench::StepBenchOptions o;
  o.family = "GPT-2";
  o.model = {{"type", "gpt2"},     {"n_layer", 12},       {"n_head", 12},
             {"n_embd", 768},      {"vocab_size", 50257}, {"padded_vocab_size", 50304},
             {"max_seq_len", 1024}};
  o.torch_script = "pytorch_gpt2_step.py";
  o.targets.fp32_of_gemm_peak = 0.60;
  if (!ztrain::bench::ParseStepBenchArgs(argc, argv, o)) return 2;
  return ztrain::bench::RunStepBench(o);
}
