// Note [Whole parameters] on its own, over real parts (a parameter table, a parameter store in
// host memory, frozen regions) in one process, whole layers and ZeRO-3 shards alike: whole
// values go in and come back (trainable ones exactly, frozen ones rounded to their compute
// dtype), in model order with tied uses once; trainable_only leaves the frozen ones out;
// SetHeld asks for the held elements of the chosen parameters only; a shape-only store is
// asked for nothing. Tensor-parallel slices and shards across ranks are the layout tests'
// (tests/engine/layout_equivalence_test.cc, zero_equivalence_test.cc).
#include "engine/whole_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/config.h"
#include "core/memory_tracker.h"

namespace ztrain {
namespace {

using offload::Place;

float Value(const std::string& name, int64_t i) {
  return std::sin(0.3f * static_cast<float>(i) + static_cast<float>(name.size())) + 0.01f;
}

nn::ParamSpec Spec(const std::string& name, Shape shape, bool trainable = true,
                   const std::string& tied_to = "") {
  nn::ParamSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.trainable = trainable;
  s.tied_to = tied_to;
  return s;
}

// Two layers: w [4, 6], b [6] and a frozen f [3, 4]; then w1 [5, 3] and h, tied to w.
class WholeParametersTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const bool stage3 = GetParam();
    frozen_ = std::make_unique<zero::FrozenRegions>(
        zero::FrozenRegions::Options{.compute = DType::kBF16, .sharded = stage3}, *dp_, *ops_,
        host_, host_,
        zero::FrozenHooks{.allocate = [this](int64_t bytes) { return Zeroed(DType::kU8, bytes); },
                          .wait = [](comm::Work& w) { w.Wait(); }});
    table_ = std::make_unique<zero::ParamTable>(
        zero::ParamTable::Options{
            .shard_optimizer = stage3,
            .shard_parameters = stage3,
            .frozen_element_bytes = 2,
            .frozen_bytes = [this](const nn::ParamSpec& s) { return frozen_->Bytes(s); }},
        groups_);
    offload::Placement at;
    at.params = Place::kHost;
    at.optimizer = Place::kHost;
    store_ = std::make_unique<offload::ParamStore>(
        offload::ParamStore::Options{.placement = at, .compute = DType::kF32}, *ops_, host_, host_,
        [this](Place, int64_t n, MemoryCategory, DType d) { return Zeroed(d, n); });
    const std::vector<std::vector<nn::ParamSpec>> layers = {
        {Spec("w", {4, 6}), Spec("b", {6}), Spec("f", {3, 4}, /*trainable=*/false)},
        {Spec("w1", {5, 3}), Spec("h", {4, 6}, true, "w")}};
    for (size_t l = 0; l < layers.size(); ++l) {
      const zero::LayerSlots& slots = table_->AddLayer("layer", layers[l], nullptr, 0);
      const zero::FlatLayout& o = slots.layout;
      store_->AddLayer({o.padded, o.shard, o.opt_begin, o.opt_len, stage3});
      std::vector<zero::FrozenParam> frozen;
      for (size_t i : slots.owned) {
        if (table_->slot(i).frozen())
          frozen.push_back({table_->slot(i).spec, table_->slot(i).offset});
      }
      frozen_->AddLayer(o.frozen_padded, o.frozen_shard, std::move(frozen));
    }
    whole_ = Make(/*computes=*/true);
  }

  Buffer Zeroed(DType dtype, int64_t n) {
    Buffer b(host_, dtype, {n}, MemoryCategory::kParameters);
    b.Zero();
    return b;
  }

  std::unique_ptr<WholeParameters> Make(bool computes) {
    WholeParameters::Hooks hooks;
    hooks.settle = [this] { ++settled_; };
    hooks.gather = [this](size_t l, const Buffer& whole) {  // one rank: its shard is the layer
      ++gathers_;
      const int64_t n = store_->shape(l).padded;
      return dp_->AllGather(store_->HeldTensor(l), whole.AsTensor(DType::kF32, {n}));
    };
    hooks.wait = [](comm::Work& w) { w.Wait(); };
    return std::make_unique<WholeParameters>(*table_, *store_, *frozen_, *tp_, *ops_,
                                             WholeParameters::Memory{host_, host_, host_},
                                             /*on_device=*/false, computes, hooks);
  }

