#!/usr/bin/env bash
# A LoRA run's resume never loses trained adapters (Note [Config changes on resume]): a resume
# whose lora section drops or reshapes them (fewer target_modules, another r, another
# layers_to_transform, the section removed) is refused, naming the key, the saved and the new
# value and the way to keep them (export the adapter, start a new run with lora.init_from),
# and leaves every checkpoint as it was; one that changes only training settings
# (lora_dropout, lr, more steps) resumes with the change named. A new run of another adapter
# set in the same checkpoint.dir is refused (its saves would replace those checkpoints).
#   lora_resume_test.sh <ztrain binary>
set -euo pipefail
ztrain=$1
work=$(mktemp -d /tmp/ztrain_lora_resume_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
config() {  # file, steps, lora members, keep_last
  cat > "$work/$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
 "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "max_seq_len": 16},
 "training": {"steps": $2, "eval_interval": 0, "output_dir": "$work/out"},
 "checkpoint": {"dir": "$work/ckpt", "interval": 2, "keep_last": ${4:-5}}$3}
JSON
}
# Every checkpoint file with its checksum (not the lock, which each run rewrites).
snapshot() { (cd "$work/ckpt" && find . -type f ! -name ztrain.lock | LC_ALL=C sort | xargs sha256sum); }
lora=', "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn", "c_fc"]'
config first.json 4 "$lora}"
"$ztrain" --config "$work/first.json" > "$work/first.log" 2>&1 || { cat "$work/first.log"; exit 1; }
before=$(snapshot)

refused() {  # label, lora members (or ""), strings the refusal must name...
  local label=$1 members=$2
  shift 2
  config "$label.json" 6 "$members"
  local status=0
  "$ztrain" --config "$work/$label.json" --resume > "$work/$label.log" 2>&1 || status=$?
  [ "$status" = 2 ] || { cat "$work/$label.log"; echo "$label: exit $status, expected 2"; exit 1; }
  for want in "$@" "--format peft" "lora.init_from"; do
    grep -qF -- "$want" "$work/$label.log" ||
      { cat "$work/$label.log"; echo "$label: the refusal does not name '$want'"; exit 1; }
  done
  grep -q "| loss" "$work/$label.log" && { cat "$work/$label.log"; echo "$label: it trained"; exit 1; }
  [ "$(snapshot)" = "$before" ] || { echo "$label: a checkpoint changed"; exit 1; }
  echo "$label: refused"
}
refused fewer_targets ', "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}' \
  'lora.target_modules ["c_attn","c_fc"] -> ["c_attn"]'
refused other_rank ', "lora": {"r": 8, "lora_alpha": 8, "target_modules": ["c_attn", "c_fc"]}' \
  'lora.r 4 -> 8'
refused one_block "$lora"', "layers_to_transform": [0]}' 'lora.layers_to_transform null -> [0]'
refused no_lora "" 'lora.enabled true -> '

config dropout.json 6 "$lora"', "lora_dropout": 0.1}'
"$ztrain" --config "$work/dropout.json" --resume > "$work/dropout.log" 2>&1 ||
  { cat "$work/dropout.log"; echo "a lora_dropout change was refused"; exit 1; }
grep -q "resumed from $work/ckpt/step4" "$work/dropout.log" &&
  grep -q 'lora.lora_dropout 0.0 -> 0.1' "$work/dropout.log" ||
  { cat "$work/dropout.log"; echo "the lora_dropout resume did not name the change"; exit 1; }
echo "lora_dropout: resumed from step4, the change named"

# A new run of another adapter set in the same checkpoint.dir is refused before it trains:
# its saves (and keep_last) would replace the first run's checkpoints.
before=$(snapshot)
config other.json 4 ', "lora": {"r": 2, "lora_alpha": 4, "target_modules": ["c_proj"]}' 1
status=0
"$ztrain" --config "$work/other.json" > "$work/other.log" 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "holds checkpoints of another model" "$work/other.log" &&
  grep -qF 'step6 (lora.r 4 -> 2)' "$work/other.log" ||
  { cat "$work/other.log"; echo "a new run over another adapter set's checkpoints: exit $status"; exit 1; }
