// The cross-backend test (ggml test-backend-ops): every op of kernels/ops.h runs on the CUDA
// backend and on the CPU backend from the same random inputs, and the results must agree.
//
// Each test runs in fp32, bf16 and fp16. 16-bit inputs are first rounded to their dtype and
// the CPU computes in fp32 on those rounded values; the GPU computes in fp32 from the same
// values and rounds its outputs to the dtype. Tolerances (ExpectClose: relative to |want| +
// rms(want)): fp32 1e-4 (summation order and exp implementations differ), bf16 1e-2 (one
// rounding of each output to bf16's 8 significant bits, at most 2^-8 relative, plus fp32
// differences small beside it), fp16 2e-3 (one rounding to 11 bits, 2^-11, the same way).
// The engine's dtype mixes are cuda_mixed_test.cc's, the tensor-parallel ops
// cuda_vocab_parallel_test.cc's, attention cuda_attention_test.cc's. Accumulating outputs start from the same
// non-zero values on both sides, so += is checked, and overwritten outputs start as NaN on
// the GPU, so a skipped element shows. Without a GPU every test skips.
//
// The Llama ops follow the same model, with these refinements:
// - RoPE: both sides take the same fp32 angle (the product t * inv_freq[i]) and the accurate
//   cosf/sinf (CUDA: within 2 ulp; glibc: within 1), so in fp32 an output differs by a few
//   2^-24 of |x0| + |x1|, some 5e-7 of the values' scale: 1e-5 holds it with a margin of 20
//   and is ten times tighter than the generic fp32 tolerance, against the __sinf/__cosf
//   intrinsics, whose error grows with the angle (positions here reach 2099 radians).
//   bf16 keeps 1e-2 (one rounding of each output).
// - Outputs that are copies (embedding rows without a position table, the v columns RoPE
//   leaves alone) must match bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attention_cases.h"
#include "cuda_test_util.h"
#include "half_test_util.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace ztrain::kernels {
namespace {

using testing::AttnCase;
using testing::DeviceTensor;
using testing::ExpectClose;
using testing::ExpectErrorMentions;
using testing::HeadsName;
using testing::Random;
using testing::RandomInts;
using testing::RoundTo;
using testing::ToDouble;
using testing::View;

class CudaOpsTest : public testing::CrossBackendTest {
 protected:
  bool half() const { return dtype() != DType::kF32; }  // bf16 or fp16
};

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpsTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         testing::DTypeParamName);

TEST_P(CudaOpsTest, GemmMatchesCpuForEveryTranspose) {
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 0.5f}) {
        SCOPED_TRACE("trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb) +
                     " beta=" + std::to_string(beta));
        const Shape sa = ta ? Shape{k, m} : Shape{m, k};
        const Shape sb = tb ? Shape{n, k} : Shape{k, n};
        auto a = Rand(m * k, 1), b = Rand(k * n, 2), c = Rand(m * n, 3);
        DeviceTensor da = Dev(a, sa), db = Dev(b, sb), dc = Dev(c, {m, n});
        cpu_->Gemm(ta, tb, 0.75f, View(a, sa), View(b, sb), beta, View(c, {m, n}));
        gpu_->Gemm(ta, tb, 0.75f, da, db, beta, dc);
        Expect(dc, c, "c");
      }
    }
  }
}

TEST_P(CudaOpsTest, LinearForwardAndBackwardMatchCpu) {
  const int64_t rows = 13, ch = 48, oc = 40;
  for (bool with_bias : {true, false}) {
    for (bool with_dx : {true, false}) {
      SCOPED_TRACE(std::string("bias=") + (with_bias ? "yes" : "no") +
                   " dx=" + (with_dx ? "yes" : "no"));
      auto x = Rand(rows * ch, 1), w = Rand(oc * ch, 2), bias = Rand(oc, 3);
      auto dy = Rand(rows * oc, 4), dw = Rand(oc * ch, 5), db = Rand(oc, 6);
      std::vector<float> y(rows * oc), dx(rows * ch);
      DeviceTensor gx = Dev(x, {rows, ch}), gw = Dev(w, {oc, ch}), gbias = Dev(bias, {oc});
      DeviceTensor gy = Out({rows, oc}), gdy = Dev(dy, {rows, oc}), gdx = Out({rows, ch});
      DeviceTensor gdw = Dev(dw, {oc, ch}), gdb = Dev(db, {oc});
      const Tensor none;
      cpu_->LinearForward(View(x, {rows, ch}), View(w, {oc, ch}),
                          with_bias ? View(bias, {oc}) : none, View(y, {rows, oc}));
      gpu_->LinearForward(gx, gw, with_bias ? gbias.tensor() : none, gy);
      Expect(gy, y, "y");
      cpu_->LinearBackward(View(dy, {rows, oc}), View(x, {rows, ch}), View(w, {oc, ch}),
                           with_dx ? View(dx, {rows, ch}) : none, View(dw, {oc, ch}),
                           with_bias ? View(db, {oc}) : none);
      gpu_->LinearBackward(gdy, gx, gw, with_dx ? gdx.tensor() : none, gdw,
                           with_bias ? gdb.tensor() : none);
      if (with_dx) Expect(gdx, dx, "dx");
      Expect(gdw, dw, "dweight (accumulated)");
      Expect(gdb, db, with_bias ? "dbias (accumulated)" : "dbias (untouched)");
    }
  }
}

