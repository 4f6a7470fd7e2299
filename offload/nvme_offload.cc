#include "offload/nvme_offload.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "core/logging.h"
#include "core/memory_tracker.h"
#include "offload/io/io_options.h"
#include "offload/optimizer_swapper.h"
#include "offload/param_swapper.h"

namespace ztrain::offload {
namespace {

// Whether two spellings of a directory name the same one (compared as written when either
// does not exist; the SwapDir then says so).
bool SameDirectory(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = std::filesystem::equivalent(a, b, ec);
  return ec ? a == b : same;
}

}  // namespace

NvmeOffload::NvmeOffload(const Placement& at, const ZeroConfig& zero, const AioConfig& aio,
                         const SwapRank& rank, bool computes, const std::vector<int64_t>& shards,
                         const std::vector<int64_t>& opt_ranges, Allocator& host, Allocator& pinned,
                         ParamStore& params, OptimizerStateStore& moments) {
  const OffloadParamConfig& op = zero.offload_param;
  const OffloadOptimizerConfig& oo = zero.offload_optimizer;
  const bool param_nvme = at.params == Place::kNvme;
  const bool opt_nvme = at.optimizer == Place::kNvme;
  if (!param_nvme && !opt_nvme) return;
  param_bytes_ = param_nvme ? ParamSwapper::FileBytes(shards, op.max_in_cpu) : 0;
  opt_bytes_ = opt_nvme ? OptimizerSwapper::FileBytes(opt_ranges, zero.sub_group_size) : 0;
  std::string param_file, opt_file;
  files_ = std::make_shared<Files>();
  if (computes) {
    files_->io = IoEngine::Make(IoOptionsFrom(aio));
    backend_ = files_->io->backend();
    MakeDirs(at, zero, rank, &param_file, &opt_file);
  }
  IoEngine* io = files_->io.get();
  if (param_nvme) {
    const ParamSwapOptions options{.buffer_count = static_cast<int>(op.buffer_count),
                                   .buffer_elements = op.buffer_size,
                                   .max_in_cpu = op.max_in_cpu};
    params.SwapTo(std::make_unique<ParamSwapper>(io, param_file, shards, options, host, pinned),
                  files_);
  }
  if (opt_nvme) {
    const OptimizerSwapOptions options{.tile_elements = zero.sub_group_size,
                                       .pipeline_read = oo.pipeline_read,
                                       .pipeline_write = oo.pipeline_write,
                                       .buffers = static_cast<int>(oo.buffer_count)};
    moments.SwapTo(std::make_unique<OptimizerSwapper>(io, opt_file, opt_ranges, options, pinned),
                   files_);
  }
}

void NvmeOffload::MakeDirs(const Placement& at, const ZeroConfig& zero, const SwapRank& rank,
                           std::string* param_file, std::string* opt_file) {
  const std::string& param_path = zero.offload_param.nvme_path;
  const std::string& opt_path = zero.offload_optimizer.nvme_path;
  const bool param_nvme = at.params == Place::kNvme;
  const bool opt_nvme = at.optimizer == Place::kNvme;
  auto make_dir = [&](const std::string& path, int64_t bytes, const std::string& what) {
    files_->dirs.push_back(std::make_unique<SwapDir>(path, rank.job_name, rank.grid_rank,
                                                     rank.grid_size, bytes, what,
                                                     FreeBytesFunction{}, rank.ranks_on_node));
    return files_->dirs.back().get();
  };
  SwapDir* param_dir = nullptr;
  SwapDir* opt_dir = nullptr;
  if (param_nvme && opt_nvme && SameDirectory(param_path, opt_path)) {
    param_dir = opt_dir = make_dir(param_path, param_bytes_ + opt_bytes_, "offload");
  } else {
    if (param_nvme) param_dir = make_dir(param_path, param_bytes_, "offload_param");
    if (opt_nvme) opt_dir = make_dir(opt_path, opt_bytes_, "offload_optimizer");
  }
  if (param_dir) *param_file = param_dir->File("params.swp");
  if (opt_dir) *opt_file = opt_dir->File("optimizer.swp");
}

std::string NvmeOffload::Describe(const ParamStore& params,
                                  const OptimizerStateStore& moments) const {
  if (backend_.empty()) return "";
  std::string out;
  if (const ParamSwapper* swap = params.swapper()) {
    out += fmt::format("parameter shards on NVMe ({} swapped, {} kept in memory)",
                       FormatBytes(param_bytes_), FormatBytes(4 * swap->resident_elements()));
  }
  if (const OptimizerSwapper* swap = moments.swapper()) {
    if (!out.empty()) out += ", ";
    out += fmt::format("optimizer state on NVMe ({} in tiles of {} elements, {} buffers)",
                       FormatBytes(opt_bytes_), swap->tile_elements(), swap->buffers());
  }
  return out + "; I/O through " + backend_;
}

}  // namespace ztrain::offload
