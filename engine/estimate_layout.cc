// The rank's layers for a memory estimate (Note [Memory estimate], estimate_replay.h): the
// stage's layers as Engine::SelectStage and Engine::BuildStorage lay them out, and what each
// allocates for a micro-batch, measured by running it on a shape-only device.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/buffer.h"
#include "core/error.h"
#include "engine/estimate_replay.h"
#include "engine/param_layout.h"
#include "kernels/ops.h"
#include "nn/layer_context.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/partition.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain::detail {
namespace {


// A finished op that moved nothing.
class NoWork final : public comm::Work {
 public:
  void Wait() override {}
  bool Done() override { return true; }
};

// A tensor-parallel group that answers its size and rank and whose ops move nothing: enough
// for tensor::BuildParallelModel to declare rank 0's parameter shapes (every rank's are equal:
// the model must split evenly) and for its layers to run on ShapeOps.
class ShapeOnlyGroup final : public comm::Communicator {
 public:
  explicit ShapeOnlyGroup(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string name() const override { return "estimate's shape-only tp group"; }
  void set_label(const std::string&) override {}
  std::chrono::milliseconds timeout() const override { return {}; }
  void set_timeout(std::chrono::milliseconds) override {}
  comm::WorkPtr AllReduce(const Tensor&, comm::ReduceOp) override { return Done(); }
  comm::WorkPtr ReduceScatter(const Tensor&, const Tensor&, comm::ReduceOp) override {
    return Done();
  }
  comm::WorkPtr AllGather(const Tensor&, const Tensor&) override { return Done(); }
  comm::WorkPtr Broadcast(const Tensor&, int) override { return Done(); }
  comm::WorkPtr Send(const Tensor&, int, int) override { return Done(); }
  comm::WorkPtr Recv(const Tensor&, int, int) override { return Done(); }
  comm::WorkPtr Barrier() override { return Done(); }
  std::unique_ptr<Communicator> Split(int, int) override {
    ZTRAIN_ASSERT(false, "the memory estimate's tp group does not split");
    return nullptr;
  }
  comm::CommStats stats() const override { return {}; }

 private:
  static comm::WorkPtr Done() { return std::make_shared<NoWork>(); }
  int size_;
};

// Kernels that compute nothing: the layers' code runs, with every allocation it makes, and
// no element is read or written.
class ShapeOps final : public kernels::Ops {
 public:
  Device device() const override { return Device::Cpu(); }
  void Gemm(bool, bool, float, const Tensor&, const Tensor&, float, const Tensor&) override {}
  void LinearForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void LinearBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override {}
  void EmbeddingForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void EmbeddingBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void LayerNormForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&) override {}
  void LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void RmsNormForward(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) override {}
  void RmsNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&) override {}
  void AttentionForward(const Tensor&, const kernels::AttentionHeads&, const Tensor&,
                        const Tensor&) override {}
  void AttentionBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const kernels::AttentionHeads&, const Tensor&) override {}
  void RopeForward(const Tensor&, const kernels::AttentionHeads&, const Tensor&) override {}
  void RopeBackward(const Tensor&, const kernels::AttentionHeads&, const Tensor&) override {}
  void SwiGluForward(const Tensor&, const Tensor&, const Tensor&) override {}
  void SwiGluBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override {}
  void GeluForward(const Tensor&, const Tensor&) override {}
  void GeluBackward(const Tensor&, const Tensor&, const Tensor&) override {}
  void Add(const Tensor&, const Tensor&, const Tensor&) override {}
  void AddInPlace(const Tensor&, const Tensor&) override {}
  void Zero(const Tensor&) override {}
  void Copy(const Tensor&, const Tensor&) override {}
  void Synchronize() override {}
  void SoftmaxCrossEntropy(const Tensor&, const Tensor&, int64_t, const Tensor&,
                           const Tensor&) override {}
  double SumSquares(const Tensor&) override { return 0.0; }
  void Scale(const Tensor&, float) override {}
};

