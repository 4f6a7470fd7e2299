#!/usr/bin/env bash
# ztrain in real SLURM batch jobs on the one-node cluster of slurm_cluster.sh (SLURM_CONF
# points at it; the CTest fixture slurm_cluster starts it). Cases:
#   tasks N   an sbatch job running `srun --mpi=pmix -n N ztrain` (N = 2: also `mpirun -np 2`
#             inside the allocation, and srun without PMIx names the fix) against one process
#             with an N times larger micro-batch:
#             20 losses and the final weights equal (Note [Equivalence tolerances]); the ranks
#             take their OpenMP threads from --cpus-per-task
#   requeue   a 2-task job signalled mid-run with `scancel --signal=USR1 --full` saves a
#             checkpoint, requeues itself, resumes from it by itself (SLURM_RESTART_COUNT 1)
#             and ends with the weights of an uninterrupted single-process run
#   killed    a task of a 2-task job killed with SIGKILL ends the whole job within 120 s, and
#             SLURM records the job as FAILED
#   slurm_train_test.sh <ztrain> <case> [N]
set -euo pipefail
source "$(dirname "$0")/../launcher/compare_runs.sh"
ztrain=$(realpath "$1") case=$2 n=${3:-2}
[ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ] || { echo "SLURM_CONF does not name the test cluster's slurm.conf"; exit 1; }
work=$(mktemp -d /tmp/ztrain_slurm_XXXXXX)
jobs=()
cleanup() {
  for j in "${jobs[@]}"; do scancel "$j" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
export OMPI_MCA_mpi_yield_when_idle=1  # more ranks than cores

job_field() {  # job id, field -> value from scontrol
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1
}
ended() {  # job state: true for the states of a job that has ended
  case "$1" in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) return 0;;
  esac
  return 1
}
wait_job() {  # job id, seconds: waits until the job has ended, prints its state
  local state
  for _ in $(seq $(($2 * 5))); do
    state=$(job_field "$1" JobState)
    ended "$state" && { echo "$state"; return 0; }
    sleep 0.2
  done
  echo "still ${state:-unknown} after $2 s"
}
show_job() {  # job id, output file
  scontrol show job "$1" || true
  echo "--- $2"; cat "$2" 2>/dev/null || true
}
csv_rows() { [ -f "$1" ] && tail -n +2 "$1" | wc -l || echo 0; }

config() {  # micro-batch, job name, steps, extra sections
  cat <<JSON
{"train_micro_batch_size_per_gpu": $1, "steps_per_print": 10, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 1},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1, "eps": 1e-6}},
 "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "max_seq_len": 32},
 "training": {"steps": $3, "eval_interval": 0, "output_dir": "$work/out_$2",
              "save_final": "$work/$2.bin"},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "$2"}$4}
JSON
}
single() {  # steps, ranks: the one-process reference
  config $((8 * $2)) single "$1" "" > "$work/single.json"
  OMP_NUM_THREADS=1 "$ztrain" --config "$work/single.json" > "$work/single.log" 2>&1 ||
    { cat "$work/single.log"; exit 1; }
}
submit() {  # script; sets $id and remembers the job for the clean-up
  id=$(sbatch --parsable "$1") || { echo "sbatch refused $1"; cat "$1"; exit 1; }
  jobs+=("$id")
}

case "$case" in
tasks)
  single 20 "$n"
  config 8 srun 20 "" > "$work/srun.json"
  cat > "$work/srun.sbatch" <<SCRIPT
