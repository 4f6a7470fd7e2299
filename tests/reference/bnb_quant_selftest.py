#!/usr/bin/env python3
"""Self-test of tests/reference/bnb_quant.py against hand-computed values and independent
formulations (brute-force nearest code, bitsandbytes' torch "default" backend formulas written out
here), in ways that fail when the reference is wrong.

  nf4_points      codebook points map to their codes and dequantize exactly; fp32 midpoints go to
                  the lower code, the next fp32 above to the upper; the tree's literals equal the
                  fp32 midpoints; hand-computed bytes with the first element in the high nibble;
                  odd lengths pad the low nibble with code(0)
  zero_blocks     absmax 0 for an all-zero block, NF4 code 0 / FP4 code 0 (the kernel's NaN path),
                  dequantized to zeros, neighbouring blocks unaffected; short last blocks
  nearest         NF4 = the nearest code with ties to the lower one (brute force) and = the default
                  backend's bucketize for every finite input; dequantization error <= half the
                  largest codebook gap * absmax
  fp4             sign bit, magnitudes at the LUT points, ties to the smaller magnitude for both
                  signs, the windows where the kernel's literals are not midpoints
  dynamic_map     256 sorted values, -0.99296874 .. 1, 0 present; within one ulp of bitsandbytes'
                  formula with this torch's linspace; linspace_f32 equals exact rounding; the 8-bit
                  binary search = brute-force nearest (ties aside)
  double_quant    hand-computed absmax codes; the round trip error within the documented bound, and
                  the bound is not vacuous (tight within a factor 4 on random data)
  int8            hand-computed rows (half-to-even rounding, fp16 conversion, zero rows), the
                  dequantization formula, error <= row_absmax / 254 + fp16 rounding
  cli             the files `quantize` and `dynamic-map` write: names, dtypes, shapes, values

Exit status: 0 all passed, 1 a check failed, 77 torch is not importable (a CTest SKIP).
"""
import contextlib
import io
import math
import os
import struct
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
import bnb_quant as bq  # noqa: E402
import safetensors_io as st  # noqa: E402

F32 = torch.float32


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def next_up(v):
    """The next fp32 above v (v an fp32 value, finite, not -0)."""
    b = struct.unpack("<i", struct.pack("<f", v))[0]
    b = b + 1 if v >= 0 else b - 1
    return struct.unpack("<f", struct.pack("<i", b))[0]


def next_down(v):
    return -next_up(-v)


NF4 = [f32(v) for v in bq.NF4_CODE]
FP4_VALUES = [f32(v) for v in bq.FP4_LUT]


def codes_of(x, qt="nf4", bs=64):
    x = torch.tensor(x, dtype=F32) if not torch.is_tensor(x) else x
    packed, absmax = bq.quantize_4bit(x, qt, bs)
    return bq.unpack_4bit(packed, x.numel()).tolist(), packed, absmax


