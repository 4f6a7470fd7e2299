#!/usr/bin/env bash
# Crash safety: a run that saves a checkpoint every step is killed with SIGKILL at many
# random moments (most of the run's time is spent saving, so most kills land inside a save:
# while rank files, meta.json or `latest` are being written). After every kill `latest` must
# load; each next run resumes from it; the last one runs to the end. The 80 losses in
# train.csv must equal an uninterrupted run's, and so must the final weights. (80 steps: a
# kill lands 0-0.4 s into a run, which then has taken about two steps on an idle machine, so
# even 36 rounds of kills do not reach the end, after which no kill could land in a save.) First, a batch
# scheduler's SIGUSR1 must make a run save a checkpoint of the step it stopped at and exit.
#   checkpoint_crash_test.sh <ztrain binary> [kills]
set -euo pipefail
source "$(dirname "$0")/compare_runs.sh"
ztrain=$1 kills=${2:-12}
work=$(mktemp -d /tmp/ztrain_ckpt_crash_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
config() {  # job, steps, checkpoint dir ("" = none), csv on/off
  cat <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1, "eps": 1e-6}},
 "model": {"n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 4096, "max_seq_len": 16},
 "training": {"steps": $2, "eval_interval": 0, "output_dir": "$work/out", "save_final": "$work/$1.bin"},
 "checkpoint": {"dir": "$3", "interval": 1, "keep_last": 2},
 "csv_monitor": {"enabled": $4, "output_path": "$work", "job_name": "$1"}}
JSON
}
# Waits until the run of <pid> logging to <log> has started its step loop (or ended): how
# long the start takes depends on the machine (loading the CUDA libraries alone may take half
# a second), so signals and kills are timed from there.
wait_for_training() {
  for _ in $(seq 1 1200); do
    grep -q "model state:" "$1" 2> /dev/null && return
    kill -0 "$2" 2> /dev/null || return
    sleep 0.05
  done
}
export OMP_NUM_THREADS=1
config straight 80 "" true > "$work/straight.json"
config crashed 80 "$work/ckpt" true > "$work/crashed.json"
config check 0 "$work/ckpt" false > "$work/check.json"
"$ztrain" --config "$work/straight.json" > "$work/straight.log" 2>&1
# SIGUSR1: stop after the step in flight, save, exit 130.
config signalled 30 "$work/ckpt_usr1" true > "$work/signalled.json"
"$ztrain" --config "$work/signalled.json" > "$work/signalled.log" 2>&1 &
pid=$!
wait_for_training "$work/signalled.log" "$pid"
sleep 0.3
kill -USR1 "$pid"
status=0
wait "$pid" || status=$?
[ "$status" = 130 ] || { cat "$work/signalled.log"; echo "SIGUSR1: exit $status, expected 130"; exit 1; }
last=$(tail -n 1 "$work/signalled/train.csv" | cut -d, -f1)
[ "$(cat "$work/ckpt_usr1/latest")" = "step$last" ] ||
  { cat "$work/signalled.log"; echo "SIGUSR1: latest is not step$last"; exit 1; }
echo "SIGUSR1 at step $last: saved step$last and exited 130"
inside=0 k=0
# At least `kills` kills, and more (up to three times as many) until two landed inside a save:
# on a loaded machine compute takes a larger share of each step.
while [ "$k" -lt "$kills" ] || { [ "$inside" -lt 2 ] && [ "$k" -lt $((3 * kills)) ]; }; do
  k=$((k + 1))
  resume=()
  [ -f "$work/ckpt/latest" ] && resume=(--resume)
  "$ztrain" --config "$work/crashed.json" "${resume[@]}" > "$work/run$k.log" 2>&1 &
  pid=$!
  wait_for_training "$work/run$k.log" "$pid"
  sleep "$(awk -v k="$k" 'BEGIN { srand(k); printf "%.3f", 0.4 * rand() }')"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  # A kill inside a save leaves a partial directory or a temporary file behind.
  if compgen -G "$work/ckpt/*.partial" > /dev/null || compgen -G "$work/ckpt/*.tmp" > /dev/null; then
    inside=$((inside + 1))
  fi
  if [ -f "$work/ckpt/latest" ]; then
    "$ztrain" --config "$work/check.json" --resume > "$work/check$k.log" 2>&1 ||
      { cat "$work/check$k.log"; echo "kill $k: latest ($(cat "$work/ckpt/latest")) does not load"; exit 1; }
    grep -q "resumed from" "$work/check$k.log" || { cat "$work/check$k.log"; exit 1; }
    if grep -q "falling back" "$work/check$k.log"; then
      cat "$work/check$k.log"; echo "kill $k: latest named a checkpoint that is not intact"; exit 1
    fi
  fi
done
resume=()
[ -f "$work/ckpt/latest" ] && resume=(--resume)
"$ztrain" --config "$work/crashed.json" "${resume[@]}" > "$work/final.log" 2>&1 || { cat "$work/final.log"; exit 1; }
echo "$inside of $k kills landed inside a save"
[ "$inside" -ge 2 ] || { echo "too few kills landed inside a save to test anything"; exit 1; }
# The same arithmetic in the same order: bit for bit.
compare_runs "$work/straight.json" "$work/straight/train.csv" "$work/crashed/train.csv" 80 \
  "$work/straight.bin" "$work/crashed.bin" --exact
echo "80 losses and the final weights equal the uninterrupted run"
