#!/usr/bin/env python3
"""bitsandbytes' weight quantization (NF4 / FP4 4-bit, their double quantization, and LLM.int8's
int8 weights) in plain torch, fp32 math, bitwise reproducible, for ztrain's tests.

Written from bitsandbytes' own definitions (github.com/bitsandbytes-foundation/bitsandbytes, the
snapshot read was commit 95f9af3, Aug 2026), not from ztrain's code:

  bitsandbytes/functional.py   quantize_4bit, dequantize_4bit, get_4bit_type, quantize_blockwise,
                               dequantize_blockwise, create_dynamic_map, create_normal_map,
                               int8_vectorwise_quant, int8_vectorwise_dequant
  csrc/kernels.cu              kQuantizeBlockwise (absmax, 1/absmax, the pair packing),
                               dQuantizeNF4 / dQuantizeFP4 (decision trees and their thresholds),
                               nf4_dequantization_lut / fp4_dequantization_lut + dDequantizeFP4Tree,
                               dQuantize<0> (8-bit binary search + midpoint rounding),
                               kDequantizeBlockwise, kInt8VectorQuant
  bitsandbytes/backends/default/ops.py, backends/cpu/ops.py, csrc/cpu_ops.cpp   the torch / CPU
                               paths, whose differences from the CUDA kernels are listed below
  bitsandbytes/nn/modules.py   Int8Params._quantize (weights go to fp16 before int8 quantization)

4-bit (quantize_4bit, kQuantizeBlockwise with DATA_TYPE NF4 / FP4)
  The tensor is flattened row-major and cut into blocks of `blocksize` (default 64; bitsandbytes
  accepts 32 .. 4096, powers of two) consecutive elements; the last block may be short.
    absmax_b = max |x| over the block's real elements (fp32)
    inv_b    = 1.0f / absmax_b                      (fp32; +inf for an all-zero block)
    s        = fp32(x) * inv_b                      (fp32 multiply, not a division)
    code     = the kernel's decision tree on s (below)
  Two codes per byte, the FIRST element of each pair in the HIGH nibble:
    byte[j] = code(x[2j]) << 4 | code(x[2j+1])       (kernels.cu: qvals[j] = dQuantizeNF4(vals[2j]) << 4;
                                                      qvals[j] |= dQuantizeNF4(vals[2j+1]); the default
                                                      backend packs (q[::2] << 4) | q[1::2] likewise)
  An odd element count pads the last low nibble with the code of 0.0 * inv_b (the kernel loads 0 for
  the missing element): NF4 0b0111, FP4 0b0000.
  Dequantize (kDequantizeBlockwise): value = LUT[code] * absmax_b in fp32.

  NF4 tree (dQuantizeNF4): 15 fp32 thresholds t_0 < ... < t_14, code = #{i : s > t_i}, i.e. a value
  exactly on a threshold goes to the LOWER code. The thresholds are the kernel's float literals
    -0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
    -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
    0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
    0.5016634166240692, 0.6427869200706482, 0.8614784181118011
  and, rounded to fp32, they equal bit for bit the fp32 midpoints (c_i + c_{i+1}) / 2 of the NF4
  codebook (checked by the self-test), so the tree is "nearest code, ties to the lower code".
  NF4 codebook (code 0..15): -1, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
  -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0, 0.07958029955625534,
  0.16093020141124725, 0.24611230194568634, 0.33791524171829224, 0.44070982933044434,
  0.5626170039176941, 0.7229568362236023, 1.

  FP4 tree (dQuantizeFP4): sign bit 0b1000 when s < 0, then on |s| the thresholds (fp32 literals)
  0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333 pick the
  magnitude code 0b000 (0), 0b001 (0.005208333333), 0b110 (0.16666667), 0b111 (0.25),
  0b100 (0.33333333), 0b101 (0.5), 0b010 (0.66666667), 0b011 (1), |s| exactly on a threshold going
  to the SMALLER magnitude. Unlike NF4, five of these literals are NOT the fp32 midpoints of the
  FP4 values (e.g. 0.583333f = 0.58333302 against the midpoint 0.58333337), so in those narrow
  windows the kernel does not pick the nearest value; this reference follows the kernel.
  FP4 dequantization: (fp4_lut[code & 7] * (1 - 2 * (code >> 3))) * absmax (code 0b1000 is -0.0).

  Where the CPU / default (torch) backend differs from the CUDA kernel (bitsandbytes has no C++
  CPU 4-bit quantizer; backends/default/ops.py quantize_4bit is used): it clamps s to [-1, 1] and
  buckets with torch.bucketize against the fp32 midpoints of the sorted codebook. For NF4 that is
  the same code for every finite s; for FP4 it differs in the windows above and at negative ties
  (bucketize sends s = -t to the larger magnitude). An all-zero block: CUDA computes 0 * inf = NaN,
  every comparison is false, and the block gets code 0 (NF4: the -1.0 code; FP4: +0); the default
  backend divides by max(absmax, 1e-38) and gets code 0b0111 (NF4) / 0 (FP4). Both store absmax 0,
  so the dequantized block is 0 either way (-0.0 for NF4 on CUDA). This reference follows CUDA
  (NF4 zero blocks give code 0 and dequantize to -0.0). Also CUDA is built with --use_fast_math,
  so on the GPU 1.0f/absmax is the approximate reciprocal (within 1 ulp); this reference, like the
  CPU paths, uses the correctly rounded fp32 division.

Double quantization (quantize_4bit with compress_statistics=True; also called "nested")
    offset   = mean(absmax)        bitsandbytes takes torch's fp32 mean on the device, whose
                                   summation order is the implementation's; this reference takes
                                   the float64 mean of the fp32 absmax values rounded to fp32
    y        = absmax - offset     (fp32)
    (absmax_codes, absmax_scales) = quantize_blockwise(y, code=dynamic map, blocksize=256):
               blocks of 256 of y, scale_b = max |y| (fp32), z = y * (1.0f / scale_b), and the 8-bit
               code from dQuantize<0>: a 7-step binary search over the sorted 256-entry map from
               pivot 127, then rounding to the nearer neighbour by the fp32 midpoint
               (lower + val) * 0.5f / (upper + val) * 0.5f; a value exactly on a midpoint goes to
               the code the search stopped on (this reference runs that search literally).
               An all-zero block of y gives NaN, the search ends on code 0, and scale 0.
  Dequantize (dequantize_4bit with a nested state):
    absmax' = dynamic_map[absmax_codes] * scale_b + offset    (fp32: the product, then the sum)
  The dynamic map (create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)): for
  i = 0..6, k = 2^i + 1 points b = linspace(0.1, 1, k) in fp32, means m = (b[:-1] + b[1:]) / 2 (fp32),
  values +-fp32(10^(i-6)) * m; plus 0 and 1.0; sorted: 256 values from -0.99296874 to 1.0 (there
  is no -1). torch.linspace's last bit depends on the torch build (torch 1.13 here differs from the
  formula below in 42 of the 256 entries, by one ulp), so this reference pins it: point j of
  linspace(start, end, k) = fp32(start + j * step) for j < k // 2 and fp32(end - (k - 1 - j) * step)
  otherwise, each computed exactly and rounded once (torch's serial CPU linspace kernel with a fused
  multiply-add), start = fp32(0.1), step = fp32(fp32(1 - start) / (k - 1)). `bnb_quant.py
  dynamic-map` writes the table.
  Error bound of the double-quantized absmax: let G = the largest gap between neighbouring values
  of the dynamic map, G = 0.0140625238 (between the i = 6 means; the gap from -1 to the smallest
  value, -0.99296874, is G / 2 too), and s_b the scale of the 256-block holding absmax_i. Then
      |absmax'_i - absmax_i| <= (G / 2) * s_b + 2^-22 * (s_b + |absmax_i|)
  (G / 2 * s_b from rounding z to its nearest map value, |z| <= 1; the second term covers the fp32
  roundings of y, z, the product and the sum). s_b <= max(absmax) - min(absmax) over the whole
  tensor, so the error is at most ~0.7% of the spread of the absmax values.

INT8 (LLM.int8 weights of Linear8bitLt: Int8Params._quantize -> int8_vectorwise_quant)
  The weight is first converted to fp16 (Int8Params does B.to(torch.float16); this reference
  refuses a tensor that overflows fp16), viewed as rows x cols with cols = the last dimension
  (rows = out_features of a Linear weight), and quantized vector-wise per row:
    row_absmax_r = max_c |x16[r, c]|                     (fp32; bitsandbytes' SCB)
    code[r, c]   = round_half_even(fp32(x16[r, c]) * fp32(127.0 / row_absmax_r))   (int8, |code| <= 127)
  (the default op's formula: the scale is one fp32 division, then a multiply; kInt8VectorQuant does
  the same with __fdividef and __float2int_rn). An all-zero row has row_absmax 0 and codes 0 (NaN
  converts to 0 on CUDA; the torch op has no guard). Dequantize (int8_vectorwise_dequant):
    x' = (fp32(code) * row_absmax_r) * 7.874015718698502e-3        (= fp32(1/127); fp32 products)
  Outliers: int8_vectorwise_quant(A, threshold) can hold back columns with |A| >= threshold, but
  Int8Params quantizes weights with the default threshold 0.0, so bitsandbytes keeps NO weight
  columns in 16 bits; llm_int8_threshold (6.0) applies to the ACTIVATIONS at matmul time
  (MatMul8bitLt finds activation columns with outliers and multiplies them in fp16 against the
  int8-DEQUANTIZED weight columns). This reference quantizes weights with threshold 0 exactly as
  bitsandbytes stores them; hf_llama.py --quant int8 then computes x @ x'^T in fp32 with the
  dequantized weights, which is NOT Linear8bitLt's int8 x int8 matmul (bitsandbytes also
  quantizes the activations row-wise to int8): it is the weight-only part of LLM.int8.

CLI (always /usr/bin/python3):

  bnb_quant.py quantize --in X.safetensors --out Q.safetensors --type {nf4,fp4,int8}
                        [--double-quant] [--blocksize 64]
      Quantizes every tensor of X (any float dtype, upcast to fp32; int8: then to fp16). For each
      tensor NAME with n elements, nb = ceil(n / blocksize) blocks:
        nf4 / fp4:   NAME.codes         U8  [ceil(n / 2)]   packed, first element in the high nibble
                                            (bitsandbytes' Params4bit holds the same bytes as
                                            [ceil(n / 2), 1])
                     NAME.absmax        F32 [nb]            (without --double-quant)
                     NAME.absmax_codes  U8  [nb]            (with --double-quant)
                     NAME.absmax_scales F32 [ceil(nb / 256)]
                     NAME.absmax_offset F32 [1]
                     NAME.dequantized   F32 shape of NAME   what dequantize_4bit returns (fp32)
        int8:        NAME.codes         I8  shape of NAME   (safetensors dtype I8, i.e. int8)
                     NAME.row_absmax    F32 [rows]          rows = n / last dim (1 for 0-d / 1-D)
                     NAME.dequantized   F32 shape of NAME
      --double-quant is refused with int8; --blocksize is ignored by int8 (one scale per row).
      The header's __metadata__ holds {"format": "pt", "quant_type", "blocksize", "double_quant"}.

  bnb_quant.py dynamic-map --out MAP.safetensors
      "dynamic_map" F32 [256], the map described above (sorted, index = 8-bit code).

Exit status 0, or 2 with a message on stderr.
"""
import argparse
import os
import sys
from fractions import Fraction

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

