#!/usr/bin/env python3
"""An independent PyTorch reference of Hugging Face transformers' LlamaForCausalLM,
Qwen2ForCausalLM and MistralForCausalLM, for ztrain's tests.

It is written from HF's conventions (modeling_llama.py, modeling_qwen2.py, modeling_mistral.py,
modeling_rope_utils.py and the configuration classes), not from ztrain's code, and does not need
the `transformers` or `safetensors` packages: only torch (Debian's python3-torch, importable from
/usr/bin/python3). It computes in fp32 (any dtype on disk is upcast), as HF's eager attention does
for an fp32 model:

  x = embed_tokens[ids]                                   (no position table)
  per layer:  h   = x + o_proj(attention(input_layernorm(x)))
              out = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(h)
  logits = lm_head(norm(x))        (lm_head is embed_tokens when tie_word_embeddings)

  RMSNorm(x) = weight * (x * rsqrt(mean(x^2) + rms_norm_eps)), the normalisation in fp32.
  Attention: q,k,v projections (biases: Llama with attention_bias on q,k,v,o; Qwen2 always on
  q,k,v and never on o; Mistral never), rotate-half RoPE on q and k with
  inv_freq = 1 / rope_theta^(arange(0, head_dim, 2) / head_dim) in fp32, scaled as
  modeling_rope_utils does for rope_scaling {"rope_type"|"type": "linear"} (inv_freq / factor)
  and "llama3" (Llama 3.1 wavelength bands), cos/sin of position * inv_freq in fp32;
  grouped-query attention (KV head j serves query heads j*g .. j*g+g-1, g = heads / kv_heads),
  scores q.k / sqrt(head_dim), causal mask, softmax in fp32, then o_proj.
  head_dim = config.head_dim when given, else hidden_size / num_attention_heads.
  MLP biases with mlp_bias (Llama only).
  Loss: mean token cross-entropy over all B*T targets.

Refused (an error naming the key): other rope types, hidden_act other than silu, a Mistral (or a
Qwen2 with use_sliding_window) sliding_window smaller than the sequence length (HF would mask
keys older than the window; this reference does not), attention_bias / mlp_bias on Mistral and
mlp_bias on Qwen2 (HF's classes have no such biases and would ignore the flag).

Model directories are laid out as HF's save_pretrained writes them: config.json, and
model.safetensors, or model-0000i-of-0000N.safetensors plus model.safetensors.index.json.

Usage (always /usr/bin/python3: the python3 on PATH may have no torch):

  hf_llama.py make-model --out DIR --arch {llama,qwen2,mistral} [--config-json '{...}']
                         [--dtype {F32,BF16,F16}] [--shards N] [--seed S]
      A randomly initialised HF model directory. --config-json holds HF config keys (e.g.
      head_dim, rope_theta, rope_scaling, tie_word_embeddings, attention_bias, mlp_bias,
      sliding_window) over these defaults: vocab_size 256, hidden_size 64, intermediate_size 128,
      num_hidden_layers 2, num_attention_heads 4, num_key_value_heads 2,
      max_position_embeddings 256, rms_norm_eps 1e-5, and HF's defaults for the rest (rope_theta
      10000, no rope_scaling, untied, no biases; Mistral: sliding_window 4096). Init: normal(0,
      0.02) matrices, embeddings and biases; norm weights 1 + normal(0, 0.1); deterministic per
      seed (drawn in fp32, then rounded to nearest-even for BF16 / F16). Shards are contiguous
      runs of HF's state_dict order, about equal in bytes.

  hf_llama.py train --model DIR --tokens FILE --batch B --seq T --steps N --lr LR
                    [--weight-decay WD] [--beta1 B1] [--beta2 B2] [--eps EPS] [--grad-clip C]
                    --out OUT.json [--grads GRADS.safetensors] [--save DIR]
      N steps of torch.optim.AdamW (constant lr; weight decay only on tensors of 2+ dims) with
      fp32 masters. FILE is raw little-endian int32 tokens; step k reads
      buf = tokens[k*B*T : k*B*T + B*T + 1], inputs = buf[:-1].view(B,T), targets = buf[1:].view(B,T).
      OUT.json: {"losses": [loss of step k's forward, before its update], "grad_norms": [global L2
      norm of step k's gradient, before clipping]}. Clipping (C > 0) is
      torch.nn.utils.clip_grad_norm_. --grads: fp32 gradients (HF names) of the first step,
      before the optimizer step; with tied embeddings only model.embed_tokens.weight, holding
      both uses. --save: the trained fp32 weights as an HF directory (F32, one file).

  hf_llama.py eval --model DIR --tokens FILE --batch B --seq T --batches K --out OUT.json
      {"loss": mean over K batches, "losses": [per batch]}, batch k read as a training step k.

Defaults: --dtype F32 --shards 1 --seed 0; --weight-decay 0 --beta1 0.9 --beta2 0.999 --eps 1e-8
--grad-clip 0 (none). --threads T sets torch's intra-op threads (train, eval).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}

# Defaults of HF's configuration classes, used when a config.json lacks a key.
HF_DEFAULTS = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
                  max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
                  rope_scaling=None, attention_bias=False, mlp_bias=False, head_dim=None,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                    max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, rope_theta=10000.0,
                    rope_scaling=None, head_dim=None, sliding_window=4096,
                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "qwen2": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, hidden_act="silu",
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0,
                  rope_scaling=None, use_sliding_window=False, sliding_window=4096,
                  max_window_layers=28, tie_word_embeddings=False, bos_token_id=None,
                  eos_token_id=None),
}

# What make-model writes before --config-json overrides: a tiny model.
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5)

TORCH_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


class ConfigError(ValueError):
    pass


# ----------------------------------------------------------------------------------------------
# Configuration


class Cfg:
    """The resolved model configuration (what the forward needs), from an HF config dict."""

    def __init__(self, raw, arch=None):
        if arch is None:
            arch = raw.get("model_type")
            if arch not in ARCHS:
                names = {v: k for k, v in ARCHS.items()}
                archs = raw.get("architectures") or []
                arch = names.get(archs[0]) if archs else None
            if arch not in ARCHS:
                raise ConfigError(f"config: model_type {raw.get('model_type')!r} / architectures "
                                  f"{raw.get('architectures')!r} is none of {sorted(ARCHS)}")
        elif raw.get("model_type") not in (None, arch):
            raise ConfigError(f"config: model_type {raw['model_type']!r} is not {arch!r}")
        self.arch = arch
        c = dict(HF_DEFAULTS[arch])
        c.update(raw)
        self.raw = c

        def integer(key):
            v = c[key]
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"config: {key} must be a positive integer, got {v!r}")
            return v

        self.vocab_size = integer("vocab_size")
        self.hidden_size = integer("hidden_size")
        self.intermediate_size = integer("intermediate_size")
        self.num_layers = integer("num_hidden_layers")
        self.num_heads = integer("num_attention_heads")
        if c.get("num_key_value_heads") is None:
            c["num_key_value_heads"] = self.num_heads
        self.num_kv_heads = integer("num_key_value_heads")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"config: num_attention_heads {self.num_heads} is not a multiple of "
                              f"num_key_value_heads {self.num_kv_heads}")
        if c.get("head_dim") is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(f"config: hidden_size {self.hidden_size} is not a multiple of "
                                  f"num_attention_heads {self.num_heads} (and no head_dim)")
            self.head_dim = self.hidden_size // self.num_heads
        else:
            self.head_dim = integer("head_dim")
        if self.head_dim % 2:
            raise ConfigError(f"config: head_dim {self.head_dim} is odd; rotate-half RoPE needs it even")
        self.eps = float(c["rms_norm_eps"])
        if c.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"config: hidden_act {c['hidden_act']!r} is not supported (only silu)")
        if float(c.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ConfigError("config: partial_rotary_factor other than 1 is not supported")
        self.tie = bool(c.get("tie_word_embeddings", False))
        self.max_position_embeddings = c.get("max_position_embeddings")

        # Biases, as each HF class builds its projections.
        if arch == "llama":
            ab = bool(c.get("attention_bias", False))
            self.qkv_bias, self.o_bias, self.mlp_bias = ab, ab, bool(c.get("mlp_bias", False))
        elif arch == "qwen2":
            if c.get("mlp_bias"):
                raise ConfigError("config: mlp_bias is set but Qwen2ForCausalLM has no MLP biases")
            self.qkv_bias, self.o_bias, self.mlp_bias = True, False, False
        else:
            for key in ("attention_bias", "mlp_bias"):
                if c.get(key):
                    raise ConfigError(f"config: {key} is set but MistralForCausalLM has no such biases")
            self.qkv_bias, self.o_bias, self.mlp_bias = False, False, False

        # Sliding window: Mistral applies config.sliding_window to every layer when it is not
        # null; Qwen2 only with use_sliding_window, and only to layers >= max_window_layers.
        self.sliding_window = None
        if arch == "mistral":
            self.sliding_window = c.get("sliding_window")
        elif arch == "qwen2" and c.get("use_sliding_window"):
            if int(c.get("max_window_layers", 28)) < self.num_layers:
                self.sliding_window = c.get("sliding_window")

        # RoPE: rope_theta plus rope_scaling (or the newer rope_parameters).
        theta = c.get("rope_theta")
        scaling = c.get("rope_scaling")
        params = c.get("rope_parameters")
        if scaling is None and isinstance(params, dict):
            theta = params.get("rope_theta", theta)
            scaling = params
        self.rope_theta = float(theta if theta is not None else 10000.0)
        self.rope_type = "default"
        self.rope = {}
        if scaling is not None:
            if not isinstance(scaling, dict):
                raise ConfigError(f"config: rope_scaling must be an object or null, got {scaling!r}")
            self.rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            self.rope = scaling
        if self.rope_type == "linear":
            self.rope_factor = float(self._rope_key("factor"))
        elif self.rope_type == "llama3":
            self.rope_factor = float(self._rope_key("factor"))
            self.low_freq_factor = float(self._rope_key("low_freq_factor"))
            self.high_freq_factor = float(self._rope_key("high_freq_factor"))
            self.original_max_position_embeddings = int(self._rope_key("original_max_position_embeddings"))
            if self.high_freq_factor == self.low_freq_factor:
                raise ConfigError("config: rope_scaling high_freq_factor equals low_freq_factor")
        elif self.rope_type != "default":
            raise ConfigError(f"config: rope_scaling type {self.rope_type!r} is not supported "
                              "(only default, linear, llama3)")

    def _rope_key(self, key):
        if self.rope.get(key) is None:
            raise ConfigError(f"config: rope_scaling type {self.rope_type!r} needs {key}")
        return self.rope[key]

    def check_seq(self, seq):
        """Refuses a sequence length the reference would compute differently from HF."""
        w = self.sliding_window
        if w is not None and w < seq:
            raise ConfigError(f"config: sliding_window {w} is smaller than the sequence length {seq}; "
                              "HF would apply a sliding-window mask that this reference does not")

    def param_shapes(self):
        """[(HF name, shape)] in HF's state_dict order."""
        D, Fi, V = self.hidden_size, self.intermediate_size, self.vocab_size
        qd, kvd = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        out = [("model.embed_tokens.weight", (V, D))]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            out.append((p + "self_attn.q_proj.weight", (qd, D)))
            if self.qkv_bias:
                out.append((p + "self_attn.q_proj.bias", (qd,)))
            out.append((p + "self_attn.k_proj.weight", (kvd, D)))
            if self.qkv_bias:
                out.append((p + "self_attn.k_proj.bias", (kvd,)))
            out.append((p + "self_attn.v_proj.weight", (kvd, D)))
            if self.qkv_bias:
                out.append((p + "self_attn.v_proj.bias", (kvd,)))
            out.append((p + "self_attn.o_proj.weight", (D, qd)))
            if self.o_bias:
                out.append((p + "self_attn.o_proj.bias", (D,)))
            for name, shape, bshape in (("gate_proj", (Fi, D), (Fi,)), ("up_proj", (Fi, D), (Fi,)),
                                        ("down_proj", (D, Fi), (D,))):
                out.append((p + f"mlp.{name}.weight", shape))
                if self.mlp_bias:
                    out.append((p + f"mlp.{name}.bias", bshape))
            out.append((p + "input_layernorm.weight", (D,)))
            out.append((p + "post_attention_layernorm.weight", (D,)))
        out.append(("model.norm.weight", (D,)))
        if not self.tie:
            out.append(("lm_head.weight", (V, D)))
        return out