def test_nf4_points():
    # absmax 1 (the block holds 1.0), so the scaled value is x itself (x * 1.0f exact)
    codes, _, absmax = codes_of(NF4)
    check(codes == list(range(16)), f"codebook points give codes {codes}")
    check(absmax.tolist() == [1.0], f"absmax {absmax.tolist()}")
    deq = bq.dequantize_4bit(*bq.quantize_4bit(torch.tensor(NF4), "nf4"), (16,), "nf4")
    check(deq.tolist() == NF4, "codebook points do not dequantize to themselves")
    # the tree's literals are the fp32 midpoints of the codebook, bit for bit
    mids = [f32((NF4[i] + NF4[i + 1]) / 2) for i in range(15)]
    t = torch.tensor(NF4, dtype=F32)
    mids32 = ((t[:-1] + t[1:]) / 2).tolist()
    check(mids == mids32 == bq.NF4_THRESHOLDS, "NF4 tree thresholds are not the fp32 midpoints")
    for i, m in enumerate(mids):
        got, _, _ = codes_of([1.0, m, next_up(m), next_down(m)])
        check(got[1:] == [i, i + 1, i], f"midpoint {i} ({m}): codes {got[1:]}, want {[i, i + 1, i]}")
    # hand-computed: absmax 2, scaled [1, -0.1, 0.25, 0.6, -0.7, 0.0, -1, 0.04]
    x = [2.0, -0.2, 0.5, 1.2, -1.4, 0.0, -2.0, 0.08]
    got, packed, absmax = codes_of(x)
    # 1 -> 15; -0.1 in (-0.1379, -0.0455] -> 6; 0.25 in (0.2035, 0.2920] -> 10; 0.6 in
    # (0.5017, 0.6428] -> 13; -0.7 in (-0.8481, -0.6106] -> 1; 0 -> 7; -1 -> 0; 0.04 > 0.0398 -> 8
    want = [15, 6, 10, 13, 1, 7, 0, 8]
    check(got == want, f"hand-computed NF4 codes {got}, want {want}")
    check(packed.tolist() == [0xF6, 0xAD, 0x17, 0x08], f"packed bytes {[hex(b) for b in packed.tolist()]}: "
          "the first element of each pair must be the HIGH nibble")
    check(absmax.tolist() == [2.0], "absmax of the block")
    deq = bq.dequantize_4bit(packed, absmax, (8,), "nf4").tolist()
    check(deq == [f32(NF4[c] * 2.0) for c in want], f"dequantized {deq}")
    # odd length: the pad nibble is code(0) = 7 for NF4, 0 for FP4
    _, packed, _ = codes_of([0.5, -1.0, 0.25])
    # NF4: 0.5 in (0.4407, 0.5017] -> 12, -1 -> 0, 0.25 -> 10, pad code(0) = 7
    check(packed.tolist() == [0xC0, 0xA7], f"odd length NF4 bytes {[hex(b) for b in packed.tolist()]}")
    _, packed, _ = codes_of([0.5, -1.0, 0.25], "fp4")
    # FP4: 0.5 -> 0b0101, -1 -> 0b1000 | 0b011, 0.25 -> 0b0111, pad code(0) = 0
    check(packed.tolist() == [0x5B, 0x70], f"odd length FP4 bytes {[hex(b) for b in packed.tolist()]}")


def test_zero_blocks():
    x = torch.zeros(64 * 3 + 5)
    x[64:128] = torch.linspace(-1, 2, 64)
    x[192:] = torch.tensor([0.0, 3.0, -1.5, 0.0, 0.75])
    for qt in ("nf4", "fp4"):
        codes, packed, absmax = codes_of(x, qt)
        check(absmax.tolist() == [0.0, 2.0, 0.0, 3.0], f"{qt}: absmax {absmax.tolist()}")
        check(packed.numel() == (x.numel() + 1) // 2, f"{qt}: {packed.numel()} bytes")
        check(codes[:64] == [0] * 64 and codes[128:192] == [0] * 64,
              f"{qt}: zero blocks give codes {set(codes[:64])}, want the kernel's NaN path (0)")
        deq = bq.dequantize_4bit(packed, absmax, tuple(x.shape), qt)
        check(deq[:64].abs().max() == 0 and deq[128:192].abs().max() == 0, f"{qt}: zero block dequantizes non-zero")
        if qt == "nf4":
            check(all(math.copysign(1, v) < 0 for v in deq[:64].tolist()), "NF4 zero block is not -0.0 (-1 * 0)")
        # the short last block [0, 3, -1.5, 0, 0.75]: absmax 3, 0 -> code(0), pad nibble code(0)
        z = 7 if qt == "nf4" else 0
        check(codes[192] == z and codes[195] == z, f"{qt}: zeros in a live block give {codes[192]}")
        check(packed[-1].item() & 0xF == z, f"{qt}: pad nibble {packed[-1].item() & 0xF}")
        check(deq[193].item() == 3.0, f"{qt}: last block {deq[192:].tolist()}")
        check(codes[194] == (2 if qt == "nf4" else 0b1101), f"{qt}: -1.5 / 3 gives code {codes[194]}")
    # a tensor shorter than one block
    codes, packed, absmax = codes_of([0.0, 0.0, 0.0])
    check(absmax.tolist() == [0.0] and codes == [0, 0, 0] and packed.tolist() == [0x00, 0x00],
          f"all-zero short tensor: {codes} {packed.tolist()} {absmax.tolist()}")


def default_backend_nf4(x, bs=64):
    """bitsandbytes/backends/default/ops.py quantize_4bit, written out (nf4): clamp(x * (1/absmax))
    bucketized against the fp32 midpoints, packed (q[::2] << 4) | q[1::2]."""
    code = torch.tensor(bq.NF4_CODE, dtype=F32)
    bounds = (code[:-1] + code[1:]) / 2
    flat = x.reshape(-1).float()
    n = flat.numel()
    rem = n % bs
    full = n - rem
    A = flat[:full].reshape(-1, bs)
    absmax = A.abs().max(dim=-1)[0]
    scaled = torch.clamp(A * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if rem:
        am = flat[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / am, -1, 1)])
    if scaled.numel() % 2:
        scaled = torch.nn.functional.pad(scaled, (0, 1))
    q = torch.bucketize(scaled, bounds, out_int32=True).to(torch.uint8)
    return (q[::2] << 4) | q[1::2], absmax


