#!/usr/bin/env bash
# The one prepared script for a session that has a GPU machine (the `device` tool: one H200,
# 16 cores, 15 minutes of device time in all, starts included). It builds only what the GPU
# checks need (the targets of the tests labelled `cuda`, the ztrain binary and the GPU
# benches) with Ninja for sm_90 alone, runs every `cuda`-labelled test with JUnit output, then
# the benches: GPT-2 124M and a Llama ~1B shape on the GPU (tokens/s, MFU against the GPU's
# dense peak, cuBLAS's GEMM peak measured in the same run), PyTorch's GPT-2 step on the same
# GPU, GPT-2's step at ZeRO-3 with CPU offload against ZeRO-3 in the GPU, and a per-kernel
# profile of a bf16 step (Nsight Compute). Results: docs/gpu.md. Everything goes to $OUT (default
# ./device_out); each phase prints how long it took, and the whole run stays within LIMIT_S
# seconds (default 540), a phase that would not fit being skipped and said so.
#   bash bench/device_check.sh                     # on the GPU machine, from the repo root
#   BUILD_ONLY=1 bash bench/device_check.sh        # the configure and build phases only
#   SKIP_TESTS=1 bash bench/device_check.sh        # the benches only (a rerun on a warm
#                                                  # machine keeps build-device)
#   PREBUILT=1 bash bench/device_check.sh          # no build: unpack .device/bundle.tar.xz
#                                                  # (bench/device_bundle.sh, made here) first
# The device tool's H200 image has no OpenMPI, OpenBLAS, spdlog, ... and no registry to
# install them from, so the build there fails at configure: build and bundle here, carry .device.
set -uo pipefail
out=${OUT:-device_out}
limit=${LIMIT_S:-540}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
summary="$out/summary.txt"
: > "$summary"
# The device tool brings back at most 8 files from $OUT: at the end every log goes into one
# archive beside summary.txt and cuda_tests.xml.
pack_logs() {
  (cd "$out" && ls *.log *.txt > /dev/null 2>&1 &&
     tar -czf logs.tar.gz --remove-files $(ls *.log *.txt | grep -v '^summary.txt$'))
}
trap pack_logs EXIT
elapsed() { echo $(( $(date +%s) - start )); }
phase() {  # name, seconds it may take, command...: runs it with a timeout, logs, times it
  local name=$1 budget=$2
  shift 2
  local left=$(( limit - $(elapsed) ))
  if (( left < 10 )); then
    echo "== $name: skipped, ${left}s of the ${limit}s left" | tee -a "$summary"
    return 0
  fi
  (( budget > left )) && budget=$left
  local t0
  t0=$(date +%s)
  echo "== $name (at most ${budget}s)"
  timeout "$budget" "$@" > "$out/$name.log" 2>&1
  local status=$?
  local took=$(( $(date +%s) - t0 ))
  echo "== $name: exit $status after ${took}s" | tee -a "$summary"
  tail -n 12 "$out/$name.log"
  return $status
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "(no nvidia-smi)" > "$out/nvidia-smi.txt"
lscpu > "$out/lscpu.txt" 2>&1
if [ -n "${PREBUILT:-}" ]; then
  source bench/device_env.sh
  t0=$(date +%s)
  device_env > "$out/unpack.log" 2>&1
  status=$?
  echo "== unpack: exit $status after $(( $(date +%s) - t0 ))s" | tee -a "$summary"
  cat "$out/unpack.log"
  (( status == 0 )) || exit 1
  phase mpi_probe 30 mpiexec --oversubscribe --bind-to none --mca btl self,vader -n 2 \
    ./build-device/ztrain --version
else
  generator=(-G Ninja)
  command -v ninja > /dev/null || generator=()
  phase configure 120 cmake "${generator[@]}" -S . -B build-device -DCMAKE_BUILD_TYPE=Release \
    -DZTRAIN_WITH_CUDA=ON -DZTRAIN_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DZTRAIN_ARCH="${ZTRAIN_ARCH:-native}" ||
    exit 1
  targets=(kernels_cuda_test optim_cuda_test cuda_engine_test nccl_availability_test
           zero_equivalence_test comm_nccl_test layout_equivalence_test ztrain_cli gpt2_bench
           llama_bench)
  phase build 420 cmake --build build-device -j"$(nproc)" --target "${targets[@]}" || exit 1
  [ -n "${BUILD_ONLY:-}" ] && { echo "BUILD_ONLY: stopping after the build ($(elapsed)s)"; exit 0; }
fi

# Every test labelled cuda that was built (tests of targets not built are not registered),
# 8 at a time (16 cores; the multi-rank ones share the GPU and count their ranks).
if [ -n "${SKIP_TESTS:-}" ]; then
  echo "== cuda_tests: skipped (SKIP_TESTS)" | tee -a "$summary"
else
  phase cuda_tests 300 ctest --test-dir build-device -L cuda -j 8 --output-on-failure \
    --output-junit "$out/cuda_tests.xml" --timeout 180
fi
# fp32, then bf16 in the same run: tokens/s, MFU against the H200's dense bf16 peak (989
# TFLOP/s), and the step's share of cuBLAS's GEMM peak in the same dtype, measured before and after.
phase gpt2_bench 90 ./build-device/bench/gpt2_bench --device cuda --batch 16 --seq 1024 \
  --steps 5 --precision bf16 --no-torch
# PyTorch's GPT-2 step at the same shape on the same GPU, the reference of the two lines above:
# eager PyTorch with flash attention (SDPA), under bf16 autocast and in fp32. The image's
# python3 holds PyTorch; it runs without the bundle's libraries.
torch_gpt2() {
  env -u LD_LIBRARY_PATH python3 bench/pytorch_gpt2_step.py --device cuda --batch 16 \
    --seq 1024 --steps 5 --attention sdpa "$@"
}
phase torch_gpt2_bf16 90 bash -c "$(declare -f torch_gpt2); torch_gpt2 --precision bf16"
phase torch_gpt2_fp32 90 bash -c "$(declare -f torch_gpt2); torch_gpt2 --precision fp32"
# A Llama-3.2-1B shape (16 layers, 2048 wide, 32 heads over 8 KV heads, MLP 8192, vocabulary
# 128256): 1.2B parameters, 19 GiB of fp32 masters and Adam state.
phase llama_bench 120 ./build-device/bench/llama_bench --device cuda --batch 4 --seq 2048 \
  --steps 5 --precision bf16 --no-torch --model-json \
  '{"n_layer": 16, "n_embd": 2048, "n_head": 32, "n_kv_head": 8, "intermediate_size": 8192,
    "vocab_size": 128256, "padded_vocab_size": 128256}'
