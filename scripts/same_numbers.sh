#!/usr/bin/env bash
# Do two ztrain binaries train the same numbers? Runs a fixed set of small runs with each —
# GPT-2 and Llama; ZeRO 0, 1, 2, 3; optimizer and parameters offloaded to the CPU and to NVMe;
# pp 2 (1F1B); tp 2; dp 2 x pp 2 x tp 2; bf16; fp16; LoRA and QLoRA at ZeRO-3; a resume — and
# compares, run by run, every step's loss, learning rate, gradient norm and clip coefficient
# (train.csv, printed with 9 significant digits: every fp32 value exactly) and the saved final
# weights, byte for byte. For a refactor that must not change a bit (issue 35): build the
# commit before it beside the one after, on the same machine, and give both binaries.
#   scripts/same_numbers.sh OLD_ZTRAIN NEW_ZTRAIN [CASE_NAME...]
# Environment: MPIEXEC (default mpirun), KEEP=1 keeps the work directory. Prints one row per
# run and exits 1 if any differ (the first differing step or file named), 2 if a run failed.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
old=$(readlink -f "$1") new=$(readlink -f "$2")
shift 2
for bin in "$old" "$new"; do
  [ -x "$bin" ] || { echo "same_numbers: $bin is not an executable ztrain"; exit 2; }
done
mpiexec=${MPIEXEC:-mpirun}
work=$(mktemp -d /tmp/ztrain_same_numbers_XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT

# name:ranks:family:stage:pp:tp:offload:precision:adapters (family gpt2|llama; offload
# none|cpu|nvme|param_nvme (parameters only); precision fp32|bf16|fp16; adapters none|lora|qlora). 8 steps each, global
# batch 8 rows x 2 micro-batches, so every layout sees the same data.
all_cases=(
  gpt2_zero0:1:gpt2:0:1:1:none:fp32:none
  gpt2_zero1_dp2:2:gpt2:1:1:1:none:fp32:none
  gpt2_zero2_dp2:2:gpt2:2:1:1:none:fp32:none
  gpt2_zero3_dp2:2:gpt2:3:1:1:none:fp32:none
  gpt2_zero3_offload_cpu:2:gpt2:3:1:1:cpu:fp32:none
  gpt2_zero3_offload_nvme:2:gpt2:3:1:1:nvme:fp32:none
  gpt2_zero3_param_nvme_dp2:2:gpt2:3:1:1:param_nvme:fp32:none
  llama_zero3_param_nvme_bf16:1:llama:3:1:1:param_nvme:bf16:none
  gpt2_pp2_1f1b:2:gpt2:0:2:1:none:fp32:none
  gpt2_tp2:2:gpt2:0:1:2:none:fp32:none
  gpt2_dp2_pp2_tp2:8:gpt2:1:2:2:none:fp32:none
  gpt2_bf16:1:gpt2:0:1:1:none:bf16:none
  gpt2_fp16_zero2_dp2:2:gpt2:2:1:1:none:fp16:none
  llama_zero0:1:llama:0:1:1:none:fp32:none
  llama_zero3_dp2:2:llama:3:1:1:none:fp32:none
  llama_lora_zero3_dp2:2:llama:3:1:1:none:fp32:lora
  llama_qlora_zero3_dp2:2:llama:3:1:1:none:bf16:qlora
  gpt2_resume_zero2_dp2:2:gpt2:2:1:1:none:fp32:resume
  gpt2_resume_zero3_param_nvme:1:gpt2:3:1:1:param_nvme:fp32:resume
)
cases=()
for want in "$@"; do  # a case by its name
  found=""
  for c in "${all_cases[@]}"; do
    [ "${c%%:*}" != "$want" ] || found=$c
  done
  [ -n "$found" ] || { echo "same_numbers: no case named $want; the cases:"; \
                       printf '  %s\n' "${all_cases[@]%%:*}"; exit 2; }
  cases+=("$found")
done
[ ${#cases[@]} -gt 0 ] || cases=("${all_cases[@]}")

config() {  # case fields, output dir, steps -> JSON
  local name=$1 np=$2 family=$3 stage=$4 pp=$5 tp=$6 offload=$7 precision=$8 adapters=$9
  local dir=${10} steps=${11}
  local dp=$((np / pp / tp)) zero="{\"stage\": $stage}"
  if [ "$offload" = param_nvme ]; then  # parameters only (Note [Deferred optimizer step])
    zero="{\"stage\": $stage, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$dir/nvme\",
           \"max_in_cpu\": 0}}"
  elif [ "$offload" != none ]; then
    local where="{\"device\": \"$offload\"}"
    [ "$offload" = nvme ] && where="{\"device\": \"nvme\", \"nvme_path\": \"$dir/nvme\"}"
    zero="{\"stage\": $stage, \"sub_group_size\": 20000, \"offload_optimizer\": $where,
           \"offload_param\": $where}"
  fi
  local model='{"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32}'
  local save_final="$dir/final.bin" extra=""
  if [ "$family" = llama ]; then
    model='{"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64,
            "intermediate_size": 96, "vocab_size": 256, "max_seq_len": 32,
            "tie_word_embeddings": false}'
    save_final="$dir/final/"
  fi
  case $adapters in
    lora|qlora)
      extra=', "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}'
      [ "$adapters" = qlora ] && extra="$extra"', "quantization": {"load_in_4bit": true,
        "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true}' ;;
  esac
  case $precision in
    bf16) extra="$extra"', "bf16": {"enabled": true}' ;;
    fp16) extra="$extra"', "fp16": {"enabled": true, "initial_scale_power": 8}' ;;
    *) extra="$extra"', "bf16": {"enabled": false}' ;;
  esac
  cat <<JSON
{"train_micro_batch_size_per_gpu": $((8 / dp)), "gradient_accumulation_steps": 2,
 "steps_per_print": 100, "gradient_clipping": 1.0, "zero_optimization": $zero,
 "pipeline": {"stages": $pp, "schedule": "1f1b"}, "tensor_parallel": {"size": $tp},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1, "eps": 1e-6}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3, "total_num_steps": 8}},
 "model": $model,
 "training": {"steps": $steps, "seed": 1234, "eval_interval": 0, "output_dir": "$dir/out",
              "save_final": "$save_final"},
 "checkpoint": {"dir": "$dir/ckpt", "interval": 4},
 "csv_monitor": {"enabled": true, "output_path": "$dir", "job_name": "run"}$extra}
