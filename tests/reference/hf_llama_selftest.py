#!/usr/bin/env python3
"""Self-test of tests/reference/hf_llama.py: checks the reference against itself and against
independent formulations, in ways that fail when the reference is wrong.

  names        the tensor names and shapes per arch are HF's (Llama attention_bias: q,k,v,o;
               Qwen2: q,k,v only; Mistral: none; mlp_bias; no lm_head when tied)
  naive        the batched forward equals a scalar pure-Python forward written from HF's
               description (rotate-half pairs (i, i+hd/2), KV head h // g, RMSNorm, SiLU MLP)
  gradients    autograd gradients equal central finite differences in float64, per tensor and
               along random global directions (Llama: GQA, head_dim != hidden/heads, all biases,
               llama3 RoPE; Qwen2: q/k/v biases, tied embeddings, linear RoPE)
  gqa          a GQA model equals the MHA model whose KV heads are copied to their query groups
  causal       changing token t changes no logits before t
  tied         a tied model equals the untied one whose lm_head is a copy of embed_tokens
  rope         rotation keeps norms; q.k after RoPE depends only on the position difference;
               llama3 inv_freq equals Meta's scalar formula with all three bands hit; linear
               scaling equals positions divided by the factor; "type" is read as "rope_type"
  safetensors  a sharded write reads back byte-equal per tensor to an unsharded one; the index
               and header layout are HF's; BF16 / F16 files round-trip bit-exactly and hold the
               fp32 init rounded to nearest-even
  init         mean / std of each tensor as specified; deterministic per seed; the loss at init
               is near ln(vocab)
  train/eval   through the CLI: --grads equals autograd of batch 0; the saved weights equal an
               independent AdamW (decay on 2+-dim tensors only, clipping with torch's 1e-6)
               driven by the reference's gradients; losses[0] equals eval of batch 0; the loss
               falls on a repetitive stream; eval of a sharded model equals the unsharded one
  sliding      a one-layer Mistral with window W: changing token t changes the logits of
               positions t .. t+W-1 and none from t+W on (kv_idx > q_idx - W); a window >= T
               equals none; Qwen2 slides only layers >= max_window_layers (a full layer 0
               reaches past the window), use_sliding_window false or max_window_layers >= the
               layer count slides none
  long_rope    YaRN: dimensions below the ramp keep the plain frequency, above it take it divided
               by factor, factor 1 is the plain RoPE, the attention factor is 0.1 ln(factor) + 1
               (or the mscale ratio, or the given one) and scales cos and sin; dynamic NTK:
               the plain frequencies up to max_position_embeddings, past it base' =
               base (factor L / max - (factor - 1))^(d / (d - 2)), scalar float64 arithmetic
  refusals     Mistral biases, unknown rope types, mismatched weights
  lora_names   PEFT's matching (suffix after ".", exact names skipping layers_to_transform, regex
               fullmatch, exclude_modules, modules_to_save exclusion, layers_pattern, all-linear
               without lm_head, >= 20 targets saved condensed), rank / alpha patterns, rslora, and
               the saved tensor names (lora_A / lora_B, base_layer.bias vs .bias, copies) written
               out by hand; refused configs
  lora_math    float64: the adapted loss equals the model with W + scaling * B @ A merged by hand
               (copies and biases replaced, a tied head kept on the original); gradients of A and
               B follow from the merged model's weight gradient by the chain rule; copies' and
               biases' gradients equal the merged model's; finite differences on A and B
  lora_adapter_dir  make-adapter: adapter_config.json has exactly PEFT 0.20's keys with its
               defaults and inference_mode true; tensor names / dtypes; lora_A within
               +-1/sqrt(in) and not narrower, lora_B 0; deterministic per seed; --b-std; gaussian
  lora_b_zero  B = 0: eval / train losses equal the base model's exactly; dL/dA = 0,
               dL/dB = scaling * dL/dW @ A^T from the base model's own --grads; copies' gradients
               are the base's; grad_norms over the trainable tensors
  lora_train_roundtrip  train --adapter equals AdamW written out over the trainable tensors
               (decay on 2+-dim only, clipping); --save-adapter F32, config unchanged, load + save
               byte-identical; eval of the saved adapter; a file lacking lora_only biases
  lora_merge   merged weights = W + s * B @ A, copies / biases replaced, the rest unchanged; merged
               eval = adapted eval; tied + lm_head copy comes out untied; BF16 = F32 rounded
  qlora        eval --quant equals a model directory holding bnb_quant's round trip of the decoder
               linears (nothing else); QLoRA with B = 0 starts at the quantized base's loss
  + the tests of bnb_quant_selftest.py (NF4 / FP4 / double quant / int8 / its CLI)

Exit status: 0 all passed, 1 a check failed, 77 torch is not importable (a CTest SKIP).
Run with /usr/bin/python3 (Debian's python3-torch).
"""
import contextlib
import io
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable from", sys.executable)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_llama as ref  # noqa: E402
import safetensors_io as st  # noqa: E402

torch.set_num_threads(1)  # tiny tensors: threads only cost, more so on a loaded machine
F64 = torch.float64

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def max_diff(a, b):
    return float((a.to(F64) - b.to(F64)).abs().max())


def tiny(arch, **over):
    base = dict(vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=6, rms_norm_eps=1e-5,
                max_position_embeddings=1024)
    base.update(over)
    return ref.Cfg(ref.make_config(arch, base), arch)


def params64(cfg, seed):
    return {n: t.to(F64) for n, t in ref.init_params(cfg, seed).items()}


def ids_for(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)


# ----------------------------------------------------------------------------------------------
# A scalar pure-Python forward, written from HF's description, sharing nothing with ref.forward.


def naive_inv_freq(cfg):
    hd = cfg.head_dim
    freqs = [1.0 / cfg.rope_theta ** (2 * i / hd) for i in range(hd // 2)]
    if cfg.rope_type == "linear":
        return [f / cfg.rope_factor for f in freqs]
    if cfg.rope_type == "llama3":
        return meta_llama3_scaling(freqs, cfg.rope_factor, cfg.low_freq_factor, cfg.high_freq_factor,
                                   cfg.original_max_position_embeddings)
    return freqs


def meta_llama3_scaling(freqs, scale, low, high, old_len):
    # Meta's reference (llama-models apply_scaling), in Python floats.
    low_wl, high_wl = old_len / low, old_len / high
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / scale)
        else:
            s = (old_len / wl - low) / (high - low)
            out.append((1 - s) * f / scale + s * f)
    return out


def naive_forward(cfg, P, ids):
    """logits[b][t][v] as nested lists; P: name -> float64 tensor."""
    W = {n: t.tolist() for n, t in P.items()}
    D, H, KV, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = H // KV
    inv = naive_inv_freq(cfg)

    def lin(x, name, bias):
        w = W[name + ".weight"]
        b = W[name + ".bias"] if bias else [0.0] * len(w)
        return [sum(wr[j] * x[j] for j in range(len(x))) + b[r] for r, wr in enumerate(w)]

    def norm(x, w):
        r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + cfg.eps)
        return [w[j] * x[j] * r for j in range(len(x))]

    def rope(vec, pos):
        half = hd // 2
        out = [0.0] * hd
        for i in range(half):
            c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    def silu(v):
        return v / (1.0 + math.exp(-v))

    result = []
    for row in ids.tolist():
        T = len(row)
        xs = [list(W["model.embed_tokens.weight"][tok]) for tok in row]
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}."
            ns = [norm(x, W[p + "input_layernorm.weight"]) for x in xs]
            qs = [lin(n, p + "self_attn.q_proj", cfg.qkv_bias) for n in ns]
            ks = [lin(n, p + "self_attn.k_proj", cfg.qkv_bias) for n in ns]
            vs = [lin(n, p + "self_attn.v_proj", cfg.qkv_bias) for n in ns]
            att = [[0.0] * (H * hd) for _ in range(T)]
            for h in range(H):
                j = h // g
                qh = [rope(q[h * hd:(h + 1) * hd], t) for t, q in enumerate(qs)]
                kh = [rope(k[j * hd:(j + 1) * hd], t) for t, k in enumerate(ks)]
                vh = [v[j * hd:(j + 1) * hd] for v in vs]
                for t in range(T):
                    sc = [sum(a * b for a, b in zip(qh[t], kh[u])) / math.sqrt(hd) for u in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(s - m) for s in sc]
                    z = sum(e)
                    for d in range(hd):
                        att[t][h * hd + d] = sum(e[u] / z * vh[u][d] for u in range(t + 1))
            xs = [[x[i] + o[i] for i in range(D)]
                  for x, o in zip(xs, (lin(a, p + "self_attn.o_proj", cfg.o_bias) for a in att))]
            ns = [norm(x, W[p + "post_attention_layernorm.weight"]) for x in xs]
            outs = []
            for n in ns:
                gate = lin(n, p + "mlp.gate_proj", cfg.mlp_bias)
                up = lin(n, p + "mlp.up_proj", cfg.mlp_bias)
                outs.append(lin([silu(a) * b for a, b in zip(gate, up)], p + "mlp.down_proj", cfg.mlp_bias))
            xs = [[x[i] + o[i] for i in range(D)] for x, o in zip(xs, outs)]
        head = W["model.embed_tokens.weight"] if cfg.tie else W["lm_head.weight"]
        result.append([[sum(a * b for a, b in zip(hr, norm(x, W["model.norm.weight"]))) for hr in head]
                       for x in xs])
    return result


