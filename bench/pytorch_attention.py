"""The reference bench/attention_bench.cc times in the same run: causal attention forward and
backward in PyTorch on the CPU, at the shape the bench gives (B, T, query heads, KV heads,
head size, --dtype fp32 or bf16), written as transformers' eager attention computes it (the
explicit T x T softmax; grouped-query heads by repeating each KV head, as repeat_kv does).
PyTorch 1.13, Debian's, has no scaled_dot_product_attention, so this is the attention its users
run on a CPU. One JSON line on stdout:

    {"torch": "1.13.0", "threads": 2, "seq": T, "dtype": "fp32", "fwd_ms": ..., "bwd_ms": ...}

fwd_ms and bwd_ms are medians over --reps timed runs after one warm-up.
"""
import argparse
import json
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    b, t, h, kv, d = a.batch, a.seq, a.heads, a.kv_heads, a.head_size
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    q = torch.randn(b, h, t, d, dtype=dt, requires_grad=True)
    k = torch.randn(b, kv, t, d, dtype=dt, requires_grad=True)
    v = torch.randn(b, kv, t, d, dtype=dt, requires_grad=True)
    mask = torch.full((t, t), float("-inf"), dtype=dt).triu(1)
    dout = torch.randn(b, h, t, d, dtype=dt)

    def forward():
        kk = k.repeat_interleave(h // kv, dim=1)
        vv = v.repeat_interleave(h // kv, dim=1)
        scores = torch.matmul(q, kk.transpose(2, 3)) / (d ** 0.5) + mask
        return torch.matmul(torch.softmax(scores, dim=-1), vv)

    fwd, bwd = [], []
    for rep in range(a.reps + 1):
        start = time.perf_counter()
        out = forward()
        mid = time.perf_counter()
        out.backward(dout)
        end = time.perf_counter()
        q.grad = k.grad = v.grad = None
        del out
        if rep > 0:
            fwd.append((mid - start) * 1e3)
            bwd.append((end - mid) * 1e3)
    print(json.dumps({"torch": torch.__version__, "threads": a.threads, "seq": t,
                      "dtype": a.dtype,
                      "fwd_ms": statistics.median(fwd), "bwd_ms": statistics.median(bwd)}))


if __name__ == "__main__":
    main()
