#!/usr/bin/env bash
# `ztrain generate` against a PyTorch reference that reruns the full forward pass at every step
# (tests/reference/greedy_reference.py): greedy decoding of 32 tokens from a tiny GPT-2 and a
# tiny Llama trained by ztrain (a few steps, saved as Hugging Face directories), and from a
# Qwen2 and a Mistral made by the reference itself, must give the same tokens. The same run's
# checkpoint (--checkpoint) and llm.c model file give the GPT-2's tokens too; a seed gives the
# same sample twice; top-k 1 is greedy; bad input is named.
#   generate_cli_test.sh <ztrain> <python with torch> <reference dir>
set -euo pipefail
ztrain=$1 python=$2 reference=$3
"$python" -c "import torch" 2>/dev/null || { echo "SKIP: $python has no torch"; exit 77; }
work=$(mktemp -d /tmp/ztrain_generate_XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
train() {  # family, save_final, job
  local model='"n_layer": 2, "n_head": 4, "n_embd": 64'
  [ "$1" = llama ] && model='"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "intermediate_size": 96, "rope_theta": 500000.0, "tie_word_embeddings": false'
  cat > "$work/$3.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "steps_per_print": 100,
 "model": {$model, "vocab_size": 256, "max_seq_len": 64},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "training": {"steps": 12, "output_dir": "$work/out_$3", "save_final": "$2"},
 "checkpoint": {"dir": "$work/ckpt_$3", "interval": 12}}
JSON
  OMP_NUM_THREADS=1 "$ztrain" --config "$work/$3.json" > "$work/$3.log" 2>&1 || { cat "$work/$3.log"; fail "training $3"; }
}
ids() {  # ztrain generate arguments... -> the new ids on one line
  "$ztrain" generate "$@" --ids 2> "$work/gen.err" | tr '\n' ' ' || { cat "$work/gen.err"; fail "generate $*"; }
}
reference() {  # model dir, prompt ids, tokens -> the reference's ids on one line
  "$python" "$reference/greedy_reference.py" --model "$1" --prompt-ids "$2" --new-tokens "$3" \
    --out "$work/ref.json" > /dev/null
  "$python" -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['tokens'])) + ' ')" "$work/ref.json"
}
train gpt2 "$work/gpt2/" gpt2
train llama "$work/llama/" llama
train gpt2 "$work/gpt2.bin" gpt2_llmc
"$python" "$reference/hf_llama.py" make-model --out "$work/qwen2" --arch qwen2 > /dev/null
"$python" "$reference/hf_llama.py" make-model --out "$work/mistral" --arch mistral \
  --config-json '{"num_key_value_heads": 1, "head_dim": 32}' > /dev/null
# Sliding windows shorter than the 37 positions generated: the caches of the sliding layers wrap
# around (Note [Windowed KV cache]); the reference reruns the whole forward under HF's mask.
"$python" "$reference/hf_llama.py" make-model --out "$work/mistral_window" --arch mistral \
  --config-json '{"num_key_value_heads": 1, "head_dim": 32, "sliding_window": 6}' > /dev/null
"$python" "$reference/hf_llama.py" make-model --out "$work/qwen2_window" --arch qwen2 \
  --config-json '{"use_sliding_window": true, "sliding_window": 5, "max_window_layers": 1}' \
  > /dev/null
# No tokenizer files and 300 ids: byte tokens, and --ids keeps every id of the model.
"$python" "$reference/hf_llama.py" make-model --out "$work/qwen2_300" --arch qwen2 \
  --config-json '{"vocab_size": 300}' > /dev/null
prompt=72,101,108,108,111
for model in gpt2 llama qwen2 mistral mistral_window qwen2_window qwen2_300; do
  got=$(ids --model "$work/$model" --prompt-ids $prompt --max-new-tokens 32)
  want=$(reference "$work/$model" $prompt 32)
  [ "$got" = "$want" ] || fail "$model: ztrain gave $got, the reference $want"
  [ "$(echo $got | wc -w)" = 32 ] || fail "$model: not 32 tokens: $got"
  echo "$model: 32 greedy tokens equal the reference's"
done
wide=$(ids --model "$work/qwen2_300" --prompt-ids $prompt --max-new-tokens 48 --temperature 5 --seed 1)
echo "$wide" | tr ' ' '\n' | awk '$1 >= 256 { found = 1 } END { exit !found }' ||
  fail "--ids without a tokenizer drew no id above the 256 bytes from 300: $wide"
gpt2=$(ids --model "$work/gpt2" --prompt-ids $prompt --max-new-tokens 32)
[ "$(ids --checkpoint "$work/ckpt_gpt2" --prompt-ids $prompt --max-new-tokens 32)" = "$gpt2" ] ||
  fail "--checkpoint gave other tokens than the run's saved model"
