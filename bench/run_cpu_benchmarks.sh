#!/usr/bin/env bash
# Runs the CPU benchmarks one after another so their figures share one machine state:
# GPT-2 124M step vs OpenBLAS SGEMM peak and the same step in PyTorch (when python3-torch is
# installed: apt-get install python3-torch), the Llama ~110M step in fp32 and bf16 vs SGEMM,
# oneDNN's bf16 matmul peak and PyTorch, AdamW vs STREAM and PyTorch's AdamW, QLoRA's
# dequantize vs STREAM and its step vs a LoRA step, swap-file I/O
# vs fio, checkpoint save/resume vs fio, the ZeRO-3 step with NVMe offload vs in memory, the
# per-op timings, tokenization vs js-tiktoken, generation's per-token time against the prompt
# length, and (when the build has MPI) data-parallel scaling on 2 ranks against the 1-rank
# step, the pipeline bubble, the tensor-parallel step and context parallelism's ring against
# Ulysses.
#   bash bench/run_cpu_benchmarks.sh [build-dir]
set -euo pipefail
build=${1:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
# Debian's torch lives in the system interpreter, which a pyenv shim may hide.
torch_python=""
for py in python3 /usr/bin/python3; do
  if "$py" -c "import torch" 2>/dev/null; then torch_python=$(command -v "$py"); break; fi
done
if [ -n "$torch_python" ]; then
  torch_args=(--python "$torch_python")
else
  echo "PyTorch not installed: skipping the PyTorch references (apt-get install python3-torch)"
  torch_args=(--no-torch)
fi
# The train steps; each bench runs its PyTorch step (bench/pytorch_*_step.py) itself.
"$build/bench/gpt2_bench" --steps 5 "${torch_args[@]}"
"$build/bench/llama_bench" --steps 5 "${torch_args[@]}"
"$build/bench/adam_bench" "${torch_args[@]}"
# QLoRA: NF4/FP4/INT8 dequantize vs STREAM copy, quantization's rate, and a QLoRA step vs a
# LoRA step on a bf16 base.
"$build/bench/quant_bench"
# Swap-file I/O against fio on the build directory's disk (1 GiB, deleted afterwards).
"$build/bench/io_bench" --dir "$build" --reps 5
# Checkpoint write and read (a ~620 MB GPT-2 checkpoint) against fio on the same disk
# (removed afterwards).
"$build/bench/checkpoint_bench" --dir "$build"
# ZeRO-3 step with parameters and optimizer state in swap files on the same disk against the
# step in memory (swap files removed afterwards).
"$build/bench/offload_bench" --dir "$build"
"$build/bench/kernels_bench" --benchmark_counters_tabular=true --benchmark_min_time=0.2
# Causal attention at T = 512 ... 16384 against the GEMM peak and PyTorch's eager attention,
# fp32 and bf16.
"$build/bench/attention_bench" --max-seq 16384 "${torch_args[@]}"
"$build/bench/attention_bench" --max-seq 16384 --dtype bf16 "${torch_args[@]}"
# `ztrain data` with GPT-2's tokenizer vs js-tiktoken (npm; installed into the build directory).
"$build/bench/tokenizer_bench" || echo "tokenizer_bench: skipped or failed (needs node and npm)"
# Generation's per-token time against the prompt length (the KV cache).
"$build/bench/generate_bench"
if [ -x "$build/bench/dp_bench" ]; then
  # Each rank takes its share of the cores, as the ztrain launcher gives it: OMP_NUM_THREADS
  # (set above for the single-process benchmarks) would give every rank all of them.
  env -u OMP_NUM_THREADS mpirun --allow-run-as-root --bind-to none --mca mpi_yield_when_idle 1 \
    --mca btl self,vader -np 2 "$build/bench/dp_bench"
  # Pipeline bubble against (p-1)/(m+p-1) on 2 stages, and a tensor-parallel step on 2 ranks
  # against the single-rank step.
  for layout in "--pp 2" "--tp 2"; do
    env -u OMP_NUM_THREADS mpirun --allow-run-as-root --bind-to none --mca mpi_yield_when_idle 1 \
      --mca btl self,vader -np 2 "$build/bench/layout_bench" $layout
  done
  # Context parallelism on 2 ranks: ring attention's step against Ulysses' on the same shape.
  bash "$(dirname "$0")/context_parallel_bench.sh" "$build"
fi
