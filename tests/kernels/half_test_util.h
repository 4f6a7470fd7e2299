#pragma once
// Helpers for the 16-bit kernel tests: host tensors of any dtype, the dtype mixes the engine
// uses, and a harness that runs an op on 16-bit tensors and on fp32 copies of the same
// (rounded) values and compares the outputs after rounding the fp32 ones to their dtype.
#include <spdlog/sinks/ostream_sink.h>

#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/logging.h"
#include "kernel_test_util.h"

namespace ztrain::kernels::testing {

// Owns the bytes of one host tensor of any dtype.
class HostTensor {
 public:
  HostTensor(DType dtype, Shape shape)
      : dtype_(dtype),
        shape_(std::move(shape)),
        words_((NumElements(shape_) * DTypeSize(dtype_) + 3) / 4) {}
  // `values` rounded to `dtype` (to nearest even; int32 dtypes take the values as integers).
  static HostTensor From(DType dtype, Shape shape, const std::vector<float>& values) {
    HostTensor t(dtype, std::move(shape));
    EXPECT_EQ(static_cast<int64_t>(values.size()), NumElements(t.shape_));
    for (size_t i = 0; i < values.size(); ++i) t.Set(i, values[i]);
    return t;
  }
  Tensor tensor() const { return Tensor(const_cast<uint32_t*>(words_.data()), dtype_, shape_); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return NumElements(shape_); }
  // Element i widened to float (exact).
  float Get(size_t i) const {
    const void* p = words_.data();
    switch (dtype_) {
      case DType::kF32:
        return static_cast<const float*>(p)[i];
      case DType::kBF16:
        return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
      case DType::kF16:
        return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
      case DType::kI32:
        return static_cast<float>(static_cast<const int32_t*>(p)[i]);
      default:
        return 0.0f;
    }
  }
  void Set(size_t i, float v) {
    void* p = words_.data();
    switch (dtype_) {
      case DType::kF32:
        static_cast<float*>(p)[i] = v;
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(p)[i] = FloatToHalf(v);
        break;
      case DType::kI32:
        static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
        break;
      default:
        break;
    }
  }
  std::vector<float> Values() const {
    std::vector<float> v(numel());
    for (size_t i = 0; i < v.size(); ++i) v[i] = Get(i);
    return v;
  }
  // The raw bit pattern of element i (16 or 32 bits).
  uint32_t Bits(size_t i) const {
    if (DTypeSize(dtype_) == 2) return reinterpret_cast<const uint16_t*>(words_.data())[i];
    return words_[i];
  }
  bool SameBytes(const HostTensor& o) const { return words_ == o.words_; }

