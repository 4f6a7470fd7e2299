#!/usr/bin/env bash
# The whole test suite, as README command 2 and .ci/run run it: every test once with the
# BLAS kernel ztrain chooses for this CPU, then the equivalence tests (labels `mpi` and
# `equivalence`: every layout against one process, resumes, micro-batching) again under
# other OpenBLAS kernels, whose different summation orders move the last bits of every GEMM:
# Haswell (AVX2 + FMA), Sandybridge (AVX without FMA) and, where the CPU has AVX-512,
# SkylakeX. Their tolerances come from Note [Equivalence tolerances]
# (tests/rounding_model.h), so a kernel change cannot turn them red. The repeat leaves out the
# fault tests (label `fault`: killed and stopped ranks, mismatched configs), whose outcome no
# kernel changes.
#   bash scripts/run_tests.sh [build dir]
set -euo pipefail
build=${1:-build}
jobs=$(nproc)
# The fp32 GEMM choices the runs measure (Note [GEMMs chosen by measurement]) go to a cache of
# this run's own, not the user's ~/.cache/ztrain.
ZTRAIN_CACHE_DIR=$(mktemp -d /tmp/ztrain-test-cache.XXXXXX)
export ZTRAIN_CACHE_DIR
trap 'rm -rf "$ZTRAIN_CACHE_DIR"' EXIT
# The first pass runs on the kernel the ztrain executable runs on (Note [BLAS kernel]):
# OpenBLAS's own pick where it knows the CPU, the best kernel for the CPU where it took a
# generic one (the test binaries link OpenBLAS without ztrain's restart, so they get it set).
chosen=$(env -u OPENBLAS_CORETYPE "$build/ztrain" --version 2> /dev/null |
         sed -n 's/^ *BLAS *\([A-Za-z]*\) kernel, chosen by ztrain over .*/\1/p')
if [ -n "$chosen" ]; then
  echo "== the whole suite, OPENBLAS_CORETYPE=$chosen (ztrain's choice: OpenBLAS took a generic kernel)"
  OPENBLAS_CORETYPE=$chosen ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900
else
  echo "== the whole suite, OpenBLAS kernel as detected (OPENBLAS_CORETYPE unset)"
  env -u OPENBLAS_CORETYPE ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900
fi
kernels=()
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
[[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]] && kernels+=(Haswell)
[[ " $flags " == *" avx "* ]] && kernels+=(Sandybridge)
[[ " $flags " == *" avx512f "* ]] && kernels+=(SkylakeX)
for kernel in "${kernels[@]}"; do
  echo "== equivalence tests (labels mpi, equivalence; not fault) with OPENBLAS_CORETYPE=$kernel"
  OPENBLAS_CORETYPE=$kernel ctest --test-dir "$build" -L '^(mpi|equivalence)$' -LE '^fault$' \
    --output-on-failure -j"$jobs" --timeout 900
done
[ ${#kernels[@]} -gt 0 ] || echo "(no other x86 OpenBLAS kernel applies to this CPU: equivalence tests ran once)"