// Address space mapped MAP_NORESERVE: no page is committed unless written. ShapeOps writes
// none, so a 70B model's tensors cost nothing here; the tensor-parallel layers' host loops
// (the vocabulary-parallel embedding and loss) do touch their tensors, which is why layers
// are measured at micro-batches 1 and 2 only (MeasureLayer). With `events`, every allocation
// and free is recorded in order.
class TraceAllocator final : public Allocator {
 public:
  explicit TraceAllocator(std::vector<AllocEvent>* events = nullptr) : events_(events) {}
  // Ids number the allocations across every phase, so a later phase may free an earlier
  // one's.
  void set_events(std::vector<AllocEvent>* events) { events_ = events; }
  void* Allocate(size_t bytes, MemoryCategory category) override {
    void* p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ZTRAIN_CHECK(p != MAP_FAILED, "the memory estimate cannot map ", bytes,
                 " bytes of address space for a layer's ", MemoryCategoryName(category));
    if (events_) {
      const int id = static_cast<int>(ids_.size());
      ids_[p] = id;
      events_->push_back({static_cast<int64_t>(bytes), category, id, false});
    }
    return p;
  }
  void Free(void* ptr, size_t bytes, MemoryCategory category) noexcept override {
    if (events_) {
      auto it = ids_.find(ptr);
      if (it != ids_.end()) {
        events_->push_back({static_cast<int64_t>(bytes), category, it->second, true});
        ids_.erase(it);
      }
    }
    ::munmap(ptr, std::max<size_t>(bytes, 1));
  }
  Device device() const override { return Device::Cpu(); }
  MemoryTracker* tracker() const override { return &tracker_; }

 private:
  std::vector<AllocEvent>* events_;
  std::unordered_map<void*, int> ids_;
  mutable MemoryTracker tracker_;
};

LayerLayout::Kind KindOf(const nn::Layer& layer, int* block) {
  const std::string name = layer.Name();
  if (name == "embedding") return LayerLayout::Kind::kEmbedding;
  if (name == "lm_head") return LayerLayout::Kind::kLmHead;
  *block = layer.BlockIndex();
  ZTRAIN_ASSERT(*block >= 0, "unexpected layer '", name, "'");
  return LayerLayout::Kind::kBlock;
}


// What `layer` allocates for one micro-batch: its Forward and Backward run once on ShapeOps,
// every allocation through its LayerContext recorded (Note [Memory estimate]). Its
// parameters (laid out as BuildStorage lays them, so packed runs are contiguous), input,
// output and their gradients are the engine's and are not recorded.
LayerActivations Measure(nn::Layer& layer, const Shape& input_shape, bool first,
                         const EstimateInput& in, int64_t micro_batch) {
  TraceAllocator untraced;
  std::vector<Buffer> keep;
  auto tensor = [&](DType dtype, const Shape& shape) {
    keep.emplace_back(untraced, dtype, shape, MemoryCategory::kActivations);
    return keep.back().AsTensor(dtype, shape);
  };
  const std::vector<nn::ParamSpec> specs = layer.Params();
  ParamPacker packer;
  std::vector<int64_t> offsets;
  for (const nn::ParamSpec& spec : specs) offsets.push_back(packer.Place(spec));
  const Tensor flat = tensor(in.compute, {std::max<int64_t>(packer.size(), 1)});
  const Tensor flat_grads = tensor(in.grad, {std::max<int64_t>(packer.size(), 1)});
  std::vector<Tensor> params, grads;
  for (size_t i = 0; i < specs.size(); ++i) {
    params.push_back(flat.Flat(offsets[i], specs[i].shape));
    grads.push_back(flat_grads.Flat(offsets[i], specs[i].shape));
  }
  layer.Bind(params, grads);
  nn::MicroBatch mb;
  mb.tokens = tensor(DType::kI32, {micro_batch, in.seq_len});
  mb.targets = tensor(DType::kI32, {micro_batch, in.seq_len});
  const DType act = in.compute, out_dtype = layer.OutputDType(act);
  const Shape out_shape = layer.OutputShape(input_shape);
  const Tensor input = first ? mb.tokens : tensor(act, input_shape);
  const Tensor output = tensor(out_dtype, out_shape);
  const Tensor doutput = tensor(out_dtype, out_shape);
  const Tensor dinput = first ? Tensor() : tensor(act, input_shape);
  LayerActivations acts;
  acts.output = NumElements(out_shape) * static_cast<int64_t>(DTypeSize(out_dtype));
  acts.input_grad = first ? 0 : NumElements(input_shape) * static_cast<int64_t>(DTypeSize(act));
  ShapeOps ops;
  TraceAllocator traced;
  nn::LayerContext ctx(ops, traced, act);
  traced.set_events(&acts.forward);
  layer.Forward(mb, input, output, ctx);
  traced.set_events(&acts.backward);
  layer.Backward(mb, input, doutput, dinput, ctx);
  traced.set_events(nullptr);
  ctx.Release();
  return acts;
}