[ "$(snapshot)" = "$before" ] || { echo "the refused run changed a checkpoint"; exit 1; }
echo "another adapter set in the same checkpoint.dir: refused, every checkpoint kept"
# The adapter a run started from (lora.init_from) is never an export's --out, even with
# --overwrite: it is what that run read.
"$ztrain" export --checkpoint "$work/ckpt" --format peft --out "$work/adapter" > /dev/null 2>&1
adapter=$( (cd "$work/adapter" && sha256sum ./*) )
cat > "$work/from_adapter.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
 "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "max_seq_len": 16},
 "training": {"steps": 2, "eval_interval": 0, "output_dir": "$work/out2"},
 "checkpoint": {"dir": "$work/ckpt2", "interval": 2},
 "lora": {"init_from": "$work/adapter"}}
JSON
"$ztrain" --config "$work/from_adapter.json" > "$work/from_adapter.log" 2>&1 ||
  { cat "$work/from_adapter.log"; echo "a run from the exported adapter failed"; exit 1; }
status=0
"$ztrain" export --checkpoint "$work/ckpt2" --format peft --out "$work/adapter/" --overwrite \
  > "$work/onto.log" 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "is lora.init_from" "$work/onto.log" ||
  { cat "$work/onto.log"; echo "export onto the run's lora.init_from: exit $status"; exit 1; }
[ "$( (cd "$work/adapter" && sha256sum ./*) )" = "$adapter" ] ||
  { echo "the adapter the run started from changed"; exit 1; }
echo "export --format peft onto the run's own lora.init_from: refused, the adapter kept"
# check-config refuses what training refuses of a lora.init_from adapter: here one trained on
# a narrower model (its tensors do not fit), named as lora.init_from.
cat > "$work/misfit.json" <<JSON
{"train_micro_batch_size_per_gpu": 2,
 "model": {"n_layer": 2, "n_head": 2, "n_embd": 48, "vocab_size": 256, "max_seq_len": 16},
 "training": {"steps": 2, "eval_interval": 0, "output_dir": "$work/out3"},
 "lora": {"init_from": "$work/adapter"}}
JSON
for command in "check-config $work/misfit.json" "--config $work/misfit.json"; do
  status=0
  "$ztrain" $command > "$work/misfit.log" 2>&1 || status=$?
  [ "$status" != 0 ] && grep -q "lora.init_from" "$work/misfit.log" &&
    ! grep -q "| loss" "$work/misfit.log" ||
    { cat "$work/misfit.log"; echo "$command: an adapter of another shape was not refused (exit $status)"; exit 1; }
done
"$ztrain" check-config "$work/misfit.json" > "$work/misfit.log" 2>&1 || true
grep -q "but adapter_config.json gives" "$work/misfit.log" ||
  { cat "$work/misfit.log"; echo "the misfit is not named in the adapter's own file"; exit 1; }
echo "an adapter that does not fit: refused by check-config and by training"

# A merge whose base was moved names the base and the fix, and writes nothing.
cat > "$work/base.json" <<JSON
{"train_micro_batch_size_per_gpu": 2,
 "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "max_seq_len": 16},
 "training": {"steps": 1, "eval_interval": 0, "output_dir": "$work/out4", "save_final": "$work/base.bin"}}
JSON
"$ztrain" --config "$work/base.json" > /dev/null 2>&1
cat > "$work/on_base.json" <<JSON
{"train_micro_batch_size_per_gpu": 2,
 "model": {"init_from": "$work/base.bin"},
 "training": {"steps": 2, "eval_interval": 0, "output_dir": "$work/out5"},
 "checkpoint": {"dir": "$work/ckpt5"},
 "lora": {"r": 2, "target_modules": ["c_attn"]}}
JSON
"$ztrain" --config "$work/on_base.json" > "$work/on_base.log" 2>&1 || { cat "$work/on_base.log"; exit 1; }
mv "$work/base.bin" "$work/base_moved.bin"
status=0
"$ztrain" export --checkpoint "$work/ckpt5" --format hf --merge --out "$work/merged" \
  > "$work/merge.log" 2>&1 || status=$?
[ "$status" != 0 ] && grep -q "is not there (moved or deleted?)" "$work/merge.log" &&
  [ ! -e "$work/merged" ] ||
  { cat "$work/merge.log"; echo "a merge onto a moved base: exit $status"; exit 1; }
echo "a merge whose base was moved: named with the fix, nothing written"
echo "PASS: LoRA resumes lose nothing"
