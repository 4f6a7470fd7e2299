#!/usr/bin/env bash
# Context parallelism's two algorithms on the same shape (Note [Context parallelism], Note
# [Ring attention]): `configs/llama_tiny.json` at T tokens per sample, micro-batch 1, on 2
# ranks with context_parallel.size 2, by Ulysses and by ring, alternating runs; prints each
# run's mean step time over steps 2..N and the ratio ring / Ulysses (the issue's bar: 1.15).
#   bash bench/context_parallel_bench.sh [build-dir] [steps] [T ...]
set -euo pipefail
build=${1:-build}
steps=${2:-6}
shift $(( $# > 2 ? 2 : $# ))
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(4096 16384)
work=$(mktemp -d /tmp/ztrain_cp_bench_XXXXXX)
trap 'rm -rf "$work"' EXIT
here=$(cd "$(dirname "$0")/.." && pwd)
config() {  # T algorithm -> file
  python3 - "$here/configs/llama_tiny.json" "$1" "$2" "$steps" "$work" <<'PY'
import json, sys
src, t, algorithm, steps, work = sys.argv[1:]
c = json.load(open(src))
c["model"]["max_seq_len"] = int(t)
c["data"] = {"seq_len": int(t)}
c["train_micro_batch_size_per_gpu"] = 1
c["gradient_accumulation_steps"] = 1
c.pop("train_batch_size", None)
c["context_parallel"] = {"size": 2, "algorithm": algorithm}
c["steps_per_print"] = 1
c["training"].update({"steps": int(steps), "eval_interval": 0,
                      "output_dir": f"{work}/out_{algorithm}_{t}"})
path = f"{work}/{algorithm}_{t}.json"
json.dump(c, open(path, "w"))
print(path)
PY
}
mean_ms() {  # log -> mean ms/step of steps 2..N
  grep -o '| [0-9.]* ms/step' "$1" | awk 'NR > 1 { s += $2; n++ } END { printf "%.1f", s / n }'
}
printf "%-8s %14s %14s %8s\n" "T" "ulysses ms" "ring ms" "ratio"
for t in "${lengths[@]}"; do
  for algorithm in ulysses ring; do
    env -u OMP_NUM_THREADS mpirun --allow-run-as-root --bind-to none --mca mpi_yield_when_idle 1 \
      -np 2 "$build/ztrain" --config "$(config "$t" "$algorithm")" > "$work/$algorithm.log" 2>&1 \
      < /dev/null || { cat "$work/$algorithm.log"; exit 1; }
  done
  u=$(mean_ms "$work/ulysses.log") r=$(mean_ms "$work/ring.log")
  printf "%-8s %14s %14s %8s\n" "$t" "$u" "$r" "$(awk -v a="$r" -v b="$u" 'BEGIN { printf "%.3f", a / b }')"
done
