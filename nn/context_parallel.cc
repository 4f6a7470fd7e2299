// Note [Context parallelism] (context_parallel.h): Ulysses' exchanges and the slicing of
// sequences.
#include "nn/context_parallel.h"

#include <numeric>

#include "core/error.h"

namespace ztrain::nn {

UlyssesHeads::UlyssesHeads(const kernels::AttentionHeads& heads, int size)
    : whole_(heads), size_(size) {
  const int kv = heads.num_kv_heads;
  ZTRAIN_CHECK_T(
      ConfigError, size >= 1 && heads.num_heads % size == 0, "context parallelism over ", size,
      " ranks needs query heads that divide by it, "
      "got ",
      heads.num_heads, "; choose a context_parallel.size that divides ", heads.num_heads);
  ZTRAIN_CHECK_T(ConfigError, kv >= 1 && (kv % size == 0 || size % kv == 0),
                 "context parallelism over ", size,
                 " ranks needs key/value heads that divide by "
                 "it or divide it, got ",
                 kv,
                 "; choose a context_parallel.size that divides or "
                 "is a multiple of ",
                 kv);
  group_ = {heads.num_heads / size, kv % size == 0 ? kv / size : 1, heads.head_dim};
}

std::vector<HeadColumns> UlyssesHeads::Columns(int j, bool with_kv) const {
  const int64_t d = whole_.head_dim;
  const int64_t qw = group_.q_width(), kvw = group_.kv_width();
  std::vector<HeadColumns> columns{{j * qw, 0, qw}};
  if (with_kv) {
    // Query head h reads key/value head h / (NH / NKV): group j's first query head is j NH/P.
    const int64_t first_kv =
        int64_t{j} * group_.num_heads / (whole_.num_heads / whole_.num_kv_heads);
    columns.push_back({whole_.q_width() + first_kv * d, qw, kvw});
    columns.push_back({whole_.q_width() + whole_.kv_width() + first_kv * d, qw + kvw, kvw});
  }
  return columns;
}

namespace {

int64_t Width(const std::vector<HeadColumns>& columns) {
  int64_t w = 0;
  for (const HeadColumns& c : columns) w += c.width;
  return w;
}

// One exchange's sizes and its send and receive buffers (freed with it). The send buffer
// holds, for each peer, the column windows it gets one after another, each a [rows, width]
// matrix: CopyColumns writes them whole, and the receiver reads each source's window of a
// part as one contiguous matrix.
struct Exchange {
  Exchange(LayerContext& ctx, const ContextGroup& cp, const UlyssesHeads& heads, bool with_kv,
           int64_t batch, const Tensor& local, const Tensor& group)
      : p(cp.size()),
        rows(local.size(0)),
        piece(rows / batch),
        chunk(rows * Width(heads.Columns(0, with_kv))),
        send_hold(ctx.allocator(), local.dtype(), {p * chunk}, MemoryCategory::kCommunication),
        recv_hold(ctx.allocator(), local.dtype(), {p * chunk}, MemoryCategory::kCommunication),
        send(send_hold.AsTensor(local.dtype(), {p * chunk})),
        recv(recv_hold.AsTensor(local.dtype(), {p * chunk})) {
    ZTRAIN_ASSERT(group.size(0) == rows * p && group.size(1) * rows == chunk, "group ",
                  ShapeToString(group.shape()), " for local ", ShapeToString(local.shape()));
  }
  // The part of `buffer` at element `at`, `width` columns of this rank's rows.
  Tensor Part(const Tensor& buffer, int64_t at, int64_t width) const {
    return buffer.Slice(at, at + rows * width).View({rows, width});
  }
  int p;
  int64_t rows, piece, chunk;  // this rank's token rows, per sample, elements per peer
  Buffer send_hold, recv_hold;
  Tensor send, recv;
};

}  // namespace

void ContextGroup::SequenceToHeads(LayerContext& ctx, const UlyssesHeads& heads, bool with_kv,
                                   int64_t batch, const Tensor& local, const Tensor& group) const {
  kernels::Ops& ops = ctx.ops();
  const Exchange x(ctx, *this, heads, with_kv, batch, local, group);
  for (int j = 0; j < x.p; ++j) {  // to rank j: this rank's tokens, head group j
    int64_t at = j * x.chunk;
    for (const HeadColumns& c : heads.Columns(j, with_kv)) {
      ops.CopyColumns(local, c.local, x.Part(x.send, at, c.width));
      at += x.rows * c.width;
    }
  }
  AllToAll(x.send, x.recv);
  ops.Zero(group);
  for (int i = 0; i < x.p; ++i) {  // from rank i: tokens [i T/P, (i+1) T/P) of each sample
    int64_t at = i * x.chunk;
    for (const HeadColumns& c : heads.Columns(rank(), with_kv)) {
      const Tensor part = x.Part(x.recv, at, c.width);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = (b * x.p + i) * x.piece;
        ops.AddColumns(group.Slice(row, row + x.piece), c.group,
                       part.Slice(b * x.piece, (b + 1) * x.piece), 1.0f);
      }
      at += x.rows * c.width;
    }
  }
}