struct EmbeddingData {
  int64_t batch = 3, seq = 7, ch = 24, vocab = 50, max_seq = 16;
  std::vector<int32_t> tokens;
  // Few distinct tokens: many rows of dwte receive several contributions.
  explicit EmbeddingData(uint32_t seed) : tokens(RandomInts(batch * seq, seed, 0, 6)) {
    tokens[0] = int32_t(vocab) - 1;  // the last row of the table takes part too
  }
};

TEST_P(CudaOpsTest, EmbeddingForwardAndBackwardMatchCpu) {
  const EmbeddingData e(7);
  const int64_t bt = e.batch * e.seq;
  auto tokens = e.tokens;
  auto wte = Rand(e.vocab * e.ch, 1), wpe = Rand(e.max_seq * e.ch, 2);
  auto dout = Rand(bt * e.ch, 3), dwte = Rand(wte.size(), 4), dwpe = Rand(wpe.size(), 5);
  std::vector<float> out(bt * e.ch);
  const Shape act{e.batch, e.seq, e.ch}, te{e.vocab, e.ch}, pe{e.max_seq, e.ch};
  DeviceTensor gtok(tokens, {e.batch, e.seq}), gwte = Dev(wte, te), gwpe = Dev(wpe, pe);
  DeviceTensor gout = Out(act), gdout = Dev(dout, act), gdwte = Dev(dwte, te),
               gdwpe = Dev(dwpe, pe);
  cpu_->EmbeddingForward(View(tokens, {e.batch, e.seq}), View(wte, te), View(wpe, pe),
                         View(out, act));
  gpu_->EmbeddingForward(gtok, gwte, gwpe, gout);
  Expect(gout, out, "out");
  cpu_->EmbeddingBackward(View(dout, act), View(tokens, {e.batch, e.seq}), View(dwte, te),
                          View(dwpe, pe));
  gpu_->EmbeddingBackward(gdout, gtok, gdwte, gdwpe);
  Expect(gdwte, dwte, "dwte (accumulated)");
  Expect(gdwpe, dwpe, "dwpe (accumulated)");
}

// Llama's embedding: no position table (wpe and dwpe undefined).
TEST_P(CudaOpsTest, EmbeddingWithoutPositionTableMatchesCpu) {
  const EmbeddingData e(8);
  const int64_t bt = e.batch * e.seq;
  auto tokens = e.tokens;
  auto wte = Rand(e.vocab * e.ch, 1), dout = Rand(bt * e.ch, 3), dwte = Rand(wte.size(), 4);
  std::vector<float> out(bt * e.ch);
  const Shape act{e.batch, e.seq, e.ch}, te{e.vocab, e.ch};
  DeviceTensor gtok(tokens, {e.batch, e.seq}), gwte = Dev(wte, te), gout = Out(act);
  DeviceTensor gdout = Dev(dout, act), gdwte = Dev(dwte, te);
  const Tensor none;
  gpu_->EmbeddingForward(gtok, gwte, none, gout);
  std::vector<float> rows;  // out is the token rows themselves, bit for bit
  for (int32_t t : tokens) {
    rows.insert(rows.end(), wte.begin() + t * e.ch, wte.begin() + (t + 1) * e.ch);
  }
  EXPECT_EQ(gout.ToHost(), rows) << "out = wte[tokens]";
  cpu_->EmbeddingForward(View(tokens, {e.batch, e.seq}), View(wte, te), none, View(out, act));
  EXPECT_EQ(gout.ToHost(), out) << "out against the CPU";
  cpu_->EmbeddingBackward(View(dout, act), View(tokens, {e.batch, e.seq}), View(dwte, te), none);
  gpu_->EmbeddingBackward(gdout, gtok, gdwte, none);
  Expect(gdwte, dwte, "dwte (accumulated)");
}

TEST_P(CudaOpsTest, LayerNormForwardAndBackwardMatchCpu) {
  const int64_t rows = 11, ch = 40;
  auto x = Rand(rows * ch, 1, -2.0f, 3.0f), w = Rand(ch, 2), b = Rand(ch, 3);
  auto dy = Rand(rows * ch, 4), dw = Rand(ch, 5), db = Rand(ch, 6);
  std::vector<float> y(rows * ch), mean(rows), rstd(rows), dx(rows * ch);
  DeviceTensor gx = Dev(x, {rows, ch}), gw = Dev(w, {ch}), gb = Dev(b, {ch});
  DeviceTensor gy = Out({rows, ch}), gmean = OutF32({rows}), grstd = OutF32({rows});
  DeviceTensor gdy = Dev(dy, {rows, ch}), gdx = Out({rows, ch}), gdw = Dev(dw, {ch}),
               gdb = Dev(db, {ch});
  cpu_->LayerNormForward(View(x, {rows, ch}), View(w, {ch}), View(b, {ch}), View(y, {rows, ch}),
                         View(mean, {rows}), View(rstd, {rows}));
  gpu_->LayerNormForward(gx, gw, gb, gy, gmean, grstd);
  Expect(gy, y, "y");
  Expect(gmean, mean, "mean", 1e-4);  // fp32 statistics of the same (rounded) inputs
  Expect(grstd, rstd, "rstd", 1e-4);
  // Both backwards take the CPU's statistics, so only the backward itself is compared.
  DeviceTensor cmean = DevF32(mean, {rows}), crstd = DevF32(rstd, {rows});
  cpu_->LayerNormBackward(View(dy, {rows, ch}), View(x, {rows, ch}), View(w, {ch}),
                          View(mean, {rows}), View(rstd, {rows}), View(dx, {rows, ch}),
                          View(dw, {ch}), View(db, {ch}));
  gpu_->LayerNormBackward(gdy, gx, gw, cmean, crstd, gdx, gdw, gdb);
  Expect(gdx, dx, "dx");
  Expect(gdw, dw, "dweight (accumulated)");
  Expect(gdb, db, "dbias (accumulated)");
}

