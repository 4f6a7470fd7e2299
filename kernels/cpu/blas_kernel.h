#pragma once
// Which OpenBLAS kernel the GEMMs run on, against what the CPU can do.
//
// Note [BLAS kernel]: an OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels by CPU
// model when the library loads. A CPU it does not know gets its generic kernels: Debian's
// 0.3.21 runs an Intel Xeon with AVX-512, AVX512-BF16 and AVX512-FP16 on Prescott (SSE3) code,
// 39 GFLOP/s against 230 with SkylakeX's, and a training step 4x slower, without a word.
// oneDNN and MKL dispatch by ISA (cpuid bits) instead, so a new CPU never gets a generic
// kernel; ztrain does the same for OpenBLAS. It ranks the kernel in use by the ISA its code
// needs (SSE, AVX, AVX2, AVX-512, AVX-512 with BF16) and the CPU by what cpuid and the OS give
// it. When the kernel is below the CPU and OPENBLAS_CORETYPE is unset, the ztrain executable
// sets OPENBLAS_CORETYPE to the best kernel of the CPU's level and executes itself again before
// anything else happens (the choice is made while the library loads, so setting the variable
// later would change nothing; MPI and SLURM see the same process, as exec keeps the pid). An
// OPENBLAS_CORETYPE the user set is respected (the test suite repeats its equivalence tests
// under chosen kernels on purpose), with a warning when it is below the CPU; code that embeds
// the library gets the same warning from the trainer, with the fix. Kernel names OpenBLAS
// does not list here (another BLAS, a newer OpenBLAS) are left alone.
//
// Thread safety: the functions read process state only; CheckBlasKernel is pure.
#include <optional>
#include <string>

namespace ztrain::kernels {

// What a CPU's (or a kernel's) vector code can use, in order.
enum class IsaLevel { kSse, kAvx, kAvx2, kAvx512, kAvx512Bf16 };

const char* IsaLevelName(IsaLevel level);  // "AVX-512 with BF16", ...
// This CPU's level (cpuid, with the registers the OS saves).
IsaLevel CpuIsaLevel();
// The level an OpenBLAS core name's kernels are written for, case-insensitive ("Prescott":
// kSse, "SkylakeX": kAvx512); nullopt for a name this table does not know.
std::optional<IsaLevel> KernelIsaLevel(const std::string& core_name);
// The OPENBLAS_CORETYPE of the fastest kernel Debian's OpenBLAS 0.3.21 has for a level
// ("Cooperlake", "SkylakeX", "Haswell", "Sandybridge"; "" for kSse: nothing to choose).
const char* BestCoreType(IsaLevel level);

// The library's own words: openblas_get_corename() and openblas_get_config().
std::string BlasCoreName();
std::string BlasConfig();

// The environment variable the executable sets beside OPENBLAS_CORETYPE when it chose the
// kernel itself; it holds the kernel OpenBLAS had picked.
inline constexpr const char* kChosenOverEnv = "ZTRAIN_OPENBLAS_CHOSEN_OVER";

struct BlasKernelCheck {
  enum class Action {
    kKeep,    // the kernel fits the CPU (or is not one this table knows)
    kSwitch,  // set OPENBLAS_CORETYPE = coretype and start again (the executable)
    kWarn,    // below the CPU, but OPENBLAS_CORETYPE was set: say so and the fix
  };
  Action action = Action::kKeep;
  std::string coretype;  // kSwitch: the OPENBLAS_CORETYPE to set
  std::string message;   // what the log says (for every action; "" when nothing is worth it)
};

// Note [BLAS kernel], as a function of what it looks at: the kernel in use (`core_name`), the
// CPU's level, OPENBLAS_CORETYPE (`coretype_env`; nullptr when unset) and the kernel OpenBLAS
// had picked before ztrain set the variable (`chosen_over`; nullptr when ztrain did not).
BlasKernelCheck CheckBlasKernel(const std::string& core_name, IsaLevel cpu,
                                const char* coretype_env, const char* chosen_over);
// The same for this process.
BlasKernelCheck CheckThisBlasKernel();

// For an executable's main(), before anything else (ztrain, the step benches): when
// CheckThisBlasKernel says kSwitch, sets OPENBLAS_CORETYPE (and kChosenOverEnv) and executes
// /proc/self/exe again with `argv`. Returns only when nothing is to be done, or when the exec
// failed (then with a warning on stderr and the environment as it was).
void RestartWithBestBlasKernel(char** argv);

}  // namespace ztrain::kernels