def make_config(arch, overrides):
    """The config.json dict make-model writes: HF's keys, small defaults, then the overrides."""
    c = dict(HF_DEFAULTS[arch])
    c.update(SMALL)
    c.update(overrides)
    if c.get("num_key_value_heads") is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c.get("head_dim") is None and arch != "qwen2":
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    c.update(architectures=[ARCHS[arch]], model_type=arch, initializer_range=0.02,
             attention_dropout=0.0, use_cache=True)
    if arch == "llama":
        c.setdefault("pretraining_tp", 1)
    if arch == "qwen2" and c.get("head_dim") is None:
        c.pop("head_dim", None)
    Cfg(c, arch)  # validates
    return c


# ----------------------------------------------------------------------------------------------
# The model


def rope_inv_freq(cfg, dtype=torch.float32):
    """inv_freq as modeling_rope_utils computes it (in fp32 by default)."""
    hd = cfg.head_dim
    exponent = torch.arange(0, hd, 2, dtype=torch.int64).to(dtype) / hd
    inv = 1.0 / (cfg.rope_theta ** exponent)
    if cfg.rope_type == "linear":
        inv = inv / cfg.rope_factor
    elif cfg.rope_type == "llama3":
        factor = cfg.rope_factor
        old = cfg.original_max_position_embeddings
        low, high = cfg.low_freq_factor, cfg.high_freq_factor
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        medium = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > low_wavelen, inv / factor,
                          torch.where(wavelen < high_wavelen, inv, medium))
    return inv


