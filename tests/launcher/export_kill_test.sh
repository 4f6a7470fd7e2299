#!/usr/bin/env bash
# Exports survive SIGKILL (Note [Staged outputs], core/staged_output.h). A run's step-2
# checkpoint is exported, then its step-4 checkpoint is exported over it with --overwrite and
# killed with SIGKILL at a random moment of that export; `kills` times for an hf export cut
# into several safetensors shards with an index, and for a LoRA run's peft adapter. After
# every kill the directory must be, file for file and byte for byte, one whole export: the
# earlier one or the new one, never a mix; what the killed export staged beside it is removed
# by the next export. Without --overwrite the export over the earlier one is refused.
#   export_kill_test.sh <ztrain binary> [kills]
set -euo pipefail
ztrain=$1 kills=${2:-20}
work=$(mktemp -d /tmp/ztrain_export_kill_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
config() {  # name, extra JSON members
  cat <<JSON
{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
 "model": {"n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 4096, "max_seq_len": 16},
 "training": {"steps": 4, "eval_interval": 0, "output_dir": "$work/out_$1"},
 "checkpoint": {"dir": "$work/ckpt_$1", "interval": 2, "keep_last": 5}$2}
JSON
}
# Every file of a directory with its checksum, names relative: the export's identity.
snapshot() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs sha256sum); }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# kill_rounds <name> <export arguments...>: the kills for one kind of export.
kill_rounds() {
  local name=$1
  shift
  local out="$work/$name" ckpt="$work/ckpt_$name"
  "$ztrain" export --checkpoint "$ckpt/step4" --out "$work/${name}_new" "$@" > /dev/null 2>&1
  "$ztrain" export --checkpoint "$ckpt/step2" --out "$out" "$@" > /dev/null 2>&1
  local old new
  old=$(snapshot "$out")
  new=$(snapshot "$work/${name}_new")
  [ "$old" != "$new" ] || { echo "$name: the two checkpoints export the same bytes"; exit 1; }
  if "$ztrain" export --checkpoint "$ckpt/step4" --out "$out" "$@" > "$work/refused.log" 2>&1 ||
     ! grep -q "already holds" "$work/refused.log" || [ "$(snapshot "$out")" != "$old" ]; then
    cat "$work/refused.log"; echo "$name: an export over another one without --overwrite was not refused"
    exit 1
  fi
  local t0 ms
  t0=$(now_ms)
  "$ztrain" export --checkpoint "$ckpt/step4" --out "$work/${name}_timed" "$@" > /dev/null 2>&1
  ms=$(( $(now_ms) - t0 + 1 ))
  local k=0 landed_old=0 landed_new=0 mid=0
  while [ "$k" -lt "$kills" ] || { [ "$mid" -lt 2 ] && [ "$k" -lt $((3 * kills)) ]; }; do
    k=$((k + 1))
    "$ztrain" export --checkpoint "$ckpt/step4" --out "$out" --overwrite "$@" \
      > "$work/kill.log" 2>&1 < /dev/null &
    local pid=$!
    sleep "$(awk -v r="$RANDOM" -v ms="$ms" 'BEGIN { printf "%.3f", r / 32768 * ms * 1.1 / 1000 }')"
    kill -9 "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
    ls -a "$work" | grep -q "^\.$name\.ztrain-staging\." && mid=$((mid + 1))
    local now
    now=$(snapshot "$out" 2> /dev/null || true)
    if [ "$now" = "$old" ]; then
      landed_old=$((landed_old + 1))
    elif [ "$now" = "$new" ]; then
      landed_new=$((landed_new + 1))
      "$ztrain" export --checkpoint "$ckpt/step2" --out "$out" --overwrite "$@" > /dev/null 2>&1
      [ "$(snapshot "$out")" = "$old" ] || { echo "$name: re-export of step 2 differs"; exit 1; }
    else
      echo "$name: after kill $k the directory is neither export:"
      echo "$now"; echo "--- earlier export:"; echo "$old"; echo "--- new export:"; echo "$new"
      exit 1
    fi
  done
  "$ztrain" export --checkpoint "$ckpt/step4" --out "$out" --overwrite "$@" > "$work/last.log" 2>&1
  [ "$(snapshot "$out")" = "$new" ] || { cat "$work/last.log"; echo "$name: last export differs"; exit 1; }
  if ls -a "$work" | grep -q "^\.$name\.ztrain-staging\."; then
    ls -a "$work"; echo "$name: a killed export's staging directory was not removed"; exit 1
  fi
  echo "$name: $k kills (export ${ms} ms): $landed_old left the earlier export, $landed_new the" \
       "new one, $mid inside the export's writing; never a mix"
}

config hf "" > "$work/hf.json"
"$ztrain" --config "$work/hf.json" > "$work/hf_train.log" 2>&1 || { cat "$work/hf_train.log"; exit 1; }
kill_rounds hf --format hf --max-shard-size 1MB
config peft ', "lora": {"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "bias": "all"}' \
  > "$work/peft.json"
"$ztrain" --config "$work/peft.json" > "$work/peft_train.log" 2>&1 ||
  { cat "$work/peft_train.log"; exit 1; }
kill_rounds peft --format peft
echo "PASS: every killed export left one whole export"