def test_nearest():
    g = torch.Generator().manual_seed(0)
    for shape, bs in (((64, 96), 64), ((33, 7), 32), ((1000,), 256), ((3, 128), 4096)):
        x = torch.randn(shape, generator=g) * 0.05
        x.view(-1)[::17] *= 20  # outliers
        packed, absmax = bq.quantize_4bit(x, "nf4", bs)
        if x.numel() % bs == 0:  # the default backend divides the short last block, not multiplies
            dp, da = default_backend_nf4(x, bs)
            check(torch.equal(dp, packed) and torch.equal(da, absmax),
                  f"NF4 {tuple(shape)} bs {bs}: the decision tree differs from bucketize on fp32 midpoints")
        n = x.numel()
        codes = bq.unpack_4bit(packed, n).long()
        blk = torch.arange(n) // bs
        s = x.reshape(-1) * (1.0 / absmax)[blk]
        table = torch.tensor(bq.NF4_CODE, dtype=F32)
        dist = (s[:, None] - table[None, :]).abs()
        best = dist.min(dim=1).values
        check(bool((dist[torch.arange(n), codes] == best).all()), "an NF4 code is not the nearest")
        # ties go to the lower code: the chosen code is the first minimiser
        check(torch.equal(codes, dist.argmin(dim=1)) or
              bool(((dist == best[:, None]).sum(1) > 1)[codes != dist.argmin(dim=1)].all()),
              "a non-tie NF4 code is not the first minimiser")
        deq = bq.dequantize_4bit(packed, absmax, tuple(x.shape), "nf4", bs).reshape(-1)
        half_gap = max(NF4[i + 1] - NF4[i] for i in range(15)) / 2
        err = (deq - x.reshape(-1)).abs() - (half_gap * absmax[blk] * (1 + 2 ** -20))
        check(float(err.max()) <= 0, f"NF4 error above half the largest gap * absmax by {float(err.max())}")
        check(torch.equal(deq, (table[codes] * absmax[blk])), "dequantization is not LUT[code] * absmax")
        # FP4: nearest except inside the kernel's literal windows (at most 4e-7 away)
        packed, absmax = bq.quantize_4bit(x, "fp4", bs)
        codes = bq.unpack_4bit(packed, n).long()
        s = x.reshape(-1) * (1.0 / absmax)[blk]
        vals = bq.FP4_CODE_T
        dist = (s[:, None] - vals[None, :]).abs()
        excess = dist[torch.arange(n), codes] - dist.min(dim=1).values
        check(float(excess.max()) <= 4e-7, f"an FP4 code is {float(excess.max())} farther than the nearest")
        deq = bq.dequantize_4bit(packed, absmax, tuple(x.shape), "fp4", bs).reshape(-1)
        err = (deq - x.reshape(-1)).abs() - (1 / 6 + 1e-6) * absmax[blk]
        check(float(err.max()) <= 0, "FP4 error above half the largest gap (1/6) * absmax")


