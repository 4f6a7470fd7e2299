// Note [Sharded optimizer] in one process: the parts a rank's ranges give, the AdamW step
// against its definition with each group's settings, the same bits whichever way the state is
// walked (memory, odd tiles, on the "device" through ops, deferred layer by layer), and the
// norm with a stage copy left out. tests/parallel/zero/sharded_optimizer_mpi_test.cc sums the
// norm across ranks.
#include "parallel/zero/sharded_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace ztrain::zero {
namespace {

// Rank 1 of 2 of a layer of 32 elements (range [16, 32)), rank 1 of 2 of one of 64 ([32, 64)),
// and a layer of frozen parameters only.
std::vector<OptimizedLayer> Layers() { return {{16, 16, 0}, {32, 32, 0}, {0, 0, 0}}; }

std::vector<OptimizedParam> Params() {
  std::vector<OptimizedParam> p(6);
  p[0] = {0, 0, 20, 0};  // straddles the shard boundary: [16, 20) here
  p[1] = {0, 20, 6, 1};  // wholly inside
  p[2] = {0, 0, 4, 2, /*trained=*/false};
  p[3] = {1, 0, 32, 0};   // wholly in the other rank's shard
  p[4] = {1, 32, 30, 1};  // [32, 62); [62, 64) is padding
  p[5] = {2, 0, 8, 2, /*trained=*/false};
  return p;
}

OptimizerConfig Config() {
  OptimizerConfig c;
  c.weight_decay = 0.1;
  c.beta1 = 0.8;
  c.beta2 = 0.95;
  c.eps = 1e-6;
  ParamGroupRule rule;
  rule.name = "scaled";
  rule.params = {"b*"};
  rule.weight_decay = 0.0;
  rule.lr_scale = 0.5;
  c.param_groups = {rule};
  return c;  // groups: 0 "default", 1 "scaled", 2 "frozen"
}

TEST(ShardedOptimizerTest, PartsAreTheTrainedElementsInEachRange) {
  const std::vector<OptimizerPart> parts = PartsOf(Layers(), Params());
  ASSERT_EQ(parts.size(), 3u);
  const OptimizerPart want[] = {{0, 0, 16, 20, 0}, {1, 0, 20, 26, 4}, {4, 1, 32, 62, 16}};
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].param, want[i].param) << i;
    EXPECT_EQ(parts[i].layer, want[i].layer) << i;
    EXPECT_EQ(parts[i].begin, want[i].begin) << i;
    EXPECT_EQ(parts[i].end, want[i].end) << i;
    EXPECT_EQ(parts[i].global, want[i].global) << i;
  }
  // Unsharded (stage 0): whole layers, concatenated.
  const std::vector<OptimizerPart> whole = PartsOf({{0, 32, 0}, {0, 64, 0}, {0, 0, 0}}, Params());
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_EQ(whole[0].begin, 0);
  EXPECT_EQ(whole[2].param, 3u);
  EXPECT_EQ(whole[2].global, 32);
  EXPECT_EQ(whole[3].global, 64);
  EXPECT_EQ(whole[3].end, 62);
  EXPECT_THROW(PartsOf(Layers(), {{7, 0, 4, 0}}), Error);
}

