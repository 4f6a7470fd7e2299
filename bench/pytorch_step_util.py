"""What bench/pytorch_<family>_step.py share: the command line bench/step_bench.cc passes, the
train step (forward, backward, global-norm clipping at 1.0, AdamW), and its timing, reported
as one JSON line for the C++ bench to read:

    {"torch": "1.13.0", "threads": 2, "precision": "fp32", "params": N, "steps": 5,
     "step_ms_median": ..., "step_ms_best": ..., "step_ms": [...]}

bf16 is PyTorch's mixed precision on the CPU: fp32 parameters and AdamW, the forward under
torch.autocast("cpu", torch.bfloat16) (matmuls in bf16, reductions such as the loss in fp32).
"""
import argparse
import contextlib
import json
import statistics
import time

import torch


def parse_args(doc):
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up step")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    return a


def time_train_step(model, vocab, a):
    """Times a.steps train steps of `model` (which returns the mean loss of idx, targets) on
    random tokens below `vocab`, after a warm-up step, and prints the JSON line."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(0, vocab, (a.batch, a.seq))
    tgt = torch.randint(0, vocab, (a.batch, a.seq))
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.precision == "bf16" \
        else contextlib.nullcontext

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up: allocations, AdamW state
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "torch": torch.__version__, "threads": torch.get_num_threads(), "precision": a.precision,
        "params": sum(p.numel() for p in model.parameters()), "steps": a.steps,
        "step_ms_median": statistics.median(ms), "step_ms_best": min(ms),
        "step_ms": [round(x, 1) for x in ms]}))
