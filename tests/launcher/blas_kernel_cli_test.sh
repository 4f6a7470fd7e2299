#!/usr/bin/env bash
# Note [BLAS kernel] through the executable: as a new user runs it, the log names the kernel;
# a generic kernel forced with OPENBLAS_CORETYPE is kept, with a warning and the fix, and the
# run trains; an OpenBLAS that takes a generic kernel by itself (the shim makes the library say
# Prescott while OPENBLAS_CORETYPE is unset) makes ztrain start again on the CPU's best kernel,
# alone and as both ranks under mpirun, and train the same losses as a run with that kernel set
# by hand.
#   blas_kernel_cli_test.sh <ztrain binary> <corename shim .so> <mpiexec or "">
set -euo pipefail
ztrain=$1 shim=$2 mpiexec=${3:-}
work=$(mktemp -d /tmp/ztrain_blas_kernel_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
unset OPENBLAS_CORETYPE ZTRAIN_OPENBLAS_CHOSEN_OVER
best=$("$ztrain" --version | sed -n 's/.*best OPENBLAS_CORETYPE=\([A-Za-z]*\).*/\1/p')
if [ -z "$best" ]; then
  echo "this CPU has no kernel above OpenBLAS's generic ones: nothing to choose"
  exit 0
fi
config() {  # output dir
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256, "max_seq_len": 16},
 "training": {"steps": 3, "eval_interval": 0, "output_dir": "$work/$1"}}
JSON
}
losses() { grep -o "loss [0-9.]*" "$1"; }

config plain > "$work/plain.json"
"$ztrain" --config "$work/plain.json" > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; exit 1; }
grep -q "BLAS: OpenBLAS [0-9.]* [A-Za-z]* kernel on this .* CPU" "$work/plain.log" ||
  { cat "$work/plain.log"; echo "the kernel is not named"; exit 1; }

OPENBLAS_CORETYPE=Prescott "$ztrain" --config "$work/plain.json" > "$work/forced.log" 2>&1 ||
  { cat "$work/forced.log"; exit 1; }
grep -q "warn.*OPENBLAS_CORETYPE=Prescott runs OpenBLAS's Prescott kernel (SSE).*unset OPENBLAS_CORETYPE (ztrain then chooses $best)" \
  "$work/forced.log" || { cat "$work/forced.log"; echo "a generic kernel set by hand was not warned about"; exit 1; }
OPENBLAS_CORETYPE=Prescott "$ztrain" --version | grep -q "BLAS      Prescott kernel;" ||
  { echo "OPENBLAS_CORETYPE set by hand was not respected"; exit 1; }

OPENBLAS_CORETYPE=$best "$ztrain" --config "$work/plain.json" > "$work/by_hand.log" 2>&1
LD_PRELOAD=$shim "$ztrain" --version > "$work/version.log"
grep -q "BLAS      $best kernel, chosen by ztrain over Prescott;" "$work/version.log" ||
  { cat "$work/version.log"; echo "--version did not start again on $best"; exit 1; }
LD_PRELOAD=$shim "$ztrain" --config "$work/plain.json" > "$work/chosen.log" 2>&1 ||
  { cat "$work/chosen.log"; exit 1; }
grep -q "BLAS: OpenBLAS [0-9.]* $best kernel on this .* CPU; OpenBLAS kernel $best, chosen by ztrain for this CPU (.*): OpenBLAS took Prescott" \
  "$work/chosen.log" || { cat "$work/chosen.log"; echo "the restart on $best is not logged"; exit 1; }
[ "$(losses "$work/chosen.log")" = "$(losses "$work/by_hand.log")" ] ||
  { echo "the restarted run's losses differ from $best set by hand"; exit 1; }
if [ -n "$mpiexec" ]; then
  config dp > "$work/dp.json"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np 2 \
    -x LD_PRELOAD="$shim" -x OMP_NUM_THREADS "$ztrain" --config "$work/dp.json" \
    > "$work/dp.log" 2>&1 < /dev/null || { cat "$work/dp.log"; echo "mpirun: the restarted ranks failed"; exit 1; }
  # Rank 0 logs the choice; a rank that had not started again would warn (ranks > 0 log
  # warnings only).
  grep -q "rank 0 .*chosen by ztrain for this CPU" "$work/dp.log" && ! grep -q "warn.*BLAS:" "$work/dp.log" ||
    { cat "$work/dp.log"; echo "mpirun: not both ranks started again on $best"; exit 1; }
fi
echo "PASS: kernel named; Prescott by hand kept and warned; Prescott by OpenBLAS replaced by $best"
