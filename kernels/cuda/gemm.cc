// Gemm and the linear layer on cuBLAS / cuBLASLt.
//
// Note [Row-major GEMM on cuBLAS]: cuBLAS is column-major, and a row-major [R, C] matrix is
// the column-major [C, R] matrix holding its transpose. So the row-major C = op(A) op(B) is
// computed as the column-major C^T = op(B)^T op(A)^T: the operands swap, M and N swap, each
// keeps its own transpose flag and its leading dimension is its row-major row length.
//
// Every GEMM computes in fp32 (CUBLAS_COMPUTE_32F; no TF32 unless NVIDIA_TF32_OVERRIDE says
// so) on fp32, bf16 or fp16 tensors; 16-bit A and B may write an fp32 C (Note [Mixed dtypes on
// CUDA] in widen.h: the weight gradient of mixed precision). cuBLAS is deterministic run to run
// on one GPU model; the bias
// gradient is a column-sum kernel (kernels/cuda/linear_bias.cu) rather than the BGRADB
// epilogue, which overwrites where ops.h accumulates and would need a scratch copy anyway.
#include <cublasLt.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/linear_bias.h"

namespace ztrain::kernels::cuda {
namespace {

// cuBLASLt's workspace: what NVIDIA recommends for Hopper; split-K and stream-K algorithms
// need it.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

cublasOperation_t Op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Row-major c[m,n] = alpha op(a) op(b) + beta c with leading dimensions (row lengths)
// lda, ldb, ldc: Note [Row-major GEMM on cuBLAS]. Needs m, n, k > 0.
struct RowMajorGemmArgs {
  bool trans_a, trans_b;
  int m, n, k;
  const void* a;
  int lda;
  const void* b;
  int ldb;
  void* c;
  int ldc;
};
// a and b are `type`, c is `c_type` (type, or fp32 over 16-bit a and b).
void RowMajorGemm(cublasHandle_t handle, cudaDataType_t type, cudaDataType_t c_type, float alpha,
                  const RowMajorGemmArgs& g, float beta) {
  ZTRAIN_CUBLAS_CHECK(cublasGemmEx(handle, Op(g.trans_b), Op(g.trans_a), g.n, g.m, g.k, &alpha,
                                   g.b, type, g.ldb, g.a, type, g.lda, &beta, g.c, c_type, g.ldc,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Largest power of two (up to 256) dividing the address: cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told, and tensors here may be views into flat buffers.
uint32_t Alignment(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && addr % align != 0) align /= 2;
  return align;
}

// Move-only owners of the cuBLASLt descriptors.
struct LtDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using LtMatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, LtDeleter>;
using LtLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LtDeleter>;
using LtPreference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtDeleter>;

LtLayout MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  ZTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  return LtLayout(layout);
}

template <typename V>
void SetDescAttr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& v) {
  ZTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)));
}
template <typename V>
void SetPrefAttr(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                 const V& v) {
  ZTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)));
}

// The linear layer's forward product y[rows,oc] = x[rows,ch] w[oc,ch]^T (+ bias) on cuBLASLt,
// the bias added in the epilogue. Column-major (Note [Row-major GEMM on cuBLAS]):
// y^T[oc,rows] = op_T(w^T stored [ch,oc]) x^T[ch,rows].
struct LtLinearArgs {
  cudaDataType_t type;
  int64_t rows, oc, ch;
  const void* x;
  const void* w;
  const void* bias;  // nullptr: no bias
  void* y;
};
void LtLinear(cublasLtHandle_t lt, cudaStream_t stream, void* workspace,
              const LtLinearArgs& g) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  ZTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const LtMatmulDesc desc(raw_desc);
  SetDescAttr(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  SetDescAttr(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  if (g.bias != nullptr) {
    SetDescAttr(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    SetDescAttr(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    SetDescAttr(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, g.type);
  }
  const LtLayout a = MakeLayout(g.type, g.ch, g.oc, g.ch);
  const LtLayout b = MakeLayout(g.type, g.ch, g.rows, g.ch);
  const LtLayout c = MakeLayout(g.type, g.oc, g.rows, g.oc);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  ZTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  const LtPreference pref(raw_pref);
  SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kLtWorkspaceBytes});
  SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, Alignment(g.w));
  SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, Alignment(g.x));
  SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, Alignment(g.y));
  SetPrefAttr(raw_pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, Alignment(g.y));

  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  ZTRAIN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, raw_desc, a.get(), b.get(), c.get(),
                                                     c.get(), raw_pref, 1, &heuristic, &found));
  ZTRAIN_CHECK(found > 0, "LinearForward: cuBLASLt has no algorithm for x [", g.rows, ", ",
               g.ch, "] @ weight [", g.oc, ", ", g.ch,
               "]^T with these dtypes and alignments (operands must be at least 2-byte "
               "aligned views)");
  const float alpha = 1.0f, beta = 0.0f;
  ZTRAIN_CUBLAS_CHECK(cublasLtMatmul(lt, raw_desc, &alpha, g.w, a.get(), g.x, b.get(), &beta,
                                     g.y, c.get(), g.y, c.get(), &heuristic.algo, workspace,
                                     kLtWorkspaceBytes, stream));
}

