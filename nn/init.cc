#include "nn/init.h"

#include <cmath>

namespace ztrain::nn {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t StreamKey(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return SplitMix64(seed ^ SplitMix64(h));
}

// Box-Muller on the two 32-bit halves of one hash: both uniforms lie in (0, 1).
double NormalFromKey(uint64_t key, int64_t index) {
  const uint64_t r = SplitMix64(key + static_cast<uint64_t>(index) * 0xd1b54a32d192ed03ull);
  const double u1 = (static_cast<double>(r >> 32) + 0.5) * 0x1p-32;
  const double u2 = (static_cast<double>(r & 0xffffffffu) + 0.5) * 0x1p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double UniformFromKey(uint64_t key, int64_t index) {  // in [-1, 1)
  const uint64_t r = SplitMix64(key + static_cast<uint64_t>(index) * 0xd1b54a32d192ed03ull);
  return static_cast<double>(r >> 11) * 0x1p-52 - 1.0;
}

}  // namespace

double InitNormal(uint64_t seed, std::string_view name, int64_t index) {
  return NormalFromKey(StreamKey(seed, name), index);
}

void InitParam(const ParamSpec& spec, uint64_t seed, const Tensor& out, int64_t offset) {
  ZTRAIN_ASSERT(out.dtype() == DType::kF32 && out.device().is_cpu());
  float* p = out.data<float>();
  const int64_t n = out.numel();
  switch (spec.init) {
    case Init::kZeros:
    case Init::kOnes: {
      const float v = spec.init == Init::kOnes ? 1.0f : 0.0f;
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case Init::kNormal: {
      const uint64_t key = StreamKey(seed, spec.name);
      const double std = spec.init_std;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(std * NormalFromKey(key, offset + i));
      return;
    }
    case Init::kUniform: {
      const uint64_t key = StreamKey(seed, spec.name);
      const double bound = spec.init_std;
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<float>(bound * UniformFromKey(key, offset + i));
      return;
    }
  }
}

}  // namespace ztrain::nn
