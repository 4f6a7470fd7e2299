// Note [Frozen regions] in one process: the bytes a frozen parameter takes, what SetHeld writes
// (each held element rounded to the compute dtype, a tensor-parallel slice's own elements, a
// quantized weight's blob from the whole weight), what `only` leaves alone, the views layers
// bind, and the values read back. tests/parallel/zero/frozen_regions_mpi_test.cc shards the
// region over real ranks.
#include "parallel/zero/frozen_regions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/quant.h"
#include "tests/parallel/zero/frozen_regions_test_util.h"

namespace ztrain::zero {
namespace {

using test::HostRegions;
using test::RecordingFill;
using test::WholeValue;

float Bf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

TEST(FrozenRegionsTest, BytesAreTheValuesInTheComputeDTypeOrTheBlob) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  HostRegions r(*dp, /*sharded=*/false);
  EXPECT_EQ(r.regions->Bytes(test::FrozenSpec("a", {3, 20})), 3 * 20 * 2);  // bf16
  nn::ParamSpec q = test::FrozenSpec("q", {4, 64});
  q.quant.type = kernels::QuantType::kInt8;  // a byte a value and an fp32 absmax a row
  q.quant_geometry = kernels::QuantGeometry::Whole(4, 64);
  EXPECT_EQ(r.regions->Bytes(q), 4 * 64 + 4 * 4);
  q.quant.type = kernels::QuantType::kNf4;  // two values a byte and an fp32 absmax a 64-block
  EXPECT_EQ(r.regions->Bytes(q), 4 * 64 / 2 + 4 * 4);
  EXPECT_EQ(r.padded, 576);
  EXPECT_EQ(r.regions->held(0).nbytes(), 576u);
}

TEST(FrozenRegionsTest, SetHeldRoundsEachElementOfTheSliceItHolds) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  HostRegions r(*dp, /*sharded=*/false);
  RecordingFill fill;
  r.regions->SetHeld(0, fill.Fill());
  const std::vector<uint8_t> whole = r.regions->Whole(0);
  ASSERT_EQ(whole.size(), 576u);
  // "a": its 60 values in bf16 at byte 0, also what the layer's view shows.
  const std::vector<float> a = r.regions->Values(test::FrozenSpec("a", {3, 20}), 0, whole);
  const Tensor view = r.regions->View(r.regions->held(0), test::FrozenSpec("a", {3, 20}), 0);
  ASSERT_EQ(view.dtype(), DType::kBF16);
  ASSERT_EQ(view.shape(), (Shape{3, 20}));
  for (int64_t i = 0; i < 60; ++i) {
    EXPECT_EQ(a[i], Bf16(WholeValue("a", i))) << i;
    EXPECT_EQ(static_cast<const uint16_t*>(view.data())[i], FloatToBf16(WholeValue("a", i)));
  }
  // "b": local row r is whole row 4 + r of the [8, 16] weight.
  const std::vector<FrozenParam> params = test::ThreeFrozenParams();
  const std::vector<float> b = r.regions->Values(params[1].spec, 128, whole);
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t c = 0; c < 16; ++c) {
      EXPECT_EQ(b[row * 16 + c], Bf16(WholeValue("b", (4 + row) * 16 + c))) << row << "," << c;
    }
  }
  // Padding and the gaps between parameters stay zero.
  for (int64_t i = 120; i < 128; ++i) EXPECT_EQ(whole[i], 0) << i;
  for (int64_t i = test::kThreeParamsEnd; i < 576; ++i) EXPECT_EQ(whole[i], 0) << i;
}

TEST(FrozenRegionsTest, AQuantizedWeightIsItsBlobFromTheWholeWeight) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  HostRegions r(*dp, /*sharded=*/false);
  RecordingFill fill;
  r.regions->SetHeld(0, fill.Fill());
  const std::vector<uint8_t> whole = r.regions->Whole(0);
  const FrozenParam q = test::ThreeFrozenParams()[2];
  std::vector<float> values(256);
  for (int64_t i = 0; i < 256; ++i) values[i] = WholeValue("q", i);
  std::vector<uint8_t> blob(272);
  kernels::QuantizeInto(q.spec.quant, q.spec.quant_geometry, values.data(), blob.data());
  EXPECT_EQ(std::memcmp(whole.data() + 256, blob.data(), blob.size()), 0);
  const Tensor view = r.regions->View(r.regions->held(0), q.spec, 256);
  EXPECT_EQ(view.dtype(), DType::kU8);
  EXPECT_EQ(view.numel(), 272);
  // Dequantized: each value within one INT8 step (its row's absmax / 127) of the weight's.
  const std::vector<float> back = r.regions->Values(q.spec, 256, whole);
  for (int64_t row = 0; row < 4; ++row) {
    float absmax = 0.0f;
    for (int64_t c = 0; c < 64; ++c) absmax = std::max(absmax, std::fabs(values[row * 64 + c]));
    for (int64_t c = 0; c < 64; ++c) {
      EXPECT_NEAR(back[row * 64 + c], values[row * 64 + c], absmax / 127 + 1e-6f);
    }
  }
}

TEST(FrozenRegionsTest, OnlyWritesTheParametersItAccepts) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  HostRegions r(*dp, /*sharded=*/false);
  RecordingFill fill;
  r.regions->SetHeld(0, fill.Fill(), [](const std::string& name) { return name == "a"; });
  EXPECT_EQ(fill.asked, std::vector<std::string>({"a"}));
  const std::vector<uint8_t> whole = r.regions->Whole(0);
  for (int64_t i = 128; i < 576; ++i) EXPECT_EQ(whole[i], 0) << i;
  EXPECT_NE(whole[0] | whole[1], 0);
}

TEST(FrozenRegionsTest, AShapeOnlyRegionAsksForNoValues) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  HostRegions r(*dp, /*sharded=*/false, /*computes=*/false);
  RecordingFill fill;
  r.regions->SetHeld(0, fill.Fill());
  EXPECT_TRUE(fill.asked.empty());
  EXPECT_EQ(r.regions->held(0).nbytes(), 576u);  // counted all the same
}

TEST(FrozenRegionsTest, AViewOfAnAbsentRegionIsUndefined) {
  const std::unique_ptr<comm::Communicator> dp = comm::MakeSelfCommunicator();
  HostRegions r(*dp, /*sharded=*/true);  // one rank: its shard is the whole region
  EXPECT_FALSE(r.regions->View(Buffer(), test::FrozenSpec("a", {3, 20}), 0).defined());
}

}  // namespace
}  // namespace ztrain::zero
