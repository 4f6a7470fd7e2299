#!/usr/bin/env python3
"""An independent PyTorch reference of greedy text generation, for ztrain's KV-cache decoder tests.

Greedy decoding without a KV cache: step k (k = 0 .. N-1) runs the FULL forward pass over the
whole sequence so far (prompt + the k tokens generated), takes the logits of the last position,
restricted to the config's vocab_size (rows of a padded embedding beyond it are ignored), and
appends their argmax (the first index on a tie, as torch.argmax). The largest forward is
len(prompt) + N - 1 tokens; it must not exceed the model's positions (GPT-2: n_positions;
Llama family: max_position_embeddings). Everything is computed in fp32 (any dtype on disk is
upcast). Only torch is needed (Debian's python3-torch, importable from /usr/bin/python3).

Models are Hugging Face directories as save_pretrained writes them (config.json, and
model.safetensors or shards plus model.safetensors.index.json):
  - LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM: hf_llama.py's load_model and
    forward (see its docstring).
  - GPT2LMHeadModel (architectures ["GPT2LMHeadModel"] or model_type "gpt2"), written from HF's
    modeling_gpt2.py / GPT2Config (their defaults fill missing keys):
      x = wte[ids] + wpe[0 .. T-1]
      per block h.{i}:  x = x + attn.c_proj(attention(ln_1(x)))
                        x = x + mlp.c_proj(gelu_new(mlp.c_fc(ln_2(x))))
      logits = ln_f(x) @ wte^T                          (tied head)
    Conv1D(x) = x @ weight + bias, weight [in, out]. LayerNorm eps = layer_norm_epsilon.
    attn.c_attn gives [q | k | v] (n_embd each), n_head heads of n_embd / n_head, scores
    q.k / sqrt(head_dim), causal mask, softmax. gelu_new(x) =
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (gelu_pytorch_tanh is the same function).
    Tensor names may carry a "transformer." prefix; the causal-mask buffers h.{i}.attn.bias /
    .masked_bias are ignored, and so is lm_head.weight when it equals wte. wte may have more
    rows than vocab_size (padding). Refused: other activations, scale_attn_weights false,
    scale_attn_by_inverse_layer_idx, tie_word_embeddings false.

Usage (always /usr/bin/python3: the python3 on PATH may have no torch):

  greedy_reference.py --model DIR --prompt-ids 1,2,3 --new-tokens N --out OUT.json
      OUT.json: {"tokens": [the N new token ids, in order],
                 "margins": [per step, the top logit minus the second-highest logit]}
  greedy_reference.py --self-test
      Checks the GPT-2 forward against an explicit per-position computation and for causal
      consistency, the weight loading rules, the refusals, and greedy on a tiny Llama directory.
      Prints "greedy_reference self-test: ok" and exits 0; 1 when a check fails.

Errors (an unknown architecture, prompt ids out of range, a sequence longer than the model's
positions, malformed weights) are ValueErrors naming the problem; the CLI prints them and exits 2.
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama  # noqa: E402
import safetensors_io as st  # noqa: E402

# GPT2Config's defaults, used when a config.json lacks a key.
GPT2_DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                     n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                     tie_word_embeddings=True)
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")


@dataclasses.dataclass
class Model:
    forward: Callable  # ids (1, T) int64 -> logits (1, T, rows), rows >= vocab_size
    vocab_size: int
    max_positions: int


# ----------------------------------------------------------------------------------------------
# GPT-2


@dataclasses.dataclass
class GPT2Cfg:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    eps: float


def positive_int(c, key):
    v = c[key]
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"config: {key} must be a positive integer, got {v!r}")
    return v


def gpt2_config(raw):
    """GPT2Cfg from a config.json dict; refuses what this reference does not compute."""
    c = dict(GPT2_DEFAULTS)
    c.update(raw)
    if c["activation_function"] not in GELU_TANH:
        raise ValueError(f"config: activation_function {c['activation_function']!r} is not supported "
                         f"(only {', '.join(GELU_TANH)})")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("tie_word_embeddings", True)):
        if bool(c[key]) != ok:
            raise ValueError(f"config: {key} {c[key]!r} is not supported (only {ok})")
    n_embd, n_head = positive_int(c, "n_embd"), positive_int(c, "n_head")
    if n_embd % n_head:
        raise ValueError(f"config: n_embd {n_embd} is not a multiple of n_head {n_head}")
    n_inner = 4 * n_embd if c["n_inner"] is None else positive_int(c, "n_inner")
    return GPT2Cfg(positive_int(c, "vocab_size"), positive_int(c, "n_positions"), n_embd,
                   positive_int(c, "n_layer"), n_head, n_inner, float(c["layer_norm_epsilon"]))


def gpt2_shapes(c):
    """{name: shape} of GPT2Model's parameters (without the "transformer." prefix); wte's rows
    are checked separately (they may be padded)."""
    D, I = c.n_embd, c.n_inner
    out = {"wpe.weight": (c.n_positions, D), "ln_f.weight": (D,), "ln_f.bias": (D,)}
    for i in range(c.n_layer):
        p = f"h.{i}."
        for name, fan_in, fan_out in (("attn.c_attn", D, 3 * D), ("attn.c_proj", D, D),
                                      ("mlp.c_fc", D, I), ("mlp.c_proj", I, D)):
            out[p + name + ".weight"] = (fan_in, fan_out)
            out[p + name + ".bias"] = (fan_out,)
        for ln in ("ln_1", "ln_2"):
            out[p + ln + ".weight"] = (D,)
            out[p + ln + ".bias"] = (D,)
    return out


def gpt2_params(c, tensors):
    """fp32 parameters under GPT2Model's names from the tensors of a file (any float dtype)."""
    P = {(n[len("transformer."):] if n.startswith("transformer.") else n): t.float()
         for n, t in tensors.items()}
    wte = P.get("wte.weight")
    if wte is None or wte.dim() != 2 or wte.shape[0] < c.vocab_size or wte.shape[1] != c.n_embd:
        shape = None if wte is None else list(wte.shape)
        raise ValueError(f"weights: wte.weight has shape {shape}, expected [>= vocab_size "
                         f"{c.vocab_size}, n_embd {c.n_embd}]")
    if "lm_head.weight" in P and not torch.equal(P.pop("lm_head.weight"), wte):
        raise ValueError("weights: lm_head.weight differs from wte.weight in a tied GPT-2")
    shapes = gpt2_shapes(c)
    buffers = {f"h.{i}.attn.{b}" for i in range(c.n_layer) for b in ("bias", "masked_bias")}
    missing = [n for n in shapes if n not in P]
    unexpected = [n for n in P if n not in shapes and n not in buffers and n != "wte.weight"]
    if missing or unexpected:
        raise ValueError(f"weights do not match the config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for n, shape in shapes.items():
        if tuple(P[n].shape) != shape:
            raise ValueError(f"weights: {n} has shape {list(P[n].shape)}, the config gives {list(shape)}")
    return {n: P[n] for n in ["wte.weight", *shapes]}


def conv1d(x, P, name):
    return torch.addmm(P[name + ".bias"], x.reshape(-1, x.shape[-1]), P[name + ".weight"]) \
        .view(*x.shape[:-1], -1)


def layer_norm(x, P, name, eps):
    return F.layer_norm(x, x.shape[-1:], P[name + ".weight"], P[name + ".bias"], eps)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_attention(c, P, pre, x):
    B, T, D = x.shape
    H, hd = c.n_head, D // c.n_head
    q, k, v = conv1d(x, P, pre + "c_attn").split(D, dim=-1)
    q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))  # B, H, T, hd
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, D)
    return conv1d(out, P, pre + "c_proj")