struct RopeCase {
  int64_t batch, seq;
  AttentionHeads heads;
  double theta;  // inv_freq[i] = theta^(-2i / HS)
};

// Positions up to 2099 (angles up to 2099 radians at i = 0); grouped and multi-query heads;
// HS / 2 odd (3); Llama 3's theta.
const RopeCase kRopeCases[] = {{2, 300, {4, 2, 64}, 10000.0},
                               {1, 2100, {1, 1, 8}, 10000.0},
                               {3, 17, {3, 1, 6}, 10000.0},
                               {1, 129, {2, 2, 128}, 500000.0}};

std::vector<float> InvFreq(int head_dim, double theta) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    f[i] = static_cast<float>(std::pow(theta, -2.0 * i / head_dim));
  }
  return f;
}

// The v columns of `got` (qkv or dqkv) hold exactly the values of `in`.
void ExpectVUntouched(const std::vector<float>& got, const std::vector<float>& in,
                      const AttentionHeads& heads, const std::string& what) {
  const int64_t width = heads.qkv_width(), v0 = heads.q_width() + heads.kv_width();
  int64_t changed = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    changed += static_cast<int64_t>(i) % width >= v0 && !(got[i] == in[i]);
  }
  EXPECT_EQ(changed, 0) << what << ": v elements changed (RoPE turns q and k only)";
}

TEST_P(CudaOpsTest, RopeForwardAndBackwardMatchCpu) {
  const double rope_tol = half() ? Tol() : 1e-5;  // the error model at the top
  // Turning back the GPU's rounded result: in 16 bits two roundings, each at most one
  // rounding of max(|x0|, |x1|) once turned, which one Tol() of |x| + rms would only just hold.
  const double round_trip_tol = half() ? 2 * Tol() : 1e-5;
  for (const RopeCase& tc : kRopeCases) {
    const AttentionHeads& h = tc.heads;
    SCOPED_TRACE(HeadsName(tc.batch, tc.seq, h));
    const Shape shape{tc.batch, tc.seq, h.qkv_width()}, freq_shape{h.head_dim / 2};
    auto inv_freq = InvFreq(h.head_dim, tc.theta);
    const auto qkv_in = Rand(NumElements(shape), 1), dqkv_in = Rand(NumElements(shape), 2);
    auto qkv = qkv_in, dqkv = dqkv_in;
    DeviceTensor gqkv = Dev(qkv, shape), gdqkv = Dev(dqkv, shape);
    DeviceTensor gfreq = DevF32(inv_freq, freq_shape);
    cpu_->RopeForward(View(qkv, shape), h, View(inv_freq, freq_shape));
    gpu_->RopeForward(gqkv, h, gfreq);
    Expect(gqkv, qkv, "qkv (turned in place)", rope_tol);
    ExpectVUntouched(gqkv.ToHost(), qkv_in, h, "RopeForward");
    cpu_->RopeBackward(View(dqkv, shape), h, View(inv_freq, freq_shape));
    gpu_->RopeBackward(gdqkv, h, gfreq);
    Expect(gdqkv, dqkv, "dqkv (turned back in place)", rope_tol);
    ExpectVUntouched(gdqkv.ToHost(), dqkv_in, h, "RopeBackward");
    // The backward is the transpose of an orthogonal map, hence its inverse: turning the
    // GPU's rotated qkv back restores the input (two more roundings in bf16).
    gpu_->RopeBackward(gqkv, h, gfreq);
    Expect(gqkv, qkv_in, "RopeBackward(RopeForward(qkv))", round_trip_tol);
  }
}

TEST_P(CudaOpsTest, RmsNormForwardAndBackwardMatchCpu) {
  // 130 rows: three row chunks of the parameter-gradient pass; 264 channels: several per lane.
  const std::pair<int64_t, int64_t> kCases[] = {{11, 40}, {130, 264}};
  for (const auto& [rows, ch] : kCases) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " C=" + std::to_string(ch));
    const float eps = 1e-6f;
    auto x = Rand(rows * ch, 1, -2.0f, 3.0f), w = Rand(ch, 2, 0.5f, 1.5f);
    auto dy = Rand(rows * ch, 4), dw = Rand(ch, 5);
    std::vector<float> y(rows * ch), rstd(rows), dx(rows * ch);
    DeviceTensor gx = Dev(x, {rows, ch}), gw = Dev(w, {ch}), gy = Out({rows, ch});
    DeviceTensor grstd = OutF32({rows}), gdy = Dev(dy, {rows, ch}), gdx = Out({rows, ch});
    DeviceTensor gdw = Dev(dw, {ch});
    cpu_->RmsNormForward(View(x, {rows, ch}), View(w, {ch}), eps, View(y, {rows, ch}),
                         View(rstd, {rows}));
    gpu_->RmsNormForward(gx, gw, eps, gy, grstd);
    Expect(gy, y, "y");
    Expect(grstd, rstd, "rstd", 1e-4);  // fp32 statistics of the same (rounded) inputs
    // Both backwards take the CPU's rstd, so only the backward itself is compared.
    DeviceTensor crstd = DevF32(rstd, {rows});
    cpu_->RmsNormBackward(View(dy, {rows, ch}), View(x, {rows, ch}), View(w, {ch}),
                          View(rstd, {rows}), View(dx, {rows, ch}), View(dw, {ch}));
    gpu_->RmsNormBackward(gdy, gx, gw, crstd, gdx, gdw);
    Expect(gdx, dx, "dx");
    Expect(gdw, dw, "dweight (accumulated)");
  }
}