JSON
}

train() {  # binary, ranks, config, log, extra args...
  local bin=$1 np=$2 cfg=$3 log=$4
  shift 4
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np "$np" \
    "$bin" --config "$cfg" "$@" > "$log" 2>&1 < /dev/null
}

run_case() {  # binary, case, dir -> 0 or the failed run's status
  local bin=$1 dir=$3
  IFS=: read -r name np family stage pp tp offload precision adapters <<< "$2"
  mkdir -p "$dir/nvme"
  if [ "$adapters" = resume ]; then  # 4 steps, then a resume to 8
    config "$name" "$np" "$family" "$stage" "$pp" "$tp" "$offload" "$precision" none "$dir" 4 \
      > "$dir/first.json"
    train "$bin" "$np" "$dir/first.json" "$dir/first.log" || return 1
    config "$name" "$np" "$family" "$stage" "$pp" "$tp" "$offload" "$precision" none "$dir" 8 \
      > "$dir/c.json"
    train "$bin" "$np" "$dir/c.json" "$dir/log" --resume
  else
    config "$name" "$np" "$family" "$stage" "$pp" "$tp" "$offload" "$precision" "$adapters" \
      "$dir" 8 > "$dir/c.json"
    train "$bin" "$np" "$dir/c.json" "$dir/log"
  fi
}

# train.csv without its timing columns (tokens_per_s, ms_per_step): step,loss,lr,grad_norm,clip
numbers() { cut -d, -f1-4,7 "$1/run/train.csv"; }

differ=0 failed=0
printf '%-26s %-15s %-12s %s\n' run "steps, csv" weights "first difference"
for c in "${cases[@]}"; do
  name=${c%%:*}
  status=ok
  for side in old new; do
    bin=$old
    [ $side = new ] && bin=$new
    mkdir -p "$work/$side/$name"
    if ! run_case "$bin" "$c" "$work/$side/$name"; then
      echo "same_numbers: $name failed with the $side binary ($bin); its log:"
      for log in "$work/$side/$name/first.log" "$work/$side/$name/log"; do
        [ ! -f "$log" ] || tail -20 "$log"
      done
      status=failed
    fi
  done
  if [ $status = failed ]; then
    failed=1
    continue
  fi
  a=$work/old/$name b=$work/new/$name
  steps=$(numbers "$a" | tail -n +2 | wc -l)
  first=$( (diff <(numbers "$a") <(numbers "$b") || true) |
           sed -n 's/^> \([0-9]*\),.*/step \1/p' | head -1)
  csv=identical
  [ -z "$first" ] || csv=DIFFER
  weights=identical
  final=final.bin
  [ -d "$a/final" ] && final=final
  if ! diff -r -q "$a/$final" "$b/$final" > "$work/weights_$name.txt" 2>&1; then
    weights=DIFFER
    first="${first:+$first; }$(head -1 "$work/weights_$name.txt" | sed "s|$a/||g; s|$b/||g")"
  fi
  [ $csv = identical ] && [ $weights = identical ] || differ=1
  printf '%-26s %-15s %-12s %s\n' "$name" "$steps $csv" "$weights" "${first:--}"
done
[ $failed = 0 ] || exit 2
[ $differ = 0 ] || { echo "same_numbers: the binaries train different numbers"; exit 1; }
echo "same_numbers: ${#cases[@]} runs bit for bit the same"
