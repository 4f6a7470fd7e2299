// The rank's layers for a memory estimate (Note [Memory estimate], estimate_replay.h): the
// stage's layers as Engine::SelectStage and Engine::BuildStorage lay them out, and what each
// allocates for a micro-batch.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "engine/estimate_replay.h"
#include "engine/param_layout.h"
#include "nn/gpt2.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/partition.h"
#include "parallel/tensor/megatron_linears.h"

namespace ztrain::detail {
namespace {


// A tensor-parallel group that only answers its size and rank: enough for
// tensor::BuildParallelModel to declare rank 0's parameter shapes (every rank's are equal:
// the model must split evenly). The estimate runs no layer, so any collective is a bug.
class ShapeOnlyGroup final : public comm::Communicator {
 public:
  explicit ShapeOnlyGroup(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string name() const override { return "estimate's shape-only tp group"; }
  void set_label(const std::string&) override {}
  std::chrono::milliseconds timeout() const override { return {}; }
  void set_timeout(std::chrono::milliseconds) override {}
  comm::WorkPtr AllReduce(const Tensor&, comm::ReduceOp) override { return Refuse(); }
  comm::WorkPtr ReduceScatter(const Tensor&, const Tensor&, comm::ReduceOp) override {
    return Refuse();
  }
  comm::WorkPtr AllGather(const Tensor&, const Tensor&) override { return Refuse(); }
  comm::WorkPtr Broadcast(const Tensor&, int) override { return Refuse(); }
  comm::WorkPtr Send(const Tensor&, int, int) override { return Refuse(); }
  comm::WorkPtr Recv(const Tensor&, int, int) override { return Refuse(); }
  comm::WorkPtr Barrier() override { return Refuse(); }
  std::unique_ptr<Communicator> Split(int, int) override {
    Refuse();
    return nullptr;
  }
  comm::CommStats stats() const override { return {}; }

 private:
  static comm::WorkPtr Refuse() {
    ZTRAIN_ASSERT(false, "the memory estimate's tp group carries no messages");
    return nullptr;
  }
  int size_;
};

LayerLayout::Kind KindOf(const nn::Layer& layer, int* block) {
  const std::string name = layer.Name();
  if (name == "embedding") return LayerLayout::Kind::kEmbedding;
  if (name == "lm_head") return LayerLayout::Kind::kLmHead;
  *block = layer.BlockIndex();
  ZTRAIN_ASSERT(*block >= 0, "unexpected layer '", name, "'");
  return LayerLayout::Kind::kBlock;
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

StageLayout LayOutStage(const Config& config, int stage, int dp, int tp) {
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
  return out;
}

// The shapes nn/gpt2.cc (parallel/tensor at tp > 1) allocates, in bytes. At tp > 1 in 16
// bits the sums over the tp group are fp32 workspace (Note [Tensor parallelism in 16 bits]).
LayerActivations ActivationsOf(const LayerLayout& layer, const EstimateInput& in) {
  const ModelConfig& m = in.config->model;
  const int64_t a = static_cast<int64_t>(DTypeSize(in.compute)), f = 4;
  const int64_t b = in.micro_batch, t = in.seq_len, n = b * t, c = m.n_embd, p = in.tp;
  const bool tp16 = p > 1 && in.compute != DType::kF32;  // fp32 sums of 16-bit values
  LayerActivations x;
  switch (layer.kind) {
    case LayerLayout::Kind::kEmbedding:
      x.output = n * c * a;
      if (tp16) x.forward_scratch = n * c * f;  // the looked-up rows, summed in fp32
      if (p > 1) {  // Backward widens what is 16-bit: doutput, dwte's slice and dwpe
        if (a != f) x.scratch.push_back(n * c * f);
        if (in.grad != DType::kF32) {
          x.scratch.push_back(m.padded_vocab_size / p * c * f);
          x.scratch.push_back(m.max_seq_len * c * f);
        }
      }
      break;
    case LayerLayout::Kind::kBlock: {
      const int64_t cl = c / p, heads = m.n_head / p;  // this rank's features and heads
      x.saved = {n * c * a,         n * f, n * f,      // ln1, its mean and rstd
                 n * 3 * cl * a,                       // qkv
                 n * cl * a,                           // att
                 b * heads * t * f,                    // lse
                 n * c * a,                            // res
                 n * c * a,         n * f, n * f,      // ln2, mean, rstd
                 n * 4 * cl * a,                       // fch
                 n * 4 * cl * a};                      // fch_gelu
      x.output = n * c * a;
      if (tp16) x.forward_scratch = n * c * f;  // both row-parallel sums
      // dfch_gelu, dfch, dln2, dres, datt, dqkv, dln1
      x.scratch = {n * 4 * cl * a, n * 4 * cl * a, n * c * a, n * c * a,
                   n * cl * a,     n * 3 * cl * a, n * c * a};
      if (tp16) x.scratch.insert(x.scratch.end(), {n * c * f, n * c * f});  // f's two sums
      x.input_grad = n * c * a;
      break;
    }
    case LayerLayout::Kind::kLmHead: {
      const int64_t vp = m.padded_vocab_size / p;
      x.saved = {n * c * a, n * f, n * f};  // lnf, mean, rstd
      x.saved.push_back(n * vp * a);        // logits, turned into dlogits in place by Backward
      if (p == 1) {
        x.scratch = {n * f, n * c * a};  // the recomputed losses, dlnf
      } else {
        x.saved.push_back(3 * n * f);              // ce_stats: max, sum of exp, target logit
        x.scratch = {n * c * a};                   // dlnf
        if (tp16) x.scratch.push_back(n * c * f);  // its sum
      }
      x.output = n * f;  // per-token losses
      x.input_grad = n * c * a;
      break;
    }
  }
  return x;
}

}  // namespace ztrain::detail
