#!/usr/bin/env bash
# Swap files of a killed run (Note [Stale swap directories]): a run with its parameters and
# optimizer state on NVMe, killed with SIGKILL mid-training, leaves its swap files behind.
# While it still runs, a second run of the same job is refused, naming its pid, and touches
# none of its files; after the kill the same run again reclaims the files (says so), trains
# to the end with the losses and weights of a run without offload (bit for bit: the same
# arithmetic) and leaves no swap file behind.
#   swap_reclaim_test.sh <ztrain binary>
set -euo pipefail
source "$(dirname "$0")/compare_runs.sh"
ztrain=$1
work=$(mktemp -d /tmp/ztrain_swap_reclaim_XXXXXX)
pid=""
trap '[ -z "$pid" ] || kill -9 "$pid" 2> /dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
config() {  # steps, offload (nvme|none), csv_monitor job name
  local zero='{"stage": 3}'
  if [ "$2" = nvme ]; then
    local nvme="{\"device\": \"nvme\", \"nvme_path\": \"$work/nvme\"}"
    local param="{\"device\": \"nvme\", \"nvme_path\": \"$work/nvme\", \"max_in_cpu\": 0}"
    zero="{\"stage\": 3, \"sub_group_size\": 20000, \"offload_param\": $param, \"offload_optimizer\": $nvme}"
  fi
  cat <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "zero_optimization": $zero,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1, "eps": 1e-6}},
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "training": {"steps": $1, "eval_interval": 0, "job_name": "reclaim", "output_dir": "$work/out_$3",
              "save_final": "$work/$3.bin"},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "$3"}}
JSON
}
fail() { for log in "$@"; do cat "$log"; done; echo "FAILED${msg:+: $msg}"; exit 1; }
export OMP_NUM_THREADS=1
mkdir -p "$work/nvme"
rank0="$work/nvme/ztrain-reclaim/rank0"
config 100000 nvme killed > "$work/killed.json"
config 20 nvme second > "$work/second.json"
config 20 nvme again > "$work/again.json"
config 20 none straight > "$work/straight.json"

"$ztrain" --config "$work/killed.json" > "$work/killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do  # until it trains (its swap files are made by then)
  grep -q "model state:" "$work/killed.log" 2> /dev/null && break
  kill -0 "$pid" 2> /dev/null || { msg="the run to kill ended"; fail "$work/killed.log"; }
  sleep 0.05
done
sleep 0.3
swap_files() { find "$work/nvme" -name '*.swp' | sort; }
[ "$(swap_files | wc -l)" = 2 ] || { msg="expected 2 swap files of the live run"; fail "$work/killed.log"; }
before=$(swap_files | xargs stat -c '%n %s %i')

# A second run of the job while the first one lives: refused, the first one's files untouched.
if "$ztrain" --config "$work/second.json" > "$work/second.log" 2>&1; then
  msg="a second run of a live job trained"; fail "$work/second.log"
fi
grep -q "swap directory $rank0 is in use by a running job: pid $pid on host " "$work/second.log" ||
  { msg="the refusal does not name the live run's pid $pid"; fail "$work/second.log"; }
grep -q "give this run another training.job_name or nvme_path" "$work/second.log" ||
  { msg="the refusal does not name the fix"; fail "$work/second.log"; }
[ "$(swap_files | xargs stat -c '%n %s %i')" = "$before" ] ||
  { msg="the refused run touched the live run's swap files"; fail "$work/second.log"; }

kill -9 "$pid"
wait "$pid" 2> /dev/null || true
pid=""
[ "$(swap_files | wc -l)" = 2 ] || { msg="SIGKILL left no swap files: nothing to reclaim"; fail; }

# The same job again: reclaims what the killed run left, trains, cleans up.
"$ztrain" --config "$work/again.json" > "$work/again.log" 2>&1 || fail "$work/again.log"
grep -q "removed 2 swap files (.*) left in $rank0 by an earlier run of job reclaim that did not end cleanly" \
  "$work/again.log" || { msg="no word of the reclaimed files"; fail "$work/again.log"; }
[ -z "$(ls -A "$work/nvme")" ] || { ls -R "$work/nvme"; msg="swap files left behind"; fail; }
"$ztrain" --config "$work/straight.json" > "$work/straight.log" 2>&1 || fail "$work/straight.log"
compare_runs "$work/straight.json" "$work/straight/train.csv" "$work/again/train.csv" 20 \
  "$work/straight.bin" "$work/again.bin" --exact
echo "a live run's swap directory was refused to a second run; after SIGKILL its swap files were reclaimed and the run trained as one without offload"
