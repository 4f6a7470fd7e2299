#!/usr/bin/env python3
"""SentencePiece reference for tests/data/sentencepiece_test.cc (run with Debian's python3,
which has python3-sentencepiece; transformers is not needed).

  spm_to_tokenizer_json.py encode MODEL TEXTS_JSON OUT_JSON
      writes {"ids": [sp.encode(text) for each text], "decoded": [sp.decode(ids), ...],
      "vocab_size": sp.get_piece_size()}.
  spm_to_tokenizer_json.py convert MODEL FORM OUT_JSON
      writes the Hugging Face tokenizer.json that transformers' LlamaConverter makes from a
      SentencePiece BPE model with byte_fallback. FORM "normalizer": Llama-2's file
      (normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")], no pre_tokenizer, merges as
      "a b" strings); FORM "metaspace-first" / "metaspace-always": transformers' legacy=False
      form (no normalizer, a Metaspace pre_tokenizer with that prepend_scheme and split false,
      merges as ["a", "b"] pairs).

The merges follow transformers' SentencePieceExtractor: for each piece, in vocabulary order,
every split into two pieces that are both in the vocabulary, sorted by (id of the left, id of
the right); then all of them sorted by the score of the merged piece, highest first (a stable
sort).
"""
import json
import sys

import sentencepiece as spm

META = "\u2581"


def load(model):
    return spm.SentencePieceProcessor(model_file=model)


def encode(model, texts_json, out_json):
    sp = load(model)
    with open(texts_json, encoding="utf-8") as f:
        texts = json.load(f)
    ids = [sp.encode(t) for t in texts]
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"ids": ids, "decoded": [sp.decode(i) for i in ids],
                   "vocab_size": sp.get_piece_size()}, f)


def merges_of(sp):
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    merges = []
    for piece, score in scores.items():
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    return vocab, [(m[0], m[1]) for m in merges]


def special(sp, i):
    return {"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def convert(model, form, out_json):
    sp = load(model)
    vocab, merges = merges_of(sp)
    specials = [i for i in (sp.unk_id(), sp.bos_id(), sp.eos_id()) if i >= 0]
    bos = sp.id_to_piece(sp.bos_id())
    decoders = [{"type": "Replace", "pattern": {"String": META}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
    j = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [special(sp, i) for i in specials],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [sp.bos_id()], "tokens": [bos]}},
        },
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
            "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
        },
    }
    if form == "normalizer":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": META},
            {"type": "Replace", "pattern": {"String": " "}, "content": META}]}
        j["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    elif form.startswith("metaspace-"):
        scheme = form[len("metaspace-"):]
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": META,
                              "prepend_scheme": scheme, "split": False}
        j["decoder"] = {"type": "Metaspace", "replacement": META, "prepend_scheme": scheme,
                        "split": False}
        j["model"]["merges"] = [[a, b] for a, b in merges]
    else:
        sys.exit(f"unknown form {form}")
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "encode":
        encode(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "convert":
        convert(*sys.argv[2:])
    else:
        sys.exit(__doc__)
