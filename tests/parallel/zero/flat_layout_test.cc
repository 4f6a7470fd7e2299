// Note [ZeRO flat layout]: offsets, padding, shards and optimizer ranges against the rules
// written out by hand, for whole parameters, packed runs, tied and frozen ones.
#include "parallel/zero/flat_layout.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace ztrain::zero {
namespace {

FlatParam P(std::string name, int64_t elements, bool trainable = true, bool packed = false,
            bool owned = true) {
  return {std::move(name), elements, trainable, packed, owned};
}

TEST(FlatLayoutTest, EachParameterStartsOn16ElementsAndTheBufferSplitsIntoDpShards) {
  // 5 -> [0, 5), 40 -> [16, 56), 1 -> [64, 65): 80 elements, padded to dp 3 x 16 = 96.
  const std::vector<FlatParam> params = {P("a", 5), P("b", 40), P("c", 1)};
  FlatLayoutOptions o;
  o.dp = 3;
  o.rank = 2;
  const FlatLayout single = LayOut(params, o);
  EXPECT_EQ(single.offsets, (std::vector<int64_t>{0, 16, 64}));
  EXPECT_EQ(single.padded, 96);
  EXPECT_EQ(single.shard, 32);
  EXPECT_EQ(single.opt_begin, 0);  // stage 0: the optimizer steps the whole buffer
  EXPECT_EQ(single.opt_len, 96);
  o.shard_optimizer = true;  // stages 1-3: rank 2's shard
  const FlatLayout sharded = LayOut(params, o);
  EXPECT_EQ(sharded.offsets, single.offsets);  // sharding never moves a parameter
  EXPECT_EQ(sharded.opt_begin, 64);
  EXPECT_EQ(sharded.opt_len, 32);
  EXPECT_EQ(sharded.frozen_padded, 0);
}

TEST(FlatLayoutTest, PackedParametersFollowWithNoGapTiedOnesTakeNoPlace) {
  // q, k, v packed (one GEMM): 24 + 8 + 8 contiguous from 0; a tied one; then a bias at 48.
  const std::vector<FlatParam> params = {P("q", 24), P("k", 8, true, true), P("v", 8, true, true),
                                         P("tied", 1000, true, false, false), P("bias", 3)};
  const FlatLayout l = LayOut(params, {});
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 24, 32, -1, 48}));
  EXPECT_EQ(l.padded, 64);
}

TEST(FlatLayoutTest, FirstParameterGoesToOffsetZeroAndMinPaddedIsKept) {
  const std::vector<FlatParam> params = {P("norm", 8), P("head", 100)};
  FlatLayoutOptions o;
  o.first = 1;
  o.min_padded = 200;
  o.dp = 2;
  const FlatLayout l = LayOut(params, o);
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{112, 0}));
  EXPECT_EQ(l.padded, 224);  // 200 rounded up to a multiple of 2 x 16
  EXPECT_EQ(TiedLayoutSize(params, "head"), 128);
  // A tied (not owned) parameter named first is placed: the stage holding the copy.
  const std::vector<FlatParam> copy = {P("norm", 8), P("lm_head", 100, true, false, false)};
  EXPECT_EQ(TiedLayoutSize(copy, "lm_head"), 128);
  EXPECT_THROW(TiedLayoutSize(copy, "nothing"), Error);
}

TEST(FlatLayoutTest, FrozenParametersGoToTheirByteRegionInDpShardsOf64Bytes) {
  // bf16 compute (2 bytes): frozen 10 and 30 elements at bytes 0 and 32 (16-element
  // alignment), 48 elements -> 96 bytes, padded to dp 2 x 64 = 128.
  const std::vector<FlatParam> params = {P("base", 10, false), P("lora_a", 7),
                                         P("base2", 30, false)};
  FlatLayoutOptions o;
  o.dp = 2;
  o.frozen_element_bytes = 2;
  const FlatLayout l = LayOut(params, o);
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 0, 32}));
  EXPECT_EQ(l.frozen_padded, 128);
  EXPECT_EQ(l.frozen_shard, 64);
  EXPECT_EQ(l.padded, 32);
  EXPECT_EQ(TiedLayoutSize(params, "lora_a"), 16);  // frozen ones are not in the flat buffer
}

TEST(FlatLayoutTest, PackedAfterAnotherKindIsRefused) {
  EXPECT_THROW(LayOut({P("base", 10, false), P("k", 8, true, true)}, {}), Error);
  EXPECT_THROW(LayOut({P("k", 8, true, true)}, {}), Error);
  EXPECT_THROW(LayOut({P("q", 8), P("t", 8, true, false, false), P("k", 8, true, true)}, {}),
               Error);
}

}  // namespace
}  // namespace ztrain::zero
