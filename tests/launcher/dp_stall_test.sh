#!/usr/bin/env bash
# A stalled rank (SIGSTOP) in `mpirun -np N ztrain`: the job must end within comm_timeout_s
# plus a bounded grace, non-zero, with a message that names the stopped rank as the one that
# does not answer (Note [Liveness probe] in parallel/comm/mpi/op_queue.h), and without a
# segfault while the ranks shut down (Note [Stopping the workers]). The segfault was
# intermittent, so the case runs `repetitions` times.
#   dp_stall_test.sh <ztrain binary> <mpiexec> <np> <rank to stop> <repetitions>
set -euo pipefail
ztrain=$1 mpiexec=$2 np=$3 victim=$4 repetitions=$5
timeout_s=3
limit_s=$((timeout_s + 20))  # the timeout, the probe's grace, the abort and mpirun's teardown

# The pid of world rank $2 among the ztrain processes of the job whose config is $1.
rank_pid() {
  local p
  for p in $(pgrep -f "$1"); do
    [ "$(ps -o comm= -p "$p" 2>/dev/null)" = ztrain ] || continue
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}

fail() {
  echo "FAIL (run $run): $*"
  cat "$work/log"
  exit 1
}

run_once() {
  work=$(mktemp -d /tmp/ztrain_stall_XXXXXX)
  cat > "$work/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "training": {"steps": 1000000, "eval_interval": 0, "output_dir": "$work/out",
              "comm_timeout_s": $timeout_s},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "run"}}
JSON
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np "$np" \
    "$ztrain" --config "$work/c.json" < /dev/null > "$work/log" 2>&1 &
  launcher=$!
  for _ in $(seq 900); do  # wait until training runs (rows in train.csv)
    [ -f "$work/run/train.csv" ] && [ "$(wc -l < "$work/run/train.csv")" -gt 5 ] && break
    sleep 0.1
  done
  local pid
  pid=$(rank_pid "$work/c.json" "$victim")
  [ -n "$pid" ] || fail "no process of rank $victim found"
  local start status=0 elapsed
  start=$(date +%s.%N)
  kill -STOP "$pid"
  for _ in $(seq $((limit_s * 10 + 100))); do
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -KILL "$launcher"
    fail "the job still runs $((limit_s + 10)) s after rank $victim was stopped"
  fi
  wait "$launcher" || status=$?
  elapsed=$(echo "$(date +%s.%N) - $start" | bc)
  [ "$status" -ne 0 ] || fail "exit status 0 after rank $victim was stopped"
  if grep -E "Segmentation fault|signal 11|SIGSEGV|exited on signal 11" "$work/log"; then
    fail "a rank crashed while the job shut down"
  fi
  # Some rank that waited names the stopped one, by world rank and host...
  grep -E "rank [0-9]+ of $np on [^ ]+ failed: .*: rank $victim \(host [^)]+\) does not answer" \
    "$work/log" > /dev/null || fail "no message names rank $victim as the one that does not answer"
  # ...and no rank blames another one: every other rank answered.
  if grep -oE "rank [0-9]+ \(host [^)]+\) (does|do) not answer" "$work/log" |
     grep -vE "^rank $victim \(host [^)]+\) does not answer$"; then
    fail "a rank that answered was named as silent"
  fi
  (( $(echo "$elapsed <= $limit_s" | bc) )) ||
    fail "the job ended ${elapsed}s after the stop, more than ${limit_s}s"
  printf 'run %d: rank %d of %d stopped: job ended with status %d after %.1fs\n' \
    "$run" "$victim" "$np" "$status" "$elapsed"
  grep -m1 "does not answer" "$work/log"
  pkill -KILL -f "$work/c.json" 2>/dev/null || true
  rm -rf "$work"
  work=""
}

work=""
trap '[ -z "$work" ] || { pkill -KILL -f "$work/c.json" 2>/dev/null || true; rm -rf "$work"; }' EXIT
for run in $(seq "$repetitions"); do run_once; done
