#!/usr/bin/env python3
"""PyTorch CPU reference for bench/llama_bench: a Llama train step written independently of
ztrain, as transformers' LlamaForCausalLM computes it (pre-RMSNorm blocks; separate q, k, v
and o projections without bias; rotate-half RoPE, theta 10000; grouped-query attention with
each key/value head repeated for its n_head / n_kv_head query heads; causal softmax attention;
SwiGLU MLP down(silu(gate(x)) * up(x)); final RMSNorm; untied LM head), then global-norm
clipping and AdamW, in fp32 or under bf16 autocast, timed after a warm-up step. The default
shape is llama_bench's (~110M: 12 layers, 768 wide, 12 heads, 4 KV heads, intermediate 2048,
vocab 32000). Prints one JSON line (bench/pytorch_step_util.py), which llama_bench reads.
Debian's python3-torch package provides torch.

    /usr/bin/python3 bench/pytorch_llama_step.py [--steps N] [--batch B] [--seq T] [--layers L]
                                                 [--threads N] [--precision fp32|bf16]
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import pytorch_step_util

N_EMBD, N_HEAD, N_KV_HEAD, INTERMEDIATE, VOCAB, EPS, THETA = 768, 12, 4, 2048, 32000, 1e-5, 1e4


class RMSNorm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * y.to(x.dtype)


def rope_tables(t, head_dim):
    inv_freq = 1.0 / THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.hd = N_EMBD // N_HEAD
        self.input_layernorm = RMSNorm(N_EMBD)
        self.q_proj = nn.Linear(N_EMBD, N_HEAD * self.hd, bias=False)
        self.k_proj = nn.Linear(N_EMBD, N_KV_HEAD * self.hd, bias=False)
        self.v_proj = nn.Linear(N_EMBD, N_KV_HEAD * self.hd, bias=False)
        self.o_proj = nn.Linear(N_HEAD * self.hd, N_EMBD, bias=False)
        self.post_attention_layernorm = RMSNorm(N_EMBD)
        self.gate_proj = nn.Linear(N_EMBD, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(N_EMBD, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, N_EMBD, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, N_HEAD, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, N_KV_HEAD, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, N_KV_HEAD, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = N_HEAD // N_KV_HEAD
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, N_HEAD * self.hd)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, N_EMBD)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = RMSNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        for m in self.modules():  # transformers' init: normal(0, 0.02) for matrices
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        cos, sin = rope_tables(idx.shape[1], N_EMBD // N_HEAD)
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, VOCAB).float(), targets.view(-1))


def main():
    a = pytorch_step_util.parse_args(__doc__)
    pytorch_step_util.time_train_step(Llama(a.layers), VOCAB, a)


if __name__ == "__main__":
    main()
