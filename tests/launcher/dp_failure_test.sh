#!/usr/bin/env bash
# A rank that dies or stops answering ends the whole `mpirun -np 2 ztrain` job within a
# bounded time, non-zero, with a message naming the failing rank and what it was doing (a
# stopped one: the rank that waited names it as the one that does not answer).
#   dp_failure_test.sh <ztrain binary> <mpiexec> <kill|stop>
set -euo pipefail
ztrain=$1 mpiexec=$2 mode=$3
past=$([ "$mode" = kill ] && echo killed || echo stopped)
work=$(mktemp -d /tmp/ztrain_fail_XXXXXX)
cleanup() { pkill -KILL -f "$work/c.json" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cat > "$work/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "steps_per_print": 1000,
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "training": {"steps": 1000000, "eval_interval": 0, "output_dir": "$work/out",
              "comm_timeout_s": 3},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "run"}}
JSON
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np 2 \
  "$ztrain" --config "$work/c.json" > "$work/log" 2>&1 &
launcher=$!
for _ in $(seq 600); do  # wait until training runs (rows in train.csv)
  [ -f "$work/run/train.csv" ] && [ "$(wc -l < "$work/run/train.csv")" -gt 5 ] && break
  sleep 0.1
done
victim=$(pgrep -f "$work/c.json" | while read -r p; do
  [ "$(ps -o comm= -p "$p")" = ztrain ] && echo "$p"; done | tail -n 1)
[ -n "$victim" ] || { echo "no rank process found"; cat "$work/log"; exit 1; }
# Its world rank (OpenMPI's environment; empty under another MPI).
victim_rank=$(tr '\0' '\n' < "/proc/$victim/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
start=$(date +%s)
if [ "$mode" = kill ]; then kill -KILL "$victim"; else kill -STOP "$victim"; fi
status=0
for _ in $(seq 600); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the job still runs 60 s after a rank was ${past}"; kill -KILL "$launcher"; exit 1
fi
wait "$launcher" || status=$?
elapsed=$(( $(date +%s) - start ))
[ "$status" -ne 0 ] || { echo "FAIL: exit status 0 after a rank was ${past}"; exit 1; }
if [ "$mode" = stop ]; then
  # The waiting rank reports the collective it was in and the timeout, then ends the job.
  grep -q "failed: .*AllReduce\|failed: .*ReduceScatter\|failed: .*AllGather" "$work/log" || {
    echo "FAIL: no message naming the rank and the collective"; cat "$work/log"; exit 1; }
  # ...and names the stopped rank as the one that does not answer (Note [Liveness probe]).
  grep -q "rank ${victim_rank:-[0-9]*} (host [^)]*) does not answer" "$work/log" || {
    echo "FAIL: no message naming rank ${victim_rank:-?} as silent"; cat "$work/log"; exit 1; }
fi
echo "rank ${past}: job ended with status $status after ${elapsed}s"
grep -m1 -E "failed|exited on signal|aborted" "$work/log" || true