def gpt2_forward(c, P, ids):
    """Logits (B, T, rows of wte) for token ids (B, T), in the dtype of P."""
    T = ids.shape[1]
    if T > c.n_positions:
        raise ValueError(f"sequence of {T} tokens is longer than n_positions {c.n_positions}")
    x = F.embedding(ids, P["wte.weight"]) + P["wpe.weight"][:T]
    for i in range(c.n_layer):
        p = f"h.{i}."
        x = x + gpt2_attention(c, P, p + "attn.", layer_norm(x, P, p + "ln_1", c.eps))
        hidden = gelu_new(conv1d(layer_norm(x, P, p + "ln_2", c.eps), P, p + "mlp.c_fc"))
        x = x + conv1d(hidden, P, p + "mlp.c_proj")
    return torch.matmul(layer_norm(x, P, "ln_f", c.eps), P["wte.weight"].t())


# ----------------------------------------------------------------------------------------------
# Loading and greedy decoding


def read_weights(model_dir):
    """name -> tensor of model.safetensors, or of the shards model.safetensors.index.json lists."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return st.load(os.path.join(model_dir, "model.safetensors"))[0]
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for fname in sorted(set(weight_map.values())):
        tensors.update(st.load(os.path.join(model_dir, fname))[0])
    missing = [n for n in weight_map if n not in tensors]
    if missing:
        raise ValueError(f"{model_dir}: the index names tensors its files lack: {missing[:5]}")
    return tensors


def load_model(model_dir):
    """A Model for a GPT-2 or Llama-family HF directory."""
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    archs = raw.get("architectures") or []
    if raw.get("model_type") == "gpt2" or archs[:1] == ["GPT2LMHeadModel"]:
        c = gpt2_config(raw)
        P = gpt2_params(c, read_weights(model_dir))
        return Model(lambda ids: gpt2_forward(c, P, ids), c.vocab_size, c.n_positions)
    if raw.get("model_type") in hf_llama.ARCHS or (archs and archs[0] in hf_llama.ARCHS.values()):
        cfg, _, tensors = hf_llama.load_model(model_dir)
        P = {n: t.float() for n, t in tensors.items()}
        max_positions = positive_int(cfg.raw, "max_position_embeddings")
        return Model(lambda ids: hf_llama.forward(cfg, P, ids), cfg.vocab_size, max_positions)
    raise ValueError(f"{model_dir}: unknown architecture: model_type {raw.get('model_type')!r}, "
                     f"architectures {archs!r} (supported: GPT2LMHeadModel, "
                     f"{', '.join(hf_llama.ARCHS.values())})")


def next_logits(model, seq):
    """fp32 logits over the real vocabulary at the last position of a full forward over seq."""
    with torch.no_grad():
        logits = model.forward(torch.tensor([seq], dtype=torch.int64))
    return logits[0, -1, :model.vocab_size]


def greedy(model, prompt, new_tokens):
    """(new token ids, margins top1 - top2 per step), re-running the full forward every step."""
    if not prompt or new_tokens < 1:
        raise ValueError(f"need a non-empty prompt and new_tokens >= 1 (got {len(prompt)} ids, {new_tokens})")
    if model.vocab_size < 2:
        raise ValueError(f"vocab_size {model.vocab_size}: no second-highest logit for the margins")
    bad = [t for t in prompt if not 0 <= t < model.vocab_size]
    if bad:
        raise ValueError(f"prompt ids {bad[:5]} are out of range [0, vocab_size {model.vocab_size})")
    longest = len(prompt) + new_tokens - 1
    if longest > model.max_positions:
        raise ValueError(f"the last forward runs over {longest} tokens (prompt {len(prompt)} + "
                         f"{new_tokens} new - 1), more than the model's {model.max_positions} positions")
    seq, tokens, margins = list(prompt), [], []
    for _ in range(new_tokens):
        logits = next_logits(model, seq)
        top2 = torch.topk(logits, 2).values
        tokens.append(int(torch.argmax(logits)))
        margins.append(float(top2[0] - top2[1]))
        seq.append(tokens[-1])
    return tokens, margins


# ----------------------------------------------------------------------------------------------
# Self-test


def random_gpt2(c, seed=0, std=0.1):
    """Random GPT-2 parameters (fp32, names without the prefix); larger than HF's init so that
    attention is far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    P = {"wte.weight": std * torch.randn(c.vocab_size, c.n_embd, generator=gen)}
    for n, shape in gpt2_shapes(c).items():
        is_ln_weight = n.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
        P[n] = (1.0 if is_ln_weight else 0.0) + std * torch.randn(shape, generator=gen)
    return P


