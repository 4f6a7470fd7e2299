#pragma once
// Which backend runs each fp32 GEMM shape (Note [GEMMs chosen by measurement] in
// kernels/cpu/gemm_choice.h): a table from shape to backend, OpenBLAS for every shape it does
// not hold. Text form (for the ranks, the checkpoint and the cache): one "TT MxNxK backend"
// entry a shape, ';' between them, in shape order: "NT 256x2048x768 onednn;TN 768x768x256
// openblas". A value type; not thread safe to modify while read.
#include <compare>
#include <cstdint>
#include <map>
#include <string>

namespace ztrain::kernels {

enum class GemmBackend { kOpenBlas, kOneDnn };
const char* GemmBackendName(GemmBackend b);  // "openblas", "onednn"

// c[m,n] = op(a) op(b) with op a transpose where the flag is set (Ops::Gemm's convention).
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  auto operator<=>(const GemmShape&) const = default;
  std::string ToString() const;  // "NT 256x2048x768"
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
};

class GemmPlan {
 public:
  void Choose(const GemmShape& shape, GemmBackend backend) { choices_[shape] = backend; }
  GemmBackend For(const GemmShape& shape) const {
    const auto it = choices_.find(shape);
    return it == choices_.end() ? GemmBackend::kOpenBlas : it->second;
  }
  const std::map<GemmShape, GemmBackend>& choices() const { return choices_; }
  // How many of the named shapes run on oneDNN.
  int OnOneDnn() const {
    int n = 0;
    for (const auto& [shape, backend] : choices_) n += backend == GemmBackend::kOneDnn ? 1 : 0;
    return n;
  }
  bool operator==(const GemmPlan&) const = default;

  std::string ToText() const;
  // Throws ztrain::Error naming the entry that does not parse.
  static GemmPlan FromText(const std::string& text);

 private:
  std::map<GemmShape, GemmBackend> choices_;
};

}  // namespace ztrain::kernels