// a + (b - a) (n - 1): the size at micro-batch n of one that is a at 1 and b at 2; ConfigError
// past int64.
int64_t Extrapolate(int64_t a, int64_t b, int64_t n) {
  int64_t grown = 0, out = 0;
  const bool overflow = __builtin_mul_overflow(b - a, n - 1, &grown) ||
                        __builtin_add_overflow(a, grown, &out);
  ZTRAIN_CHECK_T(ConfigError, !overflow && out >= 0, "a layer's activations at micro-batch ", n,
                 " exceed 2^63 bytes");
  return out;
}

bool SameEvents(const std::vector<AllocEvent>& a, const std::vector<AllocEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].free != b[i].free || a[i].category != b[i].category) {
      return false;
    }
  }
  return true;
}

// What `layer` allocates at in.micro_batch. Every size a layer allocates is affine in the
// micro-batch (B x T x width, or independent of B, such as a weight's fp32 widening), so it
// is measured at micro-batches 1 and 2 and extended to in.micro_batch: the probe never
// touches more than two rows' worth of memory, whatever the micro-batch. Should the two
// measurements differ in anything but sizes, the layer is run at in.micro_batch itself.
LayerActivations MeasureLayer(nn::Layer& layer, Shape input_shape, bool first,
                              const EstimateInput& in) {
  const int64_t b = in.micro_batch;
  if (b <= 2) return Measure(layer, input_shape, first, in, b);
  input_shape[0] = 1;
  const LayerActivations one = Measure(layer, input_shape, first, in, 1);
  input_shape[0] = 2;
  LayerActivations two = Measure(layer, input_shape, first, in, 2);
  if (!SameEvents(one.forward, two.forward) || !SameEvents(one.backward, two.backward)) {
    input_shape[0] = b;
    return Measure(layer, input_shape, first, in, b);
  }
  for (size_t i = 0; i < two.forward.size(); ++i) {
    two.forward[i].bytes = Extrapolate(one.forward[i].bytes, two.forward[i].bytes, b);
  }
  for (size_t i = 0; i < two.backward.size(); ++i) {
    two.backward[i].bytes = Extrapolate(one.backward[i].bytes, two.backward[i].bytes, b);
  }
  two.output = Extrapolate(one.output, two.output, b);
  two.input_grad = Extrapolate(one.input_grad, two.input_grad, b);
  return two;
}

std::vector<int> StageBounds(const Config& config,
                             const std::vector<std::vector<nn::ParamSpec>>& specs) {
  const int stages = config.pipeline_stages;
  if (stages <= 1) return {0, static_cast<int>(specs.size())};
  std::vector<int64_t> counts;
  for (const auto& layer : specs) {
    int64_t n = 0;
    for (const nn::ParamSpec& s : layer) n += NumElements(s.shape);
    counts.push_back(n);
  }
  try {
    return pipeline::PartitionLayers(counts, stages,
                                     pipeline::ParsePartitionMethod(config.pipeline_partition));
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
}

}  // namespace