[ "$(ids --model "$work/gpt2.bin" --prompt-ids $prompt --max-new-tokens 32)" = "$gpt2" ] ||
  fail "the llm.c model file gave other tokens than the HF directory"
[ "$(ids --model "$work/llama" --prompt-ids $prompt --max-new-tokens 32 --temperature 3 --top-k 1)" = \
  "$(ids --model "$work/llama" --prompt-ids $prompt --max-new-tokens 32)" ] || fail "top-k 1 is not greedy"
a=$(ids --model "$work/llama" --prompt-ids $prompt --max-new-tokens 24 --temperature 1 --top-p 0.9 --seed 5)
b=$(ids --model "$work/llama" --prompt-ids $prompt --max-new-tokens 24 --temperature 1 --top-p 0.9 --seed 5)
[ "$a" = "$b" ] || fail "seed 5 gave two samples: $a / $b"
text=$("$ztrain" generate --model "$work/gpt2" --prompt "Hello" --max-new-tokens 8 2>/dev/null)
[ "${text:0:5}" = "Hello" ] || fail "the text does not start with the prompt: $text"
# Text through a SentencePiece model (trained here on the README): what is printed is the
# prompt, then the text of the whole sequence as sentencepiece decodes it, spaces included (a
# piece decoded on its own loses its leading space). Its 200 ids are fewer than the model's
# 256: no id without text is picked. One of 300 ids gives prompts the model cannot read.
if "$python" -c "import sentencepiece" 2>/dev/null; then
  "$python" -c "import sentencepiece as s, sys; s.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=int(sys.argv[3]))" \
    "$reference/../../README.md" "$work/spm" 200 > /dev/null 2>&1 || fail "training a SentencePiece model"
  text=$("$ztrain" generate --model "$work/llama" --tokenizer "$work/spm.model" --prompt "Hello" --max-new-tokens 16 2>"$work/gen.err") ||
    { cat "$work/gen.err"; fail "generate with a SentencePiece model"; }
  sp_ids=$(ids --model "$work/llama" --tokenizer "$work/spm.model" --prompt "Hello" --max-new-tokens 16)
  want=$("$python" -c "import sentencepiece as s, sys; m = s.SentencePieceProcessor(model_file=sys.argv[1]); print(m.decode(m.encode('Hello') + [int(i) for i in sys.argv[2].split()]))" "$work/spm.model" "$sp_ids")
  [ "$text" = "$want" ] || fail "SentencePiece text: ztrain printed '$text', sentencepiece decodes '$want'"
  for id in $sp_ids; do [ "$id" -lt 200 ] || fail "id $id is outside the tokenizer's 200"; done
  echo "SentencePiece: the printed text is sentencepiece's decoding of the sequence"
  "$python" -c "import sentencepiece as s, sys; s.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=300)" \
    "$reference/../../README.md" "$work/spm300" > /dev/null 2>&1 || fail "training a SentencePiece model"
  # A text whose ids include one of the 44 the model lacks: the text of such a piece.
  high=$("$python" -c "
import sentencepiece as s, sys
m = s.SentencePieceProcessor(model_file=sys.argv[1])
for i in range(m.get_piece_size() - 1, 255, -1):
    text = m.id_to_piece(i).replace('\u2581', ' ').strip()
    if text and max(m.encode(text)) >= 256:
        print(text); break" "$work/spm300.model")
  [ -n "$high" ] || fail "no text encodes to an id above 255 with the 300-id model"
  err=$("$ztrain" generate --model "$work/llama" --tokenizer "$work/spm300.model" --prompt "$high" \
    --max-new-tokens 4 2>&1) && fail "prompt '$high' (ids outside the model) accepted"
  echo "$err" | grep -q "outside the model's vocabulary of 256" || fail "tokenizer mismatch: $err"
fi
err=$("$ztrain" generate --prompt x 2>&1) && fail "no model accepted"
echo "$err" | grep -q "give --model" || fail "no model: $err"
# More new tokens than the context holds: cut to what is left, said before anything prints.
err=$("$ztrain" generate --model "$work/gpt2" --prompt-ids 1,2 --max-new-tokens 80 --ids 2>&1) ||
  fail "80 new tokens past max_seq_len 64: $err"
echo "$err" | head -n 3 | grep -q "generating at most 62 tokens: the model's context is 64" ||
  fail "too long: $err"
err=$("$ztrain" generate --model "$work/none" --prompt x 2>&1) && fail "a missing model accepted"
echo "$err" | grep -q "$work/none" || fail "missing model: $err"
echo "generate: greedy equals the full-forward reference for GPT-2, Llama, Qwen2 and Mistral"
