// Token + position embedding on the GPU, forward and deterministic backward. The position
// table is optional (ops.h): with wpe / dwpe undefined, out is the token rows alone (copied
// bit for bit) and the backward writes dwte only. An undefined dwte (a frozen token table,
// Note [Frozen parameters] in ops.h) leaves the backward to dwpe alone.
//
// Both directions check every token against [0, Vp) and throw naming the first bad one, as
// ops.h requires (the backward only when it writes dwte: without it the tokens are unread).
// Tokens live on the device, so the check costs a round trip: the forward pass finds the
// first bad position with a small kernel and reads one int back; the backward pass copies
// the tokens themselves (B*T int32, e.g. 32 KiB for 8 x 1024) because it needs them on the
// host anyway. Either way the host waits for the stream once per call
// (cudaStreamSynchronize): the work enqueued before it must finish first, so the caller
// loses the overlap of CPU and GPU at this point, which for an embedding at the start of the
// forward pass and the end of the backward pass is cheap.
//
// The token table may be one rank's slice of a vocabulary-parallel embedding (VocabSlice in
// ops.h): a token of another slice reads a zero row, and its gradient goes nowhere. The forward
// writes its output in the table's dtype or in fp32 directly (the fp32 partial a tp group sums,
// Note [Tensor parallelism in 16 bits] in parallel/tensor/tp_common.h), so a 16-bit slice is
// never widened whole.
//
// The backward pass adds without floating-point atomics: the host sorts the positions by
// token (a stable counting sort, positions in increasing order), and one block per distinct
// token sums its positions' dout rows in that order, so the bits are the same every run.
#include <cstdint>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cuda/arg_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/vocab_slice_check.h"

