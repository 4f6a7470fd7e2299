#include "kernels/cpu/cpu_ops.h"

#include <memory>

#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {

CpuOps::CpuOps(Bf16GemmPath bf16_gemm) : bf16_gemm_(bf16_gemm) {}
CpuOps::~CpuOps() = default;

std::unique_ptr<Ops> MakeCpuOps() { return std::make_unique<CpuOps>(); }

bool CpuHasBf16(std::string* why) {
  const cpu::OneDnnSupport& s = cpu::OneDnnBf16Support();
  if (why) *why = s.detail;
  return s.available;
}

}  // namespace ztrain::kernels
