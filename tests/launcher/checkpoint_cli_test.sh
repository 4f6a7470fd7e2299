#!/usr/bin/env bash
# Resuming on another layout at the command line: `mpirun ztrain` trains 10 steps in layout A
# and saves a checkpoint; `mpirun ztrain --resume` continues to step 20 in layout B. The 20
# losses in train.csv and the saved final weights must equal one process training 20 steps
# straight (within Note [Equivalence tolerances], tests/rounding_model.h). A layout is
# np:zero_stage:pp:tp:offload[:cp[:algorithm]] (offload none|nvme; cp: context_parallel.size,
# default 1; algorithm ulysses, the default, or ring);
# every layout sees the same global batch (16 rows x 2 micro-batches). With family llama the model is a small Llama (grouped-query
# attention, untied head) whose final weights are saved as Hugging Face directories; with
# llama_lora, that Llama fine-tuned with LoRA adapters on every linear (its base from the seed,
# frozen), whose adapters are saved as PEFT directories, and whose last checkpoint exports as
# the same adapter and, merged, as a HF directory.
#   checkpoint_cli_test.sh <ztrain> <mpiexec> <layout A> <layout B> [gpt2|llama|llama_lora]
set -euo pipefail
source "$(dirname "$0")/compare_runs.sh"
ztrain=$1 mpiexec=$2 a=$3 b=$4 family=${5:-gpt2}
work=$(mktemp -d /tmp/ztrain_ckpt_cli_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
config() {  # layout, steps, job -> JSON
  IFS=: read -r np stage pp tp offload cp algorithm <<< "$1"
  cp=${cp:-1} algorithm=${algorithm:-ulysses}
  local dp=$((np / pp / tp / cp)) zero="{\"stage\": $stage}"
  if [ "$offload" = nvme ]; then
    local nvme="{\"device\": \"nvme\", \"nvme_path\": \"$work/nvme\"}"
    zero="{\"stage\": $stage, \"sub_group_size\": 20000, \"offload_optimizer\": $nvme"
    [ "$stage" = 3 ] && zero="$zero, \"offload_param\": $nvme"
    zero="$zero}"
  fi
  local model='{"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32}'
  local save_final=", \"save_final\": \"$work/$3.bin\""
  local lora=""
  if [ "$family" != gpt2 ]; then
    model='{"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64,
            "intermediate_size": 96, "vocab_size": 256, "max_seq_len": 32,
            "tie_word_embeddings": false}'
    save_final=", \"save_final\": \"$work/$3_hf/\""
  fi
  if [ "$family" = llama_lora ]; then
    lora=', "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "bias": "all"}'
  fi
  cat <<JSON
{"train_micro_batch_size_per_gpu": $((16 / dp)), "gradient_accumulation_steps": 2,
 "steps_per_print": 10, "gradient_clipping": 1.0, "zero_optimization": $zero,
 "pipeline": {"stages": $pp}, "tensor_parallel": {"size": $tp},
 "context_parallel": {"size": $cp, "algorithm": "$algorithm"},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1, "eps": 1e-6}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5, "total_num_steps": 20}},
 "model": $model,
 "training": {"steps": $2, "eval_interval": 0, "output_dir": "$work/out_$3"$save_final},
 "checkpoint": {"dir": "$work/ckpt_$3", "interval": 10},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "$3"}$lora}
JSON
}
run() {  # layout, config file, log, extra args...
  local np=${1%%:*} cfg=$2 log=$3
  shift 3
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np "$np" \
    "$ztrain" --config "$cfg" "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
}
mkdir -p "$work/nvme"
config 1:0:1:1:none 20 single > "$work/single.json"
config "$a" 10 resumed > "$work/a.json"
config "$b" 20 resumed > "$work/b.json"
run 1:0:1:1:none "$work/single.json" "$work/single.log"
run "$a" "$work/a.json" "$work/a.log"
[ -f "$work/ckpt_resumed/step10/meta.json" ] || { cat "$work/a.log"; echo "no checkpoint step10"; exit 1; }
run "$b" "$work/b.json" "$work/b.log" --resume
grep -q "resumed from .*step10" "$work/b.log" || { cat "$work/b.log"; echo "did not resume"; exit 1; }
models=("$work/single.bin" "$work/resumed.bin")
[ "$family" != gpt2 ] && models=("$work/single_hf" "$work/resumed_hf")
compare_runs "$work/single.json" "$work/single/train.csv" "$work/resumed/train.csv" 20 \
  "${models[@]}"
if [ "$family" = llama ]; then
  # The last checkpoint exported as a sharded HF directory is the saved final model exactly.
  "$ztrain" export --checkpoint "$work/ckpt_resumed" --format hf --out "$work/exported" \
    --max-shard-size 40KB > "$work/export.log" 2>&1 || { cat "$work/export.log"; exit 1; }
  [ -f "$work/exported/model.safetensors.index.json" ] || { echo "export was not sharded"; exit 1; }
  compare_runs "$work/single.json" "$work/resumed/train.csv" "$work/resumed/train.csv" 20 \
    "$work/resumed_hf" "$work/exported" --exact
fi
if [ "$family" = llama_lora ]; then
  [ -f "$work/resumed_hf/adapter_config.json" ] || { echo "save_final wrote no PEFT adapter"; exit 1; }
  # The last checkpoint holds the adapters: exported, they are the saved final adapter
  # exactly; merged into the base (training.seed's), a HF model directory.
  "$ztrain" export --checkpoint "$work/ckpt_resumed" --format peft --out "$work/exported" \
    > "$work/export.log" 2>&1 || { cat "$work/export.log"; exit 1; }
  compare_runs "$work/single.json" "$work/resumed/train.csv" "$work/resumed/train.csv" 20 \
    "$work/resumed_hf" "$work/exported" --exact
  "$ztrain" export --checkpoint "$work/ckpt_resumed" --format hf --merge --out "$work/merged" \
    > "$work/merge.log" 2>&1 || { cat "$work/merge.log"; exit 1; }
  [ -f "$work/merged/config.json" ] && [ -f "$work/merged/model.safetensors" ] ||
    { cat "$work/merge.log"; echo "the merged export wrote no HF directory"; exit 1; }
  if "$ztrain" export --checkpoint "$work/ckpt_resumed" --format hf --out "$work/unmerged" \
    > "$work/unmerged.log" 2>&1; then
    echo "a LoRA checkpoint exported as --format hf without --merge"; exit 1
  fi
  grep -q "format hf --merge" "$work/unmerged.log" || { cat "$work/unmerged.log"; exit 1; }
fi
echo "$family $a -> $b: 20 losses and the final weights equal 20 straight steps in one process"
