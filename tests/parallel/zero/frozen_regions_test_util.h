#pragma once
// One layer's frozen region for the tests of zero::FrozenRegions (frozen_regions_test.cc in one
// process, frozen_regions_mpi_test.cc across ranks): three parameters laid out as the engine's
// flat layout would (16-element boundaries), in bf16 —
//   "a"  [3, 20], whole, at byte 0 (120 bytes);
//   "b"  rows 4..7 of an [8, 16] weight (part 1 of a 2-way column-parallel split), at byte 128
//        (128 bytes);
//   "q"  a [4, 64] INT8-quantized weight, at byte 256 (its blob: 256 codes + 4 row absmax);
// the region padded to a multiple of 64 x dp bytes.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/memory_tracker.h"
#include "kernels/ops.h"
#include "parallel/zero/frozen_regions.h"

namespace ztrain::zero::test {

inline nn::ParamSpec FrozenSpec(const std::string& name, Shape shape) {
  nn::ParamSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.trainable = false;
  return spec;
}

inline std::vector<FrozenParam> ThreeFrozenParams() {
  nn::ParamSpec a = FrozenSpec("a", {3, 20});
  nn::ParamSpec b = FrozenSpec("b", {4, 16});
  b.tp = {.full_shape = {8, 16}, .dim = 0, .groups = 1, .parts = 2, .part = 1};
  nn::ParamSpec q = FrozenSpec("q", {4, 64});
  q.quant.type = kernels::QuantType::kInt8;
  q.quant_geometry = kernels::QuantGeometry::Whole(4, 64);
  return {{a, 0}, {b, 128}, {q, 256}};
}
inline constexpr int64_t kThreeParamsEnd = 256 + 256 + 16;

// The whole parameter's element i: different for every parameter and element.
inline float WholeValue(const std::string& name, int64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + static_cast<float>(name[0])) *
         (1.0f + 0.01f * static_cast<float>(i % 7));
}
// A fill that writes WholeValue and records what it was asked for.
struct RecordingFill {
  std::vector<std::string> asked;
  FrozenFill Fill() {
    return [this](const std::string& name, const Shape&, int64_t begin, int64_t count, float* out) {
      asked.push_back(name);
      for (int64_t i = 0; i < count; ++i) out[i] = WholeValue(name, begin + i);
    };
  }
};

// FrozenRegions over host memory, on `dp`, holding one layer of ThreeFrozenParams().
struct HostRegions {
  HostRegions(comm::Communicator& dp, bool sharded, bool computes = true)
      : host(&tracker), ops(kernels::MakeCpuOps()) {
    FrozenHooks hooks;
    hooks.allocate = [this](int64_t bytes) {
      Buffer b(host, DType::kU8, {bytes}, MemoryCategory::kParameters);
      std::fill_n(b.data<uint8_t>(), bytes, uint8_t{0});
      return b;
    };
    hooks.wait = [](comm::Work& work) { work.Wait(); };
    regions = std::make_unique<FrozenRegions>(
        FrozenRegions::Options{.compute = DType::kBF16, .sharded = sharded, .computes = computes},
        dp, *ops, host, host, hooks);
    const int64_t unit = 64 * dp.size();
    padded = (kThreeParamsEnd + unit - 1) / unit * unit;
    regions->AddLayer(padded, padded / dp.size(), ThreeFrozenParams());
  }
  MemoryTracker tracker;
  HostAllocator host;
  std::unique_ptr<kernels::Ops> ops;
  std::unique_ptr<FrozenRegions> regions;
  int64_t padded = 0;
};

}  // namespace ztrain::zero::test