// A rank's optimizer state in plain vectors: per layer the master, the reduced gradients,
// m and v of its range; `tile` > 0 walks m and v in tiles of that many elements over the
// concatenated state (as NVMe does), else a layer at a time.
struct Rank {
  explicit Rank(ShardedOptimizer::Options o = {}, int64_t tile = 0, bool device = false,
                std::vector<OptimizedLayer> layers = Layers())
      : ops(kernels::MakeCpuOps()),
        self(comm::MakeSelfCommunicator(
            [this](const Tensor& a, const Tensor& b) { ops->Copy(a, b); })) {
    int64_t total = 0;
    for (const OptimizedLayer& l : layers) {
      master.emplace_back(l.opt_len);
      grad.emplace_back(l.opt_len);
      for (int64_t i = 0; i < l.opt_len; ++i) {
        master.back()[i] = 0.5f - 0.01f * static_cast<float>(total + i);
        grad.back()[i] = std::sin(0.3f * static_cast<float>(total + i + 1));
      }
      total += l.opt_len;
    }
    m.assign(total, 0.0f);
    v.assign(total, 0.0f);
    OptimizerHooks h;
    h.gradient = [this](size_t l) { return F32(grad[l]); };
    h.host_gradient = [this](size_t l) { return grad[l].data(); };
    h.all_reduce = [this](comm::Communicator& group, float value) {
      reduced_over.push_back(&group);
      return value;
    };
    h.walk_state = [this, tile](std::optional<size_t> layer, const StateRange& fn, bool) {
      const size_t first = layer.value_or(0), last = layer ? *layer + 1 : master.size();
      for (size_t l = first; l < last; ++l) {
        const int64_t base = optimizer->base(l), n = static_cast<int64_t>(master[l].size());
        // Tiles are cut at global multiples of `tile` and at layer ends.
        for (int64_t at = 0, end = 0; at < n; at = end) {
          end = tile > 0 ? std::min(n, ((base + at) / tile + 1) * tile - base) : n;
          fn(base + at, end - at, m.data() + base + at, v.data() + base + at);
        }
      }
    };
    h.acquire_master = [this](size_t l) {
      trace += "a" + std::to_string(l) + " ";
      return master[l].data();
    };
    h.release_master = [this](size_t l, bool changed) {
      trace += (changed ? "r" : "x") + std::to_string(l) + " ";
    };
    h.prefetch_master = [this](size_t l) { trace += "p" + std::to_string(l) + " "; };
    h.flush_masters = [this] { trace += "f "; };
    h.zero_gradient = [this](size_t l) { zeroed.push_back(l); };
    h.device_params = [this](size_t l) { return F32(master[l]); };
    h.device_state = [this](size_t l) {
      const int64_t base = optimizer->base(l), n = static_cast<int64_t>(master[l].size());
      return std::pair{Tensor(m.data() + base, DType::kF32, {n}),
                       Tensor(v.data() + base, DType::kF32, {n})};
    };
    o.optimizer = Config();
    o.host_step = !device;
    optimizer = std::make_unique<ShardedOptimizer>(
        o, optim::ParamGroups(o.optimizer), layers, Params(),
        ShardedOptimizer::Groups{self.get(), self.get(), self.get()}, *ops, h);
  }
  static Tensor F32(std::vector<float>& x) {
    return Tensor(x.data(), DType::kF32, {static_cast<int64_t>(x.size())});
  }

  std::unique_ptr<kernels::Ops> ops;
  std::unique_ptr<comm::Communicator> self;
  std::vector<std::vector<float>> master, grad;
  std::vector<float> m, v;
  std::vector<comm::Communicator*> reduced_over;
  std::string trace;
  std::vector<size_t> zeroed;
  std::unique_ptr<ShardedOptimizer> optimizer;
};

void ExpectSameState(const Rank& a, const Rank& b) {
  for (size_t l = 0; l < a.master.size(); ++l) {
    for (size_t i = 0; i < a.master[l].size(); ++i) {
      ASSERT_EQ(a.master[l][i], b.master[l][i]) << "layer " << l << " element " << i;
    }
  }
  for (size_t i = 0; i < a.m.size(); ++i) {
    ASSERT_EQ(a.m[i], b.m[i]) << "m " << i;
    ASSERT_EQ(a.v[i], b.v[i]) << "v " << i;
  }
}

TEST(ShardedOptimizerTest, HostStepIsAdamWWithEachGroupsSettings) {
  Rank r;
  const std::vector<std::vector<float>> p0 = r.master;
  const StepArgs args{0.01, 0.5f, 1};
  r.optimizer->Step(args);
  // AdamW from its definition, in double: step 1 with bias correction is
  // p - lr * (g / (|g| + eps) + wd * p), g the clipped gradient.
  auto expected = [&](size_t l, int64_t i, double lr, double wd) {
    const double g = 0.5 * r.grad[l][i], p = p0[l][i];
    const double b1 = 0.8, b2 = 0.95;
    const double m = (1 - b1) * g, v = (1 - b2) * g * g;
    return p - lr * ((m / (1 - b1)) / (std::sqrt(v / (1 - b2)) + 1e-6) + wd * p);
  };
  // Layer 0's range [16, 32): [16, 20) default group, [20, 26) "scaled", the rest untouched.
  for (int64_t i = 0; i < 16; ++i) {
    const float got = r.master[0][i];
    if (i < 4) {
      EXPECT_NEAR(got, expected(0, i, 0.01, 0.1), 2e-6) << i;
    } else if (i < 10) {
      EXPECT_NEAR(got, expected(0, i, 0.005, 0.0), 2e-6) << i;
    } else {
      EXPECT_EQ(got, p0[0][i]) << i;
      EXPECT_EQ(r.m[i], 0.0f) << i;
    }
  }
  for (int64_t i = 0; i < 32; ++i) {  // layer 1's [32, 62) "scaled", padding untouched
    if (i < 30) {
      EXPECT_NEAR(r.master[1][i], expected(1, i, 0.005, 0.0), 2e-6) << i;
      EXPECT_NE(r.v[16 + i], 0.0f) << i;
    } else {
      EXPECT_EQ(r.master[1][i], p0[1][i]) << i;
    }
  }
  // Each layer acquired once, the next read ahead, released changed, then a flush.
  EXPECT_EQ(r.trace, "a0 p1 r0 a1 p2 r1 f ");
}