def test_naive_forward():
    cases = [
        tiny("llama", attention_bias=True, mlp_bias=True, rope_scaling=LLAMA3, num_hidden_layers=1),
        tiny("qwen2", tie_word_embeddings=True, rope_scaling={"type": "linear", "factor": 2.0},
             num_hidden_layers=1, rope_theta=1000.0),
        tiny("mistral", num_hidden_layers=1, num_key_value_heads=1, head_dim=None),
    ]
    for k, cfg in enumerate(cases):
        P = params64(cfg, 10 + k)
        ids = ids_for(cfg, 2, 5, k)[:, :5]
        got = ref.forward(cfg, P, ids, rope_dtype=F64)
        want = torch.tensor(naive_forward(cfg, P, ids), dtype=F64)
        d = max_diff(got, want)
        check(d < 1e-12, f"{cfg.arch}: batched forward differs from the scalar one by {d:.3g}")
        # fp32 RoPE tables (HF's) move the logits only at fp32 rounding level
        d32 = max_diff(ref.forward(cfg, P, ids), want)
        check(d32 < 1e-6, f"{cfg.arch}: fp32 RoPE tables move logits by {d32:.3g}")


# ----------------------------------------------------------------------------------------------


def fd_check(cfg, seed, directions=4):
    P = params64(cfg, seed)
    buf = ids_for(cfg, 2, 7, seed)
    inputs, targets = buf[:, :-1], buf[:, 1:]
    leaves = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    loss = ref.loss_fn(cfg, leaves, inputs, targets, rope_dtype=F64)
    loss.backward()
    grads = {n: t.grad for n, t in leaves.items()}
    gen = torch.Generator().manual_seed(seed + 1)

    def loss_at(direction, h):
        Q = {n: P[n] + h * direction[n] if n in direction else P[n] for n in P}
        with torch.no_grad():
            return float(ref.loss_fn(cfg, Q, inputs, targets, rope_dtype=F64))

    def compare(direction, what):
        h = 1e-5
        fd = (loss_at(direction, h) - loss_at(direction, -h)) / (2 * h)
        an = float(sum((grads[n] * d).sum() for n, d in direction.items()))
        scale = max(abs(fd), abs(an), 1e-3)
        check(abs(fd - an) <= 2e-7 * scale + 1e-10,
              f"{cfg.arch} {what}: autograd {an:.10g} vs finite differences {fd:.10g}")
        return abs(an)

    for n in P:
        d = torch.randn(P[n].shape, generator=gen, dtype=F64)
        mag = compare({n: d / d.norm()}, f"tensor {n}")
        check(mag > 1e-9, f"{cfg.arch}: {n} has a vanishing gradient ({mag:.3g}); the check is blind")
    for k in range(directions):
        d = {n: torch.randn(P[n].shape, generator=gen, dtype=F64) for n in P}
        total = math.sqrt(sum(float((v * v).sum()) for v in d.values()))
        compare({n: v / total for n, v in d.items()}, f"global direction {k}")
    # a few single entries too
    for n in list(P)[:3] + list(P)[-3:]:
        idx = tuple(int(torch.randint(0, s, (1,), generator=gen)) for s in P[n].shape)
        d = torch.zeros_like(P[n])
        d[idx] = 1.0
        compare({n: d}, f"entry {n}{list(idx)}")


def test_gradients():
    fd_check(tiny("llama", attention_bias=True, mlp_bias=True, rope_scaling=LLAMA3), seed=3)
    fd_check(tiny("qwen2", tie_word_embeddings=True, num_key_value_heads=1,
                  rope_scaling={"rope_type": "linear", "factor": 4.0}), seed=4)


def test_gqa_equals_repeated_mha():
    cfg = tiny("llama", attention_bias=True, num_attention_heads=6, num_key_value_heads=2, head_dim=4)
    mha = tiny("llama", attention_bias=True, num_attention_heads=6, num_key_value_heads=6, head_dim=4)
    P = params64(cfg, 5)
    g, hd = 3, 4
    Q = dict(P)
    for i in range(cfg.num_layers):
        for proj in ("k_proj", "v_proj"):
            for kind in ("weight", "bias"):
                n = f"model.layers.{i}.self_attn.{proj}.{kind}"
                t = P[n].reshape(2, hd, -1)
                Q[n] = t.repeat_interleave(g, dim=0).reshape((6 * hd,) + P[n].shape[1:])
    ids = ids_for(cfg, 2, 6, 5)
    d = max_diff(ref.forward(cfg, P, ids, F64), ref.forward(mha, Q, ids, F64))
    check(d < 1e-12, f"GQA differs from MHA with KV head j copied to query heads j*g..j*g+g-1: {d:.3g}")
    # and the strided assignment (query head h served by KV head h % n_kv) must NOT match
    R = dict(Q)
    for i in range(cfg.num_layers):
        for proj in ("k_proj", "v_proj"):
            for kind in ("weight", "bias"):
                n = f"model.layers.{i}.self_attn.{proj}.{kind}"
                t = P[n].reshape(2, hd, -1)
                R[n] = t.repeat(g, *([1] * (t.dim() - 1))).reshape((6 * hd,) + P[n].shape[1:])
    d = max_diff(ref.forward(cfg, P, ids, F64), ref.forward(mha, R, ids, F64))
    check(d > 1e-6, "GQA also equals the strided head assignment; the GQA check is blind")


def test_causal_and_tied():
    cfg = tiny("mistral", num_key_value_heads=4)
    P = params64(cfg, 6)
    ids = ids_for(cfg, 1, 8, 6)[:, :8]
    base = ref.forward(cfg, P, ids, F64)
    for t in (0, 3, 7):
        other = ids.clone()
        other[0, t] = (other[0, t] + 1) % cfg.vocab_size
        out = ref.forward(cfg, P, other, F64)
        if t > 0:
            check(max_diff(out[:, :t], base[:, :t]) == 0.0, f"changing token {t} changed earlier logits")
        check(max_diff(out[:, t:], base[:, t:]) > 1e-9, f"changing token {t} changed nothing from {t} on")
    tied = tiny("llama", tie_word_embeddings=True)
    untied = tiny("llama")
    P = params64(tied, 7)
    Q = dict(P)
    Q["lm_head.weight"] = P["model.embed_tokens.weight"].clone()
    ids = ids_for(tied, 2, 5, 7)
    d = max_diff(ref.forward(tied, P, ids, F64), ref.forward(untied, Q, ids, F64))
    check(d == 0.0, f"tied model differs from untied with lm_head = embed_tokens: {d:.3g}")


# ----------------------------------------------------------------------------------------------


def test_rope():
    for scaling in (None, LLAMA3, {"type": "linear", "factor": 3.0}):
        cfg = tiny("llama", head_dim=16, rope_scaling=scaling, rope_theta=500000.0)
        gen = torch.Generator().manual_seed(1)
        pos = torch.tensor([0, 1, 5, 100, 1000, 4097])
        cos, sin = ref.rope_tables(cfg, 0, F64, positions=pos)
        x = torch.randn(len(pos), 16, generator=gen, dtype=F64)
        y = ref.apply_rope(x, cos, sin)
        check(max_diff(y.norm(dim=-1), x.norm(dim=-1)) < 1e-12, f"RoPE ({scaling}) changes norms")
        check(max_diff(y[0], x[0]) == 0.0, "RoPE at position 0 is not the identity")
        q = torch.randn(16, generator=gen, dtype=F64)
        k = torch.randn(16, generator=gen, dtype=F64)

        def dot(m, n):
            c, s = ref.rope_tables(cfg, 0, F64, positions=torch.tensor([m, n]))
            rq = ref.apply_rope(q[None], c[:1], s[:1])[0]
            rk = ref.apply_rope(k[None], c[1:], s[1:])[0]
            return float(rq @ rk)

        for delta in (0, 1, 7, 300):
            vals = [dot(m + delta, m) for m in (0, 13, 2000)]
            check(max(vals) - min(vals) < 1e-9,
                  f"RoPE ({scaling}) q.k at distance {delta} depends on the position: {vals}")
        check(abs(dot(5, 0) - dot(6, 0)) > 1e-6, "q.k after RoPE ignores the distance")

    # llama3: Meta's formula, all three bands present
    cfg = tiny("llama", head_dim=16, rope_scaling=LLAMA3)
    plain = [1.0 / cfg.rope_theta ** (2 * i / 16) for i in range(8)]
    want = meta_llama3_scaling(plain, 8.0, 1.0, 4.0, 256)
    got = ref.rope_inv_freq(cfg, F64).tolist()
    check(max(abs(a - b) / b for a, b in zip(got, want)) < 1e-14, f"llama3 inv_freq {got} vs Meta {want}")
    bands = {("high" if abs(w - p) == 0 else "low" if abs(w - p / 8) < 1e-18 else "medium")
             for w, p in zip(want, plain)}
    check(bands == {"high", "low", "medium"}, f"llama3 test hits only bands {bands}")
    got32 = ref.rope_inv_freq(cfg).tolist()
    check(max(abs(a - b) / b for a, b in zip(got32, want)) < 1e-6, "llama3 inv_freq in fp32 is off")

    # linear: angle at p with factor f = unscaled angle at p / f; "type" == "rope_type"
    lin = tiny("llama", rope_scaling={"type": "linear", "factor": 4.0})
    lin2 = tiny("llama", rope_scaling={"rope_type": "linear", "factor": 4.0})
    plain = tiny("llama")
    pos = torch.arange(0, 64, dtype=F64)
    c1, s1 = ref.rope_tables(lin, 0, F64, positions=pos)
    c2, s2 = ref.rope_tables(plain, 0, F64, positions=pos / 4.0)
    check(max(max_diff(c1, c2), max_diff(s1, s2)) < 1e-14, "linear scaling is not positions / factor")
    check(max_diff(ref.rope_inv_freq(lin), ref.rope_inv_freq(lin2)) == 0.0, '"type" and "rope_type" differ')
    l3 = dict(LLAMA3)
    l3["type"] = l3.pop("rope_type")
    check(ref.Cfg(ref.make_config("llama", {"rope_scaling": l3}), "llama").rope_type == "llama3",
          '"type": "llama3" not read as rope_type')


# ----------------------------------------------------------------------------------------------