def test_fp4():
    # magnitudes at the LUT points, both signs; absmax 1 from a 1.0 in the block
    mags = FP4_VALUES
    for c, v in enumerate(mags):
        got, _, _ = codes_of([1.0, v, -v], "fp4")
        want_neg = c | 0b1000 if v != 0 else 0  # -0.0 is not < 0: sign bit clear
        check(got[1:] == [c, want_neg], f"FP4 magnitude code {c} ({v}): got {got[1:]}")
    got, _, _ = codes_of([1.0, -1e-9, -0.003], "fp4")
    check(got[1:] == [0b1000, 0b1001], f"tiny negatives: {got[1:]} (sign bit with magnitude 0 / 0.0052)")
    check(bq.dequantize_4bit(torch.tensor([0x08]), torch.tensor([1.0]), (2,), "fp4").tolist()[0] == 0.0 and
          math.copysign(1, bq.dequantize_4bit(torch.tensor([0x80]), torch.tensor([1.0]), (1,), "fp4").item()) < 0,
          "FP4 code 0b1000 is not -0.0")
    # thresholds: exactly on one goes to the smaller magnitude, for both signs; the next fp32 up goes up
    order = [0b000, 0b001, 0b110, 0b111, 0b100, 0b101, 0b010, 0b011]  # by magnitude
    for i, t in enumerate(bq.FP4_THRESHOLDS):
        got, _, _ = codes_of([1.0, t, next_up(t), -t, -next_up(t)], "fp4")
        want = [order[i], order[i + 1], order[i] | 8, order[i + 1] | 8]
        check(got[1:] == want, f"FP4 threshold {t}: codes {got[1:]}, want {want}")
    # the kernel's 0.583333f is below the midpoint of 0.5 and 0.6666667: in between, the kernel
    # picks 0.6666667 although 0.5 is nearer (the default backend would pick 0.5)
    lit, mid = f32(0.583333), f32((f32(0.5) + f32(0.66666667)) / 2)
    check(lit < mid, "the 0.583333 literal is not below the midpoint")
    x = next_up(lit)
    got, _, _ = codes_of([1.0, x], "fp4")
    check(got[1] == 0b010 and abs(x - 0.5) < abs(x - f32(0.66666667)),
          f"{x}: code {got[1]}; the kernel's tree gives 0b010 (0.667) though 0.5 is nearer")


def test_dynamic_map():
    m = bq.DYNAMIC_MAP
    check(m.numel() == 256 and m.dtype == F32, "map size / dtype")
    check(bool((m[1:] > m[:-1]).all()), "map not strictly increasing")
    check(m[0].item() == f32(-0.99296875) and m[-1].item() == 1.0 and 0.0 in m.tolist(),
          f"map ends {m[0].item()} {m[-1].item()}")
    check(m[127].item() == 0.0, f"map[127] = {m[127].item()}, not 0")
    # bitsandbytes' literal code with this torch's linspace: the same within two ulps (a linspace
    # point one ulp off moves a mean and its scaled value by up to two)
    lit = bq.create_dynamic_map(linspace=lambda a, b, k: torch.linspace(a, b, k, dtype=F32))
    bits = lambda t: torch.tensor([struct.unpack("<i", struct.pack("<f", v))[0] for v in t.tolist()])
    check(int((bits(lit) - bits(m)).abs().max()) <= 2, "map differs from bitsandbytes' formula by more than 2 ulps")
    # linspace_f32: exact rounding of start + j*step (checked against float64, which is exact here
    # when the double rounding cannot bite: compare only where the double is not an fp32 midpoint)
    for k in (2, 3, 5, 9, 17, 33, 65):
        got = bq.linspace_f32(0.1, 1, k).tolist()
        s, e = f32(0.1), 1.0
        step = f32(f32(e - s) / (k - 1))
        for j, v in enumerate(got):
            exact = s + step * j if j < k // 2 else e - step * (k - 1 - j)
            check(abs(v - exact) <= abs(next_up(abs(v)) - abs(v)) / 2, f"linspace_f32({k})[{j}] = {v} vs {exact}")
    gap = float((m[1:] - m[:-1]).max())
    check(gap == bq.DYNAMIC_MAP_MAX_GAP and abs(gap - 0.0140625) < 1e-6, f"largest gap {gap}")
    check(abs((m[0].item() + 1) - gap / 2) < 1e-6, "the -1 end is not G/2 from the smallest value")
    # the 8-bit binary search picks the nearest value (brute force), ties aside
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.rand(20000, generator=g) * 2 - 1, m, torch.tensor([-1.0, 1.0, 0.0, -0.0])])
    q = bq.dquantize_8bit(m, x).long()
    dist = (x[:, None] - m[None, :]).abs()
    best = dist.min(dim=1).values
    chosen = dist[torch.arange(x.numel()), q]
    check(bool((chosen == best).all()), f"8-bit code not nearest for {x[chosen != best][:5].tolist()}")
    check(torch.equal(q[20000:20256], torch.arange(256)), "map points do not map to their own codes")
    check(q[-4:].tolist() == [0, 255, 127, 127], f"-1, 1, 0, -0 give {q[-4:].tolist()}")
    # exactly on an fp32 midpoint: one of the two neighbours (which one depends on the search path)
    mids = (m[1:] + m[:-1]) / 2
    q = bq.dquantize_8bit(m, mids).long()
    check(bool(((q == torch.arange(255)) | (q == torch.arange(1, 256))).all()), "a midpoint maps elsewhere")