def rope_tables(cfg, seq, dtype=torch.float32, positions=None):
    """cos, sin of shape (seq, head_dim/2): angle position * inv_freq[i] for the pair (i, i+hd/2)."""
    pos = torch.arange(seq, dtype=torch.int64) if positions is None else positions
    angles = pos.to(dtype)[:, None] * rope_inv_freq(cfg, dtype)[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate-half RoPE: x (..., T, hd); pair (i, i + hd/2) rotated by the angle of i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rms_norm(x, weight, eps):
    xf = x if x.dtype == torch.float64 else x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def linear(x, P, name, bias):
    w = P[name + ".weight"]
    return F.linear(x, w, P[name + ".bias"] if bias else None)


def attention(cfg, P, pre, x, cos, sin, mask):
    B, T, _ = x.shape
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = H // KV
    q = linear(x, P, pre + "q_proj", cfg.qkv_bias)
    k = linear(x, P, pre + "k_proj", cfg.qkv_bias)
    v = linear(x, P, pre + "v_proj", cfg.qkv_bias)
    # query head h = j*g + r is the r-th head of KV group j
    q = q.view(B, T, KV, g, hd).permute(0, 2, 3, 1, 4)           # B, KV, g, T, hd
    k = k.view(B, T, KV, hd).permute(0, 2, 1, 3).unsqueeze(2)     # B, KV, 1, T, hd
    v = v.view(B, T, KV, hd).permute(0, 2, 1, 3).unsqueeze(2)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v)                                  # B, KV, g, T, hd
    out = out.permute(0, 3, 1, 2, 4).reshape(B, T, H * hd)
    return linear(out, P, pre + "o_proj", cfg.o_bias)