def run_cli(*args):
    rc = ref.main([str(a) for a in args])
    check(rc == 0, f"hf_llama.py {' '.join(map(str, args))} returned {rc}")


def test_safetensors(tmp):
    conf = json.dumps({"attention_bias": True, "mlp_bias": True, "num_hidden_layers": 3,
                       "hidden_size": 32, "intermediate_size": 48, "vocab_size": 97})
    one, four = os.path.join(tmp, "one"), os.path.join(tmp, "four")
    # one of the two through a real subprocess, as the C++ tests will call it
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_llama.py"), "make-model", "--out", one,
                        "--arch", "llama", "--config-json", conf, "--seed", "9"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"make-model as a subprocess failed: {r.stderr}")
    run_cli("make-model", "--out", four, "--arch", "llama", "--config-json", conf, "--seed", 9,
            "--shards", 4)
    files = sorted(f for f in os.listdir(four) if f.endswith(".safetensors"))
    check(files == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)], f"shard names {files}")
    with open(os.path.join(four, "model.safetensors.index.json")) as f:
        index = json.load(f)
    check(set(index) == {"metadata", "weight_map"}, f"index keys {sorted(index)}")
    single = st.raw_tensors(os.path.join(one, "model.safetensors"))
    sharded = {}
    for fname in files:
        part = st.raw_tensors(os.path.join(four, fname))
        check(part, f"{fname} is empty")
        for n in part:
            check(index["weight_map"][n] == fname, f"index maps {n} to {index['weight_map'][n]}, not {fname}")
        sharded.update(part)
    check(set(index["weight_map"]) == set(sharded) == set(single), "sharded and single names differ")
    check(index["metadata"]["total_size"] == sum(len(v[2]) for v in single.values()), "total_size is wrong")
    for n, v in single.items():
        check(sharded[n] == v, f"{n}: sharded bytes differ from the single file's")
    # the shards are contiguous runs of HF's state_dict order
    cfg = ref.Cfg(json.load(open(os.path.join(one, "config.json"))))
    order = [n for n, _ in cfg.param_shapes()]
    seq = [index["weight_map"][n] for n in order]
    check(seq == sorted(seq), "shards are not contiguous runs of the state_dict order")
    # header layout
    for path in [os.path.join(one, "model.safetensors")] + [os.path.join(four, f) for f in files]:
        data = open(path, "rb").read()
        n = int.from_bytes(data[:8], "little")
        check((8 + n) % 8 == 0, f"{path}: data region starts at {8 + n}, not 8-aligned")
        header = json.loads(data[8:8 + n])
        check(header.get("__metadata__") == {"format": "pt"}, f"{path}: __metadata__ {header.get('__metadata__')}")
        check(data[8:8 + n].decode().rstrip(" ") == data[8:8 + n].decode().rstrip(), "header padding is not spaces")

    # the loaded models are equal too (through the reader)
    _, _, a = ref.load_model(one)
    _, _, b = ref.load_model(four)
    check(list(a) == list(b) == order, "load_model order differs")
    check(all(torch.equal(a[n], b[n]) for n in a), "sharded model loads differently")

    # BF16 / F16: the fp32 init rounded to nearest-even, bit-exact round trip
    for dtype, tdtype in (("BF16", torch.bfloat16), ("F16", torch.float16)):
        d = os.path.join(tmp, dtype)
        run_cli("make-model", "--out", d, "--arch", "llama", "--config-json", conf, "--seed", 9,
                "--dtype", dtype, "--shards", 2)
        cfg2, raw, low = ref.load_model(d)
        check(raw["torch_dtype"] == ref.TORCH_DTYPE_NAMES[dtype], f"torch_dtype {raw['torch_dtype']}")
        for n in low:
            check(low[n].dtype == tdtype, f"{n} read as {low[n].dtype}")
            check(torch.equal(low[n], a[n].to(tdtype)), f"{dtype} {n} is not the fp32 init rounded")
        blob = st.dumps(low, {"format": "pt"})
        back, meta = st.loads(blob)
        check(all(torch.equal(back[n].view(torch.int16), low[n].view(torch.int16)) for n in low),
              f"{dtype} round trip is not bit-exact")
        check(st.dumps(back, meta) == blob, f"{dtype} rewrite is not byte-identical")
    # round-to-nearest-even on known values
    x = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20], dtype=torch.float32)
    bits = st.loads(st.dumps({"x": x.to(torch.bfloat16)}))[0]["x"].view(torch.int16).tolist()
    check(bits == [0x3F80, 0x3F82, 0x3F81], f"bf16 rounding gives {[hex(b) for b in bits]}")

    # corrupt files are refused
    data = bytearray(open(os.path.join(one, "model.safetensors"), "rb").read())
    for bad in (data[:-1], data[:4], bytes(data[:8]) + b"x" + bytes(data[9:])):
        try:
            st.loads(bytes(bad))
        except st.SafetensorsError:
            continue
        raise Failure("a truncated / corrupt safetensors file was read")