 private:
  DType dtype_;
  Shape shape_;
  std::vector<uint32_t> words_;
};

// Distance in units in the last place between two bit patterns of a float dtype: the number
// of representable values between them (0 for equal values and for two NaNs).
inline int64_t UlpDistance(uint32_t a, uint32_t b, DType dtype) {
  const int bits = DTypeSize(dtype) == 2 ? 16 : 32;
  const uint32_t sign = 1u << (bits - 1), mag = sign - 1;
  const uint32_t inf = dtype == DType::kF32    ? 0x7f800000u
                       : dtype == DType::kBF16 ? 0x7f80u
                                               : 0x7c00u;
  const bool nan_a = (a & mag) > inf, nan_b = (b & mag) > inf;
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : INT64_MAX;
  auto ordered = [&](uint32_t x) {
    return (x & sign) ? -static_cast<int64_t>(x & mag) : static_cast<int64_t>(x);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// What an argument of an op is, which decides its dtype in a DtypeMix and how it is checked.
enum class Role {
  kAct,       // activation input (x, dy, qkv, ...)
  kActInOut,  // activation the op updates in place (AddInPlace's y, logits with dlosses)
  kParam,     // parameter input (weight, bias, wte, wpe)
  kOut,       // output the op overwrites (y, dx, out, dqkv)
  kGrad,      // parameter gradient the op accumulates into (dweight, dbias, dwte, dwpe)
  kStat,      // an input ops.h fixes as fp32 (mean, rstd, lse, dlosses)
  kStatOut,   // an output ops.h fixes as fp32 (mean, rstd, lse, losses)
  kIndex,     // int32 tokens or targets in [0, index_hi)
};

struct ArgSpec {
  const char* name;
  Role role;
  Shape shape;
  int32_t index_hi = 0;  // kIndex only
};

// Which dtype each role gets.
struct DtypeMix {
  const char* name;
  DType act, param, out, grad;
  DType For(Role r) const {
    switch (r) {
      case Role::kAct:
      case Role::kActInOut:
        return act;
      case Role::kParam:
        return param;
      case Role::kOut:
        return out;
      case Role::kGrad:
        return grad;
      case Role::kIndex:
        return DType::kI32;
      default:
        return DType::kF32;
    }
  }
};

// The mixes the engine uses (everything 16-bit; 16-bit activations and weights with fp32
// parameter gradients) and two scrambled ones: the contract lets every argument differ.
inline std::vector<DtypeMix> EngineMixes() {
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  return {{"all bf16", bf16, bf16, bf16, bf16},
          {"all fp16", f16, f16, f16, f16},
          {"bf16 with fp32 grads", bf16, bf16, bf16, f32},
          {"fp16 with fp32 grads", f16, f16, f16, f32},
          {"fp32 acts, bf16 params, fp16 outs/grads", f32, bf16, f16, f16},
          {"bf16 acts, fp16 params, fp32 outs, bf16 grads", bf16, f16, f32, bf16}};
}

using OpCall = std::function<void(Ops&, const std::vector<Tensor>&)>;

// The tolerance of a GEMM output of `dtype` whose summation order differs from SGEMM's
// (oneDNN): relative to |want| + rms(want), a little over one rounding of the dtype for
// 16-bit outputs (bf16 keeps 8 significant bits, fp16 11), and float accumulation for fp32.
inline double GemmTolerance(DType dtype) {
  return dtype == DType::kBF16 ? 1e-2 : dtype == DType::kF16 ? 2e-3 : 1e-5;
}

// Argument i of a call: random values in [-1, 1) (indices in [0, index_hi) for kIndex) from
// `seed`, rounded to the mix's dtype for its role.
inline HostTensor RandomArg(const ArgSpec& s, const DtypeMix& mix, uint32_t seed, size_t i) {
  std::vector<float> v;
  if (s.role == Role::kIndex) {
    for (int32_t x : RandomInts(NumElements(s.shape), seed + i, 0, s.index_hi)) v.push_back(x);
  } else {
    v = Random(NumElements(s.shape), seed + 17 * i);
  }
  return HostTensor::From(mix.For(s.role), s.shape, v);
}

// Runs `op` on tensors of the mix's dtypes (random values in [-1, 1) rounded to each dtype)
// and on fp32 tensors holding the same values. Every output must equal the fp32 one rounded
// to its dtype: bit for bit (0 ulp), or within GemmTolerance(dtype) when gemm_tolerances is
// set (GEMMs on oneDNN). Inputs must be left untouched.
inline void ExpectMatchesFp32OnRoundedInputs(Ops& ops, const std::vector<ArgSpec>& specs,
                                             const DtypeMix& mix, const OpCall& op, uint32_t seed,
                                             bool gemm_tolerances = false) {
  SCOPED_TRACE(mix.name);
  std::vector<HostTensor> mixed, ref;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ArgSpec& s = specs[i];
    mixed.push_back(RandomArg(s, mix, seed, i));
    const DType ref_type = s.role == Role::kIndex ? DType::kI32 : DType::kF32;
    ref.push_back(HostTensor::From(ref_type, s.shape, mixed.back().Values()));
  }
  const std::vector<HostTensor> before = mixed;
  std::vector<Tensor> mixed_t, ref_t;
  for (size_t i = 0; i < specs.size(); ++i) {
    mixed_t.push_back(mixed[i].tensor());
    ref_t.push_back(ref[i].tensor());
  }
  op(ops, ref_t);
  op(ops, mixed_t);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Role r = specs[i].role;
    const std::string what =
        std::string(specs[i].name) + " (" + std::string(DTypeName(mixed[i].dtype())) + ")";
    if (r == Role::kAct || r == Role::kParam || r == Role::kStat || r == Role::kIndex) {
      EXPECT_TRUE(mixed[i].SameBytes(before[i])) << what << " is an input but was changed";
      continue;
    }
    const HostTensor want = HostTensor::From(mixed[i].dtype(), specs[i].shape, ref[i].Values());
    if (gemm_tolerances) {
      const std::vector<float> w = want.Values();
      ExpectClose(mixed[i].Values(), std::vector<double>(w.begin(), w.end()),
                  GemmTolerance(want.dtype()), what);
      continue;
    }
    int64_t worst = 0;
    size_t at = 0;
    for (size_t e = 0; e < static_cast<size_t>(want.numel()); ++e) {
      const int64_t d = UlpDistance(mixed[i].Bits(e), want.Bits(e), want.dtype());
      if (d > worst) worst = d, at = e;
    }
    EXPECT_EQ(worst, 0) << what << ": element " << at << " is " << mixed[i].Get(at)
                        << ", the fp32 op's result rounded is " << want.Get(at);
  }
}

// Captures what the "ztrain" logger writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    Log().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = Log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  int Count(const std::string& what) const {
    const std::string text = out_.str();
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace ztrain::kernels::testing
