// Elementwise ops and reductions over whole tensors. 16-bit arguments go through the
// widening adapter a chunk at a time (Note [Widening adapter] in widen.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/check.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/widen.h"

namespace ztrain::kernels {
namespace {

// SumSquares adds fixed-size chunks in index order, so its result does not depend on the
// thread count (gradient clipping must agree across runs and layouts).
constexpr int64_t kSumChunk = int64_t{1} << 16;

// Runs fn(begin, end) over [0, n) in chunks, in parallel when n is large.
template <typename Fn>
void ParallelChunks(int64_t n, Fn fn) {
  const int64_t chunks = (n + cpu::kParallelGrain - 1) / cpu::kParallelGrain;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    fn(c * cpu::kParallelGrain, std::min(n, (c + 1) * cpu::kParallelGrain));
  }
}

// SumSquares of a 16-bit tensor: the same chunks, each widened in blocks on the stack.
double HalfSumSquares(const Tensor& t) {
  constexpr int64_t kBlock = 1024;
  const auto* p = static_cast<const char*>(t.data());
  const size_t elem = DTypeSize(t.dtype());
  const int64_t n = t.numel();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kSumChunk, end = std::min(n, begin + kSumChunk);
    double acc = 0.0;
    float block[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t len = std::min(kBlock, end - b);
      cpu::WidenSerial(p + b * elem, t.dtype(), block, len);
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < len; ++i) acc += static_cast<double>(block[i]) * block[i];
    }
    partial[c] = acc;
  }
  double total = 0.0;
  for (double v : partial) total += v;
  return total;
}

}  // namespace

void CpuOps::Add(const Tensor& a, const Tensor& b, const Tensor& y) {
  if (cpu::AnyHalf(a, b, y)) {
    cpu::CheckCpuFloat(a, "Add", "a");
    cpu::CheckCpuFloat(b, a.shape(), "Add", "b");
    cpu::CheckCpuFloat(y, a.shape(), "Add", "y");
    cpu::ForEachChunk(
        scratch_, a.numel(), cpu::kChunkElements, [&](cpu::Widened& w, int64_t begin, int64_t end) {
          Add(w.In(cpu::FlatRange(a, begin, end)), w.In(cpu::FlatRange(b, begin, end)),
              w.Out(cpu::FlatRange(y, begin, end)));
        });
    return;
  }
  cpu::CheckCpu(a, "Add", "a");
  cpu::CheckCpu(b, a.shape(), "Add", "b");
  cpu::CheckCpu(y, a.shape(), "Add", "y");
  const float* ap = a.data<float>();  // no restrict: y may alias a or b
  const float* bp = b.data<float>();
  float* yp = y.data<float>();
  const int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) yp[i] = ap[i] + bp[i];
}

void CpuOps::AddInPlace(const Tensor& y, const Tensor& x) {
  if (cpu::AnyHalf(y, x)) {
    cpu::CheckCpuFloat(y, "AddInPlace", "y");
    cpu::CheckCpuFloat(x, y.shape(), "AddInPlace", "x");
    cpu::ForEachChunk(
        scratch_, y.numel(), cpu::kChunkElements, [&](cpu::Widened& w, int64_t begin, int64_t end) {
          AddInPlace(w.InOut(cpu::FlatRange(y, begin, end)), w.In(cpu::FlatRange(x, begin, end)));
        });
    return;
  }
  cpu::CheckCpu(y, "AddInPlace", "y");
  cpu::CheckCpu(x, y.shape(), "AddInPlace", "x");
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) yp[i] += xp[i];
}