def test_param_names():
    L = "model.layers.0."
    core = {"model.embed_tokens.weight", "model.norm.weight", L + "input_layernorm.weight",
            L + "post_attention_layernorm.weight"}
    core |= {L + f"self_attn.{p}_proj.weight" for p in "qkvo"} | {L + f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    qkv_b = {L + f"self_attn.{p}_proj.bias" for p in "qkv"}
    o_b = {L + "self_attn.o_proj.bias"}
    mlp_b = {L + f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")}
    head = {"lm_head.weight"}
    cases = [
        ("llama", {}, core | head),
        ("llama", {"attention_bias": True}, core | head | qkv_b | o_b),
        ("llama", {"mlp_bias": True, "tie_word_embeddings": True}, core | mlp_b),
        ("qwen2", {}, core | head | qkv_b),
        ("qwen2", {"attention_bias": False, "tie_word_embeddings": True}, core | qkv_b),
        ("mistral", {}, core | head),
    ]
    for arch, over, want in cases:
        cfg = tiny(arch, num_hidden_layers=1, **over)
        got = {n for n, _ in cfg.param_shapes()}
        check(got == want, f"{arch} {over}: names {sorted(got ^ want)} differ from HF's")
    cfg = tiny("llama", attention_bias=True, mlp_bias=True, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, head_dim=6, hidden_size=8, intermediate_size=12, vocab_size=11)
    shapes = dict(cfg.param_shapes())
    want = {"model.embed_tokens.weight": (11, 8), "lm_head.weight": (11, 8),
            L + "self_attn.q_proj.weight": (24, 8), L + "self_attn.k_proj.weight": (12, 8),
            L + "self_attn.v_proj.weight": (12, 8), L + "self_attn.o_proj.weight": (8, 24),
            L + "self_attn.q_proj.bias": (24,), L + "self_attn.k_proj.bias": (12,),
            L + "self_attn.o_proj.bias": (8,), L + "mlp.gate_proj.weight": (12, 8),
            L + "mlp.down_proj.weight": (8, 12), L + "mlp.down_proj.bias": (8,), L + "mlp.up_proj.bias": (12,)}
    for n, s in want.items():
        check(tuple(shapes[n]) == s, f"{n}: shape {shapes[n]}, HF's is {s}")


def test_init_loss():
    cfg = ref.Cfg(ref.make_config("llama", {"hidden_size": 128, "intermediate_size": 256, "attention_bias": True,
                                            "mlp_bias": True, "num_hidden_layers": 1}), "llama")
    P = ref.init_params(cfg, 1)
    for n, t in P.items():
        mean, std = float(t.mean()), float(t.std())
        if n.endswith("norm.weight"):
            check(abs(mean - 1) < 0.03 and abs(std - 0.1) < 0.02, f"{n}: mean {mean} std {std}, want 1, 0.1")
        else:
            check(abs(mean) < 0.01 and abs(std - 0.02) < 0.004, f"{n}: mean {mean} std {std}, want 0, 0.02")
    Q = ref.init_params(cfg, 1)
    R = ref.init_params(cfg, 2)
    check(all(torch.equal(P[n], Q[n]) for n in P), "init is not deterministic per seed")
    check(not any(torch.equal(P[n], R[n]) for n in P), "seeds 1 and 2 give equal tensors")
    for arch in ("llama", "qwen2"):
        cfg = ref.Cfg(ref.make_config(arch, {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
                                             "num_attention_heads": 4, "num_key_value_heads": 2}), arch)
        P = ref.init_params(cfg, 11)
        buf = ids_for(cfg, 4, 32, 11)
        with torch.no_grad():
            loss = float(ref.loss_fn(cfg, P, buf[:, :-1], buf[:, 1:]))
        check(abs(loss - math.log(512)) < 0.05, f"{arch}: loss at init {loss} vs ln(512) {math.log(512)}")


# ----------------------------------------------------------------------------------------------


def write_tokens(path, toks):
    torch.tensor(toks, dtype=torch.int32).numpy().astype("<i4").tofile(path)


def llmc_batch(toks, k, B, T):
    """Step k's (inputs, targets) from the token list, llm.c-style, written out."""
    buf = toks[k * B * T:k * B * T + B * T + 1]
    inputs = [[buf[b * T + t] for t in range(T)] for b in range(B)]
    targets = [[buf[b * T + t + 1] for t in range(T)] for b in range(B)]
    return torch.tensor(inputs), torch.tensor(targets)


def adamw_reference(cfg, P, tokens, B, T, steps, lr, wd, b1, b2, eps, clip):
    """AdamW written out (torch.optim.AdamW's math), gradients from the reference's loss."""
    P = {n: t.clone() for n, t in P.items()}
    m = {n: torch.zeros_like(t) for n, t in P.items()}
    v = {n: torch.zeros_like(t) for n, t in P.items()}
    for k in range(steps):
        inputs, targets = llmc_batch(tokens, k, B, T)
        leaves = {n: t.clone().requires_grad_(True) for n, t in P.items()}
        ref.loss_fn(cfg, leaves, inputs, targets).backward()
        g = {n: t.grad for n, t in leaves.items()}
        norm = math.sqrt(sum(float((x.double() ** 2).sum()) for x in g.values()))
        coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
        t = k + 1
        for n in P:
            gn = g[n] * coef
            decay = wd if P[n].dim() >= 2 else 0.0
            p = P[n] * (1 - lr * decay)
            m[n] = b1 * m[n] + (1 - b1) * gn
            v[n] = b2 * v[n] + (1 - b2) * gn * gn
            mhat = m[n] / (1 - b1 ** t)
            vhat = v[n] / (1 - b2 ** t)
            P[n] = p - lr * mhat / (vhat.sqrt() + eps)
    return P


def test_train_eval(tmp):
    conf = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rope_scaling": dict(LLAMA3, original_max_position_embeddings=16),
            "attention_bias": True}
    model = os.path.join(tmp, "m")
    run_cli("make-model", "--out", model, "--arch", "llama", "--config-json", json.dumps(conf), "--seed", 2,
            "--dtype", "BF16", "--shards", 3)
    rnd = random.Random(5)
    tokens = os.path.join(tmp, "tokens.bin")
    toks = [rnd.randrange(64) for _ in range(4 * 16 * 3 + 1)]
    write_tokens(tokens, toks)
    B, T, steps, lr, wd, b1, b2, eps, clip = 4, 16, 3, 3e-3, 0.5, 0.9, 0.95, 1e-8, 0.05
    out, grads, saved = os.path.join(tmp, "o.json"), os.path.join(tmp, "g.safetensors"), os.path.join(tmp, "s")
    run_cli("train", "--model", model, "--tokens", tokens, "--batch", B, "--seq", T, "--steps", steps,
            "--lr", lr, "--weight-decay", wd, "--beta1", b1, "--beta2", b2, "--eps", eps,
            "--grad-clip", clip, "--out", out, "--grads", grads, "--save", saved)
    result = json.load(open(out))
    check(len(result["losses"]) == steps and len(result["grad_norms"]) == steps, f"result {result}")

    cfg, _, stored = ref.load_model(model)
    P0 = {n: t.float() for n, t in stored.items()}
    inputs, targets = llmc_batch(toks, 0, B, T)
    leaves = {n: t.clone().requires_grad_(True) for n, t in P0.items()}
    loss0 = ref.loss_fn(cfg, leaves, inputs, targets)
    loss0.backward()
    g_file, _ = st.load(grads)
    check(list(g_file) != [] and set(g_file) == set(P0), "gradient file names differ from the weights'")
    for n in P0:
        check(g_file[n].dtype == torch.float32, f"gradient {n} is {g_file[n].dtype}")
        d = max_diff(g_file[n], leaves[n].grad)
        check(d <= 1e-6 * (float(leaves[n].grad.abs().max()) + 1e-12), f"gradient {n} differs by {d:.3g}")
    check(abs(result["losses"][0] - float(loss0)) < 1e-6, "losses[0] is not batch 0's loss at init")
    norm0 = math.sqrt(sum(float((leaves[n].grad.double() ** 2).sum()) for n in P0))
    check(abs(result["grad_norms"][0] - norm0) < 1e-5 * norm0, f"grad_norms[0] {result['grad_norms'][0]} vs {norm0}")
    check(norm0 > clip, "the clip threshold does not bite; the clipping check is blind")

    cfg_s, raw_s, trained = ref.load_model(saved)
    check(raw_s["torch_dtype"] == "float32" and os.path.exists(os.path.join(saved, "model.safetensors")),
          "--save did not write one F32 file")
    want = adamw_reference(cfg, P0, toks, B, T, steps, lr, wd, b1, b2, eps, clip)
    for n in want:
        check(trained[n].dtype == torch.float32, f"saved {n} is {trained[n].dtype}")
        d = max_diff(trained[n], want[n])
        check(d < 2e-6, f"trained {n} differs from the written-out AdamW by {d:.3g}")
    # weight decay: the 2+-dim tensors, not norms and biases (AdamW without decay differs there)
    # (one step, so that only the decay itself differs), i.e. the comparison above sees it
    decay1 = adamw_reference(cfg, P0, toks, B, T, 1, lr, wd, b1, b2, eps, clip)
    nodecay1 = adamw_reference(cfg, P0, toks, B, T, 1, lr, 0.0, b1, b2, eps, clip)
    for n in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight", "lm_head.weight"):
        check(max_diff(decay1[n], nodecay1[n]) > 1e-5, f"{n} was not decayed")
    for n in ("model.layers.0.self_attn.q_proj.bias", "model.norm.weight"):
        check(max_diff(decay1[n], nodecay1[n]) == 0.0, f"{n} was decayed")
        check(max_diff(want[n], nodecay1[n]) > 1e-4, f"{n}: too few steps to tell decay from none")

    ev = os.path.join(tmp, "e.json")
    run_cli("eval", "--model", model, "--tokens", tokens, "--batch", B, "--seq", T, "--batches", 2, "--out", ev)
    e = json.load(open(ev))
    check(abs(e["losses"][0] - result["losses"][0]) < 1e-6, "eval batch 0 differs from train losses[0]")
    check(abs(e["loss"] - sum(e["losses"]) / 2) < 1e-12, "eval loss is not the mean of its batches")

    # the loss falls on a repetitive stream (qwen2, tied, unsharded F32)
    m2 = os.path.join(tmp, "q")
    run_cli("make-model", "--out", m2, "--arch", "qwen2", "--seed", 3, "--config-json",
            json.dumps({"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64,
                        "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": True}))
    rep = os.path.join(tmp, "rep.bin")
    write_tokens(rep, [(i * 7) % 32 for i in range(2 * 16 * 20 + 1)])
    out2 = os.path.join(tmp, "o2.json")
    run_cli("train", "--model", m2, "--tokens", rep, "--batch", 2, "--seq", 16, "--steps", 20, "--lr", 1e-2,
            "--out", out2)
    losses = json.load(open(out2))["losses"]
    check(losses[-1] < losses[0] - 1.0, f"loss does not fall on a repetitive stream: {losses[0]} -> {losses[-1]}")

    # too few tokens is an error naming the batch
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ref.main(["eval", "--model", m2, "--tokens", rep, "--batch", "2", "--seq", "16", "--batches", "21",
                       "--out", os.path.join(tmp, "x.json")])
    check(rc == 2 and "batch 20" in err.getvalue(), f"eval past the end of the tokens: rc {rc}, {err.getvalue()!r}")


def test_sliding():
    T, W = 12, 4
    one = tiny("mistral", num_hidden_layers=1, sliding_window=W)
    P = params64(one, 8)
    ids = ids_for(one, 1, T, 8)[:, :T]
    base = ref.forward(one, P, ids, F64)
    for t in (0, 3, 7):
        other = ids.clone()
        other[0, t] = (other[0, t] + 1) % one.vocab_size
        out = ref.forward(one, P, other, F64)
        for i in range(T):
            changed = max_diff(out[:, i], base[:, i]) > 1e-9
            check(changed == (t <= i < t + W),
                  f"window {W}: changing token {t} {'changed' if changed else 'left'} position {i}")
    wide = ref.forward(tiny("mistral", num_hidden_layers=1, sliding_window=T), P, ids, F64)
    none = ref.forward(tiny("mistral", num_hidden_layers=1, sliding_window=None), P, ids, F64)
    check(max_diff(wide, none) == 0.0, "a window as long as the sequence changed the logits")
    check(max_diff(base, none) > 1e-9, "a window shorter than the sequence changed nothing")
    # Qwen2: layer 0 full, layer 1 sliding; token 0 reaches the last position through layer 0.
    q = tiny("qwen2", use_sliding_window=True, sliding_window=W, max_window_layers=1)
    Pq = params64(q, 9)
    qbase = ref.forward(q, Pq, ids, F64)
    other = ids.clone()
    other[0, 0] = (other[0, 0] + 1) % q.vocab_size
    check(max_diff(ref.forward(q, Pq, other, F64)[:, T - 1], qbase[:, T - 1]) > 1e-9,
          "Qwen2's full layer 0 did not carry token 0 past the window")
    check([bool(q.layer_mask(i, T)[T - 1, 0]) for i in range(2)] == [True, False],
          "Qwen2 slides layers >= max_window_layers only")
    for off in (dict(use_sliding_window=False), dict(max_window_layers=2)):
        c = tiny("qwen2", **dict(dict(use_sliding_window=True, sliding_window=W), **off))
        check(all(bool(c.layer_mask(i, T)[T - 1, 0]) for i in range(2)), f"{off} slid a layer")


def test_long_rope():
    hd, theta, orig = 16, 10000.0, 64
    plain = ref.rope_inv_freq(tiny("llama", head_dim=hd, rope_theta=theta), F64)
    yarn = tiny("llama", head_dim=hd, rope_theta=theta,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": orig})
    inv = ref.rope_inv_freq(yarn, F64)

    def correction_dim(rot):  # scalar, from the YaRN paper's definition
        return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), hd - 1)
    check(0 < high, f"the ramp [{low}, {high}] does not fall inside the dimensions")
    for i in range(hd // 2):
        if i <= low:
            check(abs(inv[i] - plain[i]) <= 1e-15 * plain[i], f"yarn dim {i} below the ramp moved")
        elif i >= high:
            check(abs(inv[i] - plain[i] / 4.0) <= 1e-15 * plain[i], f"yarn dim {i} above the ramp is not /factor")
        else:
            t = (i - low) / (high - low)
            want = plain[i] / 4.0 * t + plain[i] * (1 - t)
            check(abs(inv[i] - want) <= 1e-12 * plain[i], f"yarn dim {i} is not on the ramp")
    one = tiny("llama", head_dim=hd, rope_scaling={"rope_type": "yarn", "factor": 1.0,
                                                    "original_max_position_embeddings": orig})
    check(max_diff(ref.rope_inv_freq(one, F64), plain) < 1e-15, "yarn with factor 1 is not plain RoPE")
    check(abs(ref.yarn_attention_factor(yarn) - (0.1 * math.log(4.0) + 1)) < 1e-15, "yarn attention factor")
    ds = tiny("llama", head_dim=hd, rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale": 0.707,
                                                   "mscale_all_dim": 0.707, "original_max_position_embeddings": orig})
    check(ref.yarn_attention_factor(ds) == 1.0, "equal mscale and mscale_all_dim give factor 1")
    given = tiny("llama", head_dim=hd, rope_scaling={"rope_type": "yarn", "factor": 4.0, "attention_factor": 0.5,
                                                      "original_max_position_embeddings": orig})
    cos, sin = ref.rope_tables(given, 3, F64)
    c0, s0 = ref.rope_tables(tiny("llama", head_dim=hd, rope_scaling={"rope_type": "linear", "factor": 1.0}), 3, F64)
    check(abs(cos[0, 0] - 0.5) < 1e-15 and abs(sin[2, 0] - 0.5 * math.sin(2 * inv[0])) < 1e-12,
          "yarn's attention factor does not scale cos and sin")
    check(abs(c0[0, 0] - 1.0) < 1e-15, "linear factor 1 scales cos")
    dyn = tiny("llama", head_dim=hd, rope_theta=theta, max_position_embeddings=orig,
               rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    check(max_diff(ref.rope_inv_freq(dyn, F64, orig), plain) == 0.0, "dynamic moved within the context")
    L = 3 * orig
    base = theta * ((2.0 * L / orig) - 1.0) ** (hd / (hd - 2))
    for i in range(hd // 2):
        want = 1.0 / base ** (2 * i / hd)
        got = float(ref.rope_inv_freq(dyn, F64, L)[i])
        check(abs(got - want) <= 1e-12 * want, f"dynamic dim {i}: {got} vs {want}")


def test_refusals(tmp):
    def refused(fn, word):
        try:
            fn()
        except ref.ConfigError as e:
            check(word in str(e), f"error {e!r} does not name {word}")
            return
        raise Failure(f"not refused (expected an error naming {word})")

    refused(lambda: tiny("mistral", attention_bias=True), "attention_bias")
    refused(lambda: tiny("qwen2", mlp_bias=True), "mlp_bias")
    refused(lambda: tiny("llama", rope_scaling={"rope_type": "longrope", "factor": 2.0}), "longrope")
    refused(lambda: tiny("llama", rope_scaling={"rope_type": "llama3", "factor": 2.0}), "low_freq_factor")
    refused(lambda: tiny("llama", hidden_act="gelu"), "hidden_act")
    # weights that do not match the config
    d = os.path.join(tmp, "bad")
    ref.make_model(d, "llama", {"attention_bias": True})
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["attention_bias"] = False
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    refused(lambda: ref.load_model(d), "unexpected")


# ----------------------------------------------------------------------------------------------
# PEFT LoRA


PEFT_KEYS = {  # LoraConfig.to_dict() of peft 0.20 (PeftConfigMixin, PeftConfig, LoraConfig fields)
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
    "inference_mode", "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout",
    "fan_in_fan_out", "bias", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "megatron_config", "megatron_core",
    "trainable_token_indices", "loftq_config", "eva_config", "corda_config", "lora_ga_config", "use_dora",
    "velora_config", "alora_invocation_tokens", "use_qalora", "qalora_group_size", "monteclora_config",
    "layer_replication", "lora_bias", "target_parameters", "use_bdlora", "arrow_config", "kasa_config",
    "ensure_weight_tying"}
PP = "base_model.model."


def lora_cfg(**kw):
    return ref.lora_config_from(kw, strict=True)


def test_lora_names(tmp):
    """The tensors a config trains, under PEFT's names, written out by hand."""
    cfg = tiny("llama", attention_bias=True, num_hidden_layers=2)
    # "q_proj" / "self_attn.v_proj" match by suffix and are filtered to layer 1; the exact full
    # name of layer 0's down_proj skips the layers_to_transform filter (check_target_module_exists)
    lc = lora_cfg(r=2, lora_alpha=4, target_modules=["q_proj", "self_attn.v_proj", "model.layers.0.mlp.down_proj"],
                  layers_to_transform=[1], bias="all", modules_to_save=["embed_tokens"])
    plan = ref.LoraPlan(cfg, lc)
    L0, L1 = "model.layers.0.", "model.layers.1."
    want = {
        PP + L1 + "self_attn.q_proj.lora_A.weight": (2, 8), PP + L1 + "self_attn.q_proj.lora_B.weight": (24, 2),
        PP + L1 + "self_attn.v_proj.lora_A.weight": (2, 8), PP + L1 + "self_attn.v_proj.lora_B.weight": (12, 2),
        PP + L0 + "mlp.down_proj.lora_A.weight": (2, 12), PP + L0 + "mlp.down_proj.lora_B.weight": (8, 2),
        PP + L1 + "self_attn.q_proj.base_layer.bias": (24,), PP + L1 + "self_attn.v_proj.base_layer.bias": (12,),
        PP + L1 + "self_attn.k_proj.bias": (12,), PP + L1 + "self_attn.o_proj.bias": (8,),
        PP + L0 + "self_attn.q_proj.bias": (24,), PP + L0 + "self_attn.k_proj.bias": (12,),
        PP + L0 + "self_attn.v_proj.bias": (12,), PP + L0 + "self_attn.o_proj.bias": (8,),
        PP + "model.embed_tokens.weight": (11, 8),
    }
    got = plan.expected()
    shapes = [(n, got[n], want[n]) for n in got if n in want and got[n] != want[n]]
    check(got == want, f"trainable names differ: only ours {sorted(set(got) - set(want))}, "
          f"only PEFT's {sorted(set(want) - set(got))}, shapes {shapes}")
    check(not any(".default" in n for n in got), "an adapter name in the saved keys")
    check(set(plan.targets) == {L1 + "self_attn.q_proj", L1 + "self_attn.v_proj", L0 + "mlp.down_proj"}, "targets")
    check(plan.targets[L1 + "self_attn.q_proj"] == (2, 4, 2.0), f"scaling {plan.targets[L1 + 'self_attn.q_proj']}")
    # lora_only: only the adapted linears' biases; none: no biases
    p2 = ref.LoraPlan(cfg, lora_cfg(target_modules=["q_proj", "o_proj"], bias="lora_only", layers_to_transform=0))
    bias = {n for n, k, _, _ in p2.entries if k == "bias"}
    check(bias == {PP + L0 + "self_attn.q_proj.base_layer.bias", PP + L0 + "self_attn.o_proj.base_layer.bias"},
          f"lora_only biases {sorted(bias)}")
    p3 = ref.LoraPlan(cfg, lora_cfg(target_modules=None))
    check(set(p3.targets) == {L0 + "self_attn.q_proj", L0 + "self_attn.v_proj", L1 + "self_attn.q_proj",
                              L1 + "self_attn.v_proj"} and not any(k == "bias" for _, k, _, _ in p3.entries),
          "target_modules null is not PEFT's llama default (q_proj, v_proj)")
    # rslora, rank / alpha patterns (first key k with re.match("(.*\.)?(k)$", name))
    p4 = ref.LoraPlan(cfg, lora_cfg(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"],
                                    rank_pattern={"q_proj": 9}, alpha_pattern={"layers.1.self_attn.v_proj": 2}))
    check(p4.targets[L0 + "self_attn.q_proj"] == (9, 8, 8 / 3.0), f"rank_pattern {p4.targets[L0 + 'self_attn.q_proj']}")
    check(p4.targets[L0 + "self_attn.v_proj"] == (4, 8, 4.0), "rslora scaling is not alpha / sqrt(r)")
    check(p4.targets[L1 + "self_attn.v_proj"] == (4, 2, 1.0), "alpha_pattern")
    # regex, exclusions, layers_pattern, all-linear
    p5 = ref.LoraPlan(cfg, lora_cfg(target_modules=r".*\.1\..*_proj", exclude_modules=["k_proj"],
                                    modules_to_save=["up_proj"]))
    check(set(p5.targets) == {L1 + f"self_attn.{p}_proj" for p in "qvo"} | {L1 + "mlp.gate_proj", L1 + "mlp.down_proj"},
          f"regex / exclude / modules_to_save exclusion: {sorted(p5.targets)}")
    check(p5.copies == [L0 + "mlp.up_proj.weight", L1 + "mlp.up_proj.weight"], f"copies {p5.copies}")
    p6 = ref.LoraPlan(cfg, lora_cfg(target_modules=["gate_proj"], layers_to_transform=1, layers_pattern="layers"))
    check(set(p6.targets) == {L1 + "mlp.gate_proj"}, "layers_pattern")
    p7 = ref.LoraPlan(cfg, lora_cfg(target_modules="all-linear"))
    check(len(p7.targets) == 14 and "lm_head" not in p7.targets, "all-linear")
    check(p7.saved_config["target_modules"] == sorted(p7.targets), "all-linear saved as the full names")
    c3 = tiny("llama", num_hidden_layers=3)
    p8 = ref.LoraPlan(c3, lora_cfg(target_modules="all-linear"))
    check(len(p8.targets) == 21 and p8.saved_config["target_modules"] ==
          ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
          f"21 targets are saved condensed: {p8.saved_config['target_modules']}")
    # tied: modules_to_save lm_head copies the tied weight
    tied = tiny("qwen2", tie_word_embeddings=True)
    p9 = ref.LoraPlan(tied, lora_cfg(target_modules=["q_proj"], modules_to_save=["lm_head"]))
    check(p9.expected()[PP + "lm_head.weight"] == (11, 8), "tied lm_head copy")

    def refused(word, **kw):
        try:
            ref.LoraPlan(cfg, lora_cfg(**kw))
        except ref.ConfigError as e:
            check(word in str(e), f"error {e} does not name {word}")
            return
        raise Failure(f"LoRA config {kw} was not refused")

    refused("lora_dropout", lora_dropout=0.1)
    refused("use_dora", use_dora=True)
    refused("unknown keys", target=["q_proj"])
    refused("not supported", target_modules=["mlp"])
    refused("lm_head", target_modules=["lm_head"])
    refused("not found", target_modules=["qq_proj"])
    refused("not found", target_modules=["proj"])  # suffix matching needs a "." before the entry
    refused("layers_to_transform", target_modules="all-linear", layers_to_transform=[0])
    refused("matches no module", target_modules=["q_proj"], modules_to_save=["classifier"])
    refused("both a LoRA target", target_modules=["q_proj"], modules_to_save=["proj"])
    refused("biases", target_modules=["q_proj"], modules_to_save=["o_proj"], bias="all")
    refused("init_lora_weights", init_lora_weights="pissa")


def lora_grads64(cfg, P, plan, trained, inputs, targets):
    leaves = {n: t.clone().requires_grad_(True) for n, t in trained.items()}
    Pf, lora = plan.split(leaves, P)
    loss = ref.loss_fn(cfg, Pf, inputs, targets, F64, lora)
    loss.backward()
    return loss, {n: t.grad for n, t in leaves.items()}


def test_lora_math():
    """The adapted model equals the base with W + scaling * B @ A (an independent formulation);
    its gradients follow from the merged model's by the chain rule, and match finite differences."""
    for arch, over, lc in (
            ("llama", dict(attention_bias=True, mlp_bias=True),
             dict(r=3, lora_alpha=5, target_modules="all-linear", bias="all", modules_to_save=["lm_head"])),
            ("qwen2", dict(tie_word_embeddings=True),
             dict(r=2, lora_alpha=3, use_rslora=True, target_modules=["q_proj", "down_proj"], bias="lora_only",
                  modules_to_save=["embed_tokens", "norm"]))):
        cfg = tiny(arch, **over)
        P = params64(cfg, 21)
        plan = ref.LoraPlan(cfg, lora_cfg(**lc))
        gen = torch.Generator().manual_seed(22)
        trained = {n: t.to(F64) for n, t in ref.init_adapter(plan, P, seed=5, b_std=0.3).items()}
        for n, kind, _, _ in plan.entries:  # move biases / copies off the base values
            if kind in ("bias", "copy"):
                trained[n] = trained[n] + 0.05 * torch.randn(trained[n].shape, generator=gen, dtype=F64)
        buf = ids_for(cfg, 2, 6, 23)
        inputs, targets = buf[:, :-1], buf[:, 1:]
        loss, grads = lora_grads64(cfg, P, plan, trained, inputs, targets)
        # independent: merge by hand, copies / biases by HF name
        M = {n: t.clone() for n, t in P.items()}
        if cfg.tie:
            M["lm_head.weight"] = P["model.embed_tokens.weight"].clone()
        for n, kind, hf, _ in plan.entries:
            if kind in ("bias", "copy"):
                M[hf] = trained[n].clone()
        scal = {}
        for mod, (r, alpha, s) in plan.targets.items():
            want_s = alpha / math.sqrt(r) if lc.get("use_rslora") else alpha / r
            check(s == want_s, f"{arch} {mod}: scaling {s}, want {want_s}")
            scal[mod] = s
            A, Bm = trained[PP + mod + ".lora_A.weight"], trained[PP + mod + ".lora_B.weight"]
            M[mod + ".weight"] = M[mod + ".weight"] + s * (Bm @ A)
        untied = ref.Cfg(dict(cfg.raw, tie_word_embeddings=False), arch)
        leaves = {n: t.clone().requires_grad_(True) for n, t in M.items()}
        merged_loss = ref.loss_fn(untied, leaves, inputs, targets, F64)
        merged_loss.backward()
        check(abs(float(loss) - float(merged_loss)) < 1e-12,
              f"{arch}: adapted loss {float(loss)} != merged loss {float(merged_loss)}")
        for mod, s in scal.items():
            GW = leaves[mod + ".weight"].grad
            A, Bm = trained[PP + mod + ".lora_A.weight"], trained[PP + mod + ".lora_B.weight"]
            for name, want in ((PP + mod + ".lora_B.weight", s * GW @ A.t()),
                               (PP + mod + ".lora_A.weight", s * Bm.t() @ GW)):
                d = max_diff(grads[name], want)
                check(d <= 1e-10 * (float(want.abs().max()) + 1e-12),
                      f"{arch} {name}: gradient off the chain rule by {d:.3g}")
        for n, kind, hf, _ in plan.entries:
            if kind in ("bias", "copy"):
                d = max_diff(grads[n], leaves[hf].grad)
                check(d <= 1e-12 * (float(leaves[hf].grad.abs().max()) + 1e-12), f"{arch} {n}: gradient {d:.3g} off")
                check(float(grads[n].abs().max()) > 0, f"{arch} {n}: zero gradient; the check is blind")
        # finite differences along random directions, lora_B (and A) per module
        h = 1e-5
        for n in [e[0] for e in plan.entries if e[1] in ("lora_B", "lora_A")][:6]:
            d = torch.randn(trained[n].shape, generator=gen, dtype=F64)
            d /= d.norm()

            def at(step):
                T2 = dict(trained)
                T2[n] = trained[n] + step * d
                Pf, lora = plan.split(T2, P)
                with torch.no_grad():
                    return float(ref.loss_fn(cfg, Pf, inputs, targets, F64, lora))

            fd = (at(h) - at(-h)) / (2 * h)
            an = float((grads[n] * d).sum())
            check(abs(fd - an) <= 2e-7 * max(abs(fd), abs(an), 1e-3) + 1e-10,
                  f"{arch} {n}: autograd {an:.10g} vs finite differences {fd:.10g}")
            check(abs(an) > 1e-9, f"{arch} {n}: vanishing directional derivative")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def make_lora_fixture(tmp, arch="llama", over=None, lc=None, seed=1, b_std=0.0, dtype="BF16"):
    over = dict(vocab_size=48, hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
                **(over or {}))
    model = os.path.join(tmp, f"m_{arch}")
    run_cli("make-model", "--out", model, "--arch", arch, "--config-json", json.dumps(over), "--seed", 3, "--dtype", dtype)
    adapter = os.path.join(tmp, f"a_{arch}_{seed}_{b_std}")
    run_cli("make-adapter", "--model", model, "--out", adapter, "--lora-json", json.dumps(lc), "--seed", seed,
            "--b-std", b_std)
    tokens = os.path.join(tmp, "tokens.bin")
    rnd = random.Random(7)
    write_tokens(tokens, [rnd.randrange(48) for _ in range(3 * 2 * 8 + 1)])
    return model, adapter, tokens


def test_lora_adapter_dir(tmp):
    """make-adapter's directory: PEFT's keys and values, tensor names, init laws, determinism."""
    lc = dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], bias="lora_only",
              modules_to_save=["lm_head"])
    model, adapter, _ = make_lora_fixture(tmp, over=dict(attention_bias=True), lc=lc)
    text = open(os.path.join(adapter, "adapter_config.json")).read()
    conf = json.loads(text)
    check(set(conf) == PEFT_KEYS, f"adapter_config.json keys: extra {sorted(set(conf) - PEFT_KEYS)}, "
          f"missing {sorted(PEFT_KEYS - set(conf))}")
    check(text == json.dumps(conf, indent=2, sort_keys=True), "adapter_config.json is not json.dumps(indent=2, sort_keys)")
    want = dict(peft_type="LORA", task_type="CAUSAL_LM", r=4, lora_alpha=16, lora_dropout=0.0, bias="lora_only",
                use_rslora=False, modules_to_save=["lm_head"], layers_to_transform=None, init_lora_weights=True,
                fan_in_fan_out=False, inference_mode=True, base_model_name_or_path=model, auto_mapping=None,
                target_modules=["down_proj", "q_proj", "v_proj"], rank_pattern={}, alpha_pattern={}, use_dora=False,
                lora_bias=False, megatron_core="megatron.core", loftq_config={}, exclude_modules=None, revision=None)
    for k, v in want.items():
        check(conf[k] == v, f"adapter_config.json {k} = {conf[k]!r}, want {v!r}")
    raw = st.raw_tensors(os.path.join(adapter, "adapter_model.safetensors"))
    meta = st.load(os.path.join(adapter, "adapter_model.safetensors"))[1]
    check(meta == {"format": "pt"}, f"metadata {meta}")
    names = set()
    for i in range(2):
        L = f"{PP}model.layers.{i}."
        for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"):
            names |= {L + m + ".lora_A.weight", L + m + ".lora_B.weight"}
        names |= {L + "self_attn.q_proj.base_layer.bias", L + "self_attn.v_proj.base_layer.bias"}
    names.add(PP + "lm_head.weight")
    check(set(raw) == names, f"tensor names: extra {sorted(set(raw) - names)}, missing {sorted(names - set(raw))}")
    cfg, _, base = ref.load_model(model)
    tensors, _ = st.load(os.path.join(adapter, "adapter_model.safetensors"))
    for n, t in tensors.items():
        if ".lora_A." in n:
            fan_in = t.shape[1]
            check(t.dtype == torch.float32 and float(t.abs().max()) <= 1 / math.sqrt(fan_in),
                  f"{n}: not U(-1/sqrt(in), 1/sqrt(in))")
            check(float(t.abs().max()) > 0.6 / math.sqrt(fan_in) and float(t.std()) > 0.4 / math.sqrt(fan_in),
                  f"{n}: too narrow for kaiming_uniform(a=sqrt(5))")
        elif ".lora_B." in n:
            check(t.dtype == torch.float32 and float(t.abs().max()) == 0.0, f"{n}: lora_B is not zero")
        else:
            hf = n[len(PP):].replace(".base_layer.", ".")
            check(t.dtype == torch.bfloat16 and torch.equal(t, base[hf]), f"{n}: not an exact copy of {hf}")
    # determinism per seed; --b-std; gaussian init
    a2 = os.path.join(tmp, "a2")
    a3 = os.path.join(tmp, "a3")
    run_cli("make-adapter", "--model", model, "--out", a2, "--lora-json", json.dumps(lc), "--seed", 1)
    run_cli("make-adapter", "--model", model, "--out", a3, "--lora-json", json.dumps(lc), "--seed", 2, "--b-std", 0.5)
    f1, f2 = (open(os.path.join(d, "adapter_model.safetensors"), "rb").read() for d in (adapter, a2))
    check(f1 == f2, "make-adapter is not deterministic per seed")
    t3, _ = st.load(os.path.join(a3, "adapter_model.safetensors"))
    for n in t3:
        if ".lora_A." in n:
            check(not torch.equal(t3[n], tensors[n]), f"{n}: seeds 1 and 2 agree")
        if ".lora_B." in n:
            check(abs(float(t3[n].std()) - 0.5) < 0.2 and abs(float(t3[n].mean())) < 0.3, f"{n}: not N(0, 0.5)")
    a4 = os.path.join(tmp, "a4")
    run_cli("make-adapter", "--model", model, "--out", a4, "--lora-json",
            json.dumps(dict(r=8, target_modules=["gate_proj"], init_lora_weights="gaussian")))
    t4, _ = st.load(os.path.join(a4, "adapter_model.safetensors"))
    A = torch.cat([t.reshape(-1) for n, t in t4.items() if ".lora_A." in n])
    check(abs(float(A.std()) - 1 / 8) < 0.02, f"gaussian init: std {float(A.std())}, want 1/r")
    # refusals reach the CLI as exit status 2
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ref.main(["make-adapter", "--model", model, "--out", a4, "--lora-json", '{"lora_dropout": 0.05}'])
    check(rc == 2 and "lora_dropout" in err.getvalue(), f"lora_dropout 0.05: rc {rc} {err.getvalue()!r}")


