// Note [Frozen parameters] (kernels/ops.h) through the linear providers: the single-process
// ones (nn::WholeLinears) and MegatronLinears at every tp size of this world, in fp32 and in
// bf16 (with fp32 and with bf16 gradients). Each provider call runs twice from the same
// values: with every parameter gradient defined, and with some undefined (frozen). The input
// gradient and the other parameter gradients must come out bit for bit the same, and the
// collectives be the same ones, moving the same bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"
#include "nn/layer_context.h"
#include "parallel/tensor/megatron_linears.h"
#include "tests/parallel/mpi_test_env.h"
#include "tests/parallel/tensor/tp_test_util.h"

namespace ztrain::tensor::test {
namespace {

constexpr int64_t kB = 2, kT = 8, kN = kB * kT;

// The bytes of one host tensor of any float dtype, from fp32 values rounded once.
struct Host {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
  Host(DType d, Shape s, const std::vector<float>& values)
      : dtype(d), shape(std::move(s)), bytes(values.size() * DTypeSize(d)) {
    if (d == DType::kF32) {
      std::memcpy(bytes.data(), values.data(), bytes.size());
    } else {
      ConvertFromFloat(values.data(), bytes.data(), d, values.size());
    }
  }
  Tensor tensor() { return Tensor(bytes.data(), dtype, shape); }
};

// The dtypes of a run: activations (and the weights' compute copies), parameter gradients.
struct Precision {
  const char* name;
  DType act, grad;
};
constexpr Precision kPrecisions[] = {{"fp32", DType::kF32, DType::kF32},
                                     {"bf16, fp32 grads", DType::kBF16, DType::kF32},
                                     {"all bf16", DType::kBF16, DType::kBF16}};

struct Provider {
  std::string name;
  std::shared_ptr<const nn::LinearProvider> linears;
  int parts;  // pieces a split parameter is cut into
};

std::vector<Provider> Providers(comm::Communicator& tp) {
  return {{"whole", nn::MakeWholeLinears(), 1},
          {"megatron, tp " + std::to_string(tp.size()), std::make_shared<const MegatronLinears>(tp),
           tp.size()}};
}

using ProviderCall = std::function<void(nn::LayerContext&, const std::vector<Tensor>&)>;

struct Collectives {
  int64_t ops = 0, bytes = 0;
};
Collectives CountOf(const comm::Communicator& tp) {
  const comm::CommStats s = tp.stats();
  Collectives c{0, s.TotalBytes()};
  for (int64_t o : s.ops) c.ops += o;
  return c;
}

// Runs `call` (on a fresh context of `act` and the CPU ops) on copies of `args` twice: every
// tensor, then those at `frozen` undefined. The others must end bit for bit the same; each
// frozen one must change in the first run (on some rank of `tp`); both runs issue the same
// collectives on `tp`. Collective over `tp`.
void ExpectFrozenSkipped(comm::Communicator& tp, DType act, const std::vector<Host>& args,
                         const std::set<size_t>& frozen, const ProviderCall& call) {
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  MemoryTracker tracker;
  HostAllocator allocator(&tracker);
  const auto run = [&](std::vector<Host>& tensors, const std::set<size_t>& undefined) {
    std::vector<Tensor> views;
    for (size_t i = 0; i < tensors.size(); ++i) {
      views.push_back(undefined.count(i) ? Tensor() : tensors[i].tensor());
    }
    nn::LayerContext ctx(*ops, allocator, act);
    const Collectives before = CountOf(tp);
    call(ctx, views);
    const Collectives after = CountOf(tp);
    return Collectives{after.ops - before.ops, after.bytes - before.bytes};
  };
  std::vector<Host> full = args, part = args;
  const Collectives full_comm = run(full, {}), part_comm = run(part, frozen);
  EXPECT_EQ(part_comm.ops, full_comm.ops);
  EXPECT_EQ(part_comm.bytes, full_comm.bytes);
  for (size_t i = 0; i < args.size(); ++i) {
    if (frozen.count(i)) {
      // On some rank: a slice of the vocabulary that is all padding gets no gradient.
      std::vector<float> written = {full[i].bytes != args[i].bytes ? 1.0f : 0.0f};
      tp.AllReduce(comm::test::F32(written), comm::ReduceOp::kMax)->Wait();
      EXPECT_EQ(written[0], 1.0f) << "argument " << i << " is never written";
    } else {
      EXPECT_EQ(part[i].bytes, full[i].bytes) << "argument " << i << " differs";
    }
  }
}

// Runs `body(provider, precision)` for both providers of every tp group size and every
// precision, each traced.
template <typename Body>
void ForEveryProvider(Body&& body) {
  for (int tp_size : TpSizes()) {
    const auto tp = TpGroup(tp_size);
    for (const Provider& p : Providers(*tp)) {
      for (const Precision& prec : kPrecisions) {
        SCOPED_TRACE(p.name + ", " + prec.name);
        body(*tp, p, prec);
      }
    }
  }
}

// Two column-parallel linears on one input (SwiGLU's gate and up, or q/k/v): indices 0-3 are
// the first's dy, weight, dweight, dbias, 4-7 the second's, 8 x, 9 dx.
TEST(TensorParallelFrozenTest, ColumnBackwardSkipsFrozenWeightsAndBiases) {
  const int64_t c = TinyModel().n_embd;
  ForEveryProvider([&](comm::Communicator& tp, const Provider& p, const Precision& prec) {
    const int64_t oc1 = 48 / p.parts, oc2 = 96 / p.parts;
    const std::vector<Host> args = {
        {prec.act, {kN, oc1}, Normal("dy1", kN * oc1)}, {prec.act, {oc1, c}, Normal("w1", oc1 * c)},
        {prec.grad, {oc1, c}, Normal("dw1", oc1 * c)},  {prec.grad, {oc1}, Normal("db1", oc1)},
        {prec.act, {kN, oc2}, Normal("dy2", kN * oc2)}, {prec.act, {oc2, c}, Normal("w2", oc2 * c)},
        {prec.grad, {oc2, c}, Normal("dw2", oc2 * c)},  {prec.grad, {oc2}, Normal("db2", oc2)},
        {prec.act, {kN, c}, Normal("x", kN * c)},       {prec.act, {kN, c}, Normal("dx", kN * c)}};
    const ProviderCall call = [&](nn::LayerContext& ctx, const std::vector<Tensor>& v) {
      const nn::LinearGrad linears[] = {{v[0], v[1], v[2], v[3], Buffer()},
                                      {v[4], v[5], v[6], v[7], Buffer()}};
      p.linears->ColumnBackward(ctx, linears, v[8], v[9]);
    };
    for (const std::set<size_t>& frozen : {std::set<size_t>{2}, {2, 3}, {6}, {2, 3, 6, 7}}) {
      ExpectFrozenSkipped(tp, prec.act, args, frozen, call);
    }
  });
}

// 0 dout, 1 dwte (this piece's rows of the padded vocabulary), 2 dwpe.
TEST(TensorParallelFrozenTest, EmbeddingBackwardSkipsFrozenTables) {
  const ModelConfig m = TinyModel();
  const int64_t c = m.n_embd;
  const Batch batch(kB, kT, m.vocab_size);
  ForEveryProvider([&](comm::Communicator& tp, const Provider& p, const Precision& prec) {
    const int64_t rows = m.padded_vocab_size / p.parts;
    const std::vector<Host> args = {
        {prec.act, {kB, kT, c}, Normal("dout", kN * c)},
        {prec.grad, {rows, c}, Normal("dwte", rows * c)},
        {prec.grad, {m.max_seq_len, c}, Normal("dwpe", m.max_seq_len * c)}};
    const ProviderCall call = [&](nn::LayerContext& ctx, const std::vector<Tensor>& v) {
      p.linears->EmbeddingBackward(ctx, batch.mb, v[0], v[1], v[2]);
    };
    for (const std::set<size_t>& frozen : {std::set<size_t>{1}, {2}, {1, 2}}) {
      ExpectFrozenSkipped(tp, prec.act, args, frozen, call);
    }
  });
}

// 0 h, 1 weight (this piece's rows), 2 dlosses (fp32), 3 dh, 4 dweight: forward, then backward.
TEST(TensorParallelFrozenTest, HeadLossBackwardSkipsAFrozenHead) {
  const ModelConfig m = TinyModel();
  const int64_t c = m.n_embd;
  const Batch batch(kB, kT, m.vocab_size);
  ForEveryProvider([&](comm::Communicator& tp, const Provider& p, const Precision& prec) {
    const int64_t rows = m.padded_vocab_size / p.parts;
    const std::vector<Host> args = {{prec.act, {kN, c}, Normal("h", kN * c, 3.0f)},
                                    {prec.act, {rows, c}, Normal("weight", rows * c)},
                                    {DType::kF32, {kN}, Normal("dloss", kN, 1.0f / kN)},
                                    {prec.act, {kN, c}, Normal("dh", kN * c)},
                                    {prec.grad, {rows, c}, Normal("dweight", rows * c)}};
    const ProviderCall call = [&](nn::LayerContext& ctx, const std::vector<Tensor>& v) {
      const Tensor losses = ctx.Scratch(DType::kF32, {kN});
      p.linears->HeadLossForward(ctx, batch.mb, v[0], v[1], m.vocab_size, losses);
      p.linears->HeadLossBackward(ctx, batch.mb, v[0], v[1], m.vocab_size, v[2], v[3], v[4]);
    };
    ExpectFrozenSkipped(tp, prec.act, args, {4}, call);
  });
}

}  // namespace
}  // namespace ztrain::tensor::test