def naive_gpt2_logits(c, P, ids):
    """Logits (T, rows) for a list of ids, written differently from gpt2_forward: float64,
    LayerNorm and GELU from their formulas, attention by an explicit loop over positions."""
    Q = {n: t.double() for n, t in P.items()}
    H, hd = c.n_head, c.n_embd // c.n_head

    def ln(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + c.eps) * Q[name + ".weight"] + Q[name + ".bias"]

    def dense(x, name):
        return torch.einsum("ti,io->to", x, Q[name + ".weight"]) + Q[name + ".bias"]

    x = torch.stack([Q["wte.weight"][t] + Q["wpe.weight"][pos] for pos, t in enumerate(ids)])
    for i in range(c.n_layer):
        p = f"h.{i}."
        qkv = dense(ln(x, p + "ln_1"), p + "attn.c_attn")
        rows = []
        for t in range(len(ids)):
            heads = []
            for h in range(H):
                q = qkv[t, h * hd:(h + 1) * hd]
                ks = qkv[:t + 1, c.n_embd + h * hd:c.n_embd + (h + 1) * hd]
                vs = qkv[:t + 1, 2 * c.n_embd + h * hd:2 * c.n_embd + (h + 1) * hd]
                w = torch.exp((ks @ q) / math.sqrt(hd))
                heads.append((w / w.sum()) @ vs)
            rows.append(torch.cat(heads))
        x = x + dense(torch.stack(rows), p + "attn.c_proj")
        u = dense(ln(x, p + "ln_2"), p + "mlp.c_fc")
        u = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u * u * u)))
        x = x + dense(u, p + "mlp.c_proj")
    return ln(x, "ln_f") @ Q["wte.weight"].T


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_close(a, b, what, tol=1e-5):
    err = (a.double() - b.double()).abs().max().item()
    check(err <= tol, f"{what}: max abs difference {err:.3g} > {tol}")


