#include "offload/swap_dir.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/logging.h"
#include "core/memory_tracker.h"
#include "offload/io/swap_file.h"

namespace ztrain::offload {

namespace fs = std::filesystem;

SwapDir::SwapDir(const std::string& nvme_path, const std::string& job, int rank,
                 int64_t needed_bytes, const std::string& what) {
  std::error_code ec;
  ZTRAIN_CHECK_T(IoError, fs::is_directory(nvme_path, ec), what, ".nvme_path '", nvme_path,
                 "' is not a directory; create it or point nvme_path at a local NVMe mount");
  job_dir_ = (fs::path(nvme_path) / ("ztrain-" + job)).string();
  path_ = (fs::path(job_dir_) / ("rank" + std::to_string(rank))).string();
  const int64_t free = FreeBytes(nvme_path);
  ZTRAIN_CHECK_T(IoError, free >= needed_bytes, what, " needs ", FormatBytes(needed_bytes), " (",
                 needed_bytes, " bytes) of swap space on this rank under ", nvme_path,
                 " but only ", FormatBytes(free), " are free; free space, point nvme_path at a "
                 "larger disk, or offload less (offload_param.max_in_cpu, or device \"cpu\")");
  // Another rank of the job may remove the (then empty) job directory between our making it
  // and making rank<R> below it, when its previous engine goes: try again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    ec.clear();
    if (fs::create_directories(path_, ec) || fs::is_directory(path_)) break;
  }
  ZTRAIN_CHECK_T(IoError, fs::is_directory(path_), "cannot create the swap directory ", path_,
                 ": ", ec.message());
}

SwapDir::~SwapDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (ec) Log().warn("could not remove the swap directory {}: {}", path_, ec.message());
  // The job directory goes with its last rank directory (other ranks may still use it).
  fs::remove(job_dir_, ec);
}

std::string SwapDir::File(const std::string& name) const {
  return (fs::path(path_) / name).string();
}

}  // namespace ztrain::offload