TEST_P(CudaOpsTest, SwiGluForwardAndBackwardMatchCpu) {
  const Shape shape{10, 100};
  const int64_t n = NumElements(shape);
  auto gate = Rand(n, 1, -8.0f, 8.0f), up = Rand(n, 2, -2.0f, 2.0f), dh = Rand(n, 3);
  gate[0] = -100.0f;  // e^-g overflows: silu and its slope must come out 0, not NaN
  gate[1] = 100.0f;   // sigmoid saturates at 1
  gate[2] = 0.0f;
  std::vector<float> h(n), dgate(n), dup(n);
  DeviceTensor ggate = Dev(gate, shape), gup = Dev(up, shape), gh = Out(shape);
  DeviceTensor gdh = Dev(dh, shape), gdgate = Out(shape), gdup = Out(shape);
  cpu_->SwiGluForward(View(gate, shape), View(up, shape), View(h, shape));
  gpu_->SwiGluForward(ggate, gup, gh);
  Expect(gh, h, "h");
  cpu_->SwiGluBackward(View(dh, shape), View(gate, shape), View(up, shape), View(dgate, shape),
                       View(dup, shape));
  gpu_->SwiGluBackward(gdh, ggate, gup, gdgate, gdup);
  Expect(gdgate, dgate, "dgate");
  Expect(gdup, dup, "dup");
}

TEST_P(CudaOpsTest, GeluForwardAndBackwardMatchCpu) {
  const int64_t n = 1000;
  auto x = Rand(n, 1, -5.0f, 5.0f), dy = Rand(n, 2);
  std::vector<float> y(n), dx(n);
  DeviceTensor gx = Dev(x, {10, 100}), gy = Out({10, 100}), gdy = Dev(dy, {10, 100}),
               gdx = Out({10, 100});
  cpu_->GeluForward(View(x, {10, 100}), View(y, {10, 100}));
  gpu_->GeluForward(gx, gy);
  Expect(gy, y, "y");
  cpu_->GeluBackward(View(dy, {10, 100}), View(x, {10, 100}), View(dx, {10, 100}));
  gpu_->GeluBackward(gdy, gx, gdx);
  Expect(gdx, dx, "dx");
}

TEST_P(CudaOpsTest, ElementwiseOpsMatchCpu) {
  const int64_t n = 777;
  auto a = Rand(n, 1), b = Rand(n, 2), y = Rand(n, 3);
  std::vector<float> sum(n);
  DeviceTensor ga = Dev(a, {n}), gb = Dev(b, {n}), gy = Dev(y, {n}), gsum = Out({n});
  cpu_->Add(View(a, {n}), View(b, {n}), View(sum, {n}));
  gpu_->Add(ga, gb, gsum);
  Expect(gsum, sum, "Add");
  cpu_->Add(View(a, {n}), View(b, {n}), View(a, {n}));  // y aliasing a
  gpu_->Add(ga, gb, ga);
  Expect(ga, a, "Add into a");
  cpu_->AddInPlace(View(y, {n}), View(b, {n}));
  gpu_->AddInPlace(gy, gb);
  Expect(gy, y, "AddInPlace");
  cpu_->Scale(View(y, {n}), -0.37f);
  gpu_->Scale(gy, -0.37f);
  Expect(gy, y, "Scale");
  DeviceTensor gcopy = Out({n});
  gpu_->Copy(gb, gcopy);
  EXPECT_EQ(gcopy.Bytes(), gb.Bytes()) << "Copy must move the bytes unchanged";
  gpu_->Zero(gcopy);
  EXPECT_EQ(gcopy.ToHost(), std::vector<float>(n, 0.0f)) << "Zero";
}

TEST_P(CudaOpsTest, SumSquaresMatchesCpu) {
  for (int64_t n : {1, 1000, 100003}) {
    auto x = Rand(n, 5, -3.0f, 3.0f);
    DeviceTensor gx = Dev(x, {n});
    const double want = cpu_->SumSquares(View(x, {n}));
    // Double accumulation on both sides from the same values: only summation order differs.
    EXPECT_NEAR(gpu_->SumSquares(gx), want, 1e-5 * want) << "n = " << n;
  }
}

struct CeCase {
  int64_t rows, vocab, padded;
};

