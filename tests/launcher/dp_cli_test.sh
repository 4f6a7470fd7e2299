#!/usr/bin/env bash
# `mpirun -np N ztrain` against one process with an N times larger micro-batch: the
# per-step losses in train.csv and the saved final weights must agree (the equivalence rule
# at the command line), and every rank writes its memory and communication reports.
# With a fifth argument "nvme" the dp run also keeps its parameter shards (stage 3) and
# optimizer state in swap files, which must be gone when it exits; with "ppP" the N ranks
# form P pipeline stages of N/P data-parallel ranks each (4 micro-batches per step, 1F1B), with
# "tpT" tensor-parallel groups of T, and the progress line must show each rank's grid
# coordinates.
#   dp_cli_test.sh <ztrain binary> <mpiexec> <np> <zero stage> [nvme|ppP|tpT]
set -euo pipefail
source "$(dirname "$0")/compare_runs.sh"
ztrain=$1 mpiexec=$2 np=$3 stage=$4 offload=${5:-none}
pp=1 tp=1 gas=1
case "$offload" in
  pp*) pp=${offload#pp}; gas=4;;
  tp*) tp=${offload#tp};;
esac
dp=$((np / pp / tp))
work=$(mktemp -d /tmp/ztrain_dp_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
# Adam's eps is 1e-6, not 1e-8: the attention key bias gets a gradient that is zero but for
# rounding (softmax ignores a constant added to every score), and with eps 1e-8 Adam turns
# that rounding noise, which differs with the summation order of any parallel layout, into
# lr-sized steps.
zero() {  # job name: the zero_optimization section
  if [ "$offload" = nvme ] && [ "$1" = dp ]; then
    local nvme="{\"device\": \"nvme\", \"nvme_path\": \"$work/nvme\"}"
    local param=""
    [ "$stage" = 3 ] && param=", \"offload_param\": $nvme"
    echo "{\"stage\": $stage, \"sub_group_size\": 20000, \"offload_optimizer\": $nvme$param}"
  else
    echo "{\"stage\": $stage}"
  fi
}
config() {  # micro-batch, job name
  local stages=1 tensor=1
  [ "$2" = dp ] && stages=$pp tensor=$tp
  cat <<JSON
{"train_micro_batch_size_per_gpu": $1, "gradient_accumulation_steps": $gas, "steps_per_print": 10,
 "pipeline": {"stages": $stages}, "tensor_parallel": {"size": $tensor},
 "gradient_clipping": 1.0, "zero_optimization": $(zero "$2"),
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1, "eps": 1e-6}},
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "training": {"steps": 20, "eval_interval": 0, "output_dir": "$work/out_$2",
              "save_final": "$work/$2.bin"},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "$2"}}
JSON
}
mkdir -p "$work/nvme"
config $((8 * dp)) single > "$work/single.json"
config 8 dp > "$work/dp.json"
OMP_NUM_THREADS=1 "$ztrain" --config "$work/single.json" > "$work/single.log" 2>&1
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np "$np" \
  "$ztrain" --config "$work/dp.json" > "$work/dp.log" 2>&1 || { cat "$work/dp.log"; exit 1; }
if [ "$offload" = nvme ]; then
  grep -q "on NVMe" "$work/dp.log" || { cat "$work/dp.log"; echo "no NVMe offload in the log"; exit 1; }
  [ -z "$(ls -A "$work/nvme")" ] || { ls -R "$work/nvme"; echo "swap files left behind"; exit 1; }
fi
if [ $((pp * tp)) -gt 1 ]; then
  grep -q "(dp 0, pp $((pp - 1)), tp $((tp - 1)))" "$work/dp.log" || { cat "$work/dp.log"; echo "no grid coordinates in the progress line"; exit 1; }
fi
for r in $(seq 0 $((np - 1))); do
  for report in memory comm; do
    [ -f "$work/out_dp/${report}_rank$r.json" ] || { echo "missing ${report}_rank$r.json"; exit 1; }
  done
done
compare_runs "$work/single.json" "$work/single/train.csv" "$work/dp/train.csv" 20 \
  "$work/single.bin" "$work/dp.bin"
echo "np=$np stage $stage ($offload): 20 losses and the final weights equal the single-process run"
