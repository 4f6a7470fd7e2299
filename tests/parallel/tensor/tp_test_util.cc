#include "tests/parallel/tensor/tp_test_util.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/allocator.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"
#include "nn/init.h"
#include "nn/layer_context.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::tensor::test {

ModelConfig TinyModel() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 32;
  m.vocab_size = 90;
  m.padded_vocab_size = 128;
  m.max_seq_len = 16;
  return m;
}

std::vector<int> TpSizes() {
  const int world = comm::test::World().size();
  if (world == 4) return {4, 2};
  return {world};
}

std::unique_ptr<comm::Communicator> TpGroup(int tp_size) {
  comm::Communicator& world = comm::test::World();
  auto group = world.Split(world.rank() / tp_size, world.rank() % tp_size);
  group->set_label("tp group");
  return group;
}

std::vector<float> WholeValue(const nn::ParamSpec& whole_spec) {
  nn::ParamSpec s = whole_spec;
  if (s.init != nn::Init::kNormal) {
    s.init = nn::Init::kNormal;
    s.init_std = 0.1f;
  }
  std::vector<float> v(static_cast<size_t>(NumElements(s.shape)));
  nn::InitParam(s, kSeed, Tensor(v.data(), DType::kF32, s.shape));
  if (whole_spec.init == nn::Init::kOnes) {
    for (float& x : v) x += 1.0f;
  }
  return v;
}

std::vector<float> LocalSlice(const nn::ParamSpec& spec, const std::vector<float>& whole) {
  std::vector<float> local(static_cast<size_t>(NumElements(spec.shape)));
  nn::ForEachSliceRun(spec.tp, spec.shape,
                      [&](int64_t local_begin, int64_t full_begin, int64_t count) {
                        std::copy_n(whole.begin() + full_begin, count, local.begin() + local_begin);
                      });
  return local;
}

ParamStore::ParamStore(const std::vector<nn::Layer*>& layers) {
  for (nn::Layer* layer : layers) {
    const std::vector<nn::ParamSpec> specs = layer->Params();
    std::vector<Tensor> params, grads;
    for (size_t i = 0; i < specs.size(); ++i) {
      const nn::ParamSpec& spec = specs[i];
      Entry& e = Get(spec);
      EXPECT_EQ(e.spec.shape, spec.shape) << spec.name << " tied to " << e.spec.name;
      params.emplace_back(e.value.data(), DType::kF32, e.spec.shape);
      grads.emplace_back(e.grad.data(), DType::kF32, e.spec.shape);
      const bool run_ends = i + 1 == specs.size() || !specs[i + 1].packed;
      if (!spec.packed || !run_ends) continue;
      // The run [first, i] moves into one buffer.
      size_t first = i;
      while (specs[first].packed) --first;
      PackedRun& run = runs_.emplace_back();
      for (size_t k = first; k <= i; ++k) {
        const Entry& part = entries_.at(specs[k].name);
        run.names.push_back(specs[k].name);
        run.values.insert(run.values.end(), part.value.begin(), part.value.end());
      }
      run.grads.assign(run.values.size(), 0.0f);
      size_t offset = 0;
      for (size_t k = first; k <= i; ++k) {
        params[k] = Tensor(run.values.data() + offset, DType::kF32, specs[k].shape);
        grads[k] = Tensor(run.grads.data() + offset, DType::kF32, specs[k].shape);
        offset += static_cast<size_t>(NumElements(specs[k].shape));
      }
    }
    layer->Bind(std::move(params), std::move(grads));
  }
}

void ParamStore::SyncPacked() const {
  for (const PackedRun& run : runs_) {
    size_t offset = 0;
    for (const std::string& name : run.names) {
      std::vector<float>& grad = entries_.at(name).grad;
      std::copy_n(run.grads.begin() + static_cast<std::ptrdiff_t>(offset), grad.size(),
                  grad.begin());
      offset += grad.size();
    }
  }
}

ParamStore::Entry& ParamStore::Get(const nn::ParamSpec& spec) {
  nn::ParamSpec owner = spec;
  if (!spec.tied_to.empty()) {
    owner.name = spec.tied_to;
    owner.tied_to.clear();
  }
  auto it = entries_.find(owner.name);
  if (it != entries_.end()) return it->second;
  nn::ParamSpec whole = owner;
  if (owner.tp.split()) whole.shape = owner.tp.full_shape;
  Entry e{owner, LocalSlice(owner, WholeValue(whole)), {}};
  e.grad.assign(e.value.size(), 0.0f);
  return entries_.emplace(owner.name, std::move(e)).first->second;
}

Batch::Batch(int64_t b, int64_t t, int64_t vocab) {
  tokens.resize(static_cast<size_t>(b * t));
  targets.resize(tokens.size());
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;  // LCG: the same on every rank
    tokens[i] = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
    targets[i] = static_cast<int32_t>((x >> 17) % static_cast<uint64_t>(vocab));
  }
  mb.tokens = Tensor(tokens.data(), DType::kI32, {b, t});
  mb.targets = Tensor(targets.data(), DType::kI32, {b, t});
}

