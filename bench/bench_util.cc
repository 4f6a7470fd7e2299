#include "bench/bench_util.h"

#include <sys/vfs.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace ztrain::bench {

FloatArray::FloatArray(size_t n) : n_(n) {
  constexpr size_t kPage = 4096;
  const size_t bytes = ((n * sizeof(float) + kPage - 1) / kPage) * kPage;
  float* p = static_cast<float*>(std::aligned_alloc(kPage, bytes > 0 ? bytes : kPage));
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(p);
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) p[i] = 0.0f;
}

void FloatArray::Free::operator()(float* p) const { std::free(p); }

double StreamCopyGBs(size_t n_floats, int reps) {
  FloatArray a(n_floats), b(n_floats);
  const int64_t n = static_cast<int64_t>(n_floats);
  float* __restrict pa = a.data();
  const float* __restrict pb = b.data();
  const double s = BestOf(reps, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i];
  });
  return GBs(2.0 * sizeof(float) * static_cast<double>(n), s);
}

double StreamTriadGBs(size_t n_floats, int reps) {
  FloatArray a(n_floats), b(n_floats), c(n_floats);
  const int64_t n = static_cast<int64_t>(n_floats);
  float* __restrict pa = a.data();
  const float* __restrict pb = b.data();
  const float* __restrict pc = c.data();
  const float scalar = 3.0f;
  const double s = BestOf(reps, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + scalar * pc[i];
  });
  return GBs(3.0 * sizeof(float) * static_cast<double>(n), s);
}

double PairedMedianRatio(const std::vector<double>& ztrain, const std::vector<double>& reference) {
  std::vector<double> q;
  for (size_t i = 0; i < std::min(ztrain.size(), reference.size()); ++i) {
    if (reference[i] > 0) q.push_back(ztrain[i] / reference[i]);
  }
  return q.empty() ? -1.0 : Median(q);
}

std::string CommandOutput(const std::string& command, int* status) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    *status = -1;
    return {};
  }
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) out.append(chunk, n);
  *status = pclose(pipe);
  return out;
}

bool PythonHasTorch(const std::string& python) {
  return std::system(("'" + python + "' -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

bool HaveFio() { return std::system("fio --version > /dev/null 2>&1") == 0; }

double FioGBs(const std::string& args, const std::string& rw, std::string* error) {
  int status = 0;
  const std::string out =
      CommandOutput("fio " + args + " --rw=" + rw + " --output-format=json 2>&1", &status);
  const size_t brace = out.find('{');
  if (status != 0 || brace == std::string::npos) {
    *error = status == -1 ? "popen failed" : "fio failed: " + out.substr(0, 300);
    return -1;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(out.substr(brace));
    return static_cast<double>(j.at("jobs").at(0).at(rw).at("bw_bytes").get<int64_t>()) * 1e-9;
  } catch (const std::exception& e) {
    *error = std::string("cannot parse fio's JSON: ") + e.what();
    return -1;
  }
}

std::string FileSystemName(const std::string& dir) {
  struct statfs st;
  if (statfs(dir.c_str(), &st) != 0) return "unknown";
  switch (static_cast<uint32_t>(st.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "fs type 0x%x", static_cast<unsigned>(st.f_type));
      return hex;
    }
  }
}

}  // namespace ztrain::bench