F32 = torch.float32

# kernels.cu nf4_dequantization_lut (= functional.get_4bit_type("nf4")), code 0..15.
NF4_CODE = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]
# kernels.cu fp4_dequantization_lut, indexed by the 3 magnitude bits.
FP4_LUT = [0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25]

NF4_LUT_T = torch.tensor(NF4_CODE, dtype=F32)
FP4_LUT_T = torch.tensor(FP4_LUT, dtype=F32)
# code -> value for FP4 (kernels.cu dDequantizeFP4Tree: lut[code & 7] * (1 - 2 * sign bit)).
FP4_CODE_T = torch.tensor([FP4_LUT[c & 7] for c in range(16)], dtype=F32) * \
    torch.tensor([1.0 - 2 * ((c & 0b1000) >> 3) for c in range(16)], dtype=F32)


def _c(v):
    """A C float literal: the fp32 rounding of v, as a 0-d tensor."""
    return torch.tensor(v, dtype=F32)


# dQuantizeNF4's tree, node = (threshold, code or node when x > t, code or node otherwise).
NF4_TREE = (
    0.03979014977812767,
    (0.3893125355243683,
     (0.6427869200706482, (0.8614784181118011, 0b1111, 0b1110), (0.5016634166240692, 0b1101, 0b1100)),
     (0.2035212516784668, (0.2920137718319893, 0b1011, 0b1010), (0.1202552504837513, 0b1001, 0b1000))),
    (-0.33967943489551544,
     (-0.13791173323988914, (-0.045525018125772476, 0b0111, 0b0110), (-0.23460740596055984, 0b0101, 0b0100)),
     (-0.6106329262256622, (-0.4599952697753906, 0b0011, 0b0010), (-0.8480964004993439, 0b0001, 0b0000))),
)
# dQuantizeFP4's tree on |x| (the sign bit is added separately).
FP4_TREE = (
    0.29166667,
    (0.583333, (0.8333333, 0b0011, 0b0010), (0.4166667, 0b101, 0b100)),
    (0.0859375, (0.20833333, 0b0111, 0b0110), (0.00260417, 0b0001, 0b0000)),
)


