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
  refusals     sliding_window < seq, Mistral biases, unknown rope types, mismatched weights

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


def test_refusals(tmp):
    def refused(fn, word):
        try:
            fn()
        except ref.ConfigError as e:
            check(word in str(e), f"error {e!r} does not name {word}")
            return
        raise Failure(f"not refused (expected an error naming {word})")

    cfg = tiny("mistral", sliding_window=8)
    P = ref.init_params(cfg, 0)
    ref.forward(cfg, P, torch.zeros(1, 8, dtype=torch.long))  # window == seq: no effect, allowed
    refused(lambda: ref.forward(cfg, P, torch.zeros(1, 9, dtype=torch.long)), "sliding_window")
    ref.forward(tiny("mistral", sliding_window=None), P, torch.zeros(1, 9, dtype=torch.long))
    refused(lambda: ref.forward(tiny("mistral"), P, torch.zeros(1, 4097, dtype=torch.long)),
            "sliding_window")  # HF's default window (4096) applies when the key is absent
    q = tiny("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    refused(lambda: q.check_seq(5), "sliding_window")
    tiny("qwen2", use_sliding_window=False, sliding_window=4).check_seq(5)
    refused(lambda: tiny("mistral", attention_bias=True), "attention_bias")
    refused(lambda: tiny("qwen2", mlp_bias=True), "mlp_bias")
    refused(lambda: tiny("llama", rope_scaling={"rope_type": "yarn", "factor": 2.0}), "yarn")
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


def main():
    tests = [test_param_names, test_naive_forward, test_gradients, test_gqa_equals_repeated_mha, test_causal_and_tied,
             test_rope, test_safetensors, test_init_loss, test_train_eval, test_refusals]
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
            except Failure as e:
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
