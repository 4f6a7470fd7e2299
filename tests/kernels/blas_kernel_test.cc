// Note [BLAS kernel] (kernels/cpu/blas_kernel.h): what ztrain does with each kernel OpenBLAS
// may be on, for each CPU level and OPENBLAS_CORETYPE setting; and that its table agrees with
// the OpenBLAS this build links (the kernel in use is one it knows, at or below this CPU).
#include "kernels/cpu/blas_kernel.h"

#include <gtest/gtest.h>

#include <string>

namespace ztrain::kernels {
namespace {

using Action = BlasKernelCheck::Action;

TEST(BlasKernelTest, AGenericKernelOnAnAvx512CpuIsSwitchedWhenNothingIsSet) {
  const BlasKernelCheck c = CheckBlasKernel("Prescott", IsaLevel::kAvx512Bf16, nullptr, nullptr);
  EXPECT_EQ(c.action, Action::kSwitch);
  EXPECT_EQ(c.coretype, "Cooperlake");
  EXPECT_NE(c.message.find("OpenBLAS took its Prescott kernel (SSE) for this AVX-512 with BF16 "
                           "CPU: choosing Cooperlake"),
            std::string::npos)
      << c.message;
  EXPECT_EQ(CheckBlasKernel("Nehalem", IsaLevel::kAvx512, nullptr, nullptr).coretype, "SkylakeX");
  EXPECT_EQ(CheckBlasKernel("sandybridge", IsaLevel::kAvx2, nullptr, nullptr).coretype, "Haswell");
  EXPECT_EQ(CheckBlasKernel("Core2", IsaLevel::kAvx, nullptr, nullptr).coretype, "Sandybridge");
}

TEST(BlasKernelTest, AKernelSetByTheUserIsKeptWithAWarningAndTheFix) {
  const BlasKernelCheck c =
      CheckBlasKernel("Haswell", IsaLevel::kAvx512Bf16, "Haswell", nullptr);
  EXPECT_EQ(c.action, Action::kWarn);
  EXPECT_NE(c.message.find("OPENBLAS_CORETYPE=Haswell runs OpenBLAS's Haswell kernel (AVX2 with "
                           "FMA) on a CPU with AVX-512 with BF16"),
            std::string::npos)
      << c.message;
  EXPECT_NE(c.message.find("unset OPENBLAS_CORETYPE (ztrain then chooses Cooperlake) or set it "
                           "to Cooperlake"),
            std::string::npos)
      << c.message;
  // Set to what the CPU has (or above, where OpenBLAS falls back itself): nothing to say.
  EXPECT_EQ(CheckBlasKernel("SkylakeX", IsaLevel::kAvx512, "SkylakeX", nullptr).action,
            Action::kKeep);
  EXPECT_TRUE(CheckBlasKernel("SkylakeX", IsaLevel::kAvx512, "SkylakeX", nullptr).message.empty());
}

TEST(BlasKernelTest, AChoiceOfZtrainsIsNamedAndNeverRepeated) {
  const BlasKernelCheck chosen =
      CheckBlasKernel("Cooperlake", IsaLevel::kAvx512Bf16, "Cooperlake", "Prescott");
  EXPECT_EQ(chosen.action, Action::kKeep);
  EXPECT_NE(chosen.message.find("chosen by ztrain for this CPU (AVX-512 with BF16): OpenBLAS "
                                "took Prescott"),
            std::string::npos)
      << chosen.message;
  // OpenBLAS did not follow the variable ztrain set: a warning, not another restart.
  const BlasKernelCheck stayed =
      CheckBlasKernel("Prescott", IsaLevel::kAvx512Bf16, "Cooperlake", "Prescott");
  EXPECT_EQ(stayed.action, Action::kWarn);
  EXPECT_NE(stayed.message.find("stayed on its Prescott kernel"), std::string::npos)
      << stayed.message;
}

TEST(BlasKernelTest, KernelsThatFitOrAreUnknownAreLeftAlone) {
  EXPECT_EQ(CheckBlasKernel("Zen", IsaLevel::kAvx2, nullptr, nullptr).action, Action::kKeep);
  EXPECT_EQ(CheckBlasKernel("Cooperlake", IsaLevel::kAvx512Bf16, nullptr, nullptr).action,
            Action::kKeep);
  EXPECT_EQ(CheckBlasKernel("NeoverseN1", IsaLevel::kAvx512, nullptr, nullptr).action,
            Action::kKeep);
  EXPECT_EQ(CheckBlasKernel("", IsaLevel::kAvx512, nullptr, nullptr).action, Action::kKeep);
  EXPECT_EQ(KernelIsaLevel("SAPPHIRERAPIDS"), IsaLevel::kAvx512Bf16);
  EXPECT_EQ(KernelIsaLevel("Opteron_SSE3"), IsaLevel::kSse);
  EXPECT_FALSE(KernelIsaLevel("Prescott2").has_value());
}

// The linked OpenBLAS: its kernel is one the table knows and no better than this CPU (it
// cannot run code the CPU lacks), and the best kernel for each level the CPU has is a name
// the table ranks at that level.
TEST(BlasKernelTest, TheLinkedOpenBlasAgreesWithTheTable) {
  const std::optional<IsaLevel> kernel = KernelIsaLevel(BlasCoreName());
  ASSERT_TRUE(kernel.has_value()) << "OpenBLAS kernel '" << BlasCoreName()
                                  << "' is not in Note [BLAS kernel]'s table";
  EXPECT_LE(*kernel, CpuIsaLevel()) << BlasCoreName() << " on " << IsaLevelName(CpuIsaLevel());
  EXPECT_NE(BlasConfig().find("OpenBLAS"), std::string::npos) << BlasConfig();
  for (IsaLevel level : {IsaLevel::kAvx, IsaLevel::kAvx2, IsaLevel::kAvx512,
                         IsaLevel::kAvx512Bf16}) {
    EXPECT_EQ(KernelIsaLevel(BestCoreType(level)), level) << IsaLevelName(level);
  }
}

}  // namespace
}  // namespace ztrain::kernels