  std::map<std::string, std::vector<float>> ReadAll(bool trainable_only,
                                                    std::vector<std::string>* order = nullptr) {
    std::map<std::string, std::vector<float>> got;
    whole_->ForEach(
        [&](const std::string& name, const Tensor& value) {
          if (order) order->push_back(name);
          const float* v = value.data<float>();
          got[name] = std::vector<float>(v, v + value.numel());
        },
        trainable_only);
    return got;
  }

  MemoryTracker tracker_;
  HostAllocator host_{&tracker_};
  std::unique_ptr<kernels::Ops> ops_ = kernels::MakeCpuOps();
  std::unique_ptr<comm::Communicator> dp_ = comm::MakeSelfCommunicator();
  std::unique_ptr<comm::Communicator> tp_ = comm::MakeSelfCommunicator();
  optim::ParamGroups groups_{OptimizerConfig{}};
  std::unique_ptr<zero::FrozenRegions> frozen_;
  std::unique_ptr<zero::ParamTable> table_;
  std::unique_ptr<offload::ParamStore> store_;
  std::unique_ptr<WholeParameters> whole_;
  int settled_ = 0, gathers_ = 0;
};

TEST_P(WholeParametersTest, WholeValuesGoInAndComeBackInModelOrder) {
  whole_->SetAll([](const std::string& name, const Tensor& out) {
    for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = Value(name, i);
  });
  std::vector<std::string> order;
  const auto got = ReadAll(/*trainable_only=*/false, &order);
  EXPECT_EQ(order, std::vector<std::string>({"w", "b", "f", "w1"}));  // h is w
  for (const char* name : {"w", "b", "w1"}) {
    const std::vector<float>& v = got.at(name);
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], Value(name, i)) << name << i;
  }
  const std::vector<float>& f = got.at("f");
  ASSERT_EQ(f.size(), 12u);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(f[i], Bf16ToFloat(FloatToBf16(Value("f", i)))) << i;  // the frozen copy is bf16
  }
  EXPECT_EQ(settled_, 2);
  EXPECT_EQ(gathers_, GetParam() ? 2 : 0);  // each layer gathered once at stage 3
}

TEST_P(WholeParametersTest, TrainableOnlyLeavesTheFrozenOut) {
  std::vector<std::string> order;
  ReadAll(/*trainable_only=*/true, &order);
  EXPECT_EQ(order, std::vector<std::string>({"w", "b", "w1"}));
}

TEST_P(WholeParametersTest, SetHeldAsksForTheHeldElementsOfTheChosenParameters) {
  std::map<std::string, int64_t> asked;
  auto fill = [&](const std::string& name, const Shape& full, int64_t begin, int64_t count,
                  float* out) {
    EXPECT_EQ(full, table_->Find(name).spec.shape);
    asked[name] += count;
    for (int64_t i = 0; i < count; ++i) out[i] = Value(name, begin + i);
  };
  whole_->SetHeld(fill, [](const std::string& name) { return name == "b" || name == "f"; });
  // One rank holds everything: each chosen parameter once, whole.
  EXPECT_EQ(asked, (std::map<std::string, int64_t>{{"b", 6}, {"f", 12}}));
  const auto got = ReadAll(false);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(got.at("b")[i], Value("b", i));
  for (const float v : got.at("w")) EXPECT_EQ(v, 0.0f);  // not chosen: as it was
  asked.clear();
  whole_ = Make(/*computes=*/false);
  whole_->SetHeld(fill, {});
  EXPECT_EQ(asked.count("w"), 0u);  // a shape-only engine's trainable values are not asked for
}

INSTANTIATE_TEST_SUITE_P(Stages, WholeParametersTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("stage3") : std::string("whole");
                         });

}  // namespace
}  // namespace ztrain