def test_gpt2_forward():
    c = gpt2_config(dict(n_layer=2, n_head=4, n_embd=32, vocab_size=64, n_positions=64))
    P = random_gpt2(c)
    ids = [int(t) for t in torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(1))]
    full = gpt2_forward(c, P, torch.tensor([ids]))[0]
    check(full.dtype == torch.float32 and full.shape == (20, 64), f"logits {full.dtype} {tuple(full.shape)}")
    check(full.std().item() > 0.1, "logits are too flat for the comparison to mean anything")
    check_close(full, naive_gpt2_logits(c, P, ids), "gpt2_forward vs the per-position loop")
    for t in (0, 7, 19):  # causal consistency: position t sees only the prefix of length t+1
        check_close(full[t], gpt2_forward(c, P, torch.tensor([ids[:t + 1]]))[0, -1], f"prefix {t + 1}")
    changed = list(ids)
    changed[10] = (ids[10] + 1) % 64
    other = gpt2_forward(c, P, torch.tensor([changed]))[0]
    check(torch.equal(other[:10], full[:10]) and not torch.equal(other[10:], full[10:]),
          "changing token 10 must change logits from position 10 on, and none before")


def test_gpt2_loading():
    c = gpt2_config(dict(n_layer=1, n_head=2, n_embd=8, vocab_size=10, n_positions=16))
    P = random_gpt2(c)
    stored = {"transformer." + n: t.to(torch.bfloat16) for n, t in P.items()}
    stored["transformer.h.0.attn.bias"] = torch.ones(1, 1, 16, 16)
    stored["lm_head.weight"] = stored["transformer.wte.weight"]
    got = gpt2_params(c, stored)
    check(list(got) == list(P), "gpt2_params names")
    for n, t in got.items():
        check(t.dtype == torch.float32 and torch.equal(t, P[n].to(torch.bfloat16).float()), n)
    padded = dict(P, **{"wte.weight": torch.cat([P["wte.weight"], torch.zeros(6, 8)])})
    model = Model(lambda ids: gpt2_forward(c, gpt2_params(c, padded), ids), c.vocab_size, c.n_positions)
    check(next_logits(model, [1, 2]).shape == (10,), "padded wte rows must be cut from the logits")
    for bad in (dict(P, **{"h.0.mlp.c_fc.weight": torch.zeros(32, 8)}), dict(P, extra=torch.zeros(1))):
        expect_value_error(lambda: gpt2_params(c, bad), "weights")


