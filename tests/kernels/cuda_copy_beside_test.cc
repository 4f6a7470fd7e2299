// CudaOps' copies beside the ops (Note [Copies beside the ops] in kernels/ops.h): each copy
// starts after the ops issued before it, the ops issued after WaitCopy see its result, and
// Synchronize waits for it. The buffers are large (64 MiB) and the ops around the copies
// many, so a copy that ran out of order would read or be overwritten by half-done work, which
// the exact values below would show. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace {

using testing::CudaOk;
using testing::DeviceTensor;
using testing::ExpectErrorMentions;

constexpr int64_t kElements = int64_t{16} << 20;  // 64 MiB of fp32

// Page-locked host memory (cudaHostAlloc), so that copies from and to it are asynchronous.
class PinnedFloats {
 public:
  explicit PinnedFloats(int64_t n) : n_(n) {
    CudaOk(cudaHostAlloc(reinterpret_cast<void**>(&data_), sizeof(float) * n, 0),
           "cudaHostAlloc");
  }
  ~PinnedFloats() {
    if (data_) cudaFreeHost(data_);
  }
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;
  float* data() const { return data_; }
  Tensor tensor() const { return Tensor(data_, DType::kF32, {n_}); }

 private:
  int64_t n_;
  float* data_ = nullptr;
};

// Values exact under scaling by powers of two.
float Value(int64_t i) { return static_cast<float>(i % 977) * 0.5f + 1.0f; }

class CudaCopyBesideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    ops_ = MakeCudaOps(0);
  }
  std::unique_ptr<Ops> ops_;
};

TEST_F(CudaCopyBesideTest, OpsAfterWaitCopySeeTheCopiedValues) {
  PinnedFloats src(kElements);
  for (int64_t i = 0; i < kElements; ++i) src.data()[i] = Value(i);
  DeviceTensor dst({kElements}, DType::kF32);  // NaN until the copy lands
  const CopyTicket ticket = ops_->CopyBeside(src.tensor(), dst);
  EXPECT_NE(ticket.id, 0u);
  ops_->WaitCopy(ticket);
  // Without the wait this scaling would run on the NaNs, long before the copy is done.
  ops_->Scale(dst, 2.0f);
  const std::vector<float> got = dst.ToHost();
  for (int64_t i = 0; i < kElements; ++i) {
    ASSERT_EQ(got[static_cast<size_t>(i)], 2.0f * Value(i)) << "element " << i;
  }
}

TEST_F(CudaCopyBesideTest, ACopyStartsAfterTheOpsIssuedBeforeIt) {
  std::vector<float> init(kElements);
  for (int64_t i = 0; i < kElements; ++i) init[static_cast<size_t>(i)] = Value(i);
  DeviceTensor src(init, {kElements}, DType::kF32);
  // Many ops on src: a copy that did not wait for them would catch src halfway.
  for (int k = 0; k < 20; ++k) {
    ops_->Scale(src, 2.0f);
    ops_->Scale(src, 0.25f);
  }  // src = init / 2^20, exactly
  PinnedFloats dst(kElements);
  std::memset(dst.data(), 0xff, sizeof(float) * kElements);
  const CopyTicket ticket = ops_->CopyBeside(src, dst.tensor());
  ops_->Synchronize();  // waits for the copy as well
  ops_->WaitCopy(ticket);  // after Synchronize: nothing left to wait for
  const float scale = std::ldexp(1.0f, -20);
  for (int64_t i = 0; i < kElements; ++i) {
    ASSERT_EQ(dst.data()[i], Value(i) * scale) << "element " << i;
  }
}

TEST_F(CudaCopyBesideTest, CopiesOverlapInFlightAndEachTicketOrdersItsOwn) {
  // Two copies in flight at once into two halves, waited for in the other order.
  PinnedFloats src(kElements);
  for (int64_t i = 0; i < kElements; ++i) src.data()[i] = Value(i);
  DeviceTensor dst({kElements}, DType::kF32);
  const int64_t half = kElements / 2;
  const Tensor s = src.tensor(), d = dst.tensor();
  const CopyTicket first = ops_->CopyBeside(s.Flat(0, {half}), d.Flat(0, {half}));
  const CopyTicket second = ops_->CopyBeside(s.Flat(half, {half}), d.Flat(half, {half}));
  EXPECT_NE(first.id, second.id);
  ops_->WaitCopy(second);
  ops_->Scale(d.Flat(half, {half}), 4.0f);
  ops_->WaitCopy(first);
  ops_->WaitCopy(first);  // a second wait does nothing
  ops_->Scale(d.Flat(0, {half}), 0.5f);
  const std::vector<float> got = dst.ToHost();
  for (int64_t i = 0; i < kElements; ++i) {
    const float want = Value(i) * (i < half ? 0.5f : 4.0f);
    ASSERT_EQ(got[static_cast<size_t>(i)], want) << "element " << i;
  }
}

TEST_F(CudaCopyBesideTest, RefusesWhatOnlyCopyDoesNamingIt) {
  std::vector<float> host(8, 1.0f), other(8);
  DeviceTensor a(host, {8}, DType::kF32), b(host, {8}, DType::kF32);
  DeviceTensor half({8}, DType::kBF16);
  const Tensor h(host.data(), DType::kF32, {8}), o(other.data(), DType::kF32, {8});
  ExpectErrorMentions([&] { ops_->CopyBeside(a, b); }, {"CopyBeside", "both", "use Copy"});
  ExpectErrorMentions([&] { ops_->CopyBeside(h, o); }, {"CopyBeside", "both", "host"});
  ExpectErrorMentions([&] { ops_->CopyBeside(h, half); }, {"CopyBeside", "bf16", "Copy"});
  ExpectErrorMentions([&] { ops_->CopyBeside(h.Flat(0, {4}), a); }, {"CopyBeside", "shape"});
  const CopyTicket none = ops_->CopyBeside(h.Flat(0, {0}), a.tensor().Flat(0, {0}));
  EXPECT_EQ(none.id, 0u);
  ops_->WaitCopy(none);
  ops_->Synchronize();
}

}  // namespace
}  // namespace ztrain::kernels