// Row by row: the bias table widened into fp32 once, each row's residual as it comes, added to
// the fp32 sum and rounded once into y, so any dtypes mix without the adapter.
void CpuOps::AddBiasAndResidual(const Tensor& sum, const Tensor& bias, const Tensor& residual,
                                const Tensor& y) {
  constexpr const char* kOp = "AddBiasAndResidual";
  cpu::CheckCpuFloat(y, kOp, "y");
  ZTRAIN_CHECK(y.dim() >= 1, kOp, ": y must be [N, C], got a scalar");
  const int64_t c = y.size(-1), rows = y.numel() / std::max<int64_t>(c, 1);
  cpu::CheckCount(sum, y.numel(), kOp, "sum");
  if (residual.defined()) {
    cpu::CheckCpuFloat(residual, kOp, "residual");
    cpu::CheckCount(residual, y.numel(), kOp, "residual", residual.dtype());
  }
  int64_t bias_rows = 0;
  if (bias.defined()) {
    cpu::CheckCpuFloat(bias, kOp, "bias");
    bias_rows = cpu::RowsOf(bias, c, kOp, "bias", bias.dtype());
    ZTRAIN_CHECK(bias_rows > 0 && rows % bias_rows == 0, kOp, ": bias ",
                 ShapeToString(bias.shape()), " has ", bias_rows, " rows, which do not divide the ",
                 rows, " rows of y ", ShapeToString(y.shape()));
  }
  // No bias: one row of zeros.
  const int64_t table_rows = std::max<int64_t>(bias_rows, 1);
  std::vector<float> table(static_cast<size_t>(table_rows * c), 0.0f);
  if (bias_rows > 0) cpu::WidenSerial(bias.data(), bias.dtype(), table.data(), bias_rows * c);
  const auto* r = static_cast<const char*>(residual.data());
  auto* out = static_cast<char*>(y.data());
  const float* s = sum.data<float>();
  const size_t r_row = c * DTypeSize(residual.dtype()), y_row = c * DTypeSize(y.dtype());
#pragma omp parallel if (rows * c >= cpu::kParallelGrain)
  {
    std::vector<float> part(static_cast<size_t>(c), 0.0f);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* add = table.data() + (i % table_rows) * c;
      if (r != nullptr) cpu::WidenSerial(r + i * r_row, residual.dtype(), part.data(), c);
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) part[j] = s[i * c + j] + (add[j] + part[j]);
      cpu::NarrowSerial(part.data(), out + i * y_row, y.dtype(), c);
      if (r == nullptr) std::fill(part.begin(), part.end(), 0.0f);
    }
  }
}

// Zero moves bytes, so it takes every dtype; so does Copy between equal dtypes.
void CpuOps::Zero(const Tensor& t) {
  cpu::CheckCpu(t, "Zero", "t", t.dtype());
  char* p = static_cast<char*>(t.data());
  const int64_t elem = static_cast<int64_t>(DTypeSize(t.dtype()));
  ParallelChunks(t.numel(), [&](int64_t begin, int64_t end) {
    std::memset(p + begin * elem, 0, static_cast<size_t>((end - begin) * elem));
  });
}

// Between two float dtypes Copy converts (rounding to nearest even when it narrows).
void CpuOps::Copy(const Tensor& src, const Tensor& dst) {
  cpu::CheckCpu(src, "Copy", "src", src.dtype());
  if (dst.dtype() != src.dtype() && cpu::IsFloatType(src.dtype()) &&
      cpu::IsFloatType(dst.dtype())) {
    cpu::CheckCpuFloat(dst, src.shape(), "Copy", "dst");
    cpu::ConvertFloat(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel());
    return;
  }
  cpu::CheckCpu(dst, src.shape(), "Copy", "dst", src.dtype());
  const char* s = static_cast<const char*>(src.data());
  char* d = static_cast<char*>(dst.data());
  if (s == d) return;
  const int64_t elem = static_cast<int64_t>(DTypeSize(src.dtype()));
  ParallelChunks(src.numel(), [&](int64_t begin, int64_t end) {
    std::memmove(d + begin * elem, s + begin * elem, static_cast<size_t>((end - begin) * elem));
  });
}

double CpuOps::SumSquares(const Tensor& t) {
  if (cpu::AnyHalf(t)) {
    cpu::CheckCpuFloat(t, "SumSquares", "t");
    return HalfSumSquares(t);
  }
  cpu::CheckCpu(t, "SumSquares", "t");
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kSumChunk, end = std::min(n, begin + kSumChunk);
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = begin; i < end; ++i) acc += static_cast<double>(p[i]) * p[i];
    partial[c] = acc;
  }
  double total = 0.0;
  for (double v : partial) total += v;
  return total;
}

void CpuOps::Scale(const Tensor& t, float alpha) {
  if (cpu::AnyHalf(t)) {
    cpu::CheckCpuFloat(t, "Scale", "t");
    cpu::ForEachChunk(scratch_, t.numel(), cpu::kChunkElements,
                      [&](cpu::Widened& w, int64_t begin, int64_t end) {
                        Scale(w.InOut(cpu::FlatRange(t, begin, end)), alpha);
                      });
    return;
  }
  cpu::CheckCpu(t, "Scale", "t");
  float* p = t.data<float>();
  const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

}  // namespace ztrain::kernels