def test_double_quant():
    # hand-computed: absmax values with mean 0.5; y = absmax - 0.5 in one 256-block, scale 0.5,
    # z = y * 2 = [-1, 1, 0, 0]: codes 0 (-0.99296875, the nearest to -1), 255, 127, 127
    a = torch.tensor([0.0, 1.0, 0.5, 0.5])
    codes, scales, offset = bq.double_quantize(a)
    check(offset.tolist() == [0.5] and scales.tolist() == [0.5], f"offset {offset.tolist()} scales {scales.tolist()}")
    check(codes.tolist() == [0, 255, 127, 127], f"absmax codes {codes.tolist()}")
    back = bq.double_dequantize(codes, scales, offset).tolist()
    check(back == [f32(f32(-0.99296875) * 0.5 + 0.5), 1.0, 0.5, 0.5], f"dequantized absmax {back}")
    check(abs(back[0] - 0.0) <= bq.double_quant_bound(a, scales)[0], "hand case outside the bound")
    # random absmax vectors (as quantize_4bit produces them), several 256-blocks and a short one
    g = torch.Generator().manual_seed(2)
    for n, scale in ((1000, 0.05), (256, 1.0), (513, 3e-3), (7, 10.0)):
        x = torch.randn(n * 64, generator=g) * scale
        _, absmax = bq.quantize_4bit(x, "nf4", 64)
        codes, scales, offset = bq.double_quantize(absmax)
        check(codes.dtype == torch.uint8 and codes.numel() == absmax.numel(), "absmax codes shape")
        check(scales.numel() == (absmax.numel() + 255) // 256, f"{scales.numel()} scales for {absmax.numel()}")
        check(abs(offset.item() - sum(absmax.tolist()) / absmax.numel()) <= 1e-6 * offset.item(), "offset is not the mean")
        y = absmax - offset
        for b in range(scales.numel()):
            check(scales[b].item() == y[b * 256:(b + 1) * 256].abs().max().item(), f"scale {b} is not max |absmax - offset|")
        back = bq.double_dequantize(codes, scales, offset)
        err = (back.double() - absmax.double()).abs()
        bound = bq.double_quant_bound(absmax, scales)
        check(bool((err <= bound).all()), f"n {n}: double-quant error {float((err - bound).max())} over the bound")
        if n >= 256:
            check(float(err.max()) > 0.25 * float(bound.max()), f"n {n}: the bound is vacuous "
                  f"(max error {float(err.max())}, bound {float(bound.max())})")
        # the 4-bit dequantization with the double-quantized absmax
        parts = bq.quantize_tensor(x, "nf4", True, 64)
        packed, _ = bq.quantize_4bit(x, "nf4", 64)
        check(torch.equal(parts["codes"], packed), "double quant changed the 4-bit codes")
        want = bq.dequantize_4bit(packed, back, (x.numel(),), "nf4")
        check(torch.equal(parts["dequantized"], want), "dequantized is not LUT[code] * double-dequantized absmax")


def test_int8():
    x = torch.tensor([[127.0, -63.5, 0.5, 1.5, -2.5, 0.0],
                      [0.1, -0.2, 0.3, 0.0, 0.0, 0.0],
                      [0.0] * 6])
    codes, row_absmax = bq.quantize_int8(x)
    check(codes.dtype == torch.int8 and tuple(codes.shape) == (3, 6), "int8 codes dtype / shape")
    # row 0: scale 127 / 127 = 1, round half to even: -63.5 -> -64, 0.5 -> 0, 1.5 -> 2, -2.5 -> -2
    check(codes[0].tolist() == [127, -64, 0, 2, -2, 0], f"row 0 codes {codes[0].tolist()}")
    # row 1: fp16 first: 0.3 -> 0.2999267578125 = absmax; 0.1 -> 0.0999755859375
    h = [float(torch.tensor(v).half()) for v in (0.1, -0.2, 0.3)]
    check(row_absmax.tolist()[1] == h[2], f"row 1 absmax {row_absmax.tolist()[1]}, want fp16(0.3) = {h[2]}")
    sc = f32(127.0 / h[2])
    want = [round(f32(v * sc)) for v in h]  # Python round: half to even
    check(codes[1].tolist()[:3] == want, f"row 1 codes {codes[1].tolist()[:3]}, want {want}")
    check(codes[2].tolist() == [0] * 6 and row_absmax.tolist()[2] == 0.0, "zero row: codes / absmax")
    deq = bq.dequantize_int8(codes, row_absmax)
    for r in range(3):
        for c in range(6):
            w = f32(f32(codes[r, c].item() * row_absmax[r].item()) * f32(1 / 127))
            check(deq[r, c].item() == w, f"dequantized [{r},{c}] {deq[r, c].item()} vs {w}")
    check(f32(1 / 127) == bq.INT8_DEQUANT_SCALE, "7.874015718698502e-3 is not fp32(1/127)")
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 80, generator=g) * 0.02
    codes, row_absmax = bq.quantize_int8(w)
    check(int(codes.abs().max()) == 127 and bool((codes.abs().amax(1) == 127).all()), "each row's max is not +-127")
    deq = bq.dequantize_int8(codes, row_absmax)
    bound = row_absmax[:, None] / 254 * (1 + 1e-5) + (w - w.half().float()).abs()
    check(bool(((deq - w).abs() <= bound).all()), "int8 error above row_absmax / 254 + fp16 rounding")
    # 1-D and 3-D tensors: rows are everything but the last dimension
    c1, r1 = bq.quantize_int8(torch.tensor([1.0, -0.5]))
    check(c1.tolist() == [127, -64] and r1.tolist() == [1.0], f"1-D: {c1.tolist()} {r1.tolist()}")
    c3, r3 = bq.quantize_int8(torch.ones(2, 3, 4))
    check(tuple(c3.shape) == (2, 3, 4) and r3.numel() == 6, "3-D rows")
    try:
        bq.quantize_int8(torch.tensor([1e6, 1.0]))
    except bq.QuantError:
        pass
    else:
        raise Failure("an fp16-overflowing tensor was quantized to int8")


