#!/usr/bin/env bash
# Corpora survive SIGKILL (Note [Staged file sets], core/staged_output.h). A corpus of many
# shards is written, then another one (other shard sizes, so other files) over it with
# --overwrite, killed with SIGKILL at a random moment, `kills` times. After every kill the
# corpus files beside --out are, name for name and byte for byte, the earlier corpus or the
# new one; or the kill came inside the commit, and then the training data loader refuses the
# mixed files until the next `ztrain data` for that --out finishes the commit, after which they
# are the new corpus. Nothing a killed run staged is left after the next run.
#   data_kill_test.sh <ztrain binary> [kills]
set -euo pipefail
ztrain=$1 kills=${2:-20}
work=$(mktemp -d /tmp/ztrain_data_kill_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=
# 1.5 MB of text in 150 documents.
python3 - "$work/in" <<'PY'
import os, random, sys
random.seed(7)
words = ["alpha", "beta", "gamma", "delta", "shard", "token", "corpus", "line"]
os.makedirs(sys.argv[1])
for d in range(150):
    with open(f"{sys.argv[1]}/doc{d:03d}.txt", "w") as f:
        f.write(" ".join(random.choice(words) for _ in range(1700)))
PY
corpus() { (cd "$work/out" && find . -maxdepth 1 -type f | LC_ALL=C sort | xargs sha256sum); }
data() { "$ztrain" data "$work/in" --out "$work/out/c.bin" --threads 1 "$@"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

data --shard-tokens 20000 > /dev/null 2>&1
old=$(corpus)
data --shard-tokens 15000 --val-tokens 50000 --overwrite > /dev/null 2>&1
new=$(corpus)
[ "$old" != "$new" ] || { echo "the two corpora are the same files"; exit 1; }
data --shard-tokens 20000 --overwrite > /dev/null 2>&1
[ "$(corpus)" = "$old" ] || { echo "writing the earlier corpus again gave other files"; exit 1; }
t0=$(now_ms)
data --shard-tokens 15000 --val-tokens 50000 --overwrite > /dev/null 2>&1
ms=$(( $(now_ms) - t0 + 1 ))
data --shard-tokens 20000 --overwrite > /dev/null 2>&1
cat > "$work/train.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1,
 "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "max_seq_len": 8},
 "data": {"train": "$work/out/c_*.bin"},
 "training": {"steps": 1, "eval_interval": 0, "output_dir": "$work/run"}}
JSON
k=0 landed_old=0 landed_new=0 mid=0
while [ "$k" -lt "$kills" ]; do
  k=$((k + 1))
  # ztrain itself in the background (a shell function there would be a subshell, and the
  # SIGKILL would miss the process that writes).
  "$ztrain" data "$work/in" --out "$work/out/c.bin" --threads 1 --shard-tokens 15000 \
    --val-tokens 50000 --overwrite > "$work/kill.log" 2>&1 < /dev/null &
  pid=$!
  sleep "$(awk -v r="$RANDOM" -v ms="$ms" 'BEGIN { printf "%.3f", r / 32768 * ms * 1.1 / 1000 }')"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  now=$(corpus)
  if ls -a "$work/out"/.c.bin.ztrain-staging.*/.ztrain-commit > /dev/null 2>&1; then
    mid=$((mid + 1))
    if "$ztrain" --config "$work/train.json" > "$work/refused.log" 2>&1 < /dev/null ||
       ! grep -q "was putting in place" "$work/refused.log"; then
      cat "$work/refused.log"; echo "kill $k: training read a corpus whose commit was cut"; exit 1
    fi
    if data --shard-tokens 20000 > "$work/finish.log" 2>&1 < /dev/null ||
       ! grep -q "is there from an earlier run" "$work/finish.log"; then
      cat "$work/finish.log"; echo "kill $k: the next run did not refuse the finished corpus"; exit 1
    fi
    now=$(corpus)
    [ "$now" = "$new" ] || { echo "kill $k: the finished commit is not the new corpus"; exit 1; }
  fi
  if [ "$now" = "$old" ]; then
    landed_old=$((landed_old + 1))
  elif [ "$now" = "$new" ]; then
    landed_new=$((landed_new + 1))
    data --shard-tokens 20000 --overwrite > /dev/null 2>&1
    [ "$(corpus)" = "$old" ] || { echo "writing the earlier corpus again gave other files"; exit 1; }
  else
    echo "after kill $k the corpus files are neither corpus:"
    echo "$now"; echo "--- earlier:"; echo "$old"; echo "--- new:"; echo "$new"
    exit 1
  fi
done
data --shard-tokens 15000 --val-tokens 50000 --overwrite > "$work/last.log" 2>&1
[ "$(corpus)" = "$new" ] || { cat "$work/last.log"; echo "the last run's corpus differs"; exit 1; }
if ls -a "$work/out" | grep -q "ztrain-staging"; then
  ls -a "$work/out"; echo "a killed run's staging directory was not removed"; exit 1
fi
echo "$k kills (a run of ${ms} ms): $landed_old left the earlier corpus, $landed_new the new one" \
     "($mid inside the commit, refused to the loader, then finished); never a mix"
echo "PASS: every killed ztrain data left one whole corpus"
