#include "kernels/cpu/onednn_matmul.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"

#ifndef ZTRAIN_WITH_ONEDNN
#define ZTRAIN_WITH_ONEDNN 0
#endif
#if ZTRAIN_WITH_ONEDNN
#include <compare>
#include <cstdio>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "core/logging.h"
#endif

namespace ztrain::kernels::cpu {
namespace {

OneDnnSupport Probe() {
#if ZTRAIN_WITH_ONEDNN
  const char* env = std::getenv("ZTRAIN_ONEDNN");
  if (env != nullptr && std::string_view(env) == "0") return {false, "ZTRAIN_ONEDNN=0 is set"};
  // ISA values are bit masks, each a superset of the ones below it.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto has = [isa](dnnl::cpu_isa want) {
    return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
  };
  const std::string name = OneDnnVersion();
  if (!has(dnnl::cpu_isa::avx512_core_bf16)) {
    char mask[16];
    std::snprintf(mask, sizeof(mask), "%#x", isa);
    return {false, detail::StrCat(name, " finds neither AVX512-BF16 nor AMX-BF16 on this CPU",
                                  " (effective ISA mask ", mask, ")")};
  }
  return {true, name + (has(dnnl::cpu_isa::avx512_core_amx) ? " on AMX-BF16" : " on AVX512-BF16")};
#else
  return {false, "this build has no oneDNN (apt-get install libdnnl-dev, then reconfigure)"};
#endif
}

}  // namespace

std::string OneDnnVersion() {
#if ZTRAIN_WITH_ONEDNN
  const dnnl::version_t* v = dnnl::version();
  return detail::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch);
#else
  return "";
#endif
}

const OneDnnSupport& OneDnnBf16Support() {
  static const OneDnnSupport support = Probe();
  return support;
}

bool OneDnnBuiltIn() { return ZTRAIN_WITH_ONEDNN != 0; }

#if ZTRAIN_WITH_ONEDNN

namespace {

using dnnl::memory;

// op(x) as a [rows, cols] matrix stored row-major with leading dimension ld: transposes are
// strides, so no operand is copied.
memory::desc MatrixDesc(int64_t rows, int64_t cols, int64_t ld, bool trans,
                        memory::data_type type) {
  return memory::desc({rows, cols}, type, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}

}  // namespace

struct OneDnnMatmul::Impl {
  struct Key {
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    DType ab_type, c_type;
    bool bias;
    uint32_t alpha_bits, beta_bits;
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    bool implemented = false;
    dnnl::matmul primitive;
    memory::desc a, b, bias, c;
  };

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;

  Entry& Lookup(const MatmulArgs& p);
  Entry Create(const MatmulArgs& p);
};

OneDnnMatmul::Impl::Entry OneDnnMatmul::Impl::Create(const MatmulArgs& p) {
  using dt = memory::data_type;
  Entry e;
  const dt ab = p.ab_type == DType::kF32 ? dt::f32 : dt::bf16;
  e.a = MatrixDesc(p.m, p.k, p.lda, p.trans_a, ab);
  e.b = MatrixDesc(p.k, p.n, p.ldb, p.trans_b, ab);
  e.c = MatrixDesc(p.m, p.n, p.ldc, false, p.c_type == DType::kBF16 ? dt::bf16 : dt::f32);
  if (p.bias != nullptr) e.bias = memory::desc({1, p.n}, dt::f32, memory::dims{p.n, 1});
  // alpha as an eltwise_linear post-op (the same call in oneDNN 2 and 3, unlike output
  // scales), then beta as a sum post-op: c = alpha (a b + bias) + beta c, rounded once.
  dnnl::post_ops ops;
  if (p.alpha != 1.0f) {
#if DNNL_VERSION_MAJOR >= 3
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, p.alpha, 0.0f);
#else
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, p.alpha, 0.0f);
#endif
  }
  if (p.beta != 0.0f) ops.append_sum(p.beta);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  try {
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(engine, e.a, e.b, e.bias, e.c, attr);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.bias, e.c), attr, engine);
#endif
    e.primitive = dnnl::matmul(pd);
    e.implemented = true;
    Log().debug("oneDNN matmul {}x{}x{} trans_a={} trans_b={} -> {}: {}", p.m, p.n, p.k, p.trans_a,
                p.trans_b, DTypeName(p.c_type), pd.impl_info_str());
  } catch (const dnnl::error& err) {
    if (err.status != dnnl_unimplemented) throw;
    Log().debug("oneDNN has no matmul {}x{}x{} trans_a={} trans_b={}; using SGEMM", p.m, p.n, p.k,
                p.trans_a, p.trans_b);
  }
  return e;
}

OneDnnMatmul::Impl::Entry& OneDnnMatmul::Impl::Lookup(const MatmulArgs& p) {
  uint32_t alpha_bits, beta_bits;
  std::memcpy(&alpha_bits, &p.alpha, 4);
  std::memcpy(&beta_bits, &p.beta, 4);
  const Key key{p.trans_a, p.trans_b, p.m,       p.n,       p.k,        p.lda,     p.ldb,
                p.ldc,     p.ab_type, p.c_type, p.bias != nullptr, alpha_bits, beta_bits};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxPrimitives) cache.clear();
  return cache.emplace(key, Create(p)).first->second;
}

OneDnnMatmul::OneDnnMatmul() {
  try {
    impl_ = std::make_unique<Impl>();
  } catch (const dnnl::error& err) {
    throw Error(detail::StrCat("oneDNN: cannot create a CPU engine: ", err.what()));
  }
}
OneDnnMatmul::~OneDnnMatmul() = default;

bool OneDnnMatmul::Run(const MatmulArgs& p) {
  ZTRAIN_ASSERT(p.m > 0 && p.n > 0 && p.k > 0 &&
                (p.c_type == DType::kF32 || p.c_type == DType::kBF16) &&
                (p.ab_type == DType::kF32 || p.ab_type == DType::kBF16));
  try {
    Impl::Entry& e = impl_->Lookup(p);
    if (!e.implemented) return false;
    const dnnl::engine& eng = impl_->engine;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(e.a, eng, const_cast<void*>(p.a))},
        {DNNL_ARG_WEIGHTS, memory(e.b, eng, const_cast<void*>(p.b))},
        {DNNL_ARG_DST, memory(e.c, eng, p.c)}};
    if (p.bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, memory(e.bias, eng, const_cast<float*>(p.bias)));
    }
    e.primitive.execute(impl_->stream, args);
    impl_->stream.wait();
  } catch (const dnnl::error& err) {
    throw Error(detail::StrCat("oneDNN matmul [", p.m, ", ", p.k, "] x [", p.k, ", ", p.n,
                               "] (trans_a=", p.trans_a, ", trans_b=", p.trans_b,
                               ") failed: ", err.what(), " (dnnl status ", err.status, ")"));
  }
  return true;
}

#else  // !ZTRAIN_WITH_ONEDNN

struct OneDnnMatmul::Impl {};

OneDnnMatmul::OneDnnMatmul() { throw Error("OneDnnMatmul: " + OneDnnBf16Support().detail); }
OneDnnMatmul::~OneDnnMatmul() = default;

bool OneDnnMatmul::Run(const MatmulArgs&) { return false; }

#endif  // ZTRAIN_WITH_ONEDNN

}  // namespace ztrain::kernels::cpu