void ContextGroup::HeadsToSequence(LayerContext& ctx, const UlyssesHeads& heads, bool with_kv,
                                   int64_t batch, const Tensor& group, const Tensor& local) const {
  kernels::Ops& ops = ctx.ops();
  const Exchange x(ctx, *this, heads, with_kv, batch, local, group);
  for (int i = 0; i < x.p; ++i) {  // to rank i: its tokens, this rank's head group
    int64_t at = i * x.chunk;
    for (const HeadColumns& c : heads.Columns(rank(), with_kv)) {
      const Tensor part = x.Part(x.send, at, c.width);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = (b * x.p + i) * x.piece;
        ops.CopyColumns(group.Slice(row, row + x.piece), c.group,
                        part.Slice(b * x.piece, (b + 1) * x.piece));
      }
      at += x.rows * c.width;
    }
  }
  AllToAll(x.send, x.recv);
  ops.Zero(local);
  for (int j = 0; j < x.p; ++j) {  // from rank j: head group j of this rank's tokens
    int64_t at = j * x.chunk;
    for (const HeadColumns& c : heads.Columns(j, with_kv)) {
      ops.AddColumns(local, c.local, x.Part(x.recv, at, c.width), 1.0f);
      at += x.rows * c.width;
    }
  }
}

void ContextSlice(int rank, int size, int64_t rows, int64_t seq, const int32_t* tokens,
                  const int32_t* targets, const int32_t* whole_positions, int32_t* slice_tokens,
                  int32_t* slice_targets, int32_t* slice_positions) {
  ZTRAIN_ASSERT(size >= 1 && rank >= 0 && rank < size && seq % size == 0);
  const int64_t piece = seq / size, first = rank * piece;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t from = b * seq + first, to = b * piece;
    std::copy(tokens + from, tokens + from + piece, slice_tokens + to);
    std::copy(targets + from, targets + from + piece, slice_targets + to);
    if (whole_positions != nullptr) {
      std::copy(whole_positions + from, whole_positions + from + piece, slice_positions + to);
    } else {
      std::iota(slice_positions + to, slice_positions + to + piece, static_cast<int32_t>(first));
    }
  }
}

ContextMicroBatch::ContextMicroBatch(const MicroBatch& whole, int rank, int size) {
  const int64_t b = whole.B(), t = whole.T();
  ZTRAIN_CHECK(t % size == 0, "context parallelism over ", size, " ranks: a micro-batch of ", t,
               " tokens per sample does not split evenly");
  const int64_t n = b * (t / size);
  tokens.resize(static_cast<size_t>(n));
  targets.resize(static_cast<size_t>(n));
  positions.resize(static_cast<size_t>(n));
  const int32_t* packed = whole.positions.defined() ? whole.positions.data<int32_t>() : nullptr;
  ContextSlice(rank, size, b, t, whole.tokens.data<int32_t>(), whole.targets.data<int32_t>(),
               packed, tokens.data(), targets.data(), positions.data());
  mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t / size});
  mb.targets = Tensor(targets.data(), DType::kI32, {b, t / size});
  mb.positions = Tensor(positions.data(), DType::kI32, {b, t / size});
  if (packed != nullptr) {
    whole_positions.assign(packed, packed + b * t);
    mb.whole_positions = Tensor(whole_positions.data(), DType::kI32, {b, t});
  }
}

}  // namespace ztrain::nn
