// Note [Sharded optimizer] across real ranks (comm_mpi_test, at 2 and 4): the norm of
// gradients sharded over dp is the norm of the whole, and a parameter tensor parallelism
// leaves whole on every rank is counted once.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "parallel/zero/sharded_optimizer.h"
#include "tests/parallel/mpi_test_env.h"

namespace ztrain::zero {
namespace {

using comm::test::F32;
using comm::test::World;

// The norm of one layer whose reduced gradients on this rank are `grad`, over `params`.
double Norm(std::vector<float>& grad, std::vector<OptimizedParam> params, bool sharded,
            comm::Communicator& dp, comm::Communicator& tp) {
  const std::unique_ptr<kernels::Ops> ops = kernels::MakeCpuOps();
  const std::unique_ptr<comm::Communicator> pp = comm::MakeSelfCommunicator();
  OptimizerHooks hooks;
  hooks.gradient = [&](size_t) { return F32(grad); };
  hooks.all_reduce = [](comm::Communicator& group, float value) {
    if (group.size() > 1) group.AllReduce(Tensor(&value, DType::kF32, {1}))->Wait();
    return value;
  };
  ShardedOptimizer::Options o;
  o.sharded = sharded;
  const int64_t n = static_cast<int64_t>(grad.size());
  ShardedOptimizer optimizer(o, optim::ParamGroups(o.optimizer),
                             {{sharded ? dp.rank() * n : 0, n, 0}}, std::move(params),
                             {&dp, pp.get(), &tp}, *ops, hooks);
  return optimizer.GradNorm();
}

float Whole(int64_t i) { return std::cos(0.7f * static_cast<float>(i)) + 0.25f; }

TEST(ShardedOptimizerMpiTest, NormOfShardsIsTheNormOfTheWhole) {
  comm::Communicator& dp = World();
  const std::unique_ptr<comm::Communicator> tp = comm::MakeSelfCommunicator();
  const int64_t shard = 48, padded = shard * dp.size();
  std::vector<float> mine(shard);
  double squares = 0.0;
  for (int64_t i = 0; i < padded; ++i) {
    squares += static_cast<double>(Whole(i)) * Whole(i);
    if (i / shard == dp.rank()) mine[i % shard] = Whole(i);
  }
  const double norm = Norm(mine, {{0, 0, padded, 0}}, /*sharded=*/true, dp, *tp);
  EXPECT_NEAR(norm, std::sqrt(squares), 1e-6 * std::sqrt(squares));
}

TEST(ShardedOptimizerMpiTest, ParametersWholeOnEveryTpRankCountOnce) {
  comm::Communicator& tp = World();
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  // A 32-element slice of a split weight (different on each rank), then a 16-element bias
  // every rank holds whole (the same values on each).
  std::vector<float> grad(48);
  double squares = 0.0;
  for (int64_t i = 0; i < 48; ++i) {
    grad[i] = i < 32 ? Whole(tp.rank() * 32 + i) : Whole(1000 + i);
  }
  for (int64_t i = 0; i < 32 * tp.size(); ++i) squares += static_cast<double>(Whole(i)) * Whole(i);
  for (int64_t i = 32; i < 48; ++i) squares += static_cast<double>(grad[i]) * grad[i];
  OptimizedParam split{0, 0, 32, 0}, bias{0, 32, 16, 0};
  bias.whole_on_every_tp = true;
  const double norm = Norm(grad, {split, bias}, /*sharded=*/false, *dp, tp);
  EXPECT_NEAR(norm, std::sqrt(squares), 1e-6 * std::sqrt(squares));
}

}  // namespace
}  // namespace ztrain::zero
