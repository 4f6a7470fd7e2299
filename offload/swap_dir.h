#pragma once
// SwapDir: the directory of one rank's swap files, <nvme_path>/ztrain-<job>/rank<R>/.
//
// Made on construction after checking that the file system has room for `needed_bytes`
// (the sum of the rank's swap files): a run that cannot fit fails before training with the
// bytes it needs and the bytes free, not halfway through. The directory and its files are
// removed when the SwapDir is destroyed (normal exit, or an error unwinding), and the
// job directory too once no rank directory is left in it. Swap files hold nothing a later
// run needs: checkpoints are written elsewhere.
#include <cstdint>
#include <string>

namespace ztrain::offload {

class SwapDir {
 public:
  // `what` names the user of the space in errors, e.g. "offload_param".
  SwapDir(const std::string& nvme_path, const std::string& job, int rank, int64_t needed_bytes,
          const std::string& what);
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const;

 private:
  std::string job_dir_;
  std::string path_;
};

}  // namespace ztrain::offload
