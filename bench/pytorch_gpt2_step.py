#!/usr/bin/env python3
"""PyTorch CPU reference for bench/gpt2_bench: the same GPT-2 train step (forward, backward,
global-norm clipping, AdamW) at the same shape, timed the same way (best of N after a
warm-up). Debian's python3-torch package provides torch.

    python3 bench/pytorch_gpt2_step.py [--steps N] [--batch B] [--seq T] [--layers L]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
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
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.nh)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, nh, vp, max_t):
        super().__init__()
        self.wte = nn.Embedding(vp, c)
        self.wpe = nn.Embedding(max_t, c)
        self.h = nn.ModuleList(Block(c, nh) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, 768, 12, 50304, 1024)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(0, 50257, (a.batch, a.seq))
    tgt = torch.randint(0, 50257, (a.batch, a.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        model(idx, tgt).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up
    best = float("inf")
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    n = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} CPU, {a.threads} threads: GPT-2 {a.layers} layers, "
          f"{n} parameters, B={a.batch} T={a.seq}: {best * 1e3:.1f} ms/step (best of {a.steps})")


if __name__ == "__main__":
    main()