def _tree_thresholds(node):
    if isinstance(node, int):
        return []
    t, hi, lo = node
    return _tree_thresholds(lo) + [t] + _tree_thresholds(hi)


NF4_THRESHOLDS = [_c(t).item() for t in _tree_thresholds(NF4_TREE)]
FP4_THRESHOLDS = [_c(t).item() for t in _tree_thresholds(FP4_TREE)]


def _eval_tree(node, x):
    """The decision tree evaluated literally (fp32 compares x > fp32(t)); NaN takes every 'else'."""
    if isinstance(node, int):
        return torch.full(x.shape, node, dtype=torch.uint8)
    t, hi, lo = node
    return torch.where(x > _c(t), _eval_tree(hi, x), _eval_tree(lo, x))


def nf4_code(s):
    """dQuantizeNF4 on an fp32 tensor of scaled values."""
    return _eval_tree(NF4_TREE, s.to(F32))


def fp4_code(s):
    """dQuantizeFP4: sign = x < 0 ? 0b1000 : 0; magnitude from the tree on fabsf(x)."""
    s = s.to(F32)
    sign = torch.where(s < 0, 0b1000, 0).to(torch.uint8)
    return _eval_tree(FP4_TREE, s.abs()) + sign


QUANT_TYPES = ("nf4", "fp4")
BLOCKSIZES_4BIT = (32, 64, 128, 256, 512, 1024, 2048, 4096)


