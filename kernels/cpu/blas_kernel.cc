#include "kernels/cpu/blas_kernel.h"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ztrain::kernels {
namespace {

using ::ztrain::detail::StrCat;

struct KernelLevel {
  const char* name;
  IsaLevel level;
};

// OpenBLAS 0.3.21's DYNAMIC_ARCH x86-64 core names (driver/others/dynamic.c) by the ISA their
// kernels use. Zen and Excavator run Haswell's AVX2 kernels; Cooperlake is SkylakeX's with the
// AVX512-BF16 sbgemm (SapphireRapids maps to it in this release).
constexpr KernelLevel kKernels[] = {
    {"Unknown", IsaLevel::kSse},      {"Katmai", IsaLevel::kSse},
    {"Coppermine", IsaLevel::kSse},   {"Northwood", IsaLevel::kSse},
    {"Prescott", IsaLevel::kSse},     {"Banias", IsaLevel::kSse},
    {"Atom", IsaLevel::kSse},         {"Core2", IsaLevel::kSse},
    {"Penryn", IsaLevel::kSse},       {"Dunnington", IsaLevel::kSse},
    {"Nehalem", IsaLevel::kSse},      {"Athlon", IsaLevel::kSse},
    {"Opteron", IsaLevel::kSse},      {"Opteron_SSE3", IsaLevel::kSse},
    {"Barcelona", IsaLevel::kSse},    {"Nano", IsaLevel::kSse},
    {"Bobcat", IsaLevel::kSse},       {"Sandybridge", IsaLevel::kAvx},
    {"Bulldozer", IsaLevel::kAvx},    {"Piledriver", IsaLevel::kAvx},
    {"Steamroller", IsaLevel::kAvx},  {"Haswell", IsaLevel::kAvx2},
    {"Excavator", IsaLevel::kAvx2},   {"Zen", IsaLevel::kAvx2},
    {"SkylakeX", IsaLevel::kAvx512},  {"Cooperlake", IsaLevel::kAvx512Bf16},
    {"SapphireRapids", IsaLevel::kAvx512Bf16},
};

}  // namespace

const char* IsaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kSse: return "SSE";
    case IsaLevel::kAvx: return "AVX";
    case IsaLevel::kAvx2: return "AVX2 with FMA";
    case IsaLevel::kAvx512: return "AVX-512";
    case IsaLevel::kAvx512Bf16: return "AVX-512 with BF16";
  }
  return "?";
}

IsaLevel CpuIsaLevel() {
  // libgcc's cpu model also checks that the OS saves the AVX and AVX-512 registers.
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return IsaLevel::kAvx512Bf16;
  if (avx512) return IsaLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return IsaLevel::kAvx2;
  if (__builtin_cpu_supports("avx")) return IsaLevel::kAvx;
  return IsaLevel::kSse;
}

std::optional<IsaLevel> KernelIsaLevel(const std::string& core_name) {
  for (const KernelLevel& k : kKernels) {
    if (::strcasecmp(k.name, core_name.c_str()) == 0) return k.level;
  }
  return std::nullopt;
}

const char* BestCoreType(IsaLevel level) {
  switch (level) {
    case IsaLevel::kSse: return "";
    case IsaLevel::kAvx: return "Sandybridge";
    case IsaLevel::kAvx2: return "Haswell";
    case IsaLevel::kAvx512: return "SkylakeX";
    case IsaLevel::kAvx512Bf16: return "Cooperlake";
  }
  return "";
}

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string BlasConfig() {
  const char* config = openblas_get_config();
  return config ? config : "";
}

BlasKernelCheck CheckBlasKernel(const std::string& core_name, IsaLevel cpu,
                                const char* coretype_env, const char* chosen_over) {
  BlasKernelCheck check;
  const std::optional<IsaLevel> kernel = KernelIsaLevel(core_name);
  if (!kernel) return check;  // not a kernel this table knows: no opinion
  if (*kernel >= cpu) {
    if (chosen_over != nullptr) {
      check.message = StrCat("OpenBLAS kernel ", core_name, ", chosen by ztrain for this CPU (",
                             IsaLevelName(cpu), "): OpenBLAS took ", chosen_over,
                             " for it, a CPU it does not know (Note [BLAS kernel])");
    }
    return check;
  }
  const std::string best = BestCoreType(cpu);
  if (coretype_env == nullptr) {
    check.action = BlasKernelCheck::Action::kSwitch;
    check.coretype = best;
    check.message = StrCat("OpenBLAS took its ", core_name, " kernel (", IsaLevelName(*kernel),
                           ") for this ", IsaLevelName(cpu), " CPU: choosing ", best);
    return check;
  }
  check.action = BlasKernelCheck::Action::kWarn;
  if (chosen_over != nullptr) {
    check.message = StrCat("OpenBLAS stayed on its ", core_name, " kernel (",
                           IsaLevelName(*kernel), ") although ztrain set OPENBLAS_CORETYPE=",
                           coretype_env, " for this ", IsaLevelName(cpu),
                           " CPU: GEMMs run several times slower than the CPU allows; an "
                           "OpenBLAS built for this CPU (or another BLAS) fixes it");
  } else {
    check.message = StrCat("OPENBLAS_CORETYPE=", coretype_env, " runs OpenBLAS's ", core_name,
                           " kernel (", IsaLevelName(*kernel), ") on a CPU with ",
                           IsaLevelName(cpu), ": GEMMs run up to several times slower than the "
                           "CPU allows; unset OPENBLAS_CORETYPE (ztrain then chooses ", best,
                           ") or set it to ", best);
  }
  return check;
}

BlasKernelCheck CheckThisBlasKernel() {
  return CheckBlasKernel(BlasCoreName(), CpuIsaLevel(), std::getenv("OPENBLAS_CORETYPE"),
                         std::getenv(kChosenOverEnv));
}

void RestartWithBestBlasKernel(char** argv) {
  const BlasKernelCheck check = CheckThisBlasKernel();
  if (check.action != BlasKernelCheck::Action::kSwitch) return;
  const std::string before = BlasCoreName();
  ::setenv("OPENBLAS_CORETYPE", check.coretype.c_str(), 1);
  ::setenv(kChosenOverEnv, before.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  const int err = errno;
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kChosenOverEnv);
  std::fprintf(stderr,
               "warning: %s, but cannot start again with it (%s); set OPENBLAS_CORETYPE=%s "
               "before the program starts\n",
               check.message.c_str(), std::strerror(err), check.coretype.c_str());
}

}  // namespace ztrain::kernels
