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
  modeling_rope_utils does for rope_scaling {"rope_type"|"type": "linear"} (inv_freq / factor),
  "llama3" (Llama 3.1 wavelength bands), "yarn" (frequencies ramped between interpolation and
  extrapolation, cos and sin times the attention factor) and "dynamic" (NTK: the base grows with
  max(position) + 1 past max_position_embeddings), cos/sin of position * inv_freq in fp32;
  grouped-query attention (KV head j serves query heads j*g .. j*g+g-1, g = heads / kv_heads),
  scores q.k / sqrt(head_dim), causal mask (kv_idx <= q_idx), in sliding layers also the window
  (kv_idx > q_idx - sliding_window, transformers' sliding_window_overlay: Mistral's layers when
  sliding_window is not null, Qwen2's layers >= max_window_layers with use_sliding_window),
  softmax in fp32, then o_proj.
  head_dim = config.head_dim when given, else hidden_size / num_attention_heads.
  MLP biases with mlp_bias (Llama only).
  Loss: mean token cross-entropy over all B*T targets.

Refused (an error naming the key): other rope types, hidden_act other than silu, attention_bias
/ mlp_bias on Mistral and mlp_bias on Qwen2 (HF's classes have no such biases and would ignore
the flag).

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
      ("evaluate" is an alias of "eval".)

Defaults: --dtype F32 --shards 1 --seed 0; --weight-decay 0 --beta1 0.9 --beta2 0.999 --eps 1e-8
--grad-clip 0 (none). --threads T sets torch's intra-op threads (train, eval).

LoRA, as PEFT defines it (huggingface/peft, read at commit 5d602fd = 0.20.1.dev0; written from
peft/tuners/lora/layer.py Linear.forward / update_layer / reset_lora_parameters / get_delta_weight
/ merge, tuners/lora/config.py LoraConfig, tuners/lora/model.py _create_and_replace /
_prepare_adapter_config, tuners/tuners_utils.py check_target_module_exists /
_maybe_include_all_linear_layers / _find_minimal_target_modules / _mark_only_adapters_as_trainable /
_get_adapter_state_dict / _get_learnable_bias_state_dict / _remove_adapter_name_from_state_dict_key,
utils/other.py _set_trainable / ModulesToSaveWrapper / get_pattern_key, utils/save_and_load.py
get_peft_model_state_dict, peft_model.py PeftModel.save_pretrained, config.py save_pretrained):

  An adapted nn.Linear computes y = base(x) + lora_B(lora_A(x)) * scaling, lora_A.weight [r, in],
  lora_B.weight [out, r], no biases on A / B, scaling = lora_alpha / r (use_rslora:
  lora_alpha / sqrt(r)); r and lora_alpha per module from rank_pattern / alpha_pattern (first key k
  with re.match("(.*\\.)?(k)$", module)), else r / lora_alpha. lora_dropout must be 0.
  Which modules (named_modules() names of *ForCausalLM: model.embed_tokens, model.layers.i,
  model.layers.i.self_attn.{q,k,v,o}_proj, model.layers.i.mlp.{gate,up,down}_proj,
  model.layers.i.mlp.act_fn, model.layers.i.{input,post_attention}_layernorm, model.norm,
  model.rotary_emb, lm_head, ...):
    target_modules list: a module whose name equals an entry or ends with "." + entry; then, with
      layers_to_transform (int or list), only if the index matched by ".*?\\.[^.]*\\.(\\d+)\\." (or
      ".*?\\.<layers_pattern>\\.(\\d+)\\.") is one of them (an exact full-name match skips that
      filter, as in PEFT). A string: re.fullmatch against the name. "all-linear": every
      nn.Linear except the output embedding lm_head, as full names. null: PEFT's default for the
      model type, ["q_proj", "v_proj"]. exclude_modules (list / regex) and any module matching
      "(^|.*\\.)<m>($|\\..*)" for a modules_to_save entry m are never adapted. A matched module that is
      not a Linear (mlp, a norm) is an error as in PEFT; LoRA on embed_tokens / lm_head is refused
      here (PEFT would also save the full embedding layers), and so is a config matching nothing.
    bias: "none"; "all": every bias of the model trains; "lora_only": the adapted linears' biases.
    modules_to_save: every module whose name ends with an entry (plain endswith, as _set_trainable)
      is replaced in the forward by a trainable copy (starting equal to it); the original stays
      frozen. A tied model keeps its head on the original tied weight unless lm_head itself is
      copied (PEFT deep-copies, so the copy is untied). Refused here: an entry matching no module
      with parameters (PEFT ignores it silently), nested matches, overlap with LoRA targets, and a
      copied module with biases when bias != "none".
  Everything else is frozen.
  Adapter directory (PeftModel.save_pretrained, safetensors):
    adapter_config.json: json.dumps(LoraConfig.to_dict(), indent=2, sort_keys=True), no trailing
      newline: every key of LORA_CONFIG_DEFAULTS below (PEFT's defaults) with inference_mode true,
      peft_type "LORA", task_type "CAUSAL_LM" (auto_mapping only when task_type is null),
      base_model_name_or_path = --model as given, target_modules as PEFT saves them after
      resolution (a sorted list; "all-linear" becomes the full names; a list of 20 or more is
      condensed to the minimal suffixes), peft_version.
    adapter_model.safetensors (metadata {"format": "pt"}), names without the adapter name:
      base_model.model.<module>.lora_A.weight    F32 [r, in]
      base_model.model.<module>.lora_B.weight    F32 [out, r]
      base_model.model.<module>.base_layer.bias  trainable bias of an adapted module
      base_model.model.<module>.bias             trainable bias of a module that is not adapted
      base_model.model.<HF param name>           a modules_to_save copy: ModulesToSaveWrapper's
          "modules_to_save.default.<param>" saved as "<wrapper>.<param>", e.g.
          base_model.model.lm_head.weight, base_model.model.model.embed_tokens.weight
    Biases and copies keep the base model's dtype in make-adapter (PEFT deep-copies them); a
    trained adapter is all F32. Loading accepts a file lacking the bias=lora_only biases (peft
    0.20.0 saved none of them; the base biases then stay).

  hf_llama.py make-adapter --model DIR --out ADIR --lora-json '{...}' [--seed S] [--b-std F]
      A PEFT adapter for the model in DIR. --lora-json: LoraConfig keys (unknown keys are errors;
      task_type defaults to CAUSAL_LM). init_lora_weights true (PEFT's default): lora_A
      kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)); "gaussian": lora_A N(0, 1/r);
      false: A and B both nn.Linear's default init. lora_B zeros (true / "gaussian"), or
      N(0, b_std) when --b-std > 0 (default 0). One torch.Generator seeded with S (default 0),
      drawn per adapted module in named_modules order, A then B. Copies equal the base.

  train / eval ... --adapter ADIR: the base from --model is frozen (fp32) and the adapter's
      trainable tensors (in PeftModel.named_parameters() order) are the only fp32 masters AdamW
      updates (weight decay on the 2+-dim ones: lora A / B and matrix copies; clipping and
      grad_norms over the trainable tensors only). train --grads: first-step gradients under the
      PEFT names; --save-adapter ODIR: the trained adapter as a PEFT directory (F32); --save is
      refused with --adapter.
  train / eval ... --quant {nf4,fp4,int8} [--double-quant] [--compute-dtype float32]: the
      frozen base's decoder linear weights (q/k/v/o/gate/up/down_proj; not the embeddings, not
      lm_head, which transformers' bitsandbytes integration keeps) are quantized once at load with
      tests/reference/bnb_quant.py (blocksize 64) and replaced by their dequantized fp32 values:
      a QLoRA forward with bnb_4bit_compute_dtype float32 and the model loaded in float32 (with
      a bf16-loaded model bitsandbytes would round the dequantized weight to bf16 first; int8:
      bitsandbytes multiplies int8 activations by int8 weights, this is only the weight part).
      train --quant needs --adapter; modules_to_save may not copy a quantized weight.

  hf_llama.py merge --model DIR --adapter ADIR --out ODIR [--dtype F32|BF16|F16]
      PEFT's merge_and_unload in fp32: each adapted weight += (lora_B @ lora_A) * scaling, biases
      and modules_to_save copies in place of the originals; written as make-model writes a
      directory (one file; default F32, BF16 / F16 rounded to nearest-even). A tied model whose
      embed_tokens or lm_head was copied is written untied (tie_word_embeddings false, lm_head.weight).
"""
import argparse
import json
import math
import os
import re
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
        # null; Qwen2 only with use_sliding_window, and only to layers >= max_window_layers
        # (Qwen2Config's layer_types).
        self.sliding_window = None
        self.first_sliding_layer = 0
        if arch == "mistral":
            self.sliding_window = c.get("sliding_window")
        elif arch == "qwen2" and c.get("use_sliding_window"):
            self.sliding_window = c.get("sliding_window")
            self.first_sliding_layer = int(c.get("max_window_layers", 28))

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
        elif self.rope_type == "yarn":
            # _compute_yarn_parameters: original_max_position_embeddings from rope_scaling, else
            # the config's; a missing factor is the ratio of the two contexts (DeepSeek-V3).
            self.original_max_position_embeddings = int(
                self.rope.get("original_max_position_embeddings") or self.max_position_embeddings)
            f = self.rope.get("factor")
            self.rope_factor = float(f) if f is not None else \
                self.max_position_embeddings / self.original_max_position_embeddings
            self.beta_fast = float(self.rope.get("beta_fast") or 32)
            self.beta_slow = float(self.rope.get("beta_slow") or 1)
        elif self.rope_type == "dynamic":
            self.rope_factor = float(self._rope_key("factor"))
        elif self.rope_type != "default":
            raise ConfigError(f"config: rope_scaling type {self.rope_type!r} is not supported "
                              "(only default, linear, llama3, yarn, dynamic)")

    def _rope_key(self, key):
        if self.rope.get(key) is None:
            raise ConfigError(f"config: rope_scaling type {self.rope_type!r} needs {key}")
        return self.rope[key]

    def layer_mask(self, i, T):
        """Layer i's boolean mask [T, T] (True: query row sees key column), as transformers'
        masking_utils composes it: causal_mask_function, and in a sliding layer
        sliding_window_overlay."""
        q_idx = torch.arange(T).view(T, 1)
        kv_idx = torch.arange(T).view(1, T)
        mask = kv_idx <= q_idx
        if self.sliding_window is not None and i >= self.first_sliding_layer:
            mask = mask & (kv_idx > q_idx - int(self.sliding_window))
        return mask

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


def yarn_attention_factor(cfg):
    """_compute_yarn_parameters' attention_factor: the config's, else from mscale."""
    given = cfg.rope.get("attention_factor")
    if given is not None:
        return float(given)

    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    mscale, mscale_all_dim = cfg.rope.get("mscale"), cfg.rope.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(get_mscale(cfg.rope_factor, mscale) / get_mscale(cfg.rope_factor, mscale_all_dim))
    return get_mscale(cfg.rope_factor)


def rope_inv_freq(cfg, dtype=torch.float32, seq_len=None):
    """inv_freq as modeling_rope_utils computes it (in fp32 by default). seq_len: the length
    dynamic NTK scaling sees (max(position_ids) + 1, as dynamic_rope_update passes it)."""
    hd = cfg.head_dim
    exponent = torch.arange(0, hd, 2, dtype=torch.int64).to(dtype) / hd
    base = cfg.rope_theta
    if cfg.rope_type == "dynamic" and seq_len is not None and seq_len > cfg.max_position_embeddings:
        base = base * ((cfg.rope_factor * seq_len / cfg.max_position_embeddings)
                       - (cfg.rope_factor - 1)) ** (hd / (hd - 2))
    inv = 1.0 / (base ** exponent)
    if cfg.rope_type == "yarn":
        def correction_dim(rotations):
            return (hd * math.log(cfg.original_max_position_embeddings / (rotations * 2 * math.pi))) / \
                (2 * math.log(cfg.rope_theta))
        low = max(math.floor(correction_dim(cfg.beta_fast)), 0)
        high = min(math.ceil(correction_dim(cfg.beta_slow)), hd - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(hd // 2, dtype=torch.float32).to(dtype) - low) / (high - low), 0, 1)
        pos_freqs = cfg.rope_theta ** exponent
        extrapolation_factor = 1 - ramp
        inv = (1.0 / (cfg.rope_factor * pos_freqs)) * (1 - extrapolation_factor) + \
            (1.0 / pos_freqs) * extrapolation_factor
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
    """cos, sin of shape (seq, head_dim/2): angle position * inv_freq[i] for the pair (i, i+hd/2),
    times the attention scaling (YaRN's factor; 1 otherwise), as LlamaRotaryEmbedding.forward."""
    pos = torch.arange(seq, dtype=torch.int64) if positions is None else positions
    seq_len = int(pos.max().item()) + 1 if pos.numel() else 0
    angles = pos.to(dtype)[:, None] * rope_inv_freq(cfg, dtype, seq_len)[None, :]
    scale = yarn_attention_factor(cfg) if cfg.rope_type == "yarn" else 1.0
    return angles.cos() * scale, angles.sin() * scale


def apply_rope(x, cos, sin):
    """Rotate-half RoPE: x (..., T, hd); pair (i, i + hd/2) rotated by the angle of i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rms_norm(x, weight, eps):
    xf = x if x.dtype == torch.float64 else x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def linear(x, P, name, bias, lora=None):
    w = P[name + ".weight"]
    y = F.linear(x, w, P[name + ".bias"] if bias else None)
    if lora is not None and name in lora:
        # PEFT lora.Linear.forward (peft/tuners/lora/layer.py): result = base_layer(x), then
        # result = result + lora_B(lora_A(dropout(x))) * scaling, dropout the identity (p = 0)
        A, B, scaling = lora[name]
        y = y + F.linear(F.linear(x, A), B) * scaling
    return y


def attention(cfg, P, pre, x, cos, sin, mask, lora=None):
    B, T, _ = x.shape
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = H // KV
    q = linear(x, P, pre + "q_proj", cfg.qkv_bias, lora)
    k = linear(x, P, pre + "k_proj", cfg.qkv_bias, lora)
    v = linear(x, P, pre + "v_proj", cfg.qkv_bias, lora)
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
    return linear(out, P, pre + "o_proj", cfg.o_bias, lora)


def forward(cfg, P, ids, rope_dtype=torch.float32, lora=None):
    """Logits (B, T, V) for token ids (B, T); P maps HF names to tensors of one float dtype.
    The RoPE tables are computed in rope_dtype (fp32 as HF; the self-test uses float64).
    lora: {module name: (lora_A.weight, lora_B.weight, scaling)} of the adapted linears, or None.
    A tied model takes its head from P["lm_head.weight"] when P has one (a modules_to_save copy,
    or the frozen original when embed_tokens is replaced by a copy), else from embed_tokens."""
    B, T = ids.shape
    emb = P["model.embed_tokens.weight"]
    x = F.embedding(ids, emb)
    cos, sin = rope_tables(cfg, T, rope_dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        n = rms_norm(x, P[pre + "input_layernorm.weight"], cfg.eps)
        x = x + attention(cfg, P, pre + "self_attn.", n, cos, sin, cfg.layer_mask(i, T), lora)
        n = rms_norm(x, P[pre + "post_attention_layernorm.weight"], cfg.eps)
        m = pre + "mlp."
        hidden = F.silu(linear(n, P, m + "gate_proj", cfg.mlp_bias, lora)) * \
            linear(n, P, m + "up_proj", cfg.mlp_bias, lora)
        x = x + linear(hidden, P, m + "down_proj", cfg.mlp_bias, lora)
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    head = P["lm_head.weight"] if (not cfg.tie or "lm_head.weight" in P) else emb
    return F.linear(x, head)


def loss_fn(cfg, P, inputs, targets, rope_dtype=torch.float32, lora=None):
    logits = forward(cfg, P, inputs, rope_dtype, lora)
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
# PEFT LoRA (huggingface/peft; the snapshot read was commit 5d602fd, version 0.20.1.dev0)

PEFT_VERSION = "0.20.1.dev0@5d602fdbff04c33c1c4de55cda9d4ae1d7cb7e40"
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel (.base_model) -> the HF model (.model)

# The keys of adapter_config.json with PEFT's defaults, in the dataclass order: PeftConfigMixin
# (task_type, peft_type, auto_mapping, peft_version), PeftConfig (base_model_name_or_path,
# revision, inference_mode) and LoraConfig (peft/tuners/lora/config.py) less runtime_config, which
# LoraConfig.to_dict pops. PeftConfigMixin.save_pretrained writes json.dumps(to_dict(), indent=2,
# sort_keys=True) (sets as lists); PeftModel.save_pretrained sets inference_mode True and, when
# task_type is None, auto_mapping {"base_model_class", "parent_library"}.
LORA_CONFIG_DEFAULTS = dict(
    task_type=None, peft_type="LORA", auto_mapping=None, peft_version=PEFT_VERSION,
    base_model_name_or_path=None, revision=None, inference_mode=False,
    r=8, target_modules=None, exclude_modules=None, lora_alpha=8, lora_dropout=0.0,
    fan_in_fan_out=False, bias="none", use_rslora=False, modules_to_save=None, init_lora_weights=True,
    layers_to_transform=None, layers_pattern=None, rank_pattern={}, alpha_pattern={},
    megatron_config=None, megatron_core="megatron.core", trainable_token_indices=None, loftq_config={},
    eva_config=None, corda_config=None, lora_ga_config=None, use_dora=False, velora_config=None,
    alora_invocation_tokens=None, use_qalora=False, qalora_group_size=16, monteclora_config=None,
    layer_replication=None, lora_bias=False, target_parameters=None, use_bdlora=None, arrow_config=None,
    kasa_config=None, ensure_weight_tying=False)
# Keys this reference supports only at PEFT's default (variants, other inits, tying, ...).
LORA_DEFAULT_ONLY = ("fan_in_fan_out", "megatron_config", "trainable_token_indices", "loftq_config",
                     "eva_config", "corda_config", "lora_ga_config", "use_dora", "velora_config",
                     "alora_invocation_tokens", "use_qalora", "monteclora_config", "layer_replication",
                     "lora_bias", "target_parameters", "use_bdlora", "arrow_config", "kasa_config",
                     "ensure_weight_tying")
# peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (target_modules None)
DEFAULT_TARGETS = {"llama": ["q_proj", "v_proj"], "mistral": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"]}
MODEL_MODULES = {"llama": "transformers.models.llama.modeling_llama",
                 "mistral": "transformers.models.mistral.modeling_mistral",
                 "qwen2": "transformers.models.qwen2.modeling_qwen2"}
MIN_TARGET_MODULES_FOR_OPTIMIZATION = 20  # peft/utils/constants.py


def lora_config_from(raw, strict):
    """LORA_CONFIG_DEFAULTS updated with raw (a --lora-json object or an adapter_config.json),
    validated. strict: unknown keys are errors (--lora-json); else dropped, as PEFT's
    _check_and_remove_unused_kwargs drops keys of other PEFT versions."""
    if not isinstance(raw, dict):
        raise ConfigError("LoRA config: must be a JSON object")
    unknown = sorted(k for k in raw if k not in LORA_CONFIG_DEFAULTS)
    if unknown and strict:
        raise ConfigError(f"LoRA config: unknown keys {unknown} (LoraConfig has no such fields)")
    c = json.loads(json.dumps(LORA_CONFIG_DEFAULTS))
    c.update({k: v for k, v in raw.items() if k in LORA_CONFIG_DEFAULTS})
    if c["peft_type"] != "LORA":
        raise ConfigError(f"LoRA config: peft_type {c['peft_type']!r} is not LORA")
    if c["task_type"] not in (None, "CAUSAL_LM"):
        raise ConfigError(f"LoRA config: task_type {c['task_type']!r}: only CAUSAL_LM (or null) is supported")
    for key in LORA_DEFAULT_ONLY:
        if c[key] != LORA_CONFIG_DEFAULTS[key] and not (key == "loftq_config" and c[key] is None):
            raise ConfigError(f"LoRA config: {key} = {c[key]!r} is not supported (only PEFT's default "
                              f"{LORA_CONFIG_DEFAULTS[key]!r})")
    if c["lora_dropout"] != 0:
        raise ConfigError(f"LoRA config: lora_dropout = {c['lora_dropout']!r}: only 0 is supported "
                          "(dropout would make the forward random)")
    if c["bias"] not in ("none", "all", "lora_only"):
        raise ConfigError(f"LoRA config: bias {c['bias']!r} is none of none, all, lora_only")
    if c["init_lora_weights"] not in (True, False, "gaussian"):
        raise ConfigError(f"LoRA config: init_lora_weights {c['init_lora_weights']!r}: only true, false "
                          "and \"gaussian\" are supported")

    def pos_int(v, what):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"LoRA config: {what} must be a positive integer, got {v!r}")

    def number(v, what):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ConfigError(f"LoRA config: {what} must be a number, got {v!r}")

    pos_int(c["r"], "r")
    number(c["lora_alpha"], "lora_alpha")
    for key in ("rank_pattern", "alpha_pattern"):
        if c[key] is None:
            c[key] = {}
        if not isinstance(c[key], dict):
            raise ConfigError(f"LoRA config: {key} must be an object")
    for k, v in c["rank_pattern"].items():
        pos_int(v, f"rank_pattern[{k!r}]")
    for k, v in c["alpha_pattern"].items():
        number(v, f"alpha_pattern[{k!r}]")
    tm = c["target_modules"]
    if not (tm is None or isinstance(tm, str) or
            (isinstance(tm, list) and all(isinstance(t, str) for t in tm))):
        raise ConfigError(f"LoRA config: target_modules must be a list of names, a regex string, "
                          f"\"all-linear\" or null, got {tm!r}")
    em = c["exclude_modules"]
    if not (em is None or isinstance(em, str) or (isinstance(em, list) and all(isinstance(t, str) for t in em))):
        raise ConfigError(f"LoRA config: exclude_modules must be a list of names or a regex string, got {em!r}")
    mts = c["modules_to_save"]
    if mts is not None:
        if not (isinstance(mts, list) and all(isinstance(m, str) and m for m in mts)):
            raise ConfigError(f"LoRA config: modules_to_save must be a list of non-empty names, got {mts!r}")
    lt = c["layers_to_transform"]
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if lt is not None and not (is_int(lt) or (isinstance(lt, list) and all(is_int(i) for i in lt))):
        raise ConfigError(f"LoRA config: layers_to_transform must be an integer or a list of integers, got {lt!r}")
    lp = c["layers_pattern"]
    if lp is not None and not (isinstance(lp, str) or
                               (isinstance(lp, list) and all(isinstance(p, str) for p in lp))):
        raise ConfigError(f"LoRA config: layers_pattern must be a string or a list of strings, got {lp!r}")
    # LoraConfig.__post_init__
    if isinstance(tm, str) and lt is not None:
        raise ConfigError("LoRA config: `layers_to_transform` cannot be used when `target_modules` is a str.")
    if isinstance(tm, str) and lp is not None:
        raise ConfigError("LoRA config: `layers_pattern` cannot be used when `target_modules` is a str.")
    if lp and lt is None:
        raise ConfigError("LoRA config: When `layers_pattern` is specified, `layers_to_transform` must also be "
                          "specified.")
    return c


def hf_modules(cfg):
    """{name: info} in the order of HF's model.named_modules() for *ForCausalLM, root excluded.
    info: kind (container, embedding, linear, norm, act, rotary), params (HF names, state_dict
    order; a tied lm_head lists lm_head.weight, which the state_dict lacks), and for linears
    in_features, out_features, bias."""
    D, Fi, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qd, kvd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    mods = {}

    def leaf(name, kind, **kw):
        params = [name + ".weight"]
        if kw.get("bias"):
            params.append(name + ".bias")
        mods[name] = dict(kind=kind, params=params, **kw)

    mods["model"] = dict(kind="container")
    leaf("model.embed_tokens", "embedding")
    mods["model.layers"] = dict(kind="container")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        mods[p] = dict(kind="container")
        mods[p + ".self_attn"] = dict(kind="container")
        for name, fin, fout, b in (("q_proj", D, qd, cfg.qkv_bias), ("k_proj", D, kvd, cfg.qkv_bias),
                                   ("v_proj", D, kvd, cfg.qkv_bias), ("o_proj", qd, D, cfg.o_bias)):
            leaf(f"{p}.self_attn.{name}", "linear", in_features=fin, out_features=fout, bias=b)
        mods[p + ".mlp"] = dict(kind="container")
        for name, fin, fout in (("gate_proj", D, Fi), ("up_proj", D, Fi), ("down_proj", Fi, D)):
            leaf(f"{p}.mlp.{name}", "linear", in_features=fin, out_features=fout, bias=cfg.mlp_bias)
        mods[p + ".mlp.act_fn"] = dict(kind="act", params=[])
        leaf(p + ".input_layernorm", "norm")
        leaf(p + ".post_attention_layernorm", "norm")
    leaf("model.norm", "norm")
    mods["model.rotary_emb"] = dict(kind="rotary", params=[])
    leaf("lm_head", "linear", in_features=D, out_features=V, bias=False)
    for name, info in mods.items():
        if info["kind"] == "container":
            info["params"] = [q for n, i in mods.items() if n.startswith(name + ".") and i["kind"] != "container"
                              for q in i["params"]]
    return mods


def find_minimal_target_modules(target_modules, other_module_names):
    """peft/tuners/tuners_utils.py _find_minimal_target_modules."""
    target_modules = set(target_modules)
    other_module_names = set(other_module_names)

    def generate_suffixes(s):
        parts = s.split(".")
        return [".".join(parts[i:]) for i in range(len(parts))][::-1]

    other_suffixes = {suffix for item in other_module_names for suffix in generate_suffixes(item)}
    suffix_map = {item: generate_suffixes(item) for item in target_modules}
    required = set()
    for item, suffixes in sorted(suffix_map.items(), key=lambda tup: tup[1]):
        for suffix in suffixes:
            if suffix in required or suffix in other_suffixes:
                continue
            if not any(item.endswith("." + req) for req in required):
                required.add(suffix)
                break
    if not required:
        return set(target_modules)
    return required


class LoraPlan:
    """Which modules a LoraConfig adapts and which tensors it trains, resolved against a model as
    PEFT's LoraModel.inject_adapter / set_additional_trainable_modules / _mark_only_adapters_as_
    trainable do it, and the PEFT names adapter_model.safetensors holds them under.

      targets   {module: (r, lora_alpha, scaling)} in named_modules order
      mts       [modules_to_save module names]; copies  [HF params those copies replace]
      bias_hf   [HF names of the biases `bias` makes trainable]
      entries   [(PEFT name, kind, HF name or module, shape)], kind in lora_A, lora_B, bias, copy:
                the trainable tensors in the PeftModel's named_parameters() order
      saved_config  the adapter_config.json dict (target_modules resolved as PEFT saves them)"""

    def __init__(self, cfg, lcfg, base_model_name=None):
        self.cfg = cfg
        self.config = lcfg
        mods = hf_modules(cfg)
        self.mods = mods
        keys = list(mods)  # named_modules() less the root ""
        tm = lcfg["target_modules"]
        if tm is None:  # LoraModel._prepare_adapter_config
            tm = list(DEFAULT_TARGETS[cfg.arch])
        saved_tm = tm
        if isinstance(tm, str) and tm.lower() == "all-linear":
            # tuners_utils._maybe_include_all_linear_layers: every nn.Linear but the output
            # embedding (get_output_embeddings(), lm_head), as full module names
            tm = sorted(k for k in keys if mods[k]["kind"] == "linear" and k != "lm_head")
            saved_tm = tm
        if isinstance(tm, list):
            tm = list(dict.fromkeys(tm))
            if len(tm) >= MIN_TARGET_MODULES_FOR_OPTIMIZATION:  # inject_adapter's condensing
                suffixes = tuple("." + t for t in tm)
                no_target = [k for k in [""] + keys if k not in tm and not k.endswith(suffixes)]
                condensed = find_minimal_target_modules(tm, no_target)
                if len(condensed) < len(tm):
                    tm = sorted(condensed)
            saved_tm = sorted(tm)
        mts_names = lcfg["modules_to_save"] or []
        em = lcfg["exclude_modules"]
        lt = lcfg["layers_to_transform"]
        lp = lcfg["layers_pattern"]

        def excluded(key):
            if em:
                if isinstance(em, str):
                    if re.fullmatch(em, key):
                        return True
                elif key in em or any(key.endswith("." + e) for e in em):
                    return True
            return any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in mts_names)

        def matches(key):
            # tuners_utils.check_target_module_exists
            if excluded(key):
                return False
            if isinstance(tm, str):
                return re.fullmatch(tm, key) is not None
            if key in tm:
                return True
            found = any(key.endswith("." + t) for t in tm)
            using_indexes = lt is not None and (len(lt) != 0 if isinstance(lt, list) else True)
            if using_indexes and found:
                if not lp:
                    m = re.match(r".*?\.[^.]*\.(\d+)\.", key)
                else:
                    m = None
                    for pattern in ([lp] if isinstance(lp, str) else lp):
                        m = re.match(rf".*?\.{pattern}\.(\d+)\.", key)
                        if m is not None:
                            break
                if m is None:
                    return False
                idx = int(m.group(1))
                return idx == lt if isinstance(lt, int) else idx in lt
            return found

        def pattern_key(patterns, key):
            # peft/utils/other.py get_pattern_key
            for p in patterns:
                if re.match(rf"(.*\.)?({p})$", key):
                    return p
            return key

        self.targets = {}
        for key in keys:
            if not matches(key):
                continue
            kind = mods[key]["kind"]
            if key == "lm_head" or kind == "embedding":
                raise ConfigError(f"LoRA config: target {key!r}: LoRA on the embeddings / lm_head is not "
                                  "supported by this reference (PEFT would also save the full embedding layers)")
            if kind != "linear":
                raise ConfigError(f"LoRA config: Target module {key!r} is not supported: it is a {kind}, not a "
                                  "torch.nn.Linear (PEFT raises here too)")
            r = lcfg["rank_pattern"].get(pattern_key(lcfg["rank_pattern"], key), lcfg["r"])
            alpha = lcfg["alpha_pattern"].get(pattern_key(lcfg["alpha_pattern"], key), lcfg["lora_alpha"])
            # lora.LoraLayer.update_layer
            scaling = alpha / math.sqrt(r) if lcfg["use_rslora"] else alpha / r
            self.targets[key] = (r, alpha, scaling)
        if not self.targets:
            linears = [k for k in keys if mods[k]["kind"] == "linear"]
            raise ConfigError(f"LoRA config: Target modules {lcfg['target_modules']!r} not found in the base "
                              f"model (PEFT raises ValueError); linear modules: {linears}")

        # modules_to_save: other.py _set_trainable matches every named_modules() key by endswith
        self.mts = []
        for m in mts_names:
            found = [k for k in keys if k.endswith(m) and mods[k]["params"]]
            if not found:
                raise ConfigError(f"LoRA config: modules_to_save entry {m!r} matches no module with parameters "
                                  "(PEFT would silently ignore it)")
            for k in found:
                if k not in self.mts:
                    self.mts.append(k)
        self.mts.sort(key=keys.index)
        for k in self.mts:
            for o in self.mts:
                if o != k and o.startswith(k + "."):
                    raise ConfigError(f"LoRA config: modules_to_save matches both {k!r} and {o!r} inside it")
            for t in self.targets:
                if t == k or t.startswith(k + ".") or k.startswith(t + "."):
                    raise ConfigError(f"LoRA config: module {t!r} is both a LoRA target and (inside) a "
                                      f"modules_to_save module {k!r}")
            if lcfg["bias"] != "none" and any(p.endswith(".bias") for p in mods[k]["params"]):
                raise ConfigError(f"LoRA config: bias={lcfg['bias']!r} with modules_to_save module {k!r}, which "
                                  "has biases, is not supported (PEFT would save the original's biases too)")
        self.copies = [p for k in self.mts for p in mods[k]["params"]]

        # biases: tuners_utils._mark_only_adapters_as_trainable
        leaves = [k for k in keys if mods[k]["kind"] in ("linear", "embedding", "norm")]
        if lcfg["bias"] == "all":
            self.bias_hf = [p for k in leaves for p in mods[k]["params"] if p.endswith(".bias")]
        elif lcfg["bias"] == "lora_only":
            self.bias_hf = [k + ".bias" for k in self.targets if mods[k]["bias"]]
        else:
            self.bias_hf = []

        # trainable tensors, in the PeftModel's named_parameters() order: a lora.Linear registers
        # base_layer (weight, bias), then lora_A, lora_B; a ModulesToSaveWrapper the original
        # module, then the copy
        self.entries = []
        copies, biases = set(self.copies), set(self.bias_hf)
        for k in leaves:
            info = mods[k]
            for p in info["params"]:
                if p in copies:
                    self.entries.append((PEFT_PREFIX + p, "copy", p, None))
                elif p in biases:
                    pre = k + ".base_layer" if k in self.targets else k
                    self.entries.append((PEFT_PREFIX + pre + ".bias", "bias", p, (info["out_features"],)))
            if k in self.targets:
                r = self.targets[k][0]
                self.entries.append((PEFT_PREFIX + k + ".lora_A.weight", "lora_A", k, (r, info["in_features"])))
                self.entries.append((PEFT_PREFIX + k + ".lora_B.weight", "lora_B", k, (info["out_features"], r)))

        saved = json.loads(json.dumps(lcfg))
        saved["target_modules"] = saved_tm
        if isinstance(saved["exclude_modules"], list):
            saved["exclude_modules"] = sorted(set(saved["exclude_modules"]))
        if base_model_name is not None and saved["base_model_name_or_path"] is None:
            saved["base_model_name_or_path"] = base_model_name
        saved["inference_mode"] = True
        saved["peft_version"] = PEFT_VERSION
        if saved["task_type"] is None:
            saved["auto_mapping"] = {"base_model_class": ARCHS[cfg.arch],
                                     "parent_library": MODEL_MODULES[cfg.arch]}
        self.saved_config = saved

    def copy_shape(self, hf_name):
        D, V = self.cfg.hidden_size, self.cfg.vocab_size
        if hf_name == "lm_head.weight":
            return (V, D)
        return dict(self.cfg.param_shapes())[hf_name]

    def source_of(self, hf_name, base):
        """The base tensor a copy / bias starts from (a tied lm_head is embed_tokens)."""
        if hf_name == "lm_head.weight" and self.cfg.tie:
            return base["model.embed_tokens.weight"]
        return base[hf_name]

    def expected(self):
        """{PEFT name: shape} of adapter_model.safetensors."""
        out = {}
        for name, kind, ref, shape in self.entries:
            out[name] = tuple(self.copy_shape(ref)) if kind == "copy" else tuple(shape)
        return out

    def split(self, trained, base):
        """(P for forward: base fp32 tensors with biases / copies replaced, lora dict)."""
        P = dict(base)
        lora = {}
        if self.cfg.tie and any(ref in ("model.embed_tokens.weight", "lm_head.weight")
                                for _, kind, ref, _ in self.entries if kind == "copy"):
            # the head keeps using the original (frozen) tied weight unless lm_head is copied
            P["lm_head.weight"] = base["model.embed_tokens.weight"]
        for name, kind, ref, _ in self.entries:
            if kind in ("copy", "bias"):
                P[ref] = trained[name]
        for k, (r, alpha, scaling) in self.targets.items():
            lora[k] = (trained[PEFT_PREFIX + k + ".lora_A.weight"], trained[PEFT_PREFIX + k + ".lora_B.weight"],
                       scaling)
        return P, lora


def init_adapter(plan, base, seed=0, b_std=0.0):
    """The adapter tensors make-adapter writes, in plan order: LoRA A / B in fp32 as PEFT's
    reset_lora_parameters initialises them, biases and modules_to_save copies equal to the base
    tensors (in the base's dtype: PEFT deep-copies the module). Deterministic per seed: one
    torch.Generator, per adapted module A then B."""
    gen = torch.Generator().manual_seed(seed)
    init = plan.config["init_lora_weights"]
    out = {}

    def kaiming_uniform_a_sqrt5(shape):
        # torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5)): fan_in = w.shape[1], gain
        # calculate_gain("leaky_relu", a) = sqrt(2 / (1 + a^2)), bound = sqrt(3) * gain / sqrt(fan_in)
        a = math.sqrt(5)
        gain = math.sqrt(2.0 / (1 + a ** 2))
        std = gain / math.sqrt(shape[1])
        bound = math.sqrt(3.0) * std
        return torch.empty(shape, dtype=torch.float32).uniform_(-bound, bound, generator=gen)

    for name, kind, ref, shape in plan.entries:
        if kind == "lora_A":
            if init is True or init is False:   # False: nn.Linear's own reset_parameters, the same law
                out[name] = kaiming_uniform_a_sqrt5(shape)
            else:  # "gaussian": nn.init.normal_(lora_A.weight, std=1 / r)
                out[name] = torch.empty(shape, dtype=torch.float32).normal_(0.0, 1.0 / shape[0], generator=gen)
        elif kind == "lora_B":
            if b_std > 0:
                out[name] = torch.empty(shape, dtype=torch.float32).normal_(0.0, b_std, generator=gen)
            elif init is False:
                out[name] = kaiming_uniform_a_sqrt5(shape)
            else:  # nn.init.zeros_(lora_B.weight)
                out[name] = torch.zeros(shape, dtype=torch.float32)
        else:
            out[name] = plan.source_of(ref, base).clone()
    return out


def save_adapter(path, plan, tensors):
    """A PEFT adapter directory as PeftModel.save_pretrained writes it (safe_serialization)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        f.write(json.dumps(plan.saved_config, indent=2, sort_keys=True))
    names = [e[0] for e in plan.entries]
    st.save(os.path.join(path, "adapter_model.safetensors"), {n: tensors[n].detach() for n in names},
            {"format": "pt"})


def load_adapter(path, cfg, base):
    """(LoraPlan, {PEFT name: fp32 tensor}) from a PEFT adapter directory, checked against cfg."""
    cpath = os.path.join(path, "adapter_config.json")
    wpath = os.path.join(path, "adapter_model.safetensors")
    if not os.path.exists(cpath):
        raise ConfigError(f"{path}: no adapter_config.json")
    if not os.path.exists(wpath):
        raise ConfigError(f"{path}: no adapter_model.safetensors (adapter_model.bin is not read)")
    with open(cpath) as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{cpath}: not JSON: {e}") from None
    plan = LoraPlan(cfg, lora_config_from(raw, strict=False))
    tensors, _ = st.load(wpath)
    expected = plan.expected()
    for name in expected:
        kind = next(k for n, k, _, _ in plan.entries if n == name)
        if name not in tensors and kind == "bias":
            # peft v0.20.0's get_peft_model_state_dict looked for "<module>.bias" and so saved no
            # bias=lora_only biases; loading such a file leaves the base biases in place
            ref = next(r for n, _, r, _ in plan.entries if n == name)
            tensors[name] = base[ref]
    missing = [n for n in expected if n not in tensors]
    unexpected = [n for n in tensors if n not in expected]
    if missing or unexpected:
        raise ConfigError(f"{wpath}: tensors do not match adapter_config.json: missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}")
    out = {}
    for n, shape in expected.items():
        t = tensors[n]
        if tuple(t.shape) != shape:
            raise ConfigError(f"{wpath}: {n} has shape {list(t.shape)}, expected {list(shape)}")
        if not t.is_floating_point():
            raise ConfigError(f"{wpath}: {n} has dtype {t.dtype}")
        out[n] = t.to(torch.float32)
    return plan, out


def merge_adapter(plan, base, trained):
    """PEFT's merge_and_unload: W += (B @ A) * scaling (lora.Linear.get_delta_weight, fan_in_fan_out
    False), biases and modules_to_save copies in place of the originals (ModulesToSaveWrapper.
    unload_and_optionally_merge_module returns the copy). fp32 in, fp32 out, HF names; a tied
    model whose embed_tokens or lm_head was replaced comes back untied (lm_head.weight added)."""
    P, lora = plan.split(trained, base)
    out = {n: t.detach().clone() for n, t in P.items()}
    for k, (A, B, scaling) in lora.items():
        out[k + ".weight"] = out[k + ".weight"] + (B.detach() @ A.detach()) * scaling
    return out


# ----------------------------------------------------------------------------------------------
# bitsandbytes quantization of the frozen base (QLoRA's forward with compute dtype float32)

QUANT_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def quantized_names(cfg):
    """The weights transformers' bitsandbytes integration replaces by Linear4bit / Linear8bitLt:
    every nn.Linear but lm_head (get_keys_to_not_convert keeps the output embedding), i.e. the
    decoder layers' projections; embeddings and norms are not Linear layers."""
    return [f"model.layers.{i}.{m}.weight" for i in range(cfg.num_layers) for m in QUANT_LINEARS]


def quantize_base(cfg, P, quant, double_quant=False):
    """P with the decoder linear weights replaced by their bitsandbytes round trip (fp32)."""
    import bnb_quant
    out = dict(P)
    for n in quantized_names(cfg):
        try:
            out[n] = bnb_quant.dequantized(P[n], quant, double_quant, 64)
        except bnb_quant.QuantError as e:
            raise ConfigError(f"--quant {quant}: {n}: {e}") from None
    return out


# ----------------------------------------------------------------------------------------------
# Commands


def grad_norm(params):
    """Global L2 norm of the gradients, as torch.nn.utils.clip_grad_norm_ computes it."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in grads]), 2.0)


def adapted_base(cfg, tensors, adapter_dir, quant=None, double_quant=False):
    """(base fp32 tensors, LoraPlan or None, trainable {PEFT name: fp32} or None) for --adapter /
    --quant: the base frozen (no gradients), its decoder linears quantized with --quant."""
    base = {n: t.to(torch.float32) for n, t in tensors.items()}
    if quant:
        base = quantize_base(cfg, base, quant, double_quant)
    if adapter_dir is None:
        return base, None, None
    plan, trained = load_adapter(adapter_dir, cfg, base)
    if quant:
        hit = sorted(set(plan.copies) & set(quantized_names(cfg)))
        if hit:
            raise ConfigError(f"--quant: modules_to_save copies quantized weights {hit[:3]}; bitsandbytes' "
                              "Linear4bit / Linear8bitLt weights cannot be trained as copies here")
    return base, plan, trained


def train(model_dir, tokens_path, B, T, steps, lr, weight_decay=0.0, beta1=0.9, beta2=0.999,
          eps=1e-8, grad_clip=0.0, grads_path=None, save_dir=None, adapter_dir=None,
          save_adapter_dir=None, quant=None, double_quant=False):
    cfg, raw, tensors = load_model(model_dir)
    tokens = read_tokens(tokens_path)
    plan = None
    if adapter_dir is None:
        if quant:
            raise ConfigError("train --quant needs --adapter: the quantized base is frozen, only an adapter "
                              "trains")
        if save_adapter_dir:
            raise ConfigError("--save-adapter needs --adapter")
        P = fp32_masters(tensors)
    else:
        if save_dir:
            raise ConfigError("--save writes full weights; with --adapter use --save-adapter (and merge)")
        base, plan, trained = adapted_base(cfg, tensors, adapter_dir, quant, double_quant)
        P = {n: t.clone().requires_grad_(True) for n, t in trained.items()}  # fp32 masters of the trainable
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
        if plan is None:
            loss = loss_fn(cfg, P, inputs, targets)
        else:
            Pf, lora = plan.split(P, base)
            loss = loss_fn(cfg, Pf, inputs, targets, lora=lora)
        loss.backward()
        if plan is not None:
            for p in params:
                if p.grad is None:  # a trainable tensor the forward does not reach
                    p.grad = torch.zeros_like(p)
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
    if save_adapter_dir:
        save_adapter(save_adapter_dir, plan, {n: p.detach().clone() for n, p in P.items()})
    return {"losses": losses, "grad_norms": norms}, P


def evaluate(model_dir, tokens_path, B, T, batches, adapter_dir=None, quant=None, double_quant=False):
    cfg, _, tensors = load_model(model_dir)
    tokens = read_tokens(tokens_path)
    lora = None
    if adapter_dir is None and not quant:
        P = {n: t.to(torch.float32) for n, t in tensors.items()}
    else:
        base, plan, trained = adapted_base(cfg, tensors, adapter_dir, quant, double_quant)
        P, lora = (base, None) if plan is None else plan.split(trained, base)
    losses = []
    with torch.no_grad():
        for k in range(batches):
            inputs, targets = batch(tokens, k, B, T, cfg.vocab_size, tokens_path)
            losses.append(float(loss_fn(cfg, P, inputs, targets, lora=lora).item()))
    return {"loss": sum(losses) / len(losses), "losses": losses}


def make_adapter(model_dir, out, lora_json, seed=0, b_std=0.0):
    """A PEFT adapter directory for the model in model_dir (see make-adapter at the top)."""
    cfg, _, tensors = load_model(model_dir)
    lcfg = lora_config_from(lora_json, strict=True)
    if lcfg["task_type"] is None and "task_type" not in lora_json:
        lcfg["task_type"] = "CAUSAL_LM"
    if b_std < 0:
        raise ConfigError(f"--b-std {b_std} is negative")
    plan = LoraPlan(cfg, lcfg, base_model_name=model_dir)
    save_adapter(out, plan, init_adapter(plan, tensors, seed, b_std))
    return plan


def merge(model_dir, adapter_dir, out, dtype="F32"):
    cfg, raw, tensors = load_model(model_dir)
    base = {n: t.to(torch.float32) for n, t in tensors.items()}
    plan, trained = load_adapter(adapter_dir, cfg, base)
    merged = merge_adapter(plan, base, trained)
    config = dict(raw)
    config["torch_dtype"] = TORCH_DTYPE_NAMES[dtype]
    if cfg.tie and "lm_head.weight" in merged:
        config["tie_word_embeddings"] = False
    order = [n for n, _ in Cfg(config).param_shapes()]
    save_model(out, config, {n: merged[n].to(DTYPES[dtype]) for n in order}, shards=1)


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

    ma = sub.add_parser("make-adapter", help="write a PEFT LoRA adapter directory for a model")
    ma.add_argument("--model", required=True)
    ma.add_argument("--out", required=True)
    ma.add_argument("--lora-json", required=True, help="PEFT LoraConfig keys (JSON object)")
    ma.add_argument("--seed", type=int, default=0)
    ma.add_argument("--b-std", type=float, default=0.0, help="lora_B ~ normal(0, b_std); 0 = zeros")

    mg = sub.add_parser("merge", help="merge a PEFT LoRA adapter into the model (merge_and_unload)")
    mg.add_argument("--model", required=True)
    mg.add_argument("--adapter", required=True)
    mg.add_argument("--out", required=True)
    mg.add_argument("--dtype", default="F32", choices=sorted(DTYPES))

    tr = sub.add_parser("train", help="AdamW steps on llm.c-style int32 token batches")
    ev = sub.add_parser("eval", aliases=["evaluate"], help="mean loss over batches, no training")
    for p in (tr, ev):
        p.add_argument("--model", required=True)
        p.add_argument("--tokens", required=True)
        p.add_argument("--batch", type=positive, required=True)
        p.add_argument("--seq", type=positive, required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--threads", type=positive)
        p.add_argument("--adapter", help="PEFT LoRA adapter directory; the base is frozen")
        p.add_argument("--quant", choices=("nf4", "fp4", "int8"),
                       help="bitsandbytes round trip of the decoder linear weights (frozen)")
        p.add_argument("--double-quant", action="store_true", help="with nf4 / fp4: compress_statistics")
        p.add_argument("--compute-dtype", default="float32", choices=("float32",))
    tr.add_argument("--steps", type=positive, required=True)
    tr.add_argument("--lr", type=float, required=True)
    tr.add_argument("--weight-decay", type=float, default=0.0)
    tr.add_argument("--beta1", type=float, default=0.9)
    tr.add_argument("--beta2", type=float, default=0.999)
    tr.add_argument("--eps", type=float, default=1e-8)
    tr.add_argument("--grad-clip", type=float, default=0.0, help="max global grad norm; 0 = none")
    tr.add_argument("--grads", help="safetensors file for the first step's fp32 gradients")
    tr.add_argument("--save", help="directory for the trained fp32 weights (HF layout)")
    tr.add_argument("--save-adapter", help="directory for the trained adapter (PEFT layout)")
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
        if a.cmd == "make-adapter":
            try:
                lora_json = json.loads(a.lora_json)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--lora-json is not JSON: {e}") from None
            if not isinstance(lora_json, dict):
                raise ConfigError("--lora-json must be a JSON object")
            make_adapter(a.model, a.out, lora_json, a.seed, a.b_std)
            return 0
        if a.cmd == "merge":
            merge(a.model, a.adapter, a.out, a.dtype)
            return 0
        if a.double_quant and a.quant not in ("nf4", "fp4"):
            raise ConfigError("--double-quant needs --quant nf4 or fp4")
        if a.threads:
            torch.set_num_threads(a.threads)
        if a.cmd == "train":
            result, _ = train(a.model, a.tokens, a.batch, a.seq, a.steps, a.lr, a.weight_decay,
                              a.beta1, a.beta2, a.eps, a.grad_clip, a.grads, a.save, a.adapter,
                              a.save_adapter, a.quant, a.double_quant)
        else:
            result = evaluate(a.model, a.tokens, a.batch, a.seq, a.batches, a.adapter, a.quant,
                              a.double_quant)
        write_json(a.out, result)
        return 0
    except (ConfigError, st.SafetensorsError, OSError, re.error) as e:
        print(f"hf_llama.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
