// Note [GEMMs chosen by measurement] (gemm_choice.h).
#include "kernels/cpu/gemm_choice.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "kernels/cpu/blas_kernel.h"
#include "kernels/cpu/gemm_timing.h"
#include "kernels/cpu/onednn_matmul.h"

namespace ztrain::kernels {
namespace {

using detail::StrCat;
using nlohmann::json;

constexpr const char* kFormat = "ztrain-gemm-choices";

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t value = line.find_first_not_of(" \t", colon + 1);
    if (value != std::string::npos) return line.substr(value);
  }
  return "unknown CPU";
}

// The cache file's lock, held for as long as this lives: an exclusive flock(2) on <path>.lock,
// waited for (another run is measuring). Failing to take it is a cache problem, not an error.
class CacheLock {
 public:
  explicit CacheLock(const std::string& path) {
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The cache's entries for `key` (an object, empty when the file is absent); `*problem` says why
// a file that exists could not be used.
json ReadCache(const std::string& path, json* whole, std::string* problem) {
  *whole = json{{"format", kFormat}, {"version", 1}, {"machines", json::object()}};
  std::ifstream in(path);
  if (!in) return json::object();
  try {
    json file = json::parse(in);
    if (!file.is_object() || file.value("format", "") != kFormat ||
        !file.value("machines", json()).is_object()) {
      throw std::runtime_error("not a ztrain GEMM choice cache");
    }
    *whole = std::move(file);
  } catch (const std::exception& e) {
    *problem = StrCat("the GEMM choice cache ", path, " does not read (", e.what(),
                      "); measuring again and replacing it");
  }
  const json mine = (*whole)["machines"].value(GemmCacheKey(), json::object());
  return mine.is_object() ? mine : json::object();  // an edited entry: measured over
}

// Writes `whole` to `path` through a temporary file renamed over it; the problem, or "".
std::string WriteCache(const std::string& path, const json& whole) {
  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp);
    out << whole.dump(1) << "\n";
    out.flush();
    if (!out) return StrCat("cannot write the GEMM choice cache ", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return StrCat("cannot replace the GEMM choice cache ", path);
  }
  return "";
}

// One shape's cached entry, when it is whole.
bool FromCache(const json& entries, const GemmShape& shape, GemmBackend* backend, double* openblas,
               double* onednn) {
  const json e = entries.value(shape.ToString(), json());
  if (!e.is_object()) return false;
  const json b = e.value("backend", json()), o = e.value("openblas_gflops", json()),
             d = e.value("onednn_gflops", json());
  if (!b.is_string() || !o.is_number() || !d.is_number()) return false;
  if (b != "openblas" && b != "onednn") return false;
  *backend = b == "onednn" ? GemmBackend::kOneDnn : GemmBackend::kOpenBlas;
  *openblas = o.get<double>();
  *onednn = d.get<double>();
  return *openblas > 0.0 && (*backend == GemmBackend::kOpenBlas || *onednn > 0.0);
}

}  // namespace

Fp32GemmChoice Fp32GemmByEnvironment() {
  const char* env = std::getenv("ZTRAIN_FP32_GEMM");
  const std::string_view v = env == nullptr ? "" : env;
  if (v.empty() || v == "auto") return Fp32GemmChoice::kAuto;
  if (v == "openblas") return Fp32GemmChoice::kOpenBlas;
  ZTRAIN_CHECK(v == "onednn", "ZTRAIN_FP32_GEMM is '", v,
               "': give auto (the default: the measured choice per shape), openblas or onednn");
  return Fp32GemmChoice::kOneDnn;
}

GemmBackend FasterBackend(double openblas_gflops, double onednn_gflops) {
  return onednn_gflops >= kOneDnnPays * openblas_gflops && onednn_gflops > 0.0
             ? GemmBackend::kOneDnn
             : GemmBackend::kOpenBlas;
}

std::string GemmCacheKey() {
  return StrCat(CpuModelName(), " (", IsaLevelName(CpuIsaLevel()), "); ", BlasConfig(), ", ",
                BlasCoreName(), " kernel; ", cpu::OneDnnVersion(), "; ", omp_get_max_threads(),
                " threads");
}

std::string GemmCachePath() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? "" : v;
  };
  const std::string file = "gemm-choices.json";
  if (!env("ZTRAIN_CACHE_DIR").empty()) return env("ZTRAIN_CACHE_DIR") + "/" + file;
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/ztrain/" + file;
  if (!env("HOME").empty()) return env("HOME") + "/.cache/ztrain/" + file;
  return "";
}

GemmChoice ChooseFp32Gemms(const std::vector<CountedShape>& shapes, const std::string& cache_path) {
  GemmChoice choice;
  if (!cpu::OneDnnBuiltIn()) return choice;
  std::unique_ptr<CacheLock> lock;
  json whole, entries = json::object();
  if (!cache_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(cache_path).parent_path(), ec);
    lock = std::make_unique<CacheLock>(cache_path);
    if (lock->held()) {
      entries = ReadCache(cache_path, &whole, &choice.cache_problem);
    } else {
      choice.cache_problem =
          StrCat("cannot lock the GEMM choice cache ", cache_path, ".lock; measuring without it");
    }
  }
  bool added = false;
  for (const CountedShape& s : shapes) {
    GemmBackend backend = GemmBackend::kOpenBlas;
    double openblas = 0.0, onednn = 0.0;
    if (s.shape.flops() < kMeasuredFlops) {  // OpenBLAS, whatever an edited cache says
      ++choice.small;
      continue;
    }
    if (FromCache(entries, s.shape, &backend, &openblas, &onednn)) {
      ++choice.cached;
    } else {
      const GemmRates r = TimeGemm(s.shape, {.onednn_fp32 = true}, s.shape.flops() > 2e9 ? 3 : 5);
      openblas = r.sgemm, onednn = r.onednn_fp32;
      backend = FasterBackend(openblas, onednn);
      entries[s.shape.ToString()] = {{"backend", GemmBackendName(backend)},
                                     {"openblas_gflops", openblas},
                                     {"onednn_gflops", onednn}};
      added = true;
      ++choice.measured;
    }
    choice.plan.Choose(s.shape, backend);
    const double flops = s.shape.flops() * static_cast<double>(s.count) / 1e9;
    choice.openblas_seconds += flops / openblas;
    choice.plan_seconds += flops / (backend == GemmBackend::kOneDnn ? onednn : openblas);
  }
  if (added && lock && lock->held()) {
    whole["machines"][GemmCacheKey()] = entries;
    const std::string problem = WriteCache(cache_path, whole);
    if (!problem.empty()) choice.cache_problem = problem;
  }
  return choice;
}

}  // namespace ztrain::kernels
