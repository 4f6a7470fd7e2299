#!/usr/bin/env bash
# scripts/same_numbers.sh, the refactor check of issue 35: ztrain against itself trains every
# one of its runs bit for bit alike (each run is deterministic, so a difference it reports later
# is the change's), and against the same ztrain on another OpenBLAS kernel (a wrapper that sets
# OPENBLAS_CORETYPE=Sandybridge: other summation orders) it reports the difference and fails.
#   same_numbers_test.sh <ztrain> <mpiexec>
set -euo pipefail
ztrain=$1
export MPIEXEC=$2
script=$(dirname "$0")/../../scripts/same_numbers.sh
work=$(mktemp -d /tmp/ztrain_same_numbers_test_XXXXXX)
trap 'rm -rf "$work"' EXIT
"$script" "$ztrain" "$ztrain" | tee "$work/same.txt"
grep -q "same_numbers: 19 runs bit for bit the same" "$work/same.txt"
printf '#!/bin/sh\nOPENBLAS_CORETYPE=Sandybridge exec %s "$@"\n' "$ztrain" > "$work/other_kernel"
chmod +x "$work/other_kernel"
status=0
"$script" "$ztrain" "$work/other_kernel" gpt2_zero0 \
  > "$work/other.txt" || status=$?
cat "$work/other.txt"
[ $status = 1 ] || { echo "expected exit 1 for different numbers, got $status"; exit 1; }
grep -q "^gpt2_zero0 *8 DIFFER *DIFFER *step 1; Files final.bin and final.bin differ" "$work/other.txt"
echo "PASS"
