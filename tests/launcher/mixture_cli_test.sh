#!/usr/bin/env bash
# A data mixture at the command line (Note [Data mixture]): two corpora made with `ztrain data`
# (letters and digits, byte tokens), data.train = [{letters, 0.7}, {digits, 0.3}], shuffled.
# `mpirun -np 2` with micro-batch 4 must train what one process with micro-batch 8 trains (the
# equivalence rule: 12 losses and the final weights), and a run stopped at step 6 on 2 ranks
# and resumed on 1 process must continue mid-mixture to the same 12 losses and weights.
#   mixture_cli_test.sh <ztrain binary> <mpiexec>
set -euo pipefail
source "$(dirname "$0")/compare_runs.sh"
ztrain=$1 mpiexec=$2
work=$(mktemp -d /tmp/ztrain_mix_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
for i in $(seq 1 400); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/letters.txt"
for i in $(seq 1 400); do echo "$((i * 7919 % 10007)) + $((i * 31)) = $((i * 7919 % 10007 + i * 31))"; done > "$work/digits.txt"
"$ztrain" data "$work/letters.txt" --out "$work/letters/l.bin" --shard-tokens 5000 > /dev/null
"$ztrain" data "$work/digits.txt" --out "$work/digits/d.bin" > /dev/null
config() {  # micro-batch, steps, job, checkpoint dir
  cat <<JSON
{"train_micro_batch_size_per_gpu": $1, "steps_per_print": 100, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1, "eps": 1e-6}},
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "data": {"train": [{"path": "$work/letters/l_*.bin", "weight": 0.7},
                    {"path": "$work/digits/d.bin", "weight": 0.3}], "shuffle": true},
 "training": {"steps": $2, "eval_interval": 0, "output_dir": "$work/out_$3",
              "save_final": "$work/$3.bin"},
 "checkpoint": {"dir": "$4", "interval": 6},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "$3"}}
JSON
}
mpirun() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np 2 "$ztrain" "$@"
}
config 8 12 single "$work/ckpt_single" > "$work/single.json"
config 4 12 dp "$work/ckpt_dp" > "$work/dp.json"
config 4 6 resumed "$work/ckpt_resumed" > "$work/first_half.json"
config 8 12 resumed "$work/ckpt_resumed" > "$work/second_half.json"
OMP_NUM_THREADS=1 "$ztrain" --config "$work/single.json" > "$work/single.log" 2>&1 || { cat "$work/single.log"; exit 1; }
grep -q "mixture of 2 datasets" "$work/single.log" || { cat "$work/single.log"; echo "no mixture in the log"; exit 1; }
mpirun --config "$work/dp.json" > "$work/dp.log" 2>&1 < /dev/null || { cat "$work/dp.log"; exit 1; }
compare_runs "$work/single.json" "$work/single/train.csv" "$work/dp/train.csv" 12 \
  "$work/single.bin" "$work/dp.bin"
mpirun --config "$work/first_half.json" > "$work/first.log" 2>&1 < /dev/null || { cat "$work/first.log"; exit 1; }
OMP_NUM_THREADS=1 "$ztrain" --config "$work/second_half.json" --resume > "$work/second.log" 2>&1 || { cat "$work/second.log"; exit 1; }
grep -q "resumed from .*step6" "$work/second.log" || { cat "$work/second.log"; echo "did not resume"; exit 1; }
compare_runs "$work/single.json" "$work/single/train.csv" "$work/resumed/train.csv" 12 \
  "$work/single.bin" "$work/resumed.bin"
echo "mixture: dp 2 and a resume mid-mixture (dp 2 -> 1 process) equal the single-process run"
