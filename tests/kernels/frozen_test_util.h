#pragma once
// The check of Note [Frozen parameters] (kernels/ops.h) for the CPU kernel tests: an op run
// with some parameter gradients undefined computes everything else bit for bit as with them
// defined.
#include <set>
#include <string>
#include <vector>

#include "half_test_util.h"

namespace ztrain::kernels::testing {

// fp32 throughout, then the engine's 16-bit mixes (EngineMixes).
inline std::vector<DtypeMix> Fp32AndEngineMixes() {
  std::vector<DtypeMix> mixes = {{"all fp32", DType::kF32, DType::kF32, DType::kF32, DType::kF32}};
  for (const DtypeMix& m : EngineMixes()) mixes.push_back(m);
  return mixes;
}

// Runs `op` twice on the same random tensors of `specs` (dtypes by `mix`): once with every
// tensor, once with those named in `frozen` passed as undefined Tensors. Every other tensor
// (inputs, the input gradient, the other parameter gradients, which start from the same
// values in both runs and so check += too) must end bit for bit the same. Each frozen
// gradient must change in the first run, so that the skip is what the test sees.
inline void ExpectFrozenGradsSkipped(Ops& ops, const std::vector<ArgSpec>& specs,
                                     const DtypeMix& mix, const std::set<std::string>& frozen,
                                     const OpCall& op, uint32_t seed = 500) {
  std::string names;
  for (const std::string& f : frozen) names += " " + f;
  SCOPED_TRACE(std::string(mix.name) + "; frozen:" + names);
  std::vector<HostTensor> full;
  for (size_t i = 0; i < specs.size(); ++i) full.push_back(RandomArg(specs[i], mix, seed, i));
  std::vector<HostTensor> part = full;
  const std::vector<HostTensor> before = full;
  std::vector<Tensor> full_t, part_t;
  for (size_t i = 0; i < specs.size(); ++i) {
    full_t.push_back(full[i].tensor());
    part_t.push_back(frozen.count(specs[i].name) ? Tensor() : part[i].tensor());
  }
  op(ops, full_t);
  op(ops, part_t);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string name = specs[i].name;
    if (frozen.count(name)) {
      EXPECT_FALSE(full[i].SameBytes(before[i])) << name << " is not written even when defined";
    } else {
      EXPECT_TRUE(part[i].SameBytes(full[i])) << name << " differs from the run without frozen "
                                              << "parameters";
    }
  }
}

// ExpectFrozenGradsSkipped for every mix of Fp32AndEngineMixes and every set in `frozen_sets`.
inline void ExpectFrozenGradsSkippedEverywhere(
    Ops& ops, const std::vector<ArgSpec>& specs,
    const std::vector<std::set<std::string>>& frozen_sets, const OpCall& op) {
  for (const DtypeMix& mix : Fp32AndEngineMixes()) {
    for (const std::set<std::string>& frozen : frozen_sets) {
      ExpectFrozenGradsSkipped(ops, specs, mix, frozen, op);
    }
  }
}

}  // namespace ztrain::kernels::testing
