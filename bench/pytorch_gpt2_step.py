#!/usr/bin/env python3
"""PyTorch CPU reference for bench/gpt2_bench: the same GPT-2 train step (forward, backward,
global-norm clipping, AdamW) at the same shape, in fp32 or under bf16 autocast, timed after a
warm-up step; prints one JSON line (bench/pytorch_step_util.py), which gpt2_bench reads. Debian's
python3-torch package provides torch.

    /usr/bin/python3 bench/pytorch_gpt2_step.py [--steps N] [--batch B] [--seq T] [--layers L]
                                                [--threads N] [--precision fp32|bf16]
                                                [--device cpu|cuda] [--attention explicit|sdpa]
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import pytorch_step_util


class Block(nn.Module):
    def __init__(self, c, nh, sdpa):
        super().__init__()
        self.nh = nh
        self.sdpa = sdpa
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.nh)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, nh, vp, max_t, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vp, c)
        self.wpe = nn.Embedding(max_t, c)
        self.h = nn.ModuleList(Block(c, nh, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    a = pytorch_step_util.parse_args(__doc__)
    pytorch_step_util.time_train_step(GPT(a.layers, 768, 12, 50304, 1024, a.attention == "sdpa"),
                                      50257, a)


if __name__ == "__main__":
    main()
