#!/usr/bin/env bash
# The one prepared script for a session that has a GPU machine (the `device` tool; 15
# minutes of device time in all): builds with CUDA on, runs every CUDA test, then the GPT-2
# 124M step bench on the GPU (B=16, T=1024: tokens/s, fraction of cuBLAS's fp32 GEMM peak
# measured in the same run, MFU against the bf16 dense peak) and the default training job.
# Run from the repository root; output goes to $OUT (or ./device_out).
#   bash bench/device_check.sh
set -uo pipefail
out=${OUT:-device_out}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DZTRAIN_WITH_CUDA=ON \
      -DZTRAIN_CUDA_ARCHITECTURES="${arch:-90}" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-device -j"$(nproc)" --target kernels_cuda_test optim_cuda_test \
      cuda_engine_test zero_equivalence_test nccl_availability_test gpt2_bench ztrain \
      > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
run() {  # name, command...: the log in $out, the tail on the console
  local name=$1; shift
  echo "== $name"
  timeout 300 "$@" > "$out/$name.log" 2>&1; echo "exit $?" >> "$out/$name.log"
  tail -15 "$out/$name.log"
}
run kernels_cuda_test ./build-device/tests/kernels/kernels_cuda_test
run optim_cuda_test ./build-device/tests/optim/optim_cuda_test
run cuda_engine_test ./build-device/tests/engine/cuda_engine_test
run nccl ./build-device/tests/parallel/nccl_availability_test
# ZeRO on the GPU over NCCL, one rank (a machine with one GPU cannot run two NCCL ranks).
for stage in 0 1 2 3; do
  run zero_cuda_stage$stage mpirun --allow-run-as-root -np 1 \
      ./build-device/tests/engine/zero_equivalence_test --stage $stage --gas 2 --device cuda
done
run gpt2_bench_cuda ./build-device/bench/gpt2_bench --device cuda --batch 16 --seq 1024 --steps 5
run ztrain_default ./build-device/launcher/ztrain train