namespace ztrain::kernels::cuda {
namespace {

constexpr unsigned kNoBadToken = 0xffffffffu;

struct EmbeddingDims {
  int64_t batch, seq, channels;
  int64_t vocab;        // tokens must lie in [0, vocab)
  int64_t begin, rows;  // the table holds ids [begin, begin + rows)
};

// `t`'s dtype when it is `dtype` or when either is fp32 (a call the kernels take directly:
// 16-bit activations with fp32 tables or gradients), else `dtype`, which the check then names.
DType SameOrFp32(const Tensor& t, DType dtype) {
  const bool fp32 = t.defined() && (t.dtype() == DType::kF32 || dtype == DType::kF32);
  return fp32 && cpu::IsFloatType(t.dtype()) ? t.dtype() : dtype;
}

// wpe (undefined: no position table) is [maxT >= T, C] of `dtype` (or fp32, SameOrFp32).
void CheckPositions(Device device, const Tensor& wpe, DType dtype, const EmbeddingDims& d,
                    const char* op, const char* wpe_name) {
  if (!wpe.defined()) return;
  CheckOnDevice(wpe, device, SameOrFp32(wpe, dtype), op, wpe_name);
  ZTRAIN_CHECK(wpe.dim() == 2 && wpe.size(1) == d.channels && wpe.size(0) >= d.seq, op, ": ",
               wpe_name, " has shape ", ShapeToString(wpe.shape()), ", expected [maxT >= ", d.seq,
               ", ", d.channels, "]");
}

// act (the output or dout) is of wte's dtype, or either is fp32 (SameOrFp32).
EmbeddingDims CheckEmbeddingArgs(Device device, const Tensor& tokens, const Tensor& wte,
                                 const Tensor& wpe, const Tensor& act, const VocabSlice& slice,
                                 const char* op, const char* act_name, const char* wte_name,
                                 const char* wpe_name) {
  CheckOnDevice(tokens, device, DType::kI32, op, "tokens");
  ZTRAIN_CHECK(tokens.dim() == 2, op, ": tokens must be [B, T], got ",
               ShapeToString(tokens.shape()));
  CheckFloat(wte, device, op, wte_name);
  ZTRAIN_CHECK(wte.dim() == 2, op, ": ", wte_name, " must be [Vp, C], got ",
               ShapeToString(wte.shape()));
  CheckTableSlice(slice, wte.size(0), op, wte_name);
  const EmbeddingDims d{tokens.size(0), tokens.size(1), wte.size(1),
                        slice.vocab,    slice.begin,    wte.size(0)};
  CheckPositions(device, wpe, wte.dtype(), d, op, wpe_name);
  CheckOnDevice(act, device, SameOrFp32(act, wte.dtype()), {d.batch, d.seq, d.channels}, op,
                act_name);
  CheckInt32(d.batch * d.seq, op, "B*T");
  return d;
}

// The backward's sizes when dwte is undefined (a frozen token table, Note [Frozen parameters]
// in ops.h): C comes from dout, and the tokens' values are not read.
EmbeddingDims CheckFrozenTableArgs(Device device, const Tensor& tokens, const Tensor& dwpe,
                                   const Tensor& dout, const char* op) {
  CheckOnDevice(tokens, device, DType::kI32, op, "tokens");
  ZTRAIN_CHECK(tokens.dim() == 2, op, ": tokens must be [B, T], got ",
               ShapeToString(tokens.shape()));
  CheckFloat(dout, device, op, "dout");
  ZTRAIN_CHECK(dout.dim() == 3 && dout.size(0) == tokens.size(0) && dout.size(1) == tokens.size(1),
               op, ": dout has shape ", ShapeToString(dout.shape()), ", expected [", tokens.size(0),
               ", ", tokens.size(1), ", C] for tokens ", ShapeToString(tokens.shape()));
  const EmbeddingDims d{tokens.size(0), tokens.size(1), dout.size(2), 0, 0, 0};
  CheckPositions(device, dwpe, dout.dtype(), d, op, "dwpe");
  CheckInt32(d.batch * d.seq, op, "B*T");
  return d;
}

[[noreturn]] void ThrowBadToken(int32_t token, int64_t index, const EmbeddingDims& d,
                                const char* op) {
  throw Error(detail::StrCat(op, ": token ", token, " at position [b=", index / d.seq,
                             ", t=", index % d.seq, "] is outside [0, ", d.vocab,
                             "); the embedding table wte has ", d.vocab, " rows"));
}

// *first_bad = the smallest index whose token is outside [0, vocab) (integer atomicMin: the
// result does not depend on the order).
__global__ void FindBadTokenKernel(const int32_t* tokens, int64_t n, int64_t vocab,
                                   unsigned* first_bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (tokens[i] < 0 || tokens[i] >= vocab) atomicMin(first_bad, static_cast<unsigned>(i));
  }
}

// One block per (b, t) row, threads across channels; wpe == nullptr: no position table. The
// table holds ids [begin, begin + rows); another token reads a zero row. O is T or fp32.
template <typename T, typename O>
__global__ void EmbeddingForwardKernel(const int32_t* tokens, const T* wte, int64_t begin,
                                       int64_t rows, const T* wpe, int64_t seq, int64_t ch,
                                       O* out) {
  const int64_t row = blockIdx.x, local = tokens[row] - begin;
  const T* te = local >= 0 && local < rows ? wte + local * ch : nullptr;
  const T* pe = wpe != nullptr ? wpe + (row % seq) * ch : nullptr;
  O* o = out + row * ch;
  for (int64_t c = threadIdx.x; c < ch; c += blockDim.x) {
    const float t = te != nullptr ? ToFloat(te[c]) : 0.0f;
    o[c] = FromFloat<O>(pe != nullptr ? t + ToFloat(pe[c]) : t);
  }
}

// dwpe[t, c] += sum over b (in order) of dout[b, t, c]; G is T or fp32.
template <typename T, typename G>
__global__ void PositionGradKernel(const T* dout, int64_t batch, int64_t seq, int64_t ch,
                                   G* dwpe) {
  const int64_t n = seq * ch;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < batch; ++b) acc += ToFloat(dout[b * n + i]);
    dwpe[i] = FromFloat<G>(ToFloat(dwpe[i]) + acc);
  }
}

