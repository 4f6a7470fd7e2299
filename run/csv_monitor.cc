#include "run/csv_monitor.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/engine.h"

namespace ztrain {

namespace {
constexpr char kHeader[] = "step,loss,lr,grad_norm,tokens_per_s,ms_per_step,clip_coef\n";
}  // namespace

CsvMonitor::CsvMonitor(const CsvMonitorConfig& config, int64_t resume_step) {
  const std::filesystem::path dir =
      std::filesystem::path(config.output_path.empty() ? "." : config.output_path) /
      config.job_name;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ZTRAIN_CHECK_T(IoError, !ec, "csv_monitor: cannot create directory '", dir.string(),
                 "': ", ec.message(), "; fix csv_monitor.output_path");
  path_ = (dir / "train.csv").string();
  std::string text = kHeader;
  if (resume_step >= 0) {  // the earlier run's rows up to the resumed step
    std::ifstream old(path_);
    std::string line;
    std::getline(old, line);  // its header
    while (std::getline(old, line)) {
      // Rows whose step does not parse (an edited or cut file) are dropped, not fatal.
      int64_t step = -1;
      const size_t comma = line.find(',');
      const auto [end, ec] =
          std::from_chars(line.data(), line.data() + std::min(comma, line.size()), step);
      if (ec != std::errc() || end != line.data() + comma) continue;
      if (step <= resume_step) text += line + "\n";
    }
  }
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    ZTRAIN_CHECK_T(IoError, out.good(), "csv_monitor: cannot write '", tmp,
                   "': ", std::strerror(errno));
  }
  std::filesystem::rename(tmp, path_, ec);
  ZTRAIN_CHECK_T(IoError, !ec, "csv_monitor: cannot write '", path_, "': ", ec.message());
  file_.reset(std::fopen(path_.c_str(), "a"));
  ZTRAIN_CHECK_T(IoError, file_ != nullptr, "csv_monitor: cannot write '", path_,
                 "': ", std::strerror(errno));
}

void CsvMonitor::Write(const StepStats& s) {
  std::fprintf(file_.get(), "%lld,%.9g,%.9g,%.9g,%.3f,%.3f,%.9g\n", static_cast<long long>(s.step),
               s.loss, s.lr, s.grad_norm,
               s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0.0, s.seconds * 1e3,
               s.clip_coef);
  std::fflush(file_.get());
}

}  // namespace ztrain
