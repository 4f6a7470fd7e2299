#pragma once
// CsvMonitor: DeepSpeed's csv_monitor. Writes <output_path>/<job_name>/train.csv with a
// header row and one row per optimizer step (step, loss, lr, grad_norm, tokens_per_s,
// ms_per_step, clip_coef). Rows are flushed as written, so a crash keeps every finished step.
// Throws IoError naming the path if the directory or file cannot be created.
#include <cstdio>
#include <memory>
#include <string>

#include "core/config.h"

namespace ztrain {

struct StepStats;

class CsvMonitor {
 public:
  // A fresh file; or, for a run resumed after step `resume_step` (>= 0), the earlier run's
  // file keeping its header and the rows of steps up to resume_step (rewritten through a
  // temporary file and a rename, so a crash keeps the old file), continued after them.
  explicit CsvMonitor(const CsvMonitorConfig& config, int64_t resume_step = -1);
  void Write(const StepStats& stats);
  const std::string& path() const { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

}  // namespace ztrain
