#include "kernels/gemm_plan.h"

#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace ztrain::kernels {

const char* GemmBackendName(GemmBackend b) {
  return b == GemmBackend::kOneDnn ? "onednn" : "openblas";
}

std::string GemmShape::ToString() const {
  return detail::StrCat(trans_a ? "T" : "N", trans_b ? "T" : "N", " ", m, "x", n, "x", k);
}

std::string GemmPlan::ToText() const {
  std::string text;
  for (const auto& [shape, backend] : choices_) {
    if (!text.empty()) text += ';';
    text += shape.ToString() + " " + GemmBackendName(backend);
  }
  return text;
}

GemmPlan GemmPlan::FromText(const std::string& text) {
  GemmPlan plan;
  std::istringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ';')) {
    if (entry.empty()) continue;
    char ta = 0, tb = 0;
    long long m = 0, n = 0, k = 0;
    char backend[16] = {};
    int used = 0;
    const bool parsed = std::sscanf(entry.c_str(), "%c%c %lldx%lldx%lld %15s%n", &ta, &tb, &m, &n,
                                    &k, backend, &used) == 6 &&
                        used == static_cast<int>(entry.size());
    const std::string name = backend;
    ZTRAIN_CHECK(parsed && (ta == 'N' || ta == 'T') && (tb == 'N' || tb == 'T') && m > 0 && n > 0 &&
                     k > 0 && (name == "openblas" || name == "onednn"),
                 "GEMM plan entry '", entry,
                 "' is not 'TT MxNxK backend' (TT: N or T each, backend: openblas or onednn)");
    plan.Choose({ta == 'T', tb == 'T', m, n, k},
                name == "onednn" ? GemmBackend::kOneDnn : GemmBackend::kOpenBlas);
  }
  return plan;
}

}  // namespace ztrain::kernels
