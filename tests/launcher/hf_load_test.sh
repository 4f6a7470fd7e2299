#!/usr/bin/env bash
# A Hugging Face Llama directory loaded by `mpirun ztrain` on a parallel layout: the config
# names only model.init_from, each rank reads only the tensor bytes it holds (rank 0's share
# is checked against the layout's), and the first steps' losses equal the PyTorch reference
# (tests/reference/hf_llama.py) training the same directory in one process.
#   hf_load_test.sh <ztrain> <mpiexec> <python with torch> <reference dir> <np> <zero stage> <pp> <tp> <max share %>
set -euo pipefail
ztrain=$1 mpiexec=$2 python=$3 reference=$4 np=$5 stage=$6 pp=$7 tp=$8 share=$9
"$python" -c "import torch" 2>/dev/null || { echo "SKIP: $python has no torch"; exit 77; }
work=$(mktemp -d /tmp/ztrain_hf_load_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
B=8 T=32 steps=3
dp=$((np / pp / tp))
"$python" "$reference/hf_llama.py" make-model --out "$work/model" --arch llama --shards 2 \
  --config-json '{"num_key_value_heads": 2, "tie_word_embeddings": false}'
# The same tokens as raw int32 (the reference) and as an llm.c uint16 shard (ztrain).
"$python" - "$work" $((steps * B * T + 1)) <<'PY'
import random, struct, sys
work, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
tokens = [rng.randrange(256) for _ in range(n)]
open(f"{work}/tokens.i32", "wb").write(struct.pack(f"<{n}i", *tokens))
header = [20240520, 1, n] + [0] * 253
open(f"{work}/train.bin", "wb").write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *tokens))
PY
"$python" "$reference/hf_llama.py" train --model "$work/model" --tokens "$work/tokens.i32" \
  --batch $B --seq $T --steps $steps --lr 1e-3 --weight-decay 0.1 --threads 1 --out "$work/ref.json"
cat > "$work/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": $((B / dp)), "gradient_accumulation_steps": 1,
 "steps_per_print": 1, "gradient_clipping": 0.0, "zero_optimization": {"stage": $stage},
 "pipeline": {"stages": $pp}, "tensor_parallel": {"size": $tp},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                           "weight_decay": 0.1}},
 "model": {"init_from": "$work/model"},
 "data": {"train": "$work/train.bin", "seq_len": $T},
 "training": {"steps": $steps, "eval_interval": 0, "output_dir": "$work/out"},
 "csv_monitor": {"enabled": true, "output_path": "$work", "job_name": "run"}}
JSON
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  "$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np "$np" \
  "$ztrain" --config "$work/ds.json" > "$work/log" 2>&1 < /dev/null || { cat "$work/log"; exit 1; }
line=$(grep -m1 "this rank read" "$work/log") || { cat "$work/log"; echo "no load line"; exit 1; }
echo "$line"
"$python" - "$work" "$share" "$line" <<'PY'
import csv, json, re, sys
work, share, line = sys.argv[1], float(sys.argv[2]), sys.argv[3]
read, held = map(int, re.search(r"read (\d+) of the model's (\d+) tensor bytes", line).groups())
assert read <= share / 100 * held, f"rank 0 read {read} of {held} bytes, more than {share} %"
assert read > 0
ref = json.load(open(f"{work}/ref.json"))["losses"]
with open(f"{work}/run/train.csv") as f:
    got = [float(r["loss"]) for r in csv.DictReader(f)]
assert len(got) == len(ref), (got, ref)
for k, (g, r) in enumerate(zip(got, ref)):
    assert abs(g - r) <= 1e-4 * abs(r), f"step {k + 1}: ztrain {g} vs reference {r}"
print(f"losses {got} = reference {ref} within 1e-4; rank 0 read {100 * read / held:.1f} % of the bytes")
PY