TEST_P(CudaOpsTest, SoftmaxCrossEntropyMatchesCpu) {
  for (CeCase tc : {CeCase{6, 1000, 1024}, {3, 50257, 50304}, {2, 1, 8}}) {
    SCOPED_TRACE("V=" + std::to_string(tc.vocab) + " Vp=" + std::to_string(tc.padded));
    const Shape shape{tc.rows, tc.padded};
    auto logits = Rand(tc.rows * tc.padded, 1, -8.0f, 8.0f);
    for (int64_t r = 0; r < tc.rows; ++r) {  // padding is never read: NaN must not leak
      for (int64_t j = tc.vocab; j < tc.padded; ++j) {
        logits[r * tc.padded + j] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    auto targets = RandomInts(tc.rows, 2, 0, int32_t(tc.vocab));
    auto dlosses = Random(tc.rows, 3, 0.1f, 2.0f);  // fp32 in both dtypes
    std::vector<float> losses(tc.rows);
    DeviceTensor gtargets(targets, {tc.rows}), gdlosses = DevF32(dlosses, {tc.rows});
    // Without dlosses: losses only, logits untouched.
    DeviceTensor glogits = Dev(logits, shape), glosses = OutF32({tc.rows});
    const std::vector<uint8_t> before = glogits.Bytes();
    cpu_->SoftmaxCrossEntropy(View(logits, shape), View(targets, {tc.rows}), tc.vocab,
                              View(losses, {tc.rows}), Tensor());
    gpu_->SoftmaxCrossEntropy(glogits, gtargets, tc.vocab, glosses, Tensor());
    Expect(glosses, losses, "losses", 1e-4);  // fp32 losses from the same logits
    EXPECT_EQ(glogits.Bytes(), before) << "logits must be untouched without dlosses";
    // With dlosses: the logits turn into dlogits, padding into zeros.
    cpu_->SoftmaxCrossEntropy(View(logits, shape), View(targets, {tc.rows}), tc.vocab,
                              View(losses, {tc.rows}), View(dlosses, {tc.rows}));
    gpu_->SoftmaxCrossEntropy(glogits, gtargets, tc.vocab, glosses, gdlosses);
    Expect(glosses, losses, "losses with dlosses", 1e-4);
    Expect(glogits, logits, "dlogits");
  }
}

using Blobs = std::vector<std::vector<uint8_t>>;  // raw bytes of several outputs

// The same call twice from the same inputs gives the same bits (no floating-point atomics).
TEST_P(CudaOpsTest, BackwardsAreBitwiseDeterministic) {
  auto twice = [](auto&& run) {
    const Blobs first = run(), second = run();
    EXPECT_EQ(first, second);
  };
  {
    SCOPED_TRACE("EmbeddingBackward");
    const EmbeddingData e(9);
    const Shape act{e.batch, e.seq, e.ch}, te{e.vocab, e.ch}, pe{e.max_seq, e.ch};
    auto dout = Rand(NumElements(act), 1), dwte = Rand(e.vocab * e.ch, 2);
    auto dwpe = Rand(e.max_seq * e.ch, 3);
    DeviceTensor gtok(e.tokens, {e.batch, e.seq}), gdout = Dev(dout, act);
    twice([&] {
      DeviceTensor gdwte = Dev(dwte, te), gdwpe = Dev(dwpe, pe);
      gpu_->EmbeddingBackward(gdout, gtok, gdwte, gdwpe);
      return Blobs{gdwte.Bytes(), gdwpe.Bytes()};
    });
  }
  {
    SCOPED_TRACE("LayerNormBackward");
    const int64_t rows = 300, ch = 96;
    auto x = Rand(rows * ch, 1), w = Rand(ch, 2), dy = Rand(rows * ch, 3), dw = Rand(ch, 4);
    auto mean = Random(rows, 5, -0.1f, 0.1f), rstd = Random(rows, 6, 0.5f, 2.0f);
    DeviceTensor gx = Dev(x, {rows, ch}), gw = Dev(w, {ch}), gdy = Dev(dy, {rows, ch});
    DeviceTensor gmean = DevF32(mean, {rows}), grstd = DevF32(rstd, {rows});
    twice([&] {
      DeviceTensor gdx = Out({rows, ch}), gdw = Dev(dw, {ch}), gdb = Dev(dw, {ch});
      gpu_->LayerNormBackward(gdy, gx, gw, gmean, grstd, gdx, gdw, gdb);
      return Blobs{gdx.Bytes(), gdw.Bytes(), gdb.Bytes()};
    });
  }
  {
    SCOPED_TRACE("RmsNormBackward");
    const int64_t rows = 300, ch = 96;
    auto x = Rand(rows * ch, 1), w = Rand(ch, 2), dy = Rand(rows * ch, 3), dw = Rand(ch, 4);
    DeviceTensor gx = Dev(x, {rows, ch}), gw = Dev(w, {ch}), gdy = Dev(dy, {rows, ch});
    DeviceTensor grstd = DevF32(Random(rows, 6, 0.5f, 2.0f), {rows});
    twice([&] {
      DeviceTensor gdx = Out({rows, ch}), gdw = Dev(dw, {ch});
      gpu_->RmsNormBackward(gdy, gx, gw, grstd, gdx, gdw);
      return Blobs{gdx.Bytes(), gdw.Bytes()};
    });
  }
  // Multi-head, and grouped-query (dK and dV summed over a group of query heads).
  for (const AttnCase& tc : {AttnCase{2, 150, {2, 2, 64}}, AttnCase{2, 150, {4, 1, 64}}}) {
    SCOPED_TRACE("AttentionBackward " + tc.Name());
    DeviceTensor gqkv = Dev(Rand(NumElements(tc.qkv()), 1), tc.qkv());
    DeviceTensor gout = Out(tc.out()), glse = OutF32(tc.lse());
    DeviceTensor gdout = Dev(Rand(NumElements(tc.out()), 2), tc.out());
    gpu_->AttentionForward(gqkv, tc.heads, gout, glse);
    twice([&] {
      DeviceTensor gdqkv = Out(tc.qkv());
      gpu_->AttentionBackward(gdout, gqkv, gout, glse, tc.heads, gdqkv);
      return Blobs{gdqkv.Bytes()};
    });
  }
  {
    SCOPED_TRACE("SumSquares");
    DeviceTensor gx = Dev(Rand(200003, 1), {200003});
    const double first = gpu_->SumSquares(gx), second = gpu_->SumSquares(gx);
    EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0) << first << " vs " << second;
  }
}

// One argument of a FrozenArgs call: floats of a dtype, or int32 tokens.
struct FrozenArg {
  std::vector<float> values;
  Shape shape;
  DType dtype;
  std::vector<int32_t> tokens = {};
};
using GpuCall = std::function<void(Ops&, const std::vector<Tensor>&)>;

// Note [Frozen parameters] on the GPU, as frozen_test_util.h checks it on the CPU: `call` runs
// on device copies of `args` twice, with every tensor and with those at `frozen` undefined.
// Every other tensor must end bit for bit the same; each frozen one must change in the first
// run (so the skip is what is seen).
void ExpectFrozenSkipped(Ops& gpu, const std::vector<FrozenArg>& args,
                         const std::set<size_t>& frozen, const GpuCall& call) {
  std::vector<DeviceTensor> full, part;
  std::vector<Tensor> full_t, part_t;
  for (const FrozenArg& a : args) {
    for (auto* copies : {&full, &part}) {
      if (a.tokens.empty()) {
        copies->emplace_back(a.values, a.shape, a.dtype);
      } else {
        copies->emplace_back(a.tokens, a.shape);
      }
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    full_t.push_back(full[i]);
    part_t.push_back(frozen.count(i) ? Tensor() : part[i].tensor());
  }
  std::vector<std::vector<uint8_t>> before;
  for (const DeviceTensor& t : full) before.push_back(t.Bytes());
  call(gpu, full_t);
  call(gpu, part_t);
  for (size_t i = 0; i < args.size(); ++i) {
    if (frozen.count(i)) {
      EXPECT_NE(full[i].Bytes(), before[i]) << "argument " << i << " is never written";
    } else {
      EXPECT_EQ(part[i].Bytes(), full[i].Bytes()) << "argument " << i << " differs";
    }
  }
}

TEST_P(CudaOpsTest, FrozenParameterGradsAreSkipped) {
  const DType t = dtype(), f32 = DType::kF32;
  const int64_t rows = 130, ch = 264, oc = 72;  // three row chunks of the norm passes
  {
    SCOPED_TRACE("LinearBackward");
    const std::vector<FrozenArg> args = {
        {Rand(rows * oc, 1), {rows, oc}, t}, {Rand(rows * ch, 2), {rows, ch}, t},
        {Rand(oc * ch, 3), {oc, ch}, t},     {Rand(rows * ch, 4), {rows, ch}, t},
        {Rand(oc * ch, 5), {oc, ch}, t},     {Rand(oc, 6), {oc}, t}};
    for (const std::set<size_t>& frozen : {std::set<size_t>{4}, {5}, {4, 5}}) {
      ExpectFrozenSkipped(*gpu_, args, frozen, [](Ops& o, const auto& v) {
        o.LinearBackward(v[0], v[1], v[2], v[3], v[4], v[5]);
      });
    }
  }
  const auto stat = Random(rows, 7, 0.5f, 2.0f);
  {
    SCOPED_TRACE("LayerNormBackward");
    const std::vector<FrozenArg> args = {{Rand(rows * ch, 1), {rows, ch}, t},
                                         {Rand(rows * ch, 2), {rows, ch}, t},
                                         {Rand(ch, 3), {ch}, t},
                                         {Random(rows, 8), {rows}, f32},
                                         {stat, {rows}, f32},
                                         {Rand(rows * ch, 4), {rows, ch}, t},
                                         {Rand(ch, 5), {ch}, t},
                                         {Rand(ch, 6), {ch}, t}};
    for (const std::set<size_t>& frozen : {std::set<size_t>{6}, {7}, {6, 7}}) {
      ExpectFrozenSkipped(*gpu_, args, frozen, [](Ops& o, const auto& v) {
        o.LayerNormBackward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
      });
    }
  }
  {
    SCOPED_TRACE("RmsNormBackward");
    const std::vector<FrozenArg> args = {{Rand(rows * ch, 1), {rows, ch}, t},
                                         {Rand(rows * ch, 2), {rows, ch}, t},
                                         {Rand(ch, 3), {ch}, t},
                                         {stat, {rows}, f32},
                                         {Rand(rows * ch, 4), {rows, ch}, t},
                                         {Rand(ch, 5), {ch}, t}};
    ExpectFrozenSkipped(*gpu_, args, {5}, [](Ops& o, const auto& v) {
      o.RmsNormBackward(v[0], v[1], v[2], v[3], v[4], v[5]);
    });
  }
  {
    SCOPED_TRACE("EmbeddingBackward");
    const EmbeddingData e(10);
    const Shape act{e.batch, e.seq, e.ch};
    const std::vector<FrozenArg> args = {{Rand(NumElements(act), 1), act, t},
                                         {{}, {e.batch, e.seq}, DType::kI32, e.tokens},
                                         {Rand(e.vocab * e.ch, 2), {e.vocab, e.ch}, t},
                                         {Rand(e.max_seq * e.ch, 3), {e.max_seq, e.ch}, t}};
    for (const std::set<size_t>& frozen : {std::set<size_t>{2}, {3}, {2, 3}}) {
      ExpectFrozenSkipped(*gpu_, args, frozen, [](Ops& o, const auto& v) {
        o.EmbeddingBackward(v[0], v[1], v[2], v[3]);
      });
    }
  }
}

// AddColumns and CopyColumns against the CPU, bit for bit: alpha * x is exact (alpha = 0.75
// on values of at most 8 significant bits), so y + alpha * x is one fp32 rounding on both
// backends, fused or not, then one rounding to the dtype. fp16 too (AddColumns takes it).
TEST_P(CudaOpsTest, ColumnWindowsMatchCpu) {
  const DType dtypes[] = {dtype(), DType::kF16};  // fp16 in both instances: cheap
  const int64_t rows = 37, full = 96;
  const std::pair<int64_t, int64_t> windows[] = {{0, 32}, {64, 32}, {10, 7}, {0, 96}};
  for (DType t : dtypes) {
    for (const auto& [column, width] : windows) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " column " + std::to_string(column) + " w " +
                   std::to_string(width));
      const auto values = [](int64_t n, uint32_t seed) {
        return RoundTo(DType::kBF16, Random(n, seed));  // 8 significant bits
      };
      testing::HostTensor y = testing::HostTensor::From(t, {rows, full}, values(rows * full, 1));
      const testing::HostTensor x =
          testing::HostTensor::From(t, {rows, width}, values(rows * width, 2));
      const auto bytes = [](const testing::HostTensor& h) {
        const auto* p = static_cast<const uint8_t*>(h.tensor().data());
        return std::vector<uint8_t>(p, p + h.tensor().nbytes());
      };
      DeviceTensor gy(bytes(y), y.shape(), t), gx(bytes(x), x.shape(), t);
      DeviceTensor gwindow = Out({rows, width});
      cpu_->AddColumns(y.tensor(), column, x.tensor(), 0.75f);
      gpu_->AddColumns(gy, column, gx, 0.75f);
      EXPECT_EQ(gy.Bytes(), bytes(y)) << "AddColumns";
      if (t != dtype()) continue;  // Out() makes tensors of the instance's dtype
      gpu_->CopyColumns(gy, column, gwindow);
      std::vector<uint8_t> want;
      const std::vector<uint8_t> all = bytes(y);
      const size_t elem = DTypeSize(t);
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = all.begin() + (r * full + column) * elem;
        want.insert(want.end(), row, row + width * elem);
      }
      EXPECT_EQ(gwindow.Bytes(), want) << "CopyColumns";
    }
  }
}