TEST(ShardedOptimizerTest, TilesAndDeviceStepGiveTheSameBits) {
  Rank memory, tiled({}, /*tile=*/7), device({}, 0, /*device=*/true);
  for (int64_t step = 1; step <= 3; ++step) {
    const StepArgs args{0.01 * step, 0.9f, step};
    memory.optimizer->Step(args);
    tiled.optimizer->Step(args);
    device.optimizer->Step(args);
  }
  ExpectSameState(memory, tiled);
  ExpectSameState(memory, device);
  EXPECT_EQ(device.trace, "");  // the device step touches no host master
}

TEST(ShardedOptimizerTest, DeferredStepIsTheStepTakenLayerByLayer) {
  ShardedOptimizer::Options deferred;
  deferred.defer = true;
  Rank now, later(deferred, /*tile=*/5);
  const std::vector<std::vector<float>> p0 = later.master;
  const StepArgs first{0.02, 1.0f, 1}, second{0.01, 0.7f, 2};
  now.optimizer->Step(first);
  later.optimizer->Step(first);
  EXPECT_EQ(later.master, p0);  // recorded only
  EXPECT_TRUE(later.optimizer->any_pending());
  EXPECT_TRUE(later.optimizer->pending(0));
  EXPECT_TRUE(later.optimizer->pending(1));
  EXPECT_FALSE(later.optimizer->pending(2));  // no trained parameter
  later.optimizer->StepLayer(1);              // as a gather of layer 1 would
  EXPECT_FALSE(later.optimizer->pending(1));
  EXPECT_EQ(later.master[0], p0[0]);
  EXPECT_EQ(later.master[1], now.master[1]);
  later.optimizer->GradientsZeroed();
  later.optimizer->StepLayer(1);  // nothing left there
  // A second Step applies what is pending first, then records itself.
  now.optimizer->Step(second);
  later.optimizer->Step(second);
  EXPECT_EQ(later.zeroed, std::vector<size_t>{0});  // stepped after the gradients were zeroed
  later.optimizer->ApplyPending();
  EXPECT_FALSE(later.optimizer->any_pending());
  ExpectSameState(now, later);
  // Each Step applies (and flushes) first; pending layers are stepped in order, the next
  // pending one read ahead.
  EXPECT_EQ(later.trace, "f a1 r1 a0 r0 f p1 a0 r0 a1 r1 f ");
}

TEST(ShardedOptimizerTest, NormLeavesTheStageCopyOutAndRoundsOnlyWhenReduced) {
  // Layer 1 starts with 40 elements of a weight another pipeline stage owns: its range
  // [32, 64) counts from 40.
  std::vector<OptimizedLayer> layers = Layers();
  layers[1].leading_copy = 40;
  ShardedOptimizer::Options local, sharded;
  sharded.sharded = true;
  Rank a(local, 0, false, layers), b(sharded, 0, false, layers);
  double squares = 0.0;
  for (float g : a.grad[0]) squares += static_cast<double>(g) * g;
  for (size_t i = 8; i < a.grad[1].size(); ++i)
    squares += static_cast<double>(a.grad[1][i]) * a.grad[1][i];
  const double na = a.optimizer->GradNorm(), nb = b.optimizer->GradNorm();
  EXPECT_NEAR(na, std::sqrt(squares), 1e-12 * std::sqrt(squares));
  EXPECT_TRUE(a.reduced_over.empty());  // one process, nothing sharded: no collective
  // Summed over the groups as a float (what the collectives carry).
  EXPECT_EQ(nb, std::sqrt(static_cast<double>(static_cast<float>(nb * nb))));
  EXPECT_NEAR(nb, std::sqrt(squares), 1e-6 * std::sqrt(squares));
  ASSERT_EQ(b.reduced_over.size(), 3u);  // dp (sharded), pp, tp
}

}  // namespace
}  // namespace ztrain::zero
