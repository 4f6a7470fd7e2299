#!/usr/bin/env bash
# Ranks started MPMD-style with different configs (here different learning rates) refuse to
# train: every rank names the key and each rank's value, and the job exits 2 before step 1
# (Note [One config on every rank]). They used to train without a word.
#   mpmd_config_test.sh <ztrain binary> <mpiexec>
set -euo pipefail
ztrain=$1 mpiexec=$2
work=$(mktemp -d /tmp/ztrain_mpmd_XXXXXX)
trap 'rm -rf "$work"' EXIT
config() {  # lr
  cat <<JSON
{"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
 "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256, "max_seq_len": 16},
 "optimizer": {"type": "AdamW", "params": {"lr": $1}},
 "training": {"steps": 5, "eval_interval": 0, "output_dir": "$work/out"}}
JSON
}
config 0.001 > "$work/a.json"
config 0.003 > "$work/b.json"
status=0
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
  -np 1 "$ztrain" --config "$work/a.json" : -np 1 "$ztrain" --config "$work/b.json" \
  > "$work/log" 2>&1 < /dev/null || status=$?
[ "$status" -eq 2 ] || { cat "$work/log"; echo "FAIL: exit status $status, expected 2"; exit 1; }
grep -q "optimizer.params.lr: differs between ranks: rank 0 has 0.001, rank 1 has 0.003" "$work/log" ||
  { cat "$work/log"; echo "FAIL: the differing key is not named with both values"; exit 1; }
if grep -q "| loss" "$work/log"; then cat "$work/log"; echo "FAIL: it trained"; exit 1; fi
# The same config on both ranks trains.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
  -np 1 "$ztrain" --config "$work/a.json" : -np 1 "$ztrain" --config "$work/a.json" \
  > "$work/log2" 2>&1 < /dev/null || { cat "$work/log2"; echo "FAIL: the same config did not train"; exit 1; }
echo "different configs refused by name; the same config trains"