def forward(cfg, P, ids, rope_dtype=torch.float32):
    """Logits (B, T, V) for token ids (B, T); P maps HF names to tensors of one float dtype.
    The RoPE tables are computed in rope_dtype (fp32 as HF; the self-test uses float64)."""
    B, T = ids.shape
    cfg.check_seq(T)
    emb = P["model.embed_tokens.weight"]
    x = F.embedding(ids, emb)
    cos, sin = rope_tables(cfg, T, rope_dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        n = rms_norm(x, P[pre + "input_layernorm.weight"], cfg.eps)
        x = x + attention(cfg, P, pre + "self_attn.", n, cos, sin, mask)
        n = rms_norm(x, P[pre + "post_attention_layernorm.weight"], cfg.eps)
        m = pre + "mlp."
        hidden = F.silu(linear(n, P, m + "gate_proj", cfg.mlp_bias)) * linear(n, P, m + "up_proj", cfg.mlp_bias)
        x = x + linear(hidden, P, m + "down_proj", cfg.mlp_bias)
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    head = emb if cfg.tie else P["lm_head.weight"]
    return F.linear(x, head)


def loss_fn(cfg, P, inputs, targets, rope_dtype=torch.float32):
    logits = forward(cfg, P, inputs, rope_dtype)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------------------------
# Model directories


def init_params(cfg, seed):
    """Random fp32 weights, deterministic per seed, in HF's state_dict order."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in cfg.param_shapes():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
        else:
            t = 0.02 * torch.randn(shape, generator=gen, dtype=torch.float32)
        out[name] = t
    return out


def shard_names(names, sizes, shards):
    """[[names of shard 0], ...]: contiguous runs in state_dict order, about equal in bytes."""
    if shards < 1 or shards > len(names):
        raise ConfigError(f"--shards {shards}: must be between 1 and the number of tensors ({len(names)})")
    total = sum(sizes)
    groups = [[]]
    done = 0
    for i, (name, size) in enumerate(zip(names, sizes)):
        left = len(names) - i  # tensors still to place, this one included
        cur = len(groups) - 1
        if groups[-1] and cur < shards - 1:
            want = min(shards - 1, done * shards // total)
            if want > cur or shards - 1 - cur >= left:
                groups.append([])
        groups[-1].append(name)
        done += size
    assert len(groups) == shards and all(groups)
    return groups


def save_model(path, config, tensors, shards=1):
    """Writes an HF model directory: config.json and the safetensors file(s) (+ index)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for old in os.listdir(path):
        if old.endswith(".safetensors") or old == "model.safetensors.index.json":
            os.remove(os.path.join(path, old))
    meta = {"format": "pt"}
    if shards == 1:
        st.save(os.path.join(path, "model.safetensors"), tensors, meta)
        return
    names = list(tensors)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    weight_map = {}
    groups = shard_names(names, sizes, shards)
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        st.save(os.path.join(path, fname), {n: tensors[n] for n in group}, meta)
        for n in group:
            weight_map[n] = fname
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def load_model(path):
    """(Cfg, raw config dict, tensors as stored): reads config.json and the weights."""
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    cfg = Cfg(raw)
    index_path = os.path.join(path, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        for fname in files:
            part, _ = st.load(os.path.join(path, fname))
            for n, t in part.items():
                if index["weight_map"].get(n) != fname:
                    raise ConfigError(f"{path}: {fname} holds {n}, which the index maps to "
                                      f"{index['weight_map'].get(n)!r}")
                tensors[n] = t
        missing_files = [n for n, f in index["weight_map"].items() if n not in tensors]
        if missing_files:
            raise ConfigError(f"{path}: the index names tensors its files lack: {missing_files[:5]}")
    else:
        single = os.path.join(path, "model.safetensors")
        if not os.path.exists(single):
            raise ConfigError(f"{path}: neither model.safetensors nor model.safetensors.index.json")
        tensors, _ = st.load(single)
    expected = dict(cfg.param_shapes())
    missing = [n for n in expected if n not in tensors]
    unexpected = [n for n in tensors if n not in expected]
    if missing or unexpected:
        raise ConfigError(f"{path}: weights do not match the config: missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}")
    for n, shape in expected.items():
        if tuple(tensors[n].shape) != tuple(shape):
            raise ConfigError(f"{path}: {n} has shape {list(tensors[n].shape)}, the config gives {list(shape)}")
        if tensors[n].dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise ConfigError(f"{path}: {n} has dtype {tensors[n].dtype}")
    ordered = {n: tensors[n] for n in expected}
    return cfg, raw, ordered


def fp32_masters(tensors):
    return {n: t.to(torch.float32).clone().requires_grad_(True) for n, t in tensors.items()}


# ----------------------------------------------------------------------------------------------
# Data


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) % 4:
        raise ConfigError(f"{path}: {len(data)} bytes is not a whole number of int32 tokens")
    if not data:
        raise ConfigError(f"{path}: no tokens")
    return torch.frombuffer(bytearray(data), dtype=torch.int32).to(torch.int64)


def batch(tokens, k, B, T, vocab, path="tokens"):
    start = k * B * T
    end = start + B * T + 1
    if end > tokens.numel():
        raise ConfigError(f"{path}: batch {k} needs tokens [{start}, {end}) but the file has {tokens.numel()}")
    buf = tokens[start:end]
    lo, hi = int(buf.min()), int(buf.max())
    if lo < 0 or hi >= vocab:
        raise ConfigError(f"{path}: batch {k} has token ids in [{lo}, {hi}], outside the vocabulary [0, {vocab})")
    return buf[:-1].view(B, T), buf[1:].view(B, T)


# ----------------------------------------------------------------------------------------------
# Commands


def grad_norm(params):
    """Global L2 norm of the gradients, as torch.nn.utils.clip_grad_norm_ computes it."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0)


def train(model_dir, tokens_path, B, T, steps, lr, weight_decay=0.0, beta1=0.9, beta2=0.999,
          eps=1e-8, grad_clip=0.0, grads_path=None, save_dir=None):
    cfg, raw, tensors = load_model(model_dir)
    cfg.check_seq(T)
    tokens = read_tokens(tokens_path)
    P = fp32_masters(tensors)
    decay = [p for p in P.values() if p.dim() >= 2]
    no_decay = [p for p in P.values() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    params = list(P.values())
    losses, norms = [], []
    for k in range(steps):
        inputs, targets = batch(tokens, k, B, T, cfg.vocab_size, tokens_path)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(cfg, P, inputs, targets)
        loss.backward()
        if k == 0 and grads_path:
            st.save(grads_path, {n: p.grad.detach().clone() for n, p in P.items()}, {"format": "pt"})
        if grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        else:
            norm = grad_norm(params)
        losses.append(float(loss.item()))
        norms.append(float(norm.item()))
        opt.step()
    if save_dir:
        config = dict(raw)
        config["torch_dtype"] = "float32"
        save_model(save_dir, config, {n: p.detach().clone() for n, p in P.items()}, shards=1)
    return {"losses": losses, "grad_norms": norms}, P


def evaluate(model_dir, tokens_path, B, T, batches):
    cfg, _, tensors = load_model(model_dir)
    cfg.check_seq(T)
    tokens = read_tokens(tokens_path)
    P = {n: t.to(torch.float32) for n, t in tensors.items()}
    losses = []
    with torch.no_grad():
        for k in range(batches):
            inputs, targets = batch(tokens, k, B, T, cfg.vocab_size, tokens_path)
            losses.append(float(loss_fn(cfg, P, inputs, targets).item()))
    return {"loss": sum(losses) / len(losses), "losses": losses}


def make_model(out, arch, overrides, dtype="F32", shards=1, seed=0):
    config = make_config(arch, overrides)
    config["torch_dtype"] = TORCH_DTYPE_NAMES[dtype]
    cfg = Cfg(config, arch)
    tensors = {n: t.to(DTYPES[dtype]) for n, t in init_params(cfg, seed).items()}
    save_model(out, config, tensors, shards)
    return cfg


def write_json(path, obj):
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2) + "\n")


def positive(v):
    v = int(v)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} is not a positive integer")
    return v


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch reference of HF Llama / Qwen2 / Mistral "
                                 "(see the top of this file)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    mk = sub.add_parser("make-model", help="write a randomly initialised HF model directory")
    mk.add_argument("--out", required=True)
    mk.add_argument("--arch", required=True, choices=sorted(ARCHS))
    mk.add_argument("--config-json", default="{}", help="HF config keys overriding the defaults")
    mk.add_argument("--dtype", default="F32", choices=sorted(DTYPES))
    mk.add_argument("--shards", type=positive, default=1)
    mk.add_argument("--seed", type=int, default=0)

    tr = sub.add_parser("train", help="AdamW steps on llm.c-style int32 token batches")
    ev = sub.add_parser("eval", help="mean loss over batches, no training")
    for p in (tr, ev):
        p.add_argument("--model", required=True)
        p.add_argument("--tokens", required=True)
        p.add_argument("--batch", type=positive, required=True)
        p.add_argument("--seq", type=positive, required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--threads", type=positive)
    tr.add_argument("--steps", type=positive, required=True)
    tr.add_argument("--lr", type=float, required=True)
    tr.add_argument("--weight-decay", type=float, default=0.0)
    tr.add_argument("--beta1", type=float, default=0.9)
    tr.add_argument("--beta2", type=float, default=0.999)
    tr.add_argument("--eps", type=float, default=1e-8)
    tr.add_argument("--grad-clip", type=float, default=0.0, help="max global grad norm; 0 = none")
    tr.add_argument("--grads", help="safetensors file for the first step's fp32 gradients")
    tr.add_argument("--save", help="directory for the trained fp32 weights (HF layout)")
    ev.add_argument("--batches", type=positive, required=True)

    a = ap.parse_args(argv)
    try:
        if a.cmd == "make-model":
            try:
                overrides = json.loads(a.config_json)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--config-json is not JSON: {e}") from None
            if not isinstance(overrides, dict):
                raise ConfigError("--config-json must be a JSON object")
            make_model(a.out, a.arch, overrides, a.dtype, a.shards, a.seed)
            return 0
        if a.threads:
            torch.set_num_threads(a.threads)
        if a.cmd == "train":
            result, _ = train(a.model, a.tokens, a.batch, a.seq, a.steps, a.lr, a.weight_decay,
                              a.beta1, a.beta2, a.eps, a.grad_clip, a.grads, a.save)
        else:
            result = evaluate(a.model, a.tokens, a.batch, a.seq, a.batches)
        write_json(a.out, result)
        return 0
    except (ConfigError, st.SafetensorsError, OSError) as e:
        print(f"hf_llama.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