std::vector<float> Normal(const std::string& name, int64_t n, float std) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std * static_cast<float>(nn::InitNormal(kSeed, name, i));
  return v;
}

namespace {

struct Counts {
  int64_t all_reduces, ops, bytes;
};
Counts CountOf(const comm::Communicator* tp) {
  if (!tp) return {0, 0, 0};
  const comm::CommStats s = tp->stats();
  int64_t ops = 0;
  for (int64_t o : s.ops) ops += o;
  return {s.ops[static_cast<int>(comm::OpKind::kAllReduce)], ops, s.TotalBytes()};
}

}  // namespace

Pass RunPass(const std::vector<nn::Layer*>& layers, const nn::MicroBatch& mb,
             const std::vector<float>& input, const std::vector<float>& doutput,
             const comm::Communicator* tp, const Shape& input_shape) {
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  MemoryTracker tracker;
  HostAllocator allocator(&tracker);
  const bool from_tokens = input.empty();
  // acts[i] is layer i's input, acts.back() the last output.
  std::vector<std::vector<float>> acts(layers.size() + 1);
  std::vector<Shape> shapes(layers.size() + 1);
  acts[0] = input;
  shapes[0] = from_tokens ? mb.tokens.shape()
              : !input_shape.empty()
                  ? input_shape
                  : Shape{mb.B(), mb.T(), static_cast<int64_t>(input.size()) / (mb.B() * mb.T())};
  const auto view = [&](std::vector<float>& v, size_t i) {
    if (i == 0 && from_tokens) return mb.tokens;
    return Tensor(v.data(), DType::kF32, shapes[i]);
  };
  std::vector<nn::LayerContext> ctxs;
  for (size_t i = 0; i < layers.size(); ++i) ctxs.emplace_back(*ops, allocator);

  Pass pass;
  const Counts c0 = CountOf(tp);
  for (size_t i = 0; i < layers.size(); ++i) {
    shapes[i + 1] = layers[i]->OutputShape(shapes[i]);
    acts[i + 1].assign(static_cast<size_t>(NumElements(shapes[i + 1])), -1.0f);
    layers[i]->Forward(mb, view(acts[i], i), view(acts[i + 1], i + 1), ctxs[i]);
  }
  const Counts c1 = CountOf(tp);
  for (const nn::LayerContext& ctx : ctxs) pass.saved_bytes += static_cast<int64_t>(ctx.bytes());
  std::vector<float> dout = doutput;
  for (size_t i = layers.size(); i-- > 0;) {
    std::vector<float> din;
    Tensor dinput;
    if (i > 0 || !from_tokens) {
      din.assign(acts[i].size(), -1.0f);
      dinput = Tensor(din.data(), DType::kF32, shapes[i]);
    }
    layers[i]->Backward(mb, view(acts[i], i), Tensor(dout.data(), DType::kF32, shapes[i + 1]),
                        dinput, ctxs[i]);
    dout = std::move(din);
  }
  const Counts c2 = CountOf(tp);
  pass.output = acts.back();
  pass.dinput = dout;
  pass.forward_all_reduces = c1.all_reduces - c0.all_reduces;
  pass.backward_all_reduces = c2.all_reduces - c1.all_reduces;
  pass.forward_ops = c1.ops - c0.ops;
  pass.backward_ops = c2.ops - c1.ops;
  pass.forward_bytes = c1.bytes - c0.bytes;
  pass.backward_bytes = c2.bytes - c1.bytes;
  return pass;
}

::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& ref,
                                 double tol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << ref.size();
  }
  double max_ref = 0.0, max_diff = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(diff <= max_diff)) {  // also catches NaN
      max_diff = diff;
      worst = i;
    }
  }
  if (max_diff <= tol * max_ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |got - ref| = " << max_diff << " at element " << worst << " (got " << got[worst]
         << ", ref " << ref[worst] << "), max |ref| = " << max_ref << ", relative "
         << max_diff / max_ref << " > " << tol;
}

::testing::AssertionResult SameOnAllRanks(comm::Communicator& group, const std::vector<float>& v) {
  std::vector<float> hi = v, neg_lo(v.size());
  for (size_t i = 0; i < v.size(); ++i) neg_lo[i] = -v[i];
  group.AllReduce(comm::test::F32(hi), comm::ReduceOp::kMax)->Wait();
  group.AllReduce(comm::test::F32(neg_lo), comm::ReduceOp::kMax)->Wait();
  for (size_t i = 0; i < v.size(); ++i) {
    if (hi[i] != v[i] || -neg_lo[i] != v[i]) {
      return ::testing::AssertionFailure()
             << "element " << i << " is " << v[i] << " here but ranges over [" << -neg_lo[i] << ", "
             << hi[i] << "] across " << group.name();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ztrain::tensor::test
