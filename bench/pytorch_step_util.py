"""What bench/pytorch_<family>_step.py share: the command line bench/step_bench.cc passes, the
train step (forward, backward, global-norm clipping at 1.0, AdamW), and its timing, reported
as one JSON line for the C++ bench to read:

    {"torch": "1.13.0", "threads": 2, "precision": "fp32", "params": N, "steps": 5,
     "step_ms_median": ..., "step_ms_best": ..., "step_ms": [...]}

bf16 is PyTorch's mixed precision: fp32 parameters and AdamW, the forward under
torch.autocast(device, torch.bfloat16) (matmuls in bf16, reductions such as the loss in fp32).
--device cuda runs the same step on the GPU (bench/device_check.sh: the reference of ztrain's
CUDA step in the same run), timed between device synchronisations; --attention sdpa uses
F.scaled_dot_product_attention (flash attention on a GPU) instead of the explicit T x T
softmax.
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
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--attention", choices=("explicit", "sdpa"), default="explicit")
    a = p.parse_args()
    if a.attention == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        p.error(f"--attention sdpa needs PyTorch 2.0 or later; this is {torch.__version__}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this PyTorch sees no CUDA device")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    return a


def time_train_step(model, vocab, a):
    """Times a.steps train steps of `model` (which returns the mean loss of idx, targets) on
    random tokens below `vocab`, after a warm-up step, and prints the JSON line."""
    model = model.to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(0, vocab, (a.batch, a.seq), device=a.device)
    tgt = torch.randint(0, vocab, (a.batch, a.seq), device=a.device)
    autocast = (lambda: torch.autocast(a.device, dtype=torch.bfloat16)) \
        if a.precision == "bf16" else contextlib.nullcontext
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up: allocations, AdamW state
    sync()
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "torch": torch.__version__, "threads": torch.get_num_threads(), "precision": a.precision,
        "device": a.device, "attention": a.attention,
        "params": sum(p.numel() for p in model.parameters()), "steps": a.steps,
        "step_ms_median": statistics.median(ms), "step_ms_best": min(ms),
        "step_ms": [round(x, 1) for x in ms]}))