def test_lora_b_zero(tmp):
    """B = 0: the adapted model is the base model, the copies' gradients are the base's, and
    dL/dB = scaling * dL/dW @ A^T, dL/dA = 0 (from the base model's own --grads)."""
    for arch, over, lc in (
            ("llama", dict(attention_bias=True),
             dict(r=4, lora_alpha=8, target_modules="all-linear", bias="all", modules_to_save=["lm_head"])),
            ("qwen2", dict(tie_word_embeddings=True),
             dict(r=2, lora_alpha=7, target_modules=["k_proj", "up_proj"], modules_to_save=["embed_tokens"]))):
        sub = os.path.join(tmp, arch)
        os.makedirs(sub)
        model, adapter, tokens = make_lora_fixture(sub, arch, over, lc)
        e0, e1 = os.path.join(sub, "e0.json"), os.path.join(sub, "e1.json")
        run_cli("eval", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 3, "--out", e0)
        run_cli("evaluate", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 3,
                "--adapter", adapter, "--out", e1)
        check(read_json(e0) == read_json(e1), f"{arch}: B = 0 adapter changes the loss: {read_json(e0)} {read_json(e1)}")
        g0, g1 = os.path.join(sub, "g0.st"), os.path.join(sub, "g1.st")
        o0, o1 = os.path.join(sub, "o0.json"), os.path.join(sub, "o1.json")
        run_cli("train", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--steps", 1, "--lr", 1e-3,
                "--out", o0, "--grads", g0)
        run_cli("train", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--steps", 1, "--lr", 1e-3,
                "--adapter", adapter, "--out", o1, "--grads", g1)
        check(read_json(o0)["losses"] == read_json(o1)["losses"], f"{arch}: train losses[0] differ with B = 0")
        full, _ = st.load(g0)
        lg, _ = st.load(g1)
        cfg, _, _ = ref.load_model(model)
        plan, trained = ref.load_adapter(adapter, cfg, None)
        check(set(lg) == {n for n, _, _, _ in plan.entries} and all(g.dtype == torch.float32 for g in lg.values()),
              f"{arch}: --grads names {sorted(lg)}")
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in lg.values()))
        check(abs(read_json(o1)["grad_norms"][0] - norm) <= 1e-5 * norm,
              f"{arch}: grad_norms is not over the trainable tensors")
        for n, kind, hf, _ in plan.entries:
            g = lg[n]
            if kind == "lora_A":
                check(float(g.abs().max()) == 0.0, f"{arch} {n}: gradient of A is not 0 with B = 0")
            elif kind == "lora_B":
                s = plan.targets[hf][2]
                want = s * full[hf + ".weight"].double() @ trained[PP + hf + ".lora_A.weight"].double().t()
                d = max_diff(g, want)
                check(d <= 1e-5 * float(want.abs().max()) and float(want.abs().max()) > 0,
                      f"{arch} {n}: dL/dB {d:.3g} off scaling * dL/dW @ A^T")
            elif hf in full:
                if cfg.tie and hf == "model.embed_tokens.weight":
                    continue  # the base's tied gradient also holds the head's use
                d = max_diff(g, full[hf])
                check(d <= 1e-6 * float(full[hf].abs().max()),
                      f"{arch} {n}: gradient differs from the base's {hf} by {d:.3g}")


