#!/usr/bin/env python3
"""PyTorch CPU reference for bench/adam_bench: torch.optim.AdamW steps over one flat fp32
parameter of N elements (p, grad, exp_avg, exp_avg_sq), timed as adam_bench times ztrain's
(best of R after a warm-up). Debian's python3-torch package provides torch.

Each implementation this torch has on the CPU runs: the single-tensor loop (the CPU default,
foreach=False), foreach=True, and fused=True where torch >= 2.4 offers it on the CPU. The last
line is for adam_bench to parse:

    pytorch_adamw: version=1.13.0 threads=2 params=N single=SECONDS foreach=SECONDS fused=nan

    /usr/bin/python3 bench/pytorch_adamw.py [--params N] [--reps R] [--threads T]
"""
import argparse
import inspect
import math
import time

import torch


def best_step_seconds(n, reps, **impl):
    # The same state as adam_bench: small varied parameters and gradients, zero moments.
    p = torch.empty(n).uniform_(-0.01, 0.01).requires_grad_()
    p.grad = torch.empty(n).uniform_(-5e-4, 5e-4)
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, **impl)
    opt.step()  # warm-up: creates exp_avg and exp_avg_sq, first touch
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--params", type=int, default=124475904)
    a.add_argument("--reps", type=int, default=10)
    a.add_argument("--threads", type=int, default=2)
    args = a.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    impls = {"single": {"foreach": False}, "foreach": {"foreach": True}}
    if "fused" in inspect.signature(torch.optim.AdamW.__init__).parameters:
        impls["fused"] = {"fused": True}
    seconds = {}
    for name, impl in impls.items():
        try:
            seconds[name] = best_step_seconds(args.params, args.reps, **impl)
        except (RuntimeError, ValueError):  # e.g. fused=True not supported on the CPU here
            seconds[name] = math.nan
        print(f"PyTorch {torch.__version__} AdamW {name}: {seconds[name] * 1e3:.1f} ms/step, "
              f"{args.params / seconds[name] / 1e6:.1f} M params/s", flush=True)
    fields = " ".join(f"{k}={seconds.get(k, math.nan):.6g}" for k in ("single", "foreach", "fused"))
    print(f"pytorch_adamw: version={torch.__version__} threads={torch.get_num_threads()} "
          f"params={args.params} {fields}", flush=True)


if __name__ == "__main__":
    main()