// LoRA dropout draws the same mask on both backends (kernels/dropout.h is one function) and
// scales with one fp32 product, rounded once: the same bytes.
TEST_P(CudaOpsTest, DropoutMatchesCpuBitForBit) {
  const int64_t rows = 37, cols = 200;
  const std::vector<float> x = Rand(rows * cols, 31);
  const DropoutMask mask{DropoutKey(1337, 5, 2), 0.3f, 64, 400};
  const testing::HostTensor hx = testing::HostTensor::From(dtype(), {rows, cols}, x);
  testing::HostTensor hy = testing::HostTensor::From(dtype(), {rows, cols}, x);
  cpu_->Dropout(hx.tensor(), mask, hy.tensor());
  const DeviceTensor gx = Dev(x, {rows, cols});
  DeviceTensor gy = Out({rows, cols});
  gpu_->Dropout(gx, mask, gy);
  const auto* p = static_cast<const uint8_t*>(hy.tensor().data());
  EXPECT_EQ(gy.Bytes(), std::vector<uint8_t>(p, p + hy.tensor().nbytes()));
}

// QLoRA's dequantization: bitsandbytes' separately rounded products on both backends, so the
// same bits, for every format and a tensor-parallel piece.
TEST_P(CudaOpsTest, DequantizeMatchesCpuBitForBit) {
  const int64_t rows = 96, cols = 192;
  const std::vector<float> w = Random(rows * cols, 32, -0.1f, 0.1f);
  const QuantGeometry whole = QuantGeometry::Whole(rows, cols);
  const QuantGeometry piece{rows / 2, cols, rows, cols, rows / 6, rows / 3, rows / 6, 0};
  for (const QuantFormat format : {QuantFormat{QuantType::kNf4, false},
                                   QuantFormat{QuantType::kNf4, true},
                                   QuantFormat{QuantType::kFp4, false},
                                   QuantFormat{QuantType::kInt8, false}}) {
    for (const QuantGeometry& g : {whole, piece}) {
      std::vector<uint8_t> blob(static_cast<size_t>(LayoutOf(format, g).total));
      QuantizeInto(format, g, w.data(), blob.data());
      testing::HostTensor want =
          testing::HostTensor::From(dtype(), {g.rows, g.cols}, std::vector<float>(g.rows * g.cols));
      cpu_->Dequantize(Tensor(blob.data(), DType::kU8, {static_cast<int64_t>(blob.size())}),
                       format, g, want.tensor());
      const DeviceTensor gblob(blob, {static_cast<int64_t>(blob.size())}, DType::kU8);
      DeviceTensor got = Out({g.rows, g.cols});
      gpu_->Dequantize(gblob, format, g, got);
      const auto* p = static_cast<const uint8_t*>(want.tensor().data());
      EXPECT_EQ(got.Bytes(), std::vector<uint8_t>(p, p + want.tensor().nbytes()))
          << static_cast<int>(format.type) << (format.double_quant ? " dq" : "") << " rows "
          << g.rows;
    }
  }
}