def adamw_adapter_reference(cfg, base, plan, trained, tokens, B, T, steps, lr, wd, b1, b2, eps, clip):
    """AdamW written out over the trainable tensors only (as adamw_reference)."""
    P = {n: t.clone() for n, t in trained.items()}
    m = {n: torch.zeros_like(t) for n, t in P.items()}
    v = {n: torch.zeros_like(t) for n, t in P.items()}
    for k in range(steps):
        inputs, targets = llmc_batch(tokens, k, B, T)
        leaves = {n: t.clone().requires_grad_(True) for n, t in P.items()}
        Pf, lora = plan.split(leaves, base)
        ref.loss_fn(cfg, Pf, inputs, targets, lora=lora).backward()
        g = {n: t.grad for n, t in leaves.items()}
        norm = math.sqrt(sum(float((x.double() ** 2).sum()) for x in g.values()))
        coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
        t = k + 1
        for n in P:
            gn = g[n] * coef
            decay = wd if P[n].dim() >= 2 else 0.0
            p = P[n] * (1 - lr * decay)
            m[n] = b1 * m[n] + (1 - b1) * gn
            v[n] = b2 * v[n] + (1 - b2) * gn * gn
            P[n] = p - lr * (m[n] / (1 - b1 ** t)) / ((v[n] / (1 - b2 ** t)).sqrt() + eps)
    return P