class QuantError(ValueError):
    pass


def _check_finite(x, what):
    if not bool(torch.isfinite(x).all()):
        raise QuantError(f"{what}: holds inf or NaN; bitsandbytes' absmax would be inf/NaN")


def _blocks(flat, blocksize):
    """(padded [nb, blocksize] fp32 view with zero padding, nb)."""
    n = flat.numel()
    nb = (n + blocksize - 1) // blocksize
    padded = torch.zeros(nb * blocksize, dtype=F32)
    padded[:n] = flat
    return padded.view(nb, blocksize), nb


def block_absmax_inv(blocks):
    """absmax per block (max |x|, padding zeros never raise it) and 1.0f / absmax (inf for 0)."""
    absmax = blocks.abs().amax(dim=1)
    inv = torch.ones((), dtype=F32) / absmax
    return absmax, inv


def quantize_4bit(x, quant_type="nf4", blocksize=64):
    """(packed U8 [ceil(n/2)], absmax F32 [nb]) as kQuantizeBlockwise computes them."""
    if quant_type not in QUANT_TYPES:
        raise QuantError(f"quant_type {quant_type!r} is not nf4 or fp4")
    if blocksize not in BLOCKSIZES_4BIT:
        raise QuantError(f"blocksize {blocksize} is not one of bitsandbytes' {BLOCKSIZES_4BIT}")
    flat = x.detach().reshape(-1).to(F32)
    n = flat.numel()
    if n == 0:
        raise QuantError("cannot quantize an empty tensor")
    _check_finite(flat, "tensor")
    blocks, nb = _blocks(flat, blocksize)
    absmax, inv = block_absmax_inv(blocks)
    scaled = (blocks * inv[:, None]).reshape(-1)       # fp32 x * (1/absmax); 0 * inf = NaN
    m = n + (n % 2)                                     # the pad element (a loaded 0) of odd n
    codes = (nf4_code if quant_type == "nf4" else fp4_code)(scaled[:m])
    packed = (codes[0::2] << 4) | codes[1::2]
    return packed.contiguous(), absmax


