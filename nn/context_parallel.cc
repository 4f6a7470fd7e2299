// Note [Context parallelism] (context_parallel.h): Ulysses' exchanges and the slicing of
// sequences.
#include "nn/context_parallel.h"

#include <array>
#include <numeric>
#include <optional>

#include "core/error.h"

namespace ztrain::nn {

UlyssesHeads::UlyssesHeads(const kernels::AttentionHeads& heads, int size) : whole_(heads) {
  const int kv = heads.num_kv_heads;
  ZTRAIN_CHECK_T(ConfigError, size >= 1 && heads.num_heads % size == 0, "Ulysses over ", size,
                 " ranks needs query heads that divide by it, got ", heads.num_heads,
                 "; choose a context_parallel.size that divides ", heads.num_heads,
                 ", or \"algorithm\": \"ring\" (any head count)");
  ZTRAIN_CHECK_T(ConfigError, kv >= 1 && (kv % size == 0 || size % kv == 0), "Ulysses over ", size,
                 " ranks needs key/value heads that divide by it or divide it, got ", kv,
                 "; choose a context_parallel.size that divides or is a multiple of ", kv,
                 ", or \"algorithm\": \"ring\" (any head count)");
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

void ContextSlice(ContextAlgorithm algorithm, int rank, int size, int64_t rows, int64_t seq,
                  const int32_t* tokens, const int32_t* targets, const int32_t* whole_positions,
                  int32_t* slice_tokens, int32_t* slice_targets, int32_t* slice_positions) {
  const int chunks = algorithm == ContextAlgorithm::kRing ? 2 * size : size;
  ZTRAIN_ASSERT(size >= 1 && rank >= 0 && rank < size && seq % chunks == 0);
  const int64_t chunk = seq / chunks, piece = seq / size;
  std::vector<int64_t> ids = {rank};  // the chunks this rank keeps, in order
  if (algorithm == ContextAlgorithm::kRing) ids.push_back(2 * size - 1 - rank);
  for (int64_t b = 0; b < rows; ++b) {
    for (size_t k = 0; k < ids.size(); ++k) {
      const int64_t first = ids[k] * chunk;
      const int64_t from = b * seq + first, to = b * piece + static_cast<int64_t>(k) * chunk;
      std::copy(tokens + from, tokens + from + chunk, slice_tokens + to);
      std::copy(targets + from, targets + from + chunk, slice_targets + to);
      if (whole_positions != nullptr) {
        std::copy(whole_positions + from, whole_positions + from + chunk, slice_positions + to);
      } else {
        std::iota(slice_positions + to, slice_positions + to + chunk, static_cast<int32_t>(first));
      }
    }
  }
}

ContextAlgorithm ParseContextAlgorithm(const std::string& name) {
  if (name == "ulysses") return ContextAlgorithm::kUlysses;
  if (name == "ring") return ContextAlgorithm::kRing;
  throw ConfigError(detail::StrCat("context_parallel.algorithm \"", name,
                                   "\": expected \"ulysses\" or \"ring\""));
}

namespace {

// Zigzag chunk `k` (0 or 1) of rank `rank` of `size` (Note [Ring attention]).
int64_t RingChunk(int rank, int size, int k) { return k == 0 ? rank : 2 * size - 1 - rank; }

// The rows [k c, (k+1) c) of sample b of a [B * 2c, width] tensor.
Tensor ChunkRows(const Tensor& t, int64_t b, int k, int64_t c) {
  const int64_t row = (2 * b + k) * c;
  return t.Slice(row, row + c);
}

// The log-sum-exp of sample b's chunk k, [1, NH, c], in the ring's lse (B * 2 * NH * c).
Tensor ChunkLse(const Tensor& lse, const kernels::AttentionHeads& heads, int64_t b, int k,
                int64_t c) {
  const int64_t n = heads.num_heads * c;
  return lse.Slice((2 * b + k) * n, (2 * b + k + 1) * n).View({1, heads.num_heads, c});
}

// A ring buffer of ctx's allocator, freed with the Buffer.
Tensor RingBuffer(LayerContext& ctx, Buffer& hold, DType dtype, const Shape& shape,
                  MemoryCategory category) {
  hold = Buffer(ctx.allocator(), dtype, shape, category);
  return hold.AsTensor(dtype, shape);
}

// One query chunk against one key chunk: the pair's rows (queries of X beside keys and values
// of Y), and its mask.
struct RingPair {
  int64_t offset;  // (X - Y) c: query row i sits at key index i + offset
};

// Whether query chunk x sees anything of key chunk y: y before x, and within the window.
std::optional<RingPair> Pair(int64_t x, int64_t y, int64_t c, int64_t window) {
  if (y > x) return std::nullopt;
  const int64_t nearest = (x - y) * c - (c - 1);  // the closest query/key distance
  if (window > 0 && x != y && nearest >= window) return std::nullopt;
  return RingPair{(x - y) * c};
}

// The pair's q/k/v rows [c, W]: q (`q`, [c, q width]) beside k and v (`kv`, [c, kv widths]).
void PairRows(kernels::Ops& ops, const Tensor& q, const Tensor& kv, const Tensor& pair) {
  ops.Zero(pair);
  ops.AddColumns(pair, 0, q, 1.0f);
  ops.AddColumns(pair, q.size(1), kv, 1.0f);
}

kernels::AttentionMask PairMask(const RingPair& pair, int64_t window, const Tensor& positions,
                                int64_t b, int k, int64_t c) {
  kernels::AttentionMask mask{.window = window, .positions = {}, .offset = pair.offset};
  if (positions.defined()) {
    mask.positions = ChunkRows(positions.View({positions.numel(), 1}), b, k, c).View({1, c});
  }
  return mask;
}

}  // namespace

void ContextGroup::RingForward(LayerContext& ctx, const kernels::AttentionHeads& heads,
                               int64_t window, const Tensor& positions, int64_t batch,
                               const Tensor& qkv, const Tensor& out, const Tensor& lse) const {
  kernels::Ops& ops = ctx.ops();
  const int p = size(), r = rank();
  const int64_t rows = qkv.size(0), c = rows / batch / 2;
  const int64_t qw = heads.q_width(), kvw = 2 * heads.kv_width(), width = heads.qkv_width();
  const DType dtype = qkv.dtype();
  Buffer hold_kv, hold_next, hold_q, hold_pair, hold_part, hold_plse, hold_acc;
  Tensor kv = RingBuffer(ctx, hold_kv, dtype, {rows, kvw}, MemoryCategory::kCommunication);
  Tensor next = RingBuffer(ctx, hold_next, dtype, {rows, kvw}, MemoryCategory::kCommunication);
  ops.CopyColumns(qkv, qw, kv);
  const Tensor q = RingBuffer(ctx, hold_q, dtype, {rows, qw}, MemoryCategory::kWorkspace);
  ops.CopyColumns(qkv, 0, q);
  const Tensor pair = RingBuffer(ctx, hold_pair, dtype, {c, width}, MemoryCategory::kWorkspace);
  const Tensor part = RingBuffer(ctx, hold_part, dtype, {c, qw}, MemoryCategory::kWorkspace);
  const Tensor part_lse =
      RingBuffer(ctx, hold_plse, DType::kF32, {1, heads.num_heads, c}, MemoryCategory::kWorkspace);
  // The running outputs, fp32 (the chunks' rows of `out` itself when it is fp32).
  const Tensor acc = dtype == DType::kF32 ? out
                                          : RingBuffer(ctx, hold_acc, DType::kF32, {rows, qw},
                                                       MemoryCategory::kWorkspace);
  const auto chunk_lse = [&](int64_t b, int k) { return ChunkLse(lse, heads, b, k, c); };
  for (int s = 0; s < p; ++s) {
    const int src = (r - s + p) % p;
    const std::function<void()> wait =
        s + 1 < p ? StartShift(kv, next) : std::function<void()>([] {});
    for (int64_t b = 0; b < batch; ++b) {
      for (int kx = 0; kx < 2; ++kx) {
        const int64_t x = RingChunk(r, p, kx);
        // At step 0 the diagonal first: it starts the chunk's running output.
        for (const int ky : s == 0 ? std::array{kx, 1 - kx} : std::array{0, 1}) {
          const std::optional<RingPair> pr = Pair(x, RingChunk(src, p, ky), c, window);
          if (!pr) continue;
          PairRows(ops, ChunkRows(q, b, kx, c), ChunkRows(kv, b, ky, c), pair);
          // The diagonal at step 0 writes the chunk's running output and lse (through `part`
          // when the kernel's act dtype is not the running output's fp32); later pairs merge.
          const bool first = s == 0 && ky == kx;
          const Tensor running = ChunkRows(acc, b, kx, c);
          const Tensor o = first && dtype == DType::kF32 ? running : part;
          const Tensor o_lse = first ? chunk_lse(b, kx) : part_lse;
          ops.AttentionForward(pair.View({1, c, width}), heads,
                               PairMask(*pr, window, positions, b, kx, c), o.View({1, c, qw}),
                               o_lse);
          if (first && o.data() != running.data()) ops.Copy(o, running);
          if (!first) {
            ops.MergeAttention(running.View({1, c, qw}), chunk_lse(b, kx), part.View({1, c, qw}),
                               part_lse);
          }
        }
      }
    }
    wait();
    std::swap(kv, next);
  }
  if (acc.data() != out.data()) ops.Copy(acc, out);
}

void ContextGroup::RingBackward(LayerContext& ctx, const kernels::AttentionHeads& heads,
                                int64_t window, const Tensor& positions, int64_t batch,
                                const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse, const Tensor& dqkv) const {
  kernels::Ops& ops = ctx.ops();
  const int p = size(), r = rank();
  const int64_t rows = qkv.size(0), c = rows / batch / 2;
  const int64_t qw = heads.q_width(), kvw = 2 * heads.kv_width(), width = heads.qkv_width();
  const DType dtype = qkv.dtype();
  Buffer hold_kv, hold_next, hold_dkv, hold_sum, hold_mine, hold_q, hold_dq, hold_pair, hold_dpair,
      hold_tq, hold_tkv, hold_cast;
  Tensor kv = RingBuffer(ctx, hold_kv, dtype, {rows, kvw}, MemoryCategory::kCommunication);
  Tensor next = RingBuffer(ctx, hold_next, dtype, {rows, kvw}, MemoryCategory::kCommunication);
  // The key/value gradients: what came from rank r - 1 for the keys held, this step's own
  // contributions, and their sum, in flight to r + 1 while the next step computes.
  const Tensor dkv =
      RingBuffer(ctx, hold_dkv, DType::kF32, {rows, kvw}, MemoryCategory::kCommunication);
  const Tensor sum =
      RingBuffer(ctx, hold_sum, DType::kF32, {rows, kvw}, MemoryCategory::kCommunication);
  const Tensor mine =
      RingBuffer(ctx, hold_mine, DType::kF32, {rows, kvw}, MemoryCategory::kWorkspace);
  ops.CopyColumns(qkv, qw, kv);
  ops.Zero(dkv);
  const Tensor q = RingBuffer(ctx, hold_q, dtype, {rows, qw}, MemoryCategory::kWorkspace);
  ops.CopyColumns(qkv, 0, q);
  const Tensor dq = RingBuffer(ctx, hold_dq, DType::kF32, {rows, qw}, MemoryCategory::kWorkspace);
  ops.Zero(dq);
  const Tensor pair = RingBuffer(ctx, hold_pair, dtype, {c, width}, MemoryCategory::kWorkspace);
  const Tensor dpair =
      RingBuffer(ctx, hold_dpair, DType::kF32, {c, width}, MemoryCategory::kWorkspace);
  const Tensor tq = RingBuffer(ctx, hold_tq, DType::kF32, {c, qw}, MemoryCategory::kWorkspace);
  const Tensor tkv = RingBuffer(ctx, hold_tkv, DType::kF32, {c, kvw}, MemoryCategory::kWorkspace);
  const auto chunk_lse = [&](int64_t b, int k) { return ChunkLse(lse, heads, b, k, c); };
  std::function<void()> wait_dkv = [] {};
  for (int s = 0; s < p; ++s) {
    const int src = (r - s + p) % p;
    // The keys go on while this step computes, and so do the previous step's key gradients.
    const std::function<void()> wait_kv =
        s + 1 < p ? StartShift(kv, next) : std::function<void()>([] {});
    ops.Zero(mine);
    for (int64_t b = 0; b < batch; ++b) {
      for (int kx = 0; kx < 2; ++kx) {
        for (int ky = 0; ky < 2; ++ky) {
          const std::optional<RingPair> pr =
              Pair(RingChunk(r, p, kx), RingChunk(src, p, ky), c, window);
          if (!pr) continue;
          PairRows(ops, ChunkRows(q, b, kx, c), ChunkRows(kv, b, ky, c), pair);
          ops.AttentionBackward(ChunkRows(dout, b, kx, c).View({1, c, qw}),
                                pair.View({1, c, width}), ChunkRows(out, b, kx, c).View({1, c, qw}),
                                chunk_lse(b, kx), heads, PairMask(*pr, window, positions, b, kx, c),
                                dpair.View({1, c, width}));
          ops.CopyColumns(dpair, 0, tq);
          ops.AddInPlace(ChunkRows(dq, b, kx, c), tq);
          ops.CopyColumns(dpair, qw, tkv);
          ops.AddInPlace(ChunkRows(mine, b, ky, c), tkv);
        }
      }
    }
    wait_dkv();  // the gradients of rank r - s's keys so far are in dkv, and `sum` is free
    ops.Add(dkv, mine, sum);
    wait_dkv = StartShift(sum, dkv);  // on to r + 1; those of r - s - 1's keys come in
    wait_kv();
    std::swap(kv, next);
  }
  wait_dkv();  // after P shifts the key gradients are this rank's own again
  ops.Zero(dqkv);
  const Tensor cast_q = dtype == DType::kF32 ? dq
                                             : RingBuffer(ctx, hold_cast, dtype, {rows, qw},
                                                          MemoryCategory::kWorkspace);
  if (cast_q.data() != dq.data()) ops.Copy(dq, cast_q);
  ops.AddColumns(dqkv, 0, cast_q, 1.0f);
  Buffer hold_kv_cast;
  const Tensor cast_kv = dtype == DType::kF32 ? dkv
                                              : RingBuffer(ctx, hold_kv_cast, dtype, {rows, kvw},
                                                           MemoryCategory::kWorkspace);
  if (cast_kv.data() != dkv.data()) ops.Copy(dkv, cast_kv);
  ops.AddColumns(dqkv, qw, cast_kv, 1.0f);
}

ContextMicroBatch::ContextMicroBatch(const MicroBatch& whole, int rank, int size,
                                     ContextAlgorithm algorithm) {
  const int64_t b = whole.B(), t = whole.T();
  const int chunks = algorithm == ContextAlgorithm::kRing ? 2 * size : size;
  ZTRAIN_CHECK(t % chunks == 0, "context parallelism over ", size, " ranks: a micro-batch of ", t,
               " tokens per sample does not split into ", chunks, " equal pieces");
  const int64_t n = b * (t / size);
  tokens.resize(static_cast<size_t>(n));
  targets.resize(static_cast<size_t>(n));
  positions.resize(static_cast<size_t>(n));
  const int32_t* packed = whole.positions.defined() ? whole.positions.data<int32_t>() : nullptr;
  ContextSlice(algorithm, rank, size, b, t, whole.tokens.data<int32_t>(),
               whole.targets.data<int32_t>(), packed, tokens.data(), targets.data(),
               positions.data());
  mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t / size});
  mb.targets = Tensor(targets.data(), DType::kI32, {b, t / size});
  mb.positions = Tensor(positions.data(), DType::kI32, {b, t / size});
  if (packed != nullptr) {
    whole_positions.assign(packed, packed + b * t);
    mb.whole_positions = Tensor(whole_positions.data(), DType::kI32, {b, t});
  }
}

}  // namespace ztrain::nn
