#include "engine/csv_monitor.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "engine/engine.h"

namespace ztrain {

CsvMonitor::CsvMonitor(const CsvMonitorConfig& config) {
  const std::filesystem::path dir =
      std::filesystem::path(config.output_path.empty() ? "." : config.output_path) /
      config.job_name;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ZTRAIN_CHECK_T(IoError, !ec, "csv_monitor: cannot create directory '", dir.string(),
                 "': ", ec.message(), "; fix csv_monitor.output_path");
  path_ = (dir / "train.csv").string();
  file_.reset(std::fopen(path_.c_str(), "w"));
  ZTRAIN_CHECK_T(IoError, file_ != nullptr, "csv_monitor: cannot write '", path_, "': ",
                 std::strerror(errno));
  std::fprintf(file_.get(), "step,loss,lr,grad_norm,tokens_per_s,ms_per_step,clip_coef\n");
  std::fflush(file_.get());
}

void CsvMonitor::Write(const StepStats& s) {
  std::fprintf(file_.get(), "%lld,%.9g,%.9g,%.9g,%.3f,%.3f,%.9g\n",
               static_cast<long long>(s.step), s.loss, s.lr, s.grad_norm,
               s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0.0,
               s.seconds * 1e3, s.clip_coef);
  std::fflush(file_.get());
}

}  // namespace ztrain
