#!/usr/bin/env bash
# `mpirun -np N ztrain` against one process with an N times larger micro-batch: the
# per-step losses in train.csv must agree (the equivalence rule at the command line), and
# every rank writes its memory report.
#   dp_cli_test.sh <ztrain binary> <mpiexec> <np> <zero stage>
set -euo pipefail
ztrain=$1 mpiexec=$2 np=$3 stage=$4
work=$(mktemp -d /tmp/ztrain_dp_XXXXXX)
trap 'rm -rf "$work"' EXIT
config() {  # micro-batch, job name
  cat <<JSON
{"train_micro_batch_size_per_gpu": $1, "gradient_accumulation_steps": 1, "steps_per_print": 10,
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $stage},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "training": {"steps": 20, "eval_interval": 0, "output_dir": "$work/out_$2"},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "$2"}}
JSON
}
config $((8 * np)) single > "$work/single.json"
config 8 dp > "$work/dp.json"
OMP_NUM_THREADS=1 "$ztrain" --config "$work/single.json" > "$work/single.log" 2>&1
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np "$np" \
  "$ztrain" --config "$work/dp.json" > "$work/dp.log" 2>&1 || { cat "$work/dp.log"; exit 1; }
for r in $(seq 0 $((np - 1))); do
  [ -f "$work/out_dp/memory_rank$r.json" ] || { echo "missing memory_rank$r.json"; exit 1; }
done
paste -d, "$work/single/train.csv" "$work/dp/train.csv" | awk -F, -v cols=7 '
  NR == 1 { next }
  { a = $2; b = $(cols + 2); d = a - b; if (d < 0) d = -d
    if (d > 1e-5 * (a < 0 ? -a : a)) { printf "step %s: loss %s (1 process) vs %s (dp)\n", $1, a, b; bad = 1 }
    n++ }
  END { if (n != 20) { print "expected 20 steps, got " n; exit 1 }; exit bad }'
echo "dp=$np stage $stage: 20 losses equal the single-process run"
