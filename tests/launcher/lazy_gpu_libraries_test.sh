#!/usr/bin/env bash
# Note [Lazy GPU libraries]: the binary links neither cuBLAS, cuBLASLt nor NCCL, and a run that
# uses no GPU never loads them; they open when the CUDA backend first needs them.
#   lazy_gpu_libraries_test.sh <ztrain>
set -euo pipefail
ztrain=$1
fail() { echo "FAILED: $*"; exit 1; }
linked=$(ldd "$ztrain")
echo "$linked" | grep -qE 'libcudart' || { echo "SKIP: $ztrain has no CUDA backend"; exit 77; }
for lib in libcublas libcublasLt libnccl; do
  if echo "$linked" | grep -q "$lib\.so"; then fail "$ztrain links $lib: $(echo "$linked" | grep "$lib")"; fi
done
loaded=$(LD_DEBUG=files "$ztrain" --help 2>&1 >/dev/null | grep -E 'file=.*(cublas|nccl)' || true)
[ -z "$loaded" ] || fail "ztrain --help loaded GPU libraries: $loaded"
echo "ztrain links libcudart only; --help loads no cuBLAS or NCCL"