def test_lora_train_roundtrip(tmp):
    """train --adapter: AdamW over the trainable tensors only; --save-adapter round-trips."""
    lc = dict(r=3, lora_alpha=6, target_modules=["q_proj", "o_proj", "gate_proj"], bias="all",
              modules_to_save=["embed_tokens"])
    model, adapter, tokens = make_lora_fixture(tmp, over=dict(attention_bias=True), lc=lc, b_std=0.05)
    toks = ref.read_tokens(tokens).tolist()
    B, T, steps, lr, wd, b1, b2, eps, clip = 2, 8, 3, 5e-3, 0.3, 0.9, 0.95, 1e-8, 0.05
    out, saved = os.path.join(tmp, "o.json"), os.path.join(tmp, "saved")
    run_cli("train", "--model", model, "--tokens", tokens, "--batch", B, "--seq", T, "--steps", steps, "--lr", lr,
            "--weight-decay", wd, "--beta1", b1, "--beta2", b2, "--eps", eps, "--grad-clip", clip,
            "--adapter", adapter, "--out", out, "--save-adapter", saved)
    res = read_json(out)
    check(res["grad_norms"][0] > clip, "the clip threshold does not bite")
    cfg, _, stored = ref.load_model(model)
    base = {n: t.float() for n, t in stored.items()}
    plan, trained = ref.load_adapter(adapter, cfg, base)
    want = adamw_adapter_reference(cfg, base, plan, trained, toks, B, T, steps, lr, wd, b1, b2, eps, clip)
    plan2, got = ref.load_adapter(saved, cfg, base)
    raw = st.raw_tensors(os.path.join(saved, "adapter_model.safetensors"))
    for n in want:
        check(raw[n][0] == "F32", f"saved {n} is {raw[n][0]}")
        d = max_diff(got[n], want[n])
        check(d < 2e-6, f"trained {n} differs from the written-out AdamW by {d:.3g}")
        check(max_diff(got[n], trained[n]) > 1e-5, f"{n} did not move")
    # decay only on 2+-dim tensors: with wd the bias path must equal the wd = 0 path after one step
    one = adamw_adapter_reference(cfg, base, plan, trained, toks, B, T, 1, lr, wd, b1, b2, eps, clip)
    nod = adamw_adapter_reference(cfg, base, plan, trained, toks, B, T, 1, lr, 0.0, b1, b2, eps, clip)
    for n, kind, _, _ in plan.entries:
        same = max_diff(one[n], nod[n]) == 0.0
        check(same == (kind == "bias"), f"{n} ({kind}): decay applied = {not same}")
    # the base model is untouched, the config is re-written unchanged, load + save is byte-identical
    check(open(os.path.join(saved, "adapter_config.json")).read() ==
          open(os.path.join(adapter, "adapter_config.json")).read(), "--save-adapter changed adapter_config.json")
    again = os.path.join(tmp, "again")
    ref.save_adapter(again, plan2, got)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        check(open(os.path.join(again, f), "rb").read() == open(os.path.join(saved, f), "rb").read(),
              f"{f} does not round-trip")
    # eval with the saved adapter is the written-out model's loss
    ev = os.path.join(tmp, "e.json")
    run_cli("eval", "--model", model, "--tokens", tokens, "--batch", B, "--seq", T, "--batches", 1,
            "--adapter", saved, "--out", ev)
    inputs, targets = llmc_batch(toks, 0, B, T)
    Pf, lora = plan.split(want, base)
    with torch.no_grad():
        wl = float(ref.loss_fn(cfg, Pf, inputs, targets, lora=lora))
    check(abs(read_json(ev)["loss"] - wl) < 1e-5, f"eval of the saved adapter {read_json(ev)['loss']} vs {wl}")
    # a PEFT 0.20.0 file without the lora_only biases loads with the base biases
    lc2 = dict(lc, bias="lora_only", modules_to_save=None)
    a2 = os.path.join(tmp, "a2")
    run_cli("make-adapter", "--model", model, "--out", a2, "--lora-json", json.dumps(lc2), "--b-std", 0.1)
    t2, meta = st.load(os.path.join(a2, "adapter_model.safetensors"))
    st.save(os.path.join(a2, "adapter_model.safetensors"), {n: t for n, t in t2.items() if "bias" not in n}, meta)
    p3, t3 = ref.load_adapter(a2, cfg, base)
    check(all(torch.equal(t3[n], base[hf]) for n, k, hf, _ in p3.entries if k == "bias"), "missing biases not from the base")
    # refusals
    for args, word in ((["--save", os.path.join(tmp, "x")], "--save-adapter"),):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = ref.main(["train", "--model", model, "--tokens", tokens, "--batch", "1", "--seq", "4", "--steps", "1",
                           "--lr", "1e-3", "--adapter", adapter, "--out", os.path.join(tmp, "x.json")] + args)
        check(rc == 2 and word in err.getvalue(), f"{args}: rc {rc} {err.getvalue()!r}")


