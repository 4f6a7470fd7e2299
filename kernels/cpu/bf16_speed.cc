#include "kernels/cpu/bf16_speed.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "kernels/cpu/gemm_choice.h"
#include "kernels/cpu/gemm_timing.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {
namespace {

using ::ztrain::detail::StrCat;

constexpr int64_t kRows = 1024;
constexpr int64_t kMinSide = 512;  // below it a GEMM takes microseconds: timing noise decides
constexpr int64_t kMaxSide = 4096;

std::string Gflops(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", v);
  return text;
}

}  // namespace

Bf16Speed MeasureBf16Speed(int64_t width, int64_t mlp_width) {
  Bf16Speed s;
  const cpu::OneDnnSupport& support = cpu::OneDnnBf16Support();
  s.available = support.available;
  s.detail = support.detail;
  if (!s.available) return s;
  s.m = kRows;
  s.k = std::clamp<int64_t>(width, kMinSide, kMaxSide);
  s.n = std::clamp<int64_t>(mlp_width, kMinSide, kMaxSide);
  const GemmRates rates = TimeGemm({.m = s.m, .n = s.n, .k = s.k},
                                   GemmBackends{.onednn_fp32 = true, .onednn_bf16 = true});
  const Fp32GemmChoice by_hand = Fp32GemmByEnvironment();
  const bool fp32_on_onednn =
      rates.onednn_fp32 > 0 &&
      (by_hand == Fp32GemmChoice::kOneDnn ||
       (by_hand == Fp32GemmChoice::kAuto &&
        FasterBackend(rates.sgemm, rates.onednn_fp32) == GemmBackend::kOneDnn));
  s.fp32_gflops = fp32_on_onednn ? rates.onednn_fp32 : rates.sgemm;
  s.fp32_backend = fp32_on_onednn ? "oneDNN" : "OpenBLAS";
  s.bf16_gflops = rates.onednn_bf16;
  if (s.bf16_gflops <= 0) {
    s.available = false;
    s.detail = StrCat("oneDNN has no bf16 matmul for ", s.m, "x", s.k, "x", s.n, " here");
  }
  return s;
}

bool Bf16Pays(const Bf16Speed& speed, std::string* why) {
  if (!speed.available) {
    if (why) *why = speed.detail;
    return false;
  }
  const bool pays = speed.ratio() >= kBf16Pays;
  if (why) {
    *why = StrCat(
        "measured on the model's MLP GEMM (", speed.m, "x", speed.k, "x", speed.n, "): bf16 ",
        Gflops(speed.bf16_gflops), " GFLOP/s against fp32's ", Gflops(speed.fp32_gflops), " on ",
        speed.fp32_backend, " (", Gflops(100.0 * speed.ratio()), " %), ",
        pays ? "so bf16 pays" : "not enough to pay (bf16 needs ",
        pays ? "" : StrCat(Gflops(100.0 * kBf16Pays), " %)"), "; Note [bf16 where it pays]");
  }
  return pays;
}

}  // namespace ztrain::kernels
