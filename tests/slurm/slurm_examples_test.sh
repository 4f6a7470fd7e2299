#!/usr/bin/env bash
# The batch scripts of examples/slurm/ on the test cluster (slurm_cluster.sh; SLURM_CONF
# points at it): cpu.sbatch runs as written (4 tasks of 2 CPUs; only ZTRAIN, the binary, and
# STEPS, fewer steps, are set) and must finish with its final weights, its losses and the
# tasks' threads taken from --cpus-per-task; gpu_multinode.sbatch is syntax-checked and
# submitted with `sbatch --test-only` on one node (the test node offers 8 GPUs as a count-only
# GRES, and no second node), which SLURM accepts only when its GPU, CPU, signal and requeue
# lines are valid and fit the node, and the config it writes must pass check-config.
#   slurm_examples_test.sh <ztrain> <examples/slurm dir>
set -euo pipefail
ztrain=$(realpath "$1") examples=$(realpath "$2")
work=$(mktemp -d /tmp/ztrain_slurm_examples_XXXXXX)
id=""
trap '[ -z "$id" ] || scancel "$id" 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
cd "$work"

bash -n "$examples/gpu_multinode.sbatch"
# (A few tries: the controller can be busy with the other tests' jobs.)
for try in 1 2 3 4 5; do
  sbatch --test-only --nodes=1 "$examples/gpu_multinode.sbatch" > test_only.log 2>&1 && break
  [ "$try" = 5 ] && { cat test_only.log; echo "sbatch --test-only refused gpu_multinode.sbatch"; exit 1; }
  sleep 2
done
grep -q "to start at" test_only.log || { cat test_only.log; echo "no start time from --test-only"; exit 1; }
echo "gpu_multinode.sbatch: $(cat test_only.log)"
# The config it writes is one ztrain accepts for its 16 ranks: the script runs with srun
# stubbed out (an exported shell function), on a small Hugging Face Llama and a token file
# made here, and check-config reads what it wrote.
cat > llama.json <<JSON
{"train_micro_batch_size_per_gpu": 1, "model": {"type": "llama", "n_layer": 1, "n_head": 2,
 "n_kv_head": 1, "n_embd": 32, "intermediate_size": 48, "vocab_size": 256, "max_seq_len": 2048},
 "data": {"seq_len": 64}, "training": {"steps": 1, "eval_interval": 0, "save_final": "$work/model/"}}
JSON
"$ztrain" --config llama.json > llama.log 2>&1 || { cat llama.log; exit 1; }
mkdir -p data nvme
head -c 300000 /dev/urandom | base64 > corpus.txt
"$ztrain" data --text corpus.txt --out data/train_000000.bin > data.log 2>&1 || { cat data.log; exit 1; }
srun() { echo "srun $*" > srun_args; }  # the script runs in $work
export -f srun
SLURM_JOB_NAME=gpu SLURM_JOB_ID=1 SLURM_JOB_NODELIST=node[1-2] ZTRAIN=$ztrain MODEL=$work/model \
  DATA="$work/data/train_*.bin" RUN_DIR=$work/gpu LOCAL_NVME=$work/nvme \
  bash "$examples/gpu_multinode.sbatch" > gpu_script.log 2>&1 || { cat gpu_script.log; exit 1; }
unset -f srun
grep -q "srun --mpi=pmix --kill-on-bad-exit=1 $ztrain --config $work/gpu/ds_config.json" srun_args ||
  { cat srun_args; echo "gpu_multinode.sbatch does not launch ztrain with its config"; exit 1; }
"$ztrain" check-config gpu/ds_config.json --world-size 16 > check.log 2>&1 ||
  { cat gpu/ds_config.json check.log; echo "ztrain refuses the config gpu_multinode.sbatch writes"; exit 1; }
echo "gpu_multinode.sbatch writes a config ztrain accepts for 16 ranks and launches it with srun"

# The test machine has fewer cores than the 8 threads: ranks and threads must not spin.
id=$(ZTRAIN=$ztrain STEPS=60 OMPI_MCA_mpi_yield_when_idle=1 OMP_WAIT_POLICY=passive \
  sbatch --parsable "$examples/cpu.sbatch")
state=""
for _ in $(seq 3000); do
  state=$(scontrol show job -o "$id" | tr ' ' '\n' | sed -n 's/^JobState=//p')
  case "$state" in PENDING|RUNNING|CONFIGURING|COMPLETING) sleep 0.2;; *) break;; esac
done
out="$work/ztrain-cpu-$id.out" run="$work/runs/ztrain-cpu-$id"
[ "$state" = COMPLETED ] || { scontrol show job "$id"; cat "$out"; echo "cpu.sbatch: $state"; exit 1; }
for want in "job $id restart 0 on " "SLURM job $id (restart 0), slurm rank 0 of 4 on " \
            "2 OpenMP threads per rank from SLURM_CPUS_PER_TASK" "step *60/60"; do
  grep -q "$want" "$out" || { cat "$out"; echo "cpu.sbatch's log lacks: $want"; exit 1; }
done
[ -s "$run/final.bin" ] && [ -f "$run/checkpoints/latest" ] || { ls -R "$run"; echo "no final weights or checkpoint"; exit 1; }
rows=$(tail -n +2 "$run/csv/train.csv" | wc -l)
[ "$rows" = 60 ] || { echo "train.csv has $rows rows, not 60"; exit 1; }
echo "cpu.sbatch as written: job $id, 4 tasks x 2 CPUs, 60 steps, final weights and a checkpoint"