def test_lora_merge(tmp):
    """merge: W + scaling * B @ A, biases and copies in place; the merged model's loss is the
    adapted model's; a tied model with a copied lm_head comes out untied."""
    for arch, over, lc in (
            ("llama", dict(attention_bias=True, mlp_bias=True),
             dict(r=2, lora_alpha=4, target_modules="all-linear", bias="all", modules_to_save=["norm"])),
            ("qwen2", dict(tie_word_embeddings=True),
             dict(r=3, lora_alpha=2, use_rslora=True, target_modules=["v_proj", "down_proj"], modules_to_save=["lm_head"]))):
        sub = os.path.join(tmp, arch)
        os.makedirs(sub)
        model, adapter, tokens = make_lora_fixture(sub, arch, over, lc, b_std=0.2)
        # move the copies / biases off the base, so that replacing them is visible
        t, meta = st.load(os.path.join(adapter, "adapter_model.safetensors"))
        gen = torch.Generator().manual_seed(3)
        t = {n: (v.float() + 0.1 * torch.randn(v.shape, generator=gen)) if "lora_" not in n else v for n, v in t.items()}
        st.save(os.path.join(adapter, "adapter_model.safetensors"), t, meta)
        merged = os.path.join(sub, "merged")
        run_cli("merge", "--model", model, "--adapter", adapter, "--out", merged)
        cfg, raw, stored = ref.load_model(model)
        mcfg, mraw, mt = ref.load_model(merged)
        check(mraw["torch_dtype"] == "float32", "merged torch_dtype")
        check(mcfg.tie == (cfg.tie and "lm_head" not in (lc.get("modules_to_save") or [])), f"{arch}: merged tie {mcfg.tie}")
        plan, tr = ref.load_adapter(adapter, cfg, None)
        for n, v in mt.items():
            check(v.dtype == torch.float32, f"merged {n} is {v.dtype}")
            mod = n[:-len(".weight")] if n.endswith(".weight") else None
            if mod in plan.targets:
                s = plan.targets[mod][2]
                A, Bm = tr[PP + mod + ".lora_A.weight"], tr[PP + mod + ".lora_B.weight"]
                want = stored[n].double() + s * (Bm.double() @ A.double())
                check(max_diff(v, want) < 1e-6, f"{arch} {n}: merged weight off W + s * B @ A")
                check(max_diff(v, stored[n]) > 1e-4, f"{arch} {n}: merge did nothing")
            else:
                peft = {hf: pn for pn, k, hf, _ in plan.entries if k in ("bias", "copy")}
                if n in peft:
                    check(torch.equal(v, tr[peft[n]]), f"{arch} {n}: not the adapter's copy / bias")
                elif n == "lm_head.weight" and cfg.tie:
                    raise Failure(f"{arch}: an lm_head appeared without a copy")
                else:
                    check(torch.equal(v, stored[n].float()), f"{arch} {n}: changed by the merge")
        e1, e2 = os.path.join(sub, "e1.json"), os.path.join(sub, "e2.json")
        run_cli("eval", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 3,
                "--adapter", adapter, "--out", e1)
        run_cli("eval", "--model", merged, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 3, "--out", e2)
        l1, l2 = read_json(e1)["losses"], read_json(e2)["losses"]
        check(max(abs(a - b) for a, b in zip(l1, l2)) < 2e-6, f"{arch}: merged losses {l2} vs adapted {l1}")
        e0 = os.path.join(sub, "e0.json")
        run_cli("eval", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 3, "--out", e0)
        check(abs(read_json(e0)["loss"] - read_json(e1)["loss"]) > 1e-4, f"{arch}: the adapter changes nothing; blind")
        bf = os.path.join(sub, "merged_bf16")
        run_cli("merge", "--model", model, "--adapter", adapter, "--out", bf, "--dtype", "BF16")
        _, _, mb = ref.load_model(bf)
        check(all(torch.equal(mb[n], mt[n].to(torch.bfloat16)) for n in mt),
              f"{arch}: BF16 merge is not the F32 one rounded")


def test_qlora(tmp):
    """--quant: the decoder linears replaced by bnb_quant's round trip, nothing else."""
    import bnb_quant as bq
    lc = dict(r=2, lora_alpha=4, target_modules=["q_proj", "up_proj"], bias="lora_only")
    model, adapter, tokens = make_lora_fixture(tmp, over=dict(attention_bias=True), lc=lc, dtype="F32")
    cfg, raw, stored = ref.load_model(model)
    names = ref.quantized_names(cfg)
    want = {f"model.layers.{i}.{m}_proj.weight" for i in range(cfg.num_layers)
            for m in ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "mlp.gate", "mlp.up", "mlp.down")}
    check(set(names) == want, f"quantized weights {sorted(set(names) ^ want)}")
    e_plain = os.path.join(tmp, "plain.json")
    run_cli("eval", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 2, "--out", e_plain)
    seen = set()
    for quant, dq in (("nf4", False), ("nf4", True), ("fp4", False), ("int8", False)):
        qdir = os.path.join(tmp, f"q_{quant}{int(dq)}")
        qt = {n: (bq.dequantized(t, quant, dq, 64) if n in want else t) for n, t in stored.items()}
        ref.save_model(qdir, raw, qt)
        e1, e2 = os.path.join(tmp, "e1.json"), os.path.join(tmp, "e2.json")
        run_cli("eval", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 2, "--quant", quant,
                *(["--double-quant"] if dq else []), "--compute-dtype", "float32", "--out", e1)
        run_cli("eval", "--model", qdir, "--tokens", tokens, "--batch", 2, "--seq", 8, "--batches", 2, "--out", e2)
        check(read_json(e1) == read_json(e2),
              f"--quant {quant} dq={dq}: {read_json(e1)} vs the dequantized model {read_json(e2)}")
        check(read_json(e1)["loss"] != read_json(e_plain)["loss"], f"--quant {quant} changes nothing")
        seen.add(read_json(e1)["loss"])
        # QLoRA: B = 0 adapter on the quantized base = the quantized base; train runs
        o = os.path.join(tmp, "o.json")
        run_cli("train", "--model", model, "--tokens", tokens, "--batch", 2, "--seq", 8, "--steps", 2, "--lr", 1e-2,
                "--adapter", adapter, "--quant", quant, *(["--double-quant"] if dq else []), "--out", o)
        check(read_json(o)["losses"][0] == read_json(e1)["losses"][0],
              f"QLoRA {quant}: losses[0] is not the quantized base's")
    check(len(seen) == 4, "two quantization settings give the same loss")
    for args, word in ((["--quant", "nf4"], "--adapter"), (["--quant", "int8", "--double-quant"], "--double-quant")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = ref.main(["train", "--model", model, "--tokens", tokens, "--batch", "1", "--seq", "4", "--steps", "1",
                           "--lr", "1e-3", "--out", os.path.join(tmp, "x.json")] + args)
        check(rc == 2 and word in err.getvalue(), f"{args}: rc {rc} {err.getvalue()!r}")


def main():
    import bnb_quant_selftest
    tests = [test_param_names, test_naive_forward, test_gradients, test_gqa_equals_repeated_mha, test_causal_and_tied,
             test_sliding, test_rope, test_long_rope, test_safetensors, test_init_loss, test_train_eval, test_refusals, test_lora_names,
             test_lora_math, test_lora_adapter_dir, test_lora_b_zero, test_lora_train_roundtrip, test_lora_merge,
             test_qlora] + bnb_quant_selftest.TESTS
    failed = 0
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hf_llama_selftest.") as tmp:
        for test in tests:
            t0 = time.perf_counter()
            sub = os.path.join(tmp, test.__name__)
            os.makedirs(sub)
            try:
                test(sub) if test.__code__.co_argcount else test()
                status = "ok"
            except AssertionError as e:  # Failure, or bnb_quant_selftest's
                failed += 1
                status = f"FAILED: {e}"
            except Exception:  # a crash is a failure too, with its traceback
                failed += 1
                status = "FAILED with an exception:\n" + traceback.format_exc()
            print(f"{test.__name__:32s} {time.perf_counter() - t0:6.2f}s  {status}", flush=True)
    print(f"{len(tests) - failed}/{len(tests)} passed in {time.perf_counter() - t_all:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
