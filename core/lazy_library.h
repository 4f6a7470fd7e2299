#pragma once
// Shared libraries opened on first use, for the GPU libraries the binary does not link.
//
// Note [Lazy GPU libraries]: cuBLAS, cuBLASLt and NCCL are some 700 MB of shared objects; a
// binary linked against them maps and relocates all of it at every start, GPU or not (ztrain
// --help took 0.5-0.9 s and 230 MB of RSS). So nothing links them: the functions ztrain calls
// are defined in the binary (kernels/cuda/cublas_lazy.cc, parallel/comm/nccl/nccl_lazy.cc)
// with the libraries' own declarations, so a signature that drifted from the header does not
// compile, and each forwards to the real function, looked up in the library the first time it
// is called. A run on the CPU never opens them; the first CUDA op or NCCL communicator does.
// The CUDA runtime (libcudart, under 1 MB) stays linked: the device count and properties come
// from it. A library that cannot be opened, or lacks a function, fails the call that needed it
// with ztrain::Error naming the file, the loader's reason and the fix.
#include <mutex>
#include <string>
#include <vector>

namespace ztrain {

class LazyLibrary {
 public:
  // `files`: the names (or paths) dlopen tries, in order; `what`: what ztrain needs it for,
  // for error messages (e.g. "cuBLAS, the CUDA backend's GEMMs").
  LazyLibrary(std::vector<std::string> files, std::string what);
  LazyLibrary(const LazyLibrary&) = delete;
  LazyLibrary& operator=(const LazyLibrary&) = delete;

  // Whether the library opens (opened on the first call; never throws).
  bool Available();
  // The address of `symbol` in the library; throws ztrain::Error when the library does not
  // open or lacks it.
  void* Symbol(const char* symbol);

 private:
  void Open();

  std::vector<std::string> files_;
  std::string what_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;  // why it did not open
};

// `symbol` of `library` as a function R(A...), A the argument types of a call of it.
template <typename R, typename... A>
R (*LazyFunction(LazyLibrary& library, const char* symbol, const A&...))(A...) {
  return reinterpret_cast<R (*)(A...)>(library.Symbol(symbol));
}

}  // namespace ztrain

// The body of a forwarding definition (Note [Lazy GPU libraries]): calls the real function
// `name` of `library` (a LazyLibrary&), looked up on the first call, with the definition's
// parameters, in order. Its type is the parameters' and the return type of `name` called with
// them (which also picks among a header's overloads); the header's declaration of `name` checks
// the definition itself.
#define ZTRAIN_LAZY_FORWARD(library, name, ...)                                             \
  static const auto ztrain_real = ::ztrain::LazyFunction<decltype(name(__VA_ARGS__))>(      \
      library, #name __VA_OPT__(, ) __VA_ARGS__);                                           \
  return ztrain_real(__VA_ARGS__)
