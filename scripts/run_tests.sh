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
# The first pass runs on the kernel the ztrain executable chooses for this CPU (Note [BLAS
# kernel]): OpenBLAS's own pick where it knows the CPU, never its generic kernels where it does
# not (the test binaries link OpenBLAS without ztrain's restart).
best=$("$build/ztrain" --version 2> /dev/null | sed -n 's/.*best OPENBLAS_CORETYPE=\([A-Za-z]*\).*/\1/p')
echo "== the whole suite, on the OpenBLAS kernel ztrain chooses (OPENBLAS_CORETYPE=${best:-unset})"
if [ -n "$best" ]; then
  OPENBLAS_CORETYPE=$best ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 900
else
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