#!/bin/bash
#SBATCH --job-name=ztrain-srun$n --ntasks=$n --cpus-per-task=1 --output=$work/srun.out
srun --mpi=pmix --kill-on-bad-exit=1 "$ztrain" --config "$work/srun.json"
SCRIPT
  submit "$work/srun.sbatch"
  state=$(wait_job "$id" 600)
  [ "$state" = COMPLETED ] || { show_job "$id" "$work/srun.out"; echo "srun job: $state"; exit 1; }
  grep -q "1 OpenMP threads per rank from SLURM_CPUS_PER_TASK" "$work/srun.out" ||
    { cat "$work/srun.out"; echo "threads not taken from --cpus-per-task"; exit 1; }
  grep -q "SLURM job $id (restart 0), slurm rank 0 of $n on " "$work/srun.out" ||
    { cat "$work/srun.out"; echo "the job is not logged"; exit 1; }
  ! grep -q "srun started these ranks with" "$work/srun.out" ||
    { cat "$work/srun.out"; echo "the --mpi=pmix hint was shown to a job started with PMIx"; exit 1; }
  compare_runs "$work/single.json" "$work/single/train.csv" "$work/srun/train.csv" 20 \
    "$work/single.bin" "$work/srun.bin"
  echo "srun -n $n in an sbatch job: 20 losses and the final weights equal one process"
  if [ "$n" = 2 ]; then
    # Without --mpi=pmix (the cluster's MpiDefault is none) OpenMPI cannot start: ztrain
    # names the fix before OpenMPI's own error.
    srun -n 2 "$ztrain" --config "$work/srun.json" > "$work/nopmix.out" 2>&1 &&
      { cat "$work/nopmix.out"; echo "srun without PMIx started"; exit 1; }
    grep -q "srun started these ranks with no MPI plugin.*launch with srun --mpi=pmix" "$work/nopmix.out" ||
      { cat "$work/nopmix.out"; echo "no hint to use --mpi=pmix"; exit 1; }
    config 8 mpirun 20 "" > "$work/mpirun.json"
    cat > "$work/mpirun.sbatch" <<SCRIPT
#!/bin/bash
#SBATCH --job-name=ztrain-mpirun --ntasks=2 --cpus-per-task=1 --output=$work/mpirun.out
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --bind-to none -np 2 "$ztrain" --config "$work/mpirun.json"
SCRIPT
    submit "$work/mpirun.sbatch"
    state=$(wait_job "$id" 600)
    [ "$state" = COMPLETED ] || { show_job "$id" "$work/mpirun.out"; echo "mpirun job: $state"; exit 1; }
    compare_runs "$work/single.json" "$work/single/train.csv" "$work/mpirun/train.csv" 20 \
      "$work/single.bin" "$work/mpirun.bin"
    echo "mpirun -np 2 in an sbatch job: 20 losses and the final weights equal one process"
  fi
  ;;
requeue)
  steps=400
  single "$steps" 2
  config 8 requeued "$steps" ", \"checkpoint\": {\"dir\": \"$work/ckpt\", \"interval\": 1000}" \
    > "$work/requeued.json"
  cat > "$work/requeued.sbatch" <<SCRIPT