TEST_P(CudaOpsTest, BadInputThrowsNamingIt) {
  const EmbeddingData e(3);
  auto tokens = e.tokens;
  tokens[5] = int32_t(e.vocab) + 7;
  const Shape act{e.batch, e.seq, e.ch};
  DeviceTensor gtok(tokens, {e.batch, e.seq}), gwte = Out({e.vocab, e.ch}),
               gwpe = Out({e.max_seq, e.ch}), gout = Out(act);
  ExpectErrorMentions([&] { gpu_->EmbeddingForward(gtok, gwte, gwpe, gout); },
                      {"EmbeddingForward", "token", "57"});

  std::vector<int32_t> targets{0, 3, 10, 1};  // 10 is outside [0, 10)
  DeviceTensor glogits = Out({4, 16}), gtargets(targets, {4}), glosses = OutF32({4});
  ExpectErrorMentions(
      [&] { gpu_->SoftmaxCrossEntropy(glogits, gtargets, 10, glosses, Tensor()); },
      {"SoftmaxCrossEntropy", "target 10", "row 2"});

  DeviceTensor x = Out({4, 8}), w = Out({7}), b = Out({8}), y = Out({4, 8});
  DeviceTensor mean = OutF32({4}), rstd = OutF32({4});
  ExpectErrorMentions([&] { gpu_->LayerNormForward(x, w, b, y, mean, rstd); },
                      {"LayerNormForward", "weight"});
  DeviceTensor qkv = Out({1, 5, 12}), out = Out({1, 5, 3}), lse = OutF32({1, 2, 5});
  ExpectErrorMentions([&] { gpu_->AttentionForward(qkv, 2, out, lse); },
                      {"AttentionForward", "out"});
  ExpectErrorMentions(
      [&] { gpu_->AttentionForward(qkv, AttentionHeads{4, 3, 1}, out, lse); },
      {"AttentionForward", "num_kv_heads = 3", "divide"});
  DeviceTensor wide = Out({1, 5, 3 * 256}), wide_out = Out({1, 5, 256});
  DeviceTensor wide_lse = OutF32({1, 1, 5});
  ExpectErrorMentions(
      [&] { gpu_->AttentionForward(wide, AttentionHeads{1, 1, 256}, wide_out, wide_lse); },
      {"AttentionForward", "head_dim = 256", "128"});

  ExpectErrorMentions([&] { gpu_->RmsNormForward(x, w, 1e-5f, y, rstd); },
                      {"RmsNormForward", "weight"});
  DeviceTensor w8 = Out({8}), rstd3 = OutF32({3});
  ExpectErrorMentions([&] { gpu_->RmsNormForward(x, w8, 1e-5f, y, rstd3); },
                      {"RmsNormForward", "rstd"});

  const AttentionHeads gqa{2, 1, 4};  // qkv rows of (2 + 2) * 4 = 16
  DeviceTensor rq = Out({1, 5, 16}), freq = OutF32({2}), freq3 = OutF32({3});
  ExpectErrorMentions([&] { gpu_->RopeForward(rq, gqa, freq3); }, {"RopeForward", "inv_freq"});
  ExpectErrorMentions([&] { gpu_->RopeBackward(rq, AttentionHeads{2, 2, 4}, freq); },
                      {"RopeBackward", "dqkv", "[B, T, 24]"});
  DeviceTensor odd = Out({1, 5, 12}), freq1 = OutF32({1});
  ExpectErrorMentions([&] { gpu_->RopeForward(odd, AttentionHeads{2, 1, 3}, freq1); },
                      {"RopeForward", "head_dim = 3", "even"});

  DeviceTensor g = Out({4, 8}), u = Out({4, 8}), u_bad = Out({8, 4});
  ExpectErrorMentions([&] { gpu_->SwiGluForward(g, u_bad, y); }, {"SwiGluForward", "up"});
  ExpectErrorMentions([&] { gpu_->SwiGluBackward(y, g, u, g, u_bad); },
                      {"SwiGluBackward", "dup"});

  DeviceTensor ga = Out({3, 4}), gb = Out({5, 2}), gc = Out({3, 2});
  ExpectErrorMentions([&] { gpu_->Gemm(false, false, 1.0f, ga, gb, 0.0f, gc); }, {"Gemm"});

  DeviceTensor full = Out({4, 10}), narrow = Out({4, 3}), narrow_f32 = OutF32({4, 3});
  ExpectErrorMentions([&] { gpu_->AddColumns(full, 8, narrow, 1.0f); },
                      {"AddColumns", "column = 8", "0 <= column <= 7"});
  ExpectErrorMentions([&] { gpu_->CopyColumns(full, -1, narrow); }, {"CopyColumns", "column = -1"});
  ExpectErrorMentions([&] { gpu_->CopyColumns(full, 0, ga); }, {"CopyColumns", "y", "[3, 4]"});
  if (half()) {
    const std::string want = "y's dtype " + std::string(DTypeName(dtype()));
    ExpectErrorMentions([&] { gpu_->AddColumns(full, 0, narrow_f32, 1.0f); },
                        {"AddColumns", "x", "fp32", want.c_str()});
  }
  std::vector<float> host(12);
  const Tensor on_host(host.data(), dtype(), {4, 3});
  ExpectErrorMentions([&] { gpu_->AddColumns(full, 0, on_host, 1.0f); },
                      {"AddColumns", "x", "cpu"});
}

}  // namespace
}  // namespace ztrain::kernels