def expect_value_error(fn, needle):
    try:
        fn()
    except ValueError as e:
        check(needle in str(e), f"error {e!r} does not mention {needle!r}")
        return
    raise AssertionError(f"no ValueError (expected one about {needle!r})")


def test_refusals(tmp):
    c = gpt2_config(dict(n_layer=1, n_head=2, n_embd=8, vocab_size=10, n_positions=16))
    P = random_gpt2(c)
    model = Model(lambda ids: gpt2_forward(c, P, ids), c.vocab_size, c.n_positions)
    expect_value_error(lambda: greedy(model, [1, 10], 2), "out of range")
    expect_value_error(lambda: greedy(model, [-1], 2), "out of range")
    expect_value_error(lambda: greedy(model, [1] * 10, 8), "17 tokens")
    greedy(model, [1] * 10, 7)  # exactly n_positions tokens in the last forward
    expect_value_error(lambda: gpt2_forward(c, P, torch.zeros(1, 17, dtype=torch.int64)), "n_positions")
    expect_value_error(lambda: gpt2_config(dict(activation_function="relu")), "activation_function")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump({"architectures": ["BertForMaskedLM"], "model_type": "bert"}, f)
    expect_value_error(lambda: load_model(tmp), "unknown architecture")


def test_llama_greedy(tmp):
    hf_llama.make_model(tmp, "llama", {"max_position_embeddings": 24}, dtype="BF16", seed=3)
    model = load_model(tmp)
    prompt, n = [5, 17, 42, 99], 12
    tokens, margins = greedy(model, prompt, n)
    check(len(tokens) == n and all(0 <= t < 256 for t in tokens), f"tokens {tokens}")
    check(all(m >= 0 for m in margins) and any(m > 0 for m in margins), f"margins {margins}")
    with torch.no_grad():
        full = model.forward(torch.tensor([prompt + tokens[:-1]]))[0]
    for k in range(n):
        pos = len(prompt) - 1 + k
        step = next_logits(model, prompt + tokens[:k])
        check_close(full[pos], step, f"full-sequence logits at {pos} vs the prefix forward")
        check(int(torch.argmax(step)) == tokens[k], f"step {k}: argmax is not the token")
        top2 = torch.topk(full[pos], 2).values
        check(abs(float(top2[0] - top2[1]) - margins[k]) <= 1e-5, f"step {k}: margin")
    expect_value_error(lambda: greedy(model, prompt, 22), "more than the model's 24 positions")


def self_test():
    with tempfile.TemporaryDirectory(prefix="greedy_reference.") as tmp:
        for test, args in ((test_gpt2_forward, ()), (test_gpt2_loading, ()),
                           (test_refusals, (tmp,)), (test_llama_greedy, (os.path.join(tmp, "llama"),))):
            try:
                test(*args)
            except AssertionError as e:
                print(f"greedy_reference self-test: {test.__name__} FAILED: {e}", file=sys.stderr)
                return 1
    print("greedy_reference self-test: ok")
    return 0


# ----------------------------------------------------------------------------------------------
# CLI


def parse_ids(text):
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids {text!r} is not a comma-separated list of integers") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description="greedy decoding reference (see the top of this file)")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--prompt-ids")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    if None in (a.model, a.prompt_ids, a.new_tokens, a.out):
        ap.error("--model, --prompt-ids, --new-tokens and --out are required (or --self-test)")
    try:
        tokens, margins = greedy(load_model(a.model), parse_ids(a.prompt_ids), a.new_tokens)
        with open(a.out, "w") as f:
            f.write(json.dumps({"tokens": tokens, "margins": margins}) + "\n")
        return 0
    except (ValueError, OSError) as e:
        print(f"greedy_reference.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