// Block j: token ids[j] occurs at positions[offsets[j] .. offsets[j+1]) (increasing);
// dwte[ids[j], c] += the sum of those dout rows, added in that order; G is T or fp32.
template <typename T, typename G>
__global__ void TokenGradKernel(const int32_t* ids, const int32_t* offsets,
                                const int32_t* positions, const T* dout, int64_t ch, G* dwte) {
  const int32_t begin = offsets[blockIdx.x], end = offsets[blockIdx.x + 1];
  G* dst = dwte + int64_t{ids[blockIdx.x]} * ch;
  for (int64_t c = threadIdx.x; c < ch; c += blockDim.x) {
    float acc = 0.0f;
    for (int32_t p = begin; p < end; ++p) acc += ToFloat(dout[int64_t{positions[p]} * ch + c]);
    dst[c] = FromFloat<G>(ToFloat(dst[c]) + acc);
  }
}

// The positions grouped by token, as one int32 array: ids[u], offsets[u + 1], positions[n].
struct TokenLists {
  std::vector<int32_t> data;
  int64_t distinct = 0;
};

// Stable counting sort of the positions by table row, rows[i] being position i's (-1: a token
// the table, a slice, does not hold; left out).
TokenLists GroupPositions(const std::vector<int32_t>& rows, int64_t vocab) {
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> count(static_cast<size_t>(vocab), 0);
  for (int32_t t : rows) {
    if (t >= 0) ++count[t];
  }
  TokenLists lists;
  for (int32_t c : count) lists.distinct += c > 0;
  const int64_t u = lists.distinct;
  lists.data.resize(static_cast<size_t>(u + (u + 1) + n));
  int32_t* ids = lists.data.data();
  int32_t* offsets = ids + u;
  int32_t* positions = offsets + u + 1;
  std::vector<int32_t> next(static_cast<size_t>(vocab), 0);  // write cursor per token
  int64_t j = 0;
  int32_t offset = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (count[v] == 0) continue;
    ids[j] = static_cast<int32_t>(v);
    offsets[j++] = offset;
    next[v] = offset;
    offset += count[v];
  }
  offsets[u] = offset;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] >= 0) positions[next[rows[i]]++] = static_cast<int32_t>(i);
  }
  return lists;
}

// The tokens copied to the host (waiting for the stream) and checked against [0, Vp), as the
// table's rows (-1 for a token of another slice).
std::vector<int32_t> CheckedHostTokens(const Tensor& tokens, const EmbeddingDims& d,
                                       cudaStream_t stream, const char* op) {
  const int64_t rows = d.batch * d.seq;
  std::vector<int32_t> host(static_cast<size_t>(rows));
  ZTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), tokens.data(), tokens.nbytes(), cudaMemcpyDeviceToHost, stream));
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t i = 0; i < rows; ++i) {
    if (host[i] < 0 || host[i] >= d.vocab) ThrowBadToken(host[i], i, d, op);
  }
  for (int32_t& t : host) t = t >= d.begin && t < d.begin + d.rows ? t - d.begin : -1;
  return host;
}

}  // namespace

