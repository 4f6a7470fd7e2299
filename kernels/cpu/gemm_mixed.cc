// Gemm and the linear layer with 16-bit arguments.
//
// Note [bf16 GEMMs]: a GEMM whose two operands are both bf16 runs on oneDNN's matmul
// primitive (kernels/cpu/onednn_matmul.h): bf16 x bf16 products accumulated in fp32, written
// to an fp32 or bf16 c (rounded once), the linear layer's bias fused, alpha and beta as
// post-ops (so dweight += dy^T x accumulates into an fp32 or bf16 dweight with one rounding),
// transposes as strides. On AVX512-BF16 / AMX-BF16 that is several times SGEMM's rate and
// reads half the bytes. Everything else goes through the widening adapter and OpenBLAS SGEMM:
// mixed operands (a bf16 weight with an fp32 x: narrowing x would add a rounding the contract
// does not allow), any fp16 operand (the CPUs we run on have no AMX-FP16 / AVX512-FP16 dot
// products, so an fp16 matmul gains nothing over SGEMM), an fp16 c, and bf16 GEMMs where
// oneDNN is missing from the build, finds no bf16 instructions on the CPU, or is switched off
// (ZTRAIN_ONEDNN=0, Bf16GemmPath::kSgemm). Each CpuOps logs once which path its bf16 GEMMs
// take, and why when it is the slower one.
#include <algorithm>

#include "core/logging.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/column_sums.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_util.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {
namespace {

// dbias[c] += sum over rows of dy[r, c] for a 16-bit dy: the fp32 kernel's blocking and row
// order (deterministic), widening each row's slice of the block on the fly.
void AccumulateHalfColumnSums(const Tensor& dy, int64_t rows, int64_t cols, float* dbias) {
  const auto* base = static_cast<const char*>(dy.data());
  const size_t elem = DTypeSize(dy.dtype());
#pragma omp parallel if (rows * cols >= cpu::kParallelGrain)
  cpu::SumColumnBlocks<1>(rows, cols, {dbias},
                          [&](int64_t r, int64_t c0, int64_t width, auto& acc) {
                            float row[cpu::kColumnBlock];
                            cpu::WidenSerial(base + (r * cols + c0) * elem, dy.dtype(), row, width);
#pragma omp simd
                            for (int64_t c = 0; c < width; ++c) acc[0][c] += row[c];
                          });
}

}  // namespace

bool CpuOps::Bf16GemmsOnOneDnn() {
  if (bf16_path_decided_) return onednn_ != nullptr;
  bf16_path_decided_ = true;
  const cpu::OneDnnSupport& support = cpu::OneDnnBf16Support();
  if (bf16_gemm_ == Bf16GemmPath::kAuto && support.available) {
    onednn_ = std::make_unique<cpu::OneDnnMatmul>();
    Log().info("CPU ops: bf16 GEMMs run on {}", support.detail);
  } else if (bf16_gemm_ == Bf16GemmPath::kSgemm) {
    Log().info(
        "CPU ops: bf16 GEMMs run as OpenBLAS SGEMM on fp32 copies of the operands "
        "(Bf16GemmPath::kSgemm)");
  } else {
    Log().warn(
        "CPU ops: bf16 GEMMs run as OpenBLAS SGEMM on fp32 copies of the operands, "
        "slower than oneDNN: {}",
        support.detail);
  }
  return onednn_ != nullptr;
}

void CpuOps::MixedGemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                       const Tensor& bias, float beta, const Tensor& c, cpu::Widened& w,
                       const char* op) {
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  const bool onednn_types = a.dtype() == DType::kBF16 && b.dtype() == DType::kBF16 &&
                            (c.dtype() == DType::kF32 || c.dtype() == DType::kBF16);
  if (onednn_types && m > 0 && n > 0 && k > 0 && Bf16GemmsOnOneDnn()) {
    const Tensor bias32 = w.In(bias);  // [N]: widening costs nothing next to the GEMM
    cpu::MatmulArgs args;
    args.trans_a = trans_a;
    args.trans_b = trans_b;
    args.m = m;
    args.n = n;
    args.k = k;
    args.alpha = alpha;
    args.a = a.data();
    args.lda = a.size(1);
    args.b = b.data();
    args.ldb = b.size(1);
    args.bias = bias.defined() ? bias32.data<float>() : nullptr;
    args.beta = beta;
    args.c = c.data();
    args.c_type = c.dtype();
    args.ldc = n;
    if (onednn_->Run(args)) return;
  }
  const Tensor a32 = w.In(a), b32 = w.In(b);
  const Tensor c32 = beta != 0.0f ? w.InOut(c) : w.Out(c);
  cpu::Sgemm(trans_a, trans_b, m, n, k, alpha, a32.data<float>(), a.size(1), b32.data<float>(),
             b.size(1), beta, c32.data<float>(), n, op, gemm_plan_);
  if (bias.defined()) cpu::AddBiasRows(c32.data<float>(), w.In(bias).data<float>(), m, n);
}

// The fp32 path's three steps, each on any dtypes: dx = dy W, dW += dy^T x, dbias += colsum,
// each skipped when its output is undefined (Note [Frozen parameters] in ops.h).
void CpuOps::MixedLinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                                 const char* op) {
  const int64_t oc = weight.size(0), ch = weight.size(1), rows = ch == 0 ? 0 : x.numel() / ch;
  const Tensor dy2 = dy.View({rows, oc}), x2 = x.View({rows, ch});
  cpu::Widened w(scratch_);
  if (dx.defined()) {
    MixedGemm(false, false, 1.0f, dy2, weight, Tensor(), 0.0f, dx.View({rows, ch}), w, op);
  }
  if (dweight.defined()) MixedGemm(true, false, 1.0f, dy2, x2, Tensor(), 1.0f, dweight, w, op);
  if (dbias.defined()) {  // bitwise the fp32 kernel's sum of the widened dy either way
    const Tensor db = w.InOut(dbias);
    if (dy.dtype() == DType::kF32) {
      cpu::AccumulateColumnSums(dy.data<float>(), rows, oc, db.data<float>());
    } else {
      AccumulateHalfColumnSums(dy2, rows, oc, db.data<float>());
    }
  }
  w.Commit();
}

}  // namespace ztrain::kernels