#!/bin/bash
#SBATCH --job-name=ztrain-requeue --ntasks=2 --cpus-per-task=1 --requeue --open-mode=append
#SBATCH --output=$work/requeued.out
trap 'echo "batch shell: SIGUSR1"' USR1  # scancel --full signals this shell too
srun --mpi=pmix --kill-on-bad-exit=1 "$ztrain" --config "$work/requeued.json"
SCRIPT
  submit "$work/requeued.sbatch"
  for _ in $(seq 3000); do
    [ "$(csv_rows "$work/requeued/train.csv")" -ge 30 ] && break
    ! ended "$(job_field "$id" JobState)" ||
      { show_job "$id" "$work/requeued.out"; echo "the job ended before the signal"; exit 1; }
    sleep 0.1
  done
  scancel --signal=USR1 --full "$id"
  # SLURM holds a requeued job back for two minutes (its begin time); start it now instead.
  for _ in $(seq 600); do
    [ "$(job_field "$id" Restarts)" = 1 ] && [ "$(job_field "$id" JobState)" = PENDING ] && break
    sleep 0.1
  done
  [ "$(job_field "$id" Restarts)" = 1 ] || { show_job "$id" "$work/requeued.out"; echo "not requeued"; exit 1; }
  scontrol update JobId="$id" StartTime=now
  state=$(wait_job "$id" 600)
  [ "$state" = COMPLETED ] || { show_job "$id" "$work/requeued.out"; echo "requeued job: $state"; exit 1; }
  out="$work/requeued.out"
  for want in "requeued SLURM job $id: it resumes from the checkpoint just saved" \
              "SLURM job $id (restart 1: requeued, resuming from its checkpoints)" \
              "resumed from .*ckpt/step" "\[rank 1 on [^]]*\] .*stopped at step"; do
    grep -q "$want" "$out" || { cat "$out"; echo "missing in the job's output: $want"; exit 1; }
  done
  stopped=$(sed -n 's/.*\[rank 0[^]]*\].*stopped at step \([0-9]*\) of.*/\1/p' "$out" | head -n1)
  [ -n "$stopped" ] && [ "$stopped" -lt "$steps" ] || { cat "$out"; echo "no stop mid-run"; exit 1; }
  compare_runs "$work/single.json" "$work/single/train.csv" "$work/requeued/train.csv" "$steps" \
    "$work/single.bin" "$work/requeued.bin"
  echo "USR1 at step $stopped: saved, requeued, resumed; $steps losses and the final weights equal one uninterrupted process"
  # A job that may not be requeued: saved, the refusal named with the fix, exit 130, FAILED.
  sed -e 's/--requeue/--no-requeue/' -e "s|requeued.out|norequeue.out|" \
    -e "s|requeued.json|norequeue.json|" "$work/requeued.sbatch" > "$work/norequeue.sbatch"
  config 8 norequeue 100000 ", \"checkpoint\": {\"dir\": \"$work/ckpt_no\"}" > "$work/norequeue.json"
  submit "$work/norequeue.sbatch"
  for _ in $(seq 3000); do
    [ "$(csv_rows "$work/norequeue/train.csv")" -ge 5 ] && break
    sleep 0.1
  done
  scancel --signal=USR1 "$id"
  state=$(wait_job "$id" 120)
  out="$work/norequeue.out"
  [ "$state" = FAILED ] && [ "$(job_field "$id" Restarts)" = 0 ] &&
    [ "$(job_field "$id" ExitCode)" = 130:0 ] || { show_job "$id" "$out"; echo "--no-requeue job: $state"; exit 1; }
  grep -q "scontrol requeue $id. failed: .*submit such jobs with sbatch --requeue" "$out" &&
    [ -f "$work/ckpt_no/latest" ] || { cat "$out"; echo "no checkpoint or no named refusal"; exit 1; }
  echo "USR1 in a --no-requeue job: saved a checkpoint, named the refusal, exit 130"
  ;;
killed)
  config 8 killed 100000 "" > "$work/killed.json"
  cat > "$work/killed.sbatch" <<SCRIPT
#!/bin/bash
#SBATCH --job-name=ztrain-killed --ntasks=2 --cpus-per-task=1 --output=$work/killed.out
srun --mpi=pmix --kill-on-bad-exit=1 "$ztrain" --config "$work/killed.json"
SCRIPT
  submit "$work/killed.sbatch"
  for _ in $(seq 3000); do
    [ "$(csv_rows "$work/killed/train.csv")" -ge 5 ] && break
    sleep 0.1
  done
  [ "$(csv_rows "$work/killed/train.csv")" -ge 5 ] || { show_job "$id" "$work/killed.out"; echo "never trained"; exit 1; }
  victim=$(pgrep -n -f "$ztrain --config $work/killed.json")
  start=$(date +%s)
  kill -9 "$victim"
  state=$(wait_job "$id" 120)
  took=$(($(date +%s) - start))
  [ "$state" = FAILED ] || { show_job "$id" "$work/killed.out"; echo "after SIGKILL of a task: $state"; exit 1; }
  sleep 1
  ! pgrep -f "$ztrain --config $work/killed.json" > /dev/null ||
    { pgrep -af "$ztrain --config $work/killed.json"; echo "ranks left running"; exit 1; }
  echo "a task killed with SIGKILL: the job ended FAILED after $took s with no rank left"
  ;;
*) echo "unknown case $case"; exit 2;;
esac