StageLayout LayOutStage(const EstimateInput& in) {
  const Config& config = *in.config;
  const int stage = in.pp_stage, dp = in.dp, tp = in.tp;
  ShapeOnlyGroup group(tp);
  const std::vector<std::unique_ptr<nn::Layer>> model =
      tensor::BuildParallelModel(config.model, group);
  std::vector<std::vector<nn::ParamSpec>> specs;
  for (const auto& layer : model) specs.push_back(layer->Params());
  const std::vector<int> bounds = StageBounds(config, specs);
  const auto begin = static_cast<size_t>(bounds[static_cast<size_t>(stage)]);
  const auto end = static_cast<size_t>(bounds[static_cast<size_t>(stage) + 1]);
  auto stage_of = [&](size_t l) {
    return static_cast<int>(std::upper_bound(bounds.begin(), bounds.end(), static_cast<int>(l)) -
                            bounds.begin()) -
           1;
  };
  StageLayout out;
  std::unordered_map<std::string, size_t> owner;
  for (size_t l = 0; l < specs.size(); ++l) {
    for (const nn::ParamSpec& s : specs[l]) {
      if (!s.tied_to.empty()) continue;
      owner[s.name] = l;
      out.model_parameters += NumElements(s.tp.split() ? s.tp.full_shape : s.shape);
    }
  }
  out.layers.resize(end - begin);
  std::vector<int64_t> min_padded(end - begin, 0);
  // Weights tied across stages (engine_pipeline.cc, SelectStage): both ends store them.
  for (size_t l = 0; l < specs.size(); ++l) {
    for (const nn::ParamSpec& s : specs[l]) {
      auto it = s.tied_to.empty() ? owner.end() : owner.find(s.tied_to);
      if (it == owner.end() || stage_of(it->second) == stage_of(l)) continue;
      const size_t o = it->second;
      const int64_t size =
          std::max(TiedLayoutSize(specs[o], s.tied_to), TiedLayoutSize(specs[l], s.name));
      for (size_t end_layer : {l, o}) {
        if (stage_of(end_layer) != stage) continue;
        min_padded[end_layer - begin] = std::max(min_padded[end_layer - begin], size);
        out.layers[end_layer - begin].stage_tie = NumElements(s.shape);
      }
    }
  }
  for (size_t l = begin; l < end; ++l) {
    LayerLayout& layer = out.layers[l - begin];
    layer.kind = KindOf(*model[l], &layer.block);
    ParamPacker packer;
    auto add_unit = [&](size_t u) {
      if (std::find(layer.units.begin(), layer.units.end(), u) == layer.units.end()) {
        layer.units.push_back(u);
      }
    };
    for (const nn::ParamSpec& s : specs[l]) {
      auto it = s.tied_to.empty() ? owner.end() : owner.find(s.tied_to);
      const bool in_stage = it != owner.end() && stage_of(it->second) == stage;
      if (in_stage) {  // bound to the owner's buffer
        out.layers[it->second - begin].tie_owner = true;
        add_unit(it->second - begin);
        continue;
      }
      // Its own parameter, or this stage's copy of a weight another stage owns.
      packer.Place(s);
      layer.owned += NumElements(s.shape);
      add_unit(l - begin);
    }
    const int64_t padded = std::max(packer.size(), min_padded[l - begin]);
    layer.padded = AlignUp(padded, kParamAlignment * dp);
    layer.shard = layer.padded / dp;
    out.rank_parameters += layer.owned;
  }
  // The layers' own allocations, each layer's input shaped by those before it.
  Shape shape = {in.micro_batch, in.seq_len};
  for (size_t l = 0; l < end; ++l) {
    if (l >= begin) out.layers[l - begin].acts = MeasureLayer(*model[l], shape, l == 0, in);
    shape = model[l]->OutputShape(shape);
  }
  return out;
}

}  // namespace ztrain::detail