// The sizes of a linear layer: weight [OC, C] and x [..., C] with `rows` rows; checks both,
// the output-side tensor `out` ([..., OC]) and the bias-side one (when defined), all of x's
// dtype on this device.
struct LinearDims {
  int64_t oc, ch, rows;
};
LinearDims CheckLinear(Device device, const Tensor& x, const Tensor& weight, const Tensor& out,
                       const char* out_name, const Tensor& bias, const char* bias_name,
                       const char* op, bool bias_is_grad = false) {
  CheckFloat(x, device, op, "x");
  CheckOnDevice(weight, device, x.dtype(), op, "weight");
  ZTRAIN_CHECK(weight.dim() == 2, op, ": weight must be [OC, C], got ",
               ShapeToString(weight.shape()));
  const LinearDims d{weight.size(0), weight.size(1), RowsOf(x, weight.size(1), op, "x")};
  Shape out_shape = x.shape();
  out_shape.back() = d.oc;
  CheckOnDevice(out, device, x.dtype(), out_shape, op, out_name);
  if (bias.defined()) {
    const DType bias_type = bias_is_grad && bias.dtype() == DType::kF32 ? DType::kF32 : x.dtype();
    CheckOnDevice(bias, device, bias_type, {d.oc}, op, bias_name);
  }
  CheckInt32(d.rows, op, "rows of x");
  CheckInt32(d.ch, op, "C");
  CheckInt32(d.oc, op, "OC");
  return d;
}

}  // namespace

void CudaOps::Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                   float beta, const Tensor& c) {
  constexpr const char* kOp = "Gemm";
  if (NeedsWidening({a, b}, {c})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    Gemm(trans_a, trans_b, alpha, w.In(a), w.In(b), beta, beta == 0.0f ? w.Out(c) : w.InOut(c));
    w.Commit();
    return;
  }
  CheckFloat(a, device(), kOp, "a");
  CheckOnDevice(b, device(), a.dtype(), kOp, "b");
  CheckOnDevice(c, device(), c.dtype() == DType::kF32 ? DType::kF32 : a.dtype(), kOp, "c");
  const GemmShape s = CheckGemmShapes(trans_a, trans_b, a, b, c, kOp);
  const int64_t m = s.m, n = s.n, k = s.k;
  const RowMajorGemmArgs g{trans_a,
                           trans_b,
                           CheckInt32(m, kOp, "M"),
                           CheckInt32(n, kOp, "N"),
                           CheckInt32(k, kOp, "K"),
                           a.data(),
                           CheckInt32(a.size(1), kOp, "lda"),
                           b.data(),
                           CheckInt32(b.size(1), kOp, "ldb"),
                           c.data(),
                           CheckInt32(n, kOp, "ldc")};
  if (m == 0 || n == 0) return;
  if (k == 0) {  // cuBLAS rejects a zero leading dimension; only beta * c remains
    if (beta == 0.0f) {
      Zero(c);
    } else if (beta != 1.0f) {
      Scale(c, beta);
    }
    return;
  }
  RowMajorGemm(cublas_, CudaType(a.dtype()), CudaType(c.dtype()), alpha, g, beta);
}

void CudaOps::LinearForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& y) {
  constexpr const char* kOp = "LinearForward";
  if (NeedsWidening({x, weight, bias, y})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    LinearForward(w.In(x), w.In(weight), w.In(bias), w.Out(y));
    w.Commit();
    return;
  }
  const auto [oc, ch, rows] = CheckLinear(device(), x, weight, y, "y", bias, "bias", kOp);
  if (rows == 0 || oc == 0) return;
  if (ch == 0) {  // an empty product: y is the bias (or zero)
    if (bias.defined()) {
      BroadcastRows(bias, rows, oc, y, stream_);
    } else {
      Zero(y);
    }
    return;
  }
  void* workspace = Workspace(kLtWorkspaceBytes);
  LtLinear(cublaslt_, stream_, workspace,
           {CudaType(x.dtype()), rows, oc, ch, x.data(), weight.data(),
            bias.defined() ? bias.data() : nullptr, y.data()});
}

void CudaOps::LinearBackward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  constexpr const char* kOp = "LinearBackward";
  // 16-bit dy, x, weight and dx with fp32 dweight and dbias run directly (mixed precision).
  if (NeedsWidening({dy, x, weight, dx}, {dweight, dbias})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    LinearBackward(w.In(dy), w.In(x), w.In(weight), w.Out(dx), w.InOut(dweight), w.InOut(dbias));
    w.Commit();
    return;
  }
  const auto [oc, ch, rows] =
      CheckLinear(device(), x, weight, dy, "dy", dbias, "dbias", kOp, /*bias_is_grad=*/true);
  if (dweight.defined()) CheckGrad(dweight, weight, kOp, "dweight");
  if (dx.defined()) CheckLike(dx, x, kOp, "dx");
  const cudaDataType_t type = CudaType(x.dtype());
  const int r = static_cast<int>(rows), o = static_cast<int>(oc), c = static_cast<int>(ch);

  if (dx.defined() && rows > 0 && ch > 0) {  // dx[N,C] = dy[N,OC] @ W[OC,C]
    if (oc == 0) {
      Zero(dx);
    } else {
      RowMajorGemm(cublas_, type, type, 1.0f,
                   {false, false, r, c, o, dy.data(), o, weight.data(), c, dx.data(), c}, 0.0f);
    }
  }
  // dW[OC,C] += dy^T[OC,N] @ x[N,C], unless the weight is frozen (Note [Frozen parameters])
  if (dweight.defined() && rows > 0 && oc > 0 && ch > 0) {
    RowMajorGemm(cublas_, type, CudaType(dweight.dtype()), 1.0f,
                 {true, false, o, c, r, dy.data(), o, x.data(), c, dweight.data(), c}, 1.0f);
  }
  if (dbias.defined() && rows > 0 && oc > 0) {
    void* scratch = Workspace(ColumnSumsScratchBytes(rows, oc));
    AccumulateColumnSums(dy, rows, oc, dbias, scratch, stream_);
  }
}

}  // namespace ztrain::kernels::cuda