def unpack_4bit(packed, n):
    """The 4-bit codes, element order: the high nibble of byte j is element 2j."""
    p = packed.reshape(-1).to(torch.uint8)
    codes = torch.empty(p.numel() * 2, dtype=torch.uint8)
    codes[0::2] = p >> 4
    codes[1::2] = p & 0x0F
    return codes[:n]


def dequantize_4bit(packed, absmax, shape, quant_type="nf4", blocksize=64):
    """kDequantizeBlockwise: LUT[code] * absmax of the element's block, fp32, in `shape`."""
    n = 1
    for s in shape:
        n *= s
    codes = unpack_4bit(packed, n).long()
    table = NF4_LUT_T if quant_type == "nf4" else FP4_CODE_T
    block = torch.arange(n) // blocksize
    return (table[codes] * absmax.to(F32)[block]).reshape(shape)


# ---------------------------------------------------------------------------------------------
# 8-bit blockwise (double quantization of the absmax values)


def _f32_of_fraction(fr):
    """The fp32 value nearest to an exact rational (ties to even), normal range only."""
    if fr == 0:
        return 0.0
    sign = -1 if fr < 0 else 1
    a = abs(fr)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = round(a * Fraction(2) ** (23 - e))  # Fraction.__round__: half to even
    return sign * float(Fraction(q) * Fraction(2) ** (e - 23))