def test_cli(tmp):
    g = torch.Generator().manual_seed(4)
    src = {"w": torch.randn(8, 24, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16),
           "z": torch.zeros(3, 70)}
    inp = os.path.join(tmp, "x.safetensors")
    st.save(inp, src, {"format": "pt"})
    for qt, dq in (("nf4", False), ("nf4", True), ("fp4", True), ("fp4", False), ("int8", False)):
        out = os.path.join(tmp, f"{qt}{int(dq)}.safetensors")
        args = [sys.executable, os.path.join(HERE, "bnb_quant.py"), "quantize", "--in", inp, "--out", out,
                "--type", qt] + (["--double-quant"] if dq else [])
        if qt == "nf4" and not dq:
            args += ["--blocksize", "32"]
        if qt == "nf4" and not dq:  # once through a real subprocess, as the C++ tests will call it
            r = subprocess.run(args, capture_output=True, text=True)
            check(r.returncode == 0, f"quantize {qt} dq={dq}: {r.stderr}")
        else:
            check(bq.main([str(v) for v in args[2:]]) == 0, f"quantize {qt} dq={dq} failed")
        raw = st.raw_tensors(out)
        got, meta = st.load(out)
        check(meta["quant_type"] == qt and meta["double_quant"] == ("true" if dq else "false"), f"metadata {meta}")
        bs = 32 if (qt == "nf4" and not dq) else 64
        for name, t in src.items():
            n = t.numel()
            nb = -(-n // bs)
            if qt == "int8":
                rows = n // t.shape[-1]
                want = {"codes": ("I8", tuple(t.shape)), "row_absmax": ("F32", (rows,)),
                        "dequantized": ("F32", tuple(t.shape))}
                codes, ra = bq.quantize_int8(t.float())
                check(torch.equal(got[name + ".codes"], codes) and torch.equal(got[name + ".row_absmax"], ra),
                      f"int8 {name} values")
            else:
                want = {"codes": ("U8", ((n + 1) // 2,)), "dequantized": ("F32", tuple(t.shape))}
                if dq:
                    want.update({"absmax_codes": ("U8", (nb,)), "absmax_scales": ("F32", (-(-nb // 256),)),
                                 "absmax_offset": ("F32", (1,))})
                else:
                    want["absmax"] = ("F32", (nb,))
                packed, absmax = bq.quantize_4bit(t.float(), qt, bs)
                check(torch.equal(got[name + ".codes"], packed), f"{qt} {name}: codes differ")
                if not dq:
                    check(torch.equal(got[name + ".absmax"], absmax), f"{qt} {name}: absmax differs")
                    want_dq = bq.dequantize_4bit(packed, absmax, tuple(t.shape), qt, bs)
                    check(torch.equal(got[name + ".dequantized"], want_dq), f"{qt} {name}: dequantized")
                else:
                    back = bq.double_dequantize(got[name + ".absmax_codes"], got[name + ".absmax_scales"],
                                                got[name + ".absmax_offset"])
                    want_dq = bq.dequantize_4bit(packed, back, tuple(t.shape), qt, bs)
                    check(torch.equal(got[name + ".dequantized"], want_dq), f"{qt} {name}: dq dequantized")
            for suffix, (dt, shape) in want.items():
                key = f"{name}.{suffix}"
                check(key in raw, f"{qt}: {key} missing from {sorted(raw)}")
                check(raw[key][0] == dt and raw[key][1] == shape, f"{key}: {raw[key][:2]}, want {dt} {shape}")
            check(set(k for k in raw if k.startswith(name + ".")) == {f"{name}.{s}" for s in want},
                  f"{qt} {name}: extra tensors")
    out = os.path.join(tmp, "map.safetensors")
    check(bq.main(["dynamic-map", "--out", out]) == 0, "dynamic-map failed")
    check(torch.equal(st.load(out)[0]["dynamic_map"], bq.DYNAMIC_MAP), "dynamic-map file")
    for args, word in ((["--type", "int8", "--double-quant"], "--double-quant"),
                       (["--type", "nf4", "--blocksize", "48"], "48")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = bq.main(["quantize", "--in", inp, "--out", out] + args)
        check(rc == 2 and word in err.getvalue(), f"{args} was not refused: rc {rc} {err.getvalue()!r}")


TESTS = [test_nf4_points, test_zero_blocks, test_nearest, test_fp4, test_dynamic_map, test_double_quant,
         test_int8, test_cli]


def run(tests, tmp):
    failed = 0
    for test in tests:
        t0 = time.perf_counter()
        sub = os.path.join(tmp, test.__name__)
        os.makedirs(sub, exist_ok=True)
        try:
            test(sub) if test.__code__.co_argcount else test()
            status = "ok"
        except Failure as e:
            failed += 1
            status = f"FAILED: {e}"
        except Exception:
            failed += 1
            status = "FAILED with an exception:\n" + traceback.format_exc()
        print(f"{test.__name__:32s} {time.perf_counter() - t0:6.2f}s  {status}", flush=True)
    return failed


def main():
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bnb_quant_selftest.") as tmp:
        failed = run(TESTS, tmp)
    print(f"{len(TESTS) - failed}/{len(TESTS)} passed in {time.perf_counter() - t_all:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