// The token check reads one int back and synchronises the stream (see the top of the file).
// out may be fp32 over 16-bit tables without the adapter (the top of the file).
void CudaOps::EmbeddingForward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                               const Tensor& out, const VocabSlice& slice) {
  constexpr const char* kOp = "EmbeddingForward";
  if (NeedsWidening({wte, wpe}, {out})) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    EmbeddingForward(tokens, w.In(wte), w.In(wpe), w.Out(out), slice);
    w.Commit();
    return;
  }
  const EmbeddingDims d =
      CheckEmbeddingArgs(device(), tokens, wte, wpe, out, slice, kOp, "out", "wte", "wpe");
  const int64_t rows = d.batch * d.seq;
  if (rows == 0) return;
  auto* first_bad = static_cast<unsigned*>(Workspace(sizeof(unsigned)));
  ZTRAIN_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(unsigned), stream_));
  FindBadTokenKernel<<<GridFor(rows), kThreads, 0, stream_>>>(tokens.data<const int32_t>(),
                                                              rows, d.vocab, first_bad);
  ZTRAIN_CUDA_CHECK_LAUNCH();
  unsigned bad = kNoBadToken;
  ZTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream_));
  ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (bad != kNoBadToken) {
    int32_t token = 0;
    ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(&token, tokens.data<const int32_t>() + bad, sizeof(token),
                                      cudaMemcpyDeviceToHost, stream_));
    ZTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ThrowBadToken(token, bad, d, kOp);
  }
  if (d.channels == 0) return;
  DispatchFloat(wte.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    DispatchGrad<T>(out.dtype(), [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      EmbeddingForwardKernel<T, O><<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(
          tokens.data<const int32_t>(), wte.data<const T>(), d.begin, d.rows,
          wpe.defined() ? wpe.data<const T>() : nullptr, d.seq, d.channels, out.data<O>());
      ZTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

// The tokens come to the host (one synchronisation, see the top of the file), are checked
// and grouped there, and the groups go back into the workspace for the dwte kernel. An
// undefined dwte or dwpe (a frozen table or none, Note [Frozen parameters]) gets no kernel;
// without dwte the tokens stay where they are. fp32 gradients over 16-bit dout (mixed
// precision's default) run directly; so do gradients of dout's dtype.
void CudaOps::EmbeddingBackward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                                const Tensor& dwpe, const VocabSlice& slice) {
  constexpr const char* kOp = "EmbeddingBackward";
  const bool tables_differ = dwte.defined() && dwpe.defined() && dwte.dtype() != dwpe.dtype();
  if (NeedsWidening({dout}, {dwte, dwpe}) || tables_differ) {  // Note [Mixed dtypes on CUDA]
    Widened w(*this);
    EmbeddingBackward(w.In(dout), tokens, w.InOut(dwte), w.InOut(dwpe), slice);
    w.Commit();
    return;
  }
  const EmbeddingDims d = dwte.defined()
                              ? CheckEmbeddingArgs(device(), tokens, dwte, dwpe, dout, slice, kOp,
                                                   "dout", "dwte", "dwpe")
                              : CheckFrozenTableArgs(device(), tokens, dwpe, dout, kOp);
  const int64_t rows = d.batch * d.seq;
  if (rows == 0 || (!dwte.defined() && !dwpe.defined())) return;
  const std::vector<int32_t> host_tokens =
      dwte.defined() ? CheckedHostTokens(tokens, d, stream_, kOp) : std::vector<int32_t>();
  if (d.channels == 0) return;
  int64_t u = 0;
  int32_t* device_lists = nullptr;
  if (dwte.defined()) {
    const TokenLists lists = GroupPositions(host_tokens, d.rows);
    u = lists.distinct;
    device_lists = static_cast<int32_t*>(Workspace(lists.data.size() * sizeof(int32_t)));
    // A pageable source: the call returns once the bytes are staged, so `lists` may die after.
    ZTRAIN_CUDA_CHECK(cudaMemcpyAsync(device_lists, lists.data.data(),
                                      lists.data.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                      stream_));
  }
  DispatchFloat(dout.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    DispatchGrad<T>((dwte.defined() ? dwte : dwpe).dtype(), [&](auto grad_tag) {
      using G = typename decltype(grad_tag)::type;
      if (dwpe.defined()) {
        PositionGradKernel<T, G><<<GridFor(d.seq * d.channels), kThreads, 0, stream_>>>(
            dout.data<const T>(), d.batch, d.seq, d.channels, dwpe.data<G>());
        ZTRAIN_CUDA_CHECK_LAUNCH();
      }
      if (dwte.defined() && u > 0) {  // u = 0: no token of this slice
        TokenGradKernel<T, G><<<static_cast<unsigned>(u), kThreads, 0, stream_>>>(
            device_lists, device_lists + u, device_lists + 2 * u + 1, dout.data<const T>(),
            d.channels, dwte.data<G>());
        ZTRAIN_CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace ztrain::kernels::cuda