def linspace_f32(start, end, steps):
    """torch's CPU linspace kernel for fp32 (start + j*step below steps//2, end - (steps-1-j)*step
    from there), each point the exact value rounded once to fp32 (a fused multiply-add)."""
    s = Fraction(_c(start).item())
    e = Fraction(_c(end).item())
    step = Fraction(_f32_of_fraction(Fraction(_f32_of_fraction(e - s)) / (steps - 1)))
    half = steps // 2
    pts = [s + step * j if j < half else e - step * (steps - 1 - j) for j in range(steps)]
    return torch.tensor([_f32_of_fraction(p) for p in pts], dtype=F32)


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8, linspace=linspace_f32):
    """functional.create_dynamic_map, with torch.linspace replaced by linspace_f32 (see the top)."""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        boundaries = linspace(0.1, 1, additional_items + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data += [0] * (256 - len(data))
    data.sort()
    return torch.tensor(data, dtype=F32)


DYNAMIC_MAP = create_dynamic_map()
# The largest gap between neighbouring values of the map (G in the bound at the top).
DYNAMIC_MAP_MAX_GAP = float((DYNAMIC_MAP[1:] - DYNAMIC_MAP[:-1]).max())


def dquantize_8bit(code, x):
    """kernels.cu dQuantize<0> (no stochastic rounding), vectorised: 7 halving steps from pivot
    127, then the nearer of the stopping value and its bracketing neighbour by fp32 midpoint."""
    x = x.to(F32)
    code = code.to(F32)
    pivot = torch.full(x.shape, 127, dtype=torch.long)
    upper_pivot = torch.full(x.shape, 255, dtype=torch.long)
    lower_pivot = torch.zeros(x.shape, dtype=torch.long)
    lower = torch.full(x.shape, -1.0, dtype=F32)
    upper = torch.full(x.shape, 1.0, dtype=F32)
    val = code[pivot]
    for i in (64, 32, 16, 8, 4, 2, 1):
        gt = x > val
        lower_pivot = torch.where(gt, pivot, lower_pivot)
        lower = torch.where(gt, val, lower)
        upper_pivot = torch.where(gt, upper_pivot, pivot)
        upper = torch.where(gt, upper, val)
        pivot = torch.where(gt, pivot + i, pivot - i)
        val = code[pivot]
    upper = torch.where(upper_pivot == 255, code[255], upper)
    lower = torch.where(lower_pivot == 0, code[0], lower)
    gt = x > val
    up = torch.where(x > (upper + val) * 0.5, upper_pivot, pivot)
    down = torch.where(x < (lower + val) * 0.5, lower_pivot, pivot)
    return torch.where(gt, up, down).to(torch.uint8)


def quantize_blockwise(x, code=None, blocksize=256):
    """(codes U8 [n], absmax F32 [nb]): kQuantizeBlockwise with the General8bit data type."""
    code = DYNAMIC_MAP if code is None else code
    flat = x.detach().reshape(-1).to(F32)
    n = flat.numel()
    blocks, nb = _blocks(flat, blocksize)
    absmax, inv = block_absmax_inv(blocks)
    scaled = (blocks * inv[:, None]).reshape(-1)[:n]
    return dquantize_8bit(code, scaled), absmax


def dequantize_blockwise(q, absmax, code=None, blocksize=256):
    code = DYNAMIC_MAP if code is None else code
    q = q.reshape(-1).long()
    block = torch.arange(q.numel()) // blocksize
    return code[q] * absmax.to(F32)[block]


def mean_offset(absmax):
    """The double-quantization offset: the mean of the fp32 absmax values (float64, rounded)."""
    return absmax.to(torch.float64).mean().to(F32).reshape(1)


def double_quantize(absmax):
    """(absmax_codes U8 [nb], absmax_scales F32 [ceil(nb/256)], offset F32 [1])."""
    offset = mean_offset(absmax)
    codes, scales = quantize_blockwise(absmax.to(F32) - offset, DYNAMIC_MAP, 256)
    return codes, scales, offset


def double_dequantize(codes, scales, offset):
    """dequantize_4bit's nested branch: dequantize_blockwise(...) then += offset (fp32)."""
    return dequantize_blockwise(codes, scales, DYNAMIC_MAP, 256) + offset.to(F32).reshape(())


def double_quant_bound(absmax, scales):
    """The bound stated at the top, per absmax value."""
    s = scales.to(F32).double()[torch.arange(absmax.numel()) // 256]
    return (DYNAMIC_MAP_MAX_GAP / 2) * s + 2.0 ** -22 * (s + absmax.double().abs())


# ---------------------------------------------------------------------------------------------
# INT8 (LLM.int8 weights)

INT8_DEQUANT_SCALE = 7.874015718698502e-3  # int8_vectorwise_dequant's constant, = fp32(1/127)


def _rows(x):
    x = x.detach().to(F32)
    cols = x.shape[-1] if x.dim() >= 1 else 1
    return x.reshape(-1, cols)


def quantize_int8(x):
    """(codes int8 of x's shape, row_absmax F32 [rows]) as Int8Params stores a weight."""
    if x.numel() == 0:
        raise QuantError("cannot quantize an empty tensor")
    rows = _rows(x)
    _check_finite(rows, "tensor")
    x16 = rows.to(torch.float16)
    if not bool(torch.isfinite(x16).all()):
        raise QuantError("tensor overflows fp16; Int8Params converts weights to fp16 before quantizing")
    a = x16.to(F32)
    row_absmax = a.abs().amax(dim=1)
    scale = torch.tensor(127.0, dtype=F32) / row_absmax            # 127.0 / row_stats (fp32)
    q = torch.round(a * scale[:, None])                              # half to even
    q = torch.where(row_absmax[:, None] > 0, q, torch.zeros((), dtype=F32))
    return q.to(torch.int8).reshape(x.shape), row_absmax


def dequantize_int8(codes, row_absmax):
    rows = _rows(codes.to(F32))
    out = rows * row_absmax.to(F32)[:, None] * INT8_DEQUANT_SCALE
    return out.reshape(codes.shape)


# ---------------------------------------------------------------------------------------------
# Whole tensors


def quantize_tensor(x, quant_type, double_quant=False, blocksize=64):
    """name suffix -> tensor, as the CLI writes them for one tensor."""
    if quant_type == "int8":
        if double_quant:
            raise QuantError("--double-quant applies to nf4 / fp4 only")
        codes, row_absmax = quantize_int8(x)
        return {"codes": codes, "row_absmax": row_absmax,
                "dequantized": dequantize_int8(codes, row_absmax)}
    packed, absmax = quantize_4bit(x, quant_type, blocksize)
    out = {"codes": packed}
    if double_quant:
        codes, scales, offset = double_quantize(absmax)
        out.update(absmax_codes=codes, absmax_scales=scales, absmax_offset=offset)
        absmax = double_dequantize(codes, scales, offset)
    else:
        out["absmax"] = absmax
    out["dequantized"] = dequantize_4bit(packed, absmax, tuple(x.shape), quant_type, blocksize)
    return out


def dequantized(x, quant_type, double_quant=False, blocksize=64):
    """What the quantize-dequantize round trip gives for x (fp32, x's shape)."""
    return quantize_tensor(x, quant_type, double_quant, blocksize)["dequantized"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="bitsandbytes' NF4 / FP4 / int8 weight quantization "
                                 "(see the top of this file)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize", help="quantize every tensor of a safetensors file")
    q.add_argument("--in", dest="inp", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--type", required=True, choices=("nf4", "fp4", "int8"))
    q.add_argument("--double-quant", action="store_true")
    q.add_argument("--blocksize", type=int, default=64)
    dm = sub.add_parser("dynamic-map", help="write the 8-bit dynamic map of double quantization")
    dm.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "dynamic-map":
            st.save(a.out, {"dynamic_map": DYNAMIC_MAP.clone()}, {"format": "pt"})
            return 0
        if a.type != "int8" and a.blocksize not in BLOCKSIZES_4BIT:
            raise QuantError(f"--blocksize {a.blocksize} is not one of {BLOCKSIZES_4BIT}")
        tensors, _ = st.load(a.inp)
        out = {}
        for name, t in tensors.items():
            if not t.is_floating_point():
                raise QuantError(f"{name}: dtype {t.dtype} is not a float type")
            try:
                parts = quantize_tensor(t.to(F32), a.type, a.double_quant, a.blocksize)
            except QuantError as e:
                raise QuantError(f"{name}: {e}") from None
            for suffix, v in parts.items():
                out[f"{name}.{suffix}"] = v
        meta = {"format": "pt", "quant_type": a.type,
                "blocksize": str(a.blocksize) if a.type != "int8" else "row",
                "double_quant": "true" if a.double_quant else "false"}
        st.save(a.out, out, meta)
        return 0
    except (QuantError, st.SafetensorsError, OSError) as e:
        print(f"bnb_quant.py {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
