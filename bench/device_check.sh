#!/usr/bin/env bash
# The one prepared script for a session that has a GPU machine (the `device` tool; 15
# minutes of device time in all): builds with CUDA on, runs every CUDA test (the
# cross-backend op test kernels_cuda_test against the CPU backend, the NCCL tests), and
# prints the GPU. Run from the repository root; output goes to $OUT (or ./device_out).
#   bash bench/device_check.sh
# Still to come with issue 7: the engine on CUDA and the GPT-2 124M tokens/s and MFU bench.
set -uo pipefail
out=${OUT:-device_out}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DZTRAIN_WITH_CUDA=ON \
      -DZTRAIN_CUDA_ARCHITECTURES="${arch:-90}" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-device -j"$(nproc)" --target kernels_cuda_test nccl_availability_test \
      > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
# Every case prints; failures keep their details in the log.
./build-device/tests/kernels/kernels_cuda_test 2>&1 | tee "$out/kernels_cuda_test.log" | tail -40
./build-device/tests/parallel/nccl_availability_test 2>&1 | tee "$out/nccl.log" | tail -10