# ZeRO-3 with the shards and AdamW on the host (pinned; Note [Offloaded shards beside compute])
# against ZeRO-3 in the GPU, GPT-2 124M bf16: the two step times of one script run.
phase zero3_in_gpu 90 ./build-device/bench/gpt2_bench --device cuda --batch 16 --seq 1024 \
  --steps 5 --precision bf16 --no-torch --zero-json '{"stage": 3}'
phase zero3_offload 150 ./build-device/bench/gpt2_bench --device cuda --batch 16 --seq 1024 \
  --steps 5 --precision bf16 --no-torch --zero-json \
  '{"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true},
    "offload_optimizer": {"device": "cpu", "pin_memory": true}}'
phase ztrain_default 60 ./build-device/ztrain train
# Where a bf16 step's GPU time goes, kernel by kernel (GPT-2 B16 T1024, 2 layers, one step
# after the warm-up; the fp32 step runs first and is in the table too): Nsight Compute's
# per-kernel summary of gpu__time_duration, clocks left alone. ncu runs without the bundle's
# libraries, the bench with them.
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -n 1)
if [ -n "$ncu" ]; then
  phase kernel_profile 150 env -u LD_LIBRARY_PATH "$ncu" --clock-control none \
    --metrics gpu__time_duration.sum --print-summary per-kernel \
    sh -c "LD_LIBRARY_PATH='$LD_LIBRARY_PATH' exec ./build-device/bench/gpt2_bench \
      --device cuda --batch 16 --seq 1024 --steps 1 --layers 2 --precision bf16 --no-torch"
else
  echo "== kernel_profile: skipped, no ncu" | tee -a "$summary"
fi
echo "total $(elapsed)s of ${limit}s; logs and cuda_tests.xml in $out" | tee -a "$summary"
