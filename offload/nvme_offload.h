#pragma once
// NvmeOffload: what one rank needs to keep state on NVMe — the I/O engine, its swap
// directories (space checked, locked) and the swappers, handed to the parameter and
// optimizer-state stores (Note [NVMe offload setup]).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/config.h"
#include "offload/io/io_engine.h"
#include "offload/optimizer_state_store.h"
#include "offload/param_store.h"
#include "offload/placement.h"
#include "offload/swap_dir.h"

namespace ztrain::offload {

// Which rank of which job this is, naming its swap directories (Note [Stale swap
// directories]): its place in the dp x pp x tp grid and the grid's size.
struct SwapRank {
  std::string job_name;
  int grid_rank = 0;
  int grid_size = 1;
  int ranks_on_node = 1;  // this run's ranks on this node, sharing its disk
};

// Note [NVMe offload setup]
// With parameters (offload_param nvme) or optimizer state (offload_optimizer nvme) on NVMe,
// the rank makes one I/O engine (the `aio` section), one swap directory per distinct
// nvme_path ("/nvme" and "/nvme/" are one directory: a second SwapDir of it would find it
// locked), each checked for the bytes all its files need, and the swappers over the files
// `params.swp` and `optimizer.swp` in them, sized by the layers' shards and optimizer
// ranges; the stores hold the swappers from then on, each with a share of the I/O engine and
// the directories, which go only after the last swapper using them (whatever the order in
// which this object and the stores are destroyed). A
// shape-only setup (`computes` false, Note [Shape-only engine]) makes the swappers' buffers
// and no directory, file or I/O engine. Nothing on NVMe: nothing is made.
class NvmeOffload {
 public:
  NvmeOffload() = default;
  NvmeOffload(const Placement& at, const ZeroConfig& zero, const AioConfig& aio,
              const SwapRank& rank, bool computes, const std::vector<int64_t>& shards,
              const std::vector<int64_t>& opt_ranges, Allocator& host, Allocator& pinned,
              ParamStore& params, OptimizerStateStore& moments);
  NvmeOffload(NvmeOffload&&) noexcept = default;
  NvmeOffload& operator=(NvmeOffload&&) noexcept = default;

  // The swap files' bytes (what the directories were checked for).
  int64_t file_bytes() const { return param_bytes_ + opt_bytes_; }
  // What is on NVMe and how, for the log ("" when nothing is).
  std::string Describe(const ParamStore& params, const OptimizerStateStore& moments) const;

 private:
  void MakeDirs(const Placement& at, const ZeroConfig& zero, const SwapRank& rank,
                std::string* param_file, std::string* opt_file);

  // The I/O engine and the directories, shared with the swappers.
  struct Files {
    std::unique_ptr<IoEngine> io;
    std::vector<std::unique_ptr<SwapDir>> dirs;
  };
  std::shared_ptr<Files> files_;
  std::string backend_;  // the I/O engine's, for Describe
  int64_t param_bytes_ = 0, opt_bytes_ = 0;
};

}  // namespace ztrain::offload
