#include "launcher/commands.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/config.h"
#include "core/logging.h"
#include "data/byte_tokenizer.h"
#include "engine/checkpoint_export.h"
#include "engine/device_select.h"
#include "engine/trainer.h"
#include "kernels/ops.h"
#include "launcher/build_info.h"
#include "launcher/signals.h"
#include "parallel/comm/mpi/mpi_communicator.h"
#include "parallel/launch_env.h"

namespace ztrain::launcher {

namespace {

// Ranks on one node would each start one OpenMP thread per core and fight over the cores;
// unless the user chose OMP_NUM_THREADS, each rank gets its share (as torchrun does).
void ShareCoresAmongLocalRanks(const LaunchEnv& env) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr || env.local_size <= 1) return;
  const int threads = std::max(1, omp_get_num_procs() / env.local_size);
  omp_set_num_threads(threads);
  Log().info("{} ranks on this node: {} OpenMP threads each (set OMP_NUM_THREADS to override)",
             env.local_size, threads);
}

Config LoadTrainConfig(const std::string& config_path, int world_size) {
  if (config_path.empty()) {
    Log().info("no --config given: training the built-in default model");
    return ParseConfig(DefaultConfigJson(), world_size);
  }
  return LoadConfigFile(config_path, world_size);
}

int Train(Config config, comm::Communicator* world, const LaunchEnv& env,
          const std::string& resume) {
  const std::atomic<bool>& stop = InstallStopHandlers();
  const bool resuming = !resume.empty() || config.checkpoint.resume;
  Trainer trainer(std::move(config), world, env);
  if (resuming) trainer.Resume(resume.empty() ? "latest" : resume);
  const TrainSummary summary = trainer.Run(&stop);
  return summary.interrupted ? kExitInterrupted : kExitOk;
}

// Where `setting` would put this process (a rank of `world_size` outside a launcher), on
// stderr so that stdout stays the JSON. A device this machine lacks is not a config error:
// the config may be checked where it does not run.
void PrintDeviceChoice(const std::string& setting, int world_size) {
  try {
    LaunchEnv env = DetectLaunchEnv();
    if (env.launcher == "none") env.world_size = world_size;
    const DeviceChoice choice = SelectDevice(setting, env);
    std::fprintf(stderr, "device on this machine: %s (%s)\n",
                 choice.device.ToString().c_str(), choice.reason.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "device on this machine: not usable here: %s\n", e.what());
  }
}

}  // namespace

int RunTrain(const std::string& config_path, const std::string& resume) {
  const LaunchEnv env = DetectLaunchEnv();
  // Every rank reads the config before MPI starts: a bad config fails every rank the same
  // way, with nothing to wait for.
  Config config = LoadTrainConfig(config_path, env.world_size);
  if (env.world_size == 1) return Train(std::move(config), nullptr, env, resume);
  const auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(config.training.comm_timeout_s * 1000.0));
  std::unique_ptr<comm::Communicator> world = comm::MakeMpiWorld(timeout);
  SetLogRankPrefix("[rank " + std::to_string(world->rank()) + "] ");
  if (world->rank() != 0) SetLogLevel("warn");  // progress comes from rank 0, as DeepSpeed
  ShareCoresAmongLocalRanks(env);
  try {
    ZTRAIN_CHECK(world->size() == env.world_size, "the launcher says ", env.world_size,
                 " ranks (", env.launcher, ") but MPI has ", world->size());
    return Train(std::move(config), world.get(), env, resume);
  } catch (const std::exception& e) {
    // One failing rank ends the whole job, so no other rank waits in a collective forever.
    std::fprintf(stderr, "ztrain: rank %d of %d failed: %s\n", world->rank(), world->size(),
                 e.what());
    std::fflush(stderr);
    comm::AbortWorld(dynamic_cast<const ConfigError*>(&e) ? kExitConfigError : kExitError);
  }
}

int RunExport(const std::string& checkpoint, const std::string& format, const std::string& out,
              const std::string& dtype) {
  const ExportResult r =
      ExportCheckpoint(checkpoint, format, out, dtype == "bf16" ? DType::kBF16 : DType::kF32);
  Log().info("exported {} (step {}, {} parameters) to {} ({}, {})", r.checkpoint, r.step,
             r.parameters, out, format, dtype);
  return kExitOk;
}

int RunCheckConfig(const std::string& config_path, int world_size) {
  try {
    const Config config = LoadConfigFile(config_path, world_size);
    std::printf("%s\n", config.resolved.dump(2).c_str());
    std::fflush(stdout);
    PrintDeviceChoice(config.device, world_size);
    return kExitOk;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());  // names the file and every problem
    return kExitConfigError;
  }
}

int RunData(const std::string& text_path, const std::string& shard_path) {
  const int64_t tokens = data::TextToShard(text_path, shard_path);
  std::printf("wrote %lld tokens from %s to %s (byte-level tokens: use vocab_size >= 256)\n",
              static_cast<long long>(tokens), text_path.c_str(), shard_path.c_str());
  return kExitOk;
}

void PrintVersion() {
  std::printf("ztrain %s\n", ZTRAIN_VERSION_STRING);
  std::printf("backends in this build:\n");
  std::printf("  CPU       yes (OpenBLAS %s, OpenMP)\n", ZTRAIN_BUILD_OPENBLAS);
  if (ZTRAIN_BUILD_HAS_CUDA_TOOLKIT) {
    std::printf("  CUDA      yes (cuBLAS and ztrain's kernels; CUDA devices visible now: %d; "
                "the config's \"device\" chooses)\n",
                kernels::CudaDeviceCount());
  } else {
    std::printf("  CUDA      no (reconfigure with -DZTRAIN_WITH_CUDA=ON; needs the CUDA toolkit)\n");
  }
  if (ZTRAIN_BUILD_HAS_NCCL) {
    std::printf("  NCCL      yes (the ranks' collectives when they train on CUDA)\n");
  } else {
    std::printf("  NCCL      no (reconfigure with -DZTRAIN_WITH_NCCL=ON; needs CUDA and NCCL)\n");
  }
  std::printf("  MPI       %s\n", ZTRAIN_BUILD_HAS_MPI
                                     ? "yes (data parallel and ZeRO stages 0-3 under mpirun/srun)"
                                     : "no (reconfigure with -DZTRAIN_WITH_MPI=ON)");
  std::printf("  io_uring  %s\n", ZTRAIN_BUILD_HAS_IO_URING
                                     ? "built (async file I/O for offload)"
                                     : "no (offload file I/O uses pread/pwrite; install "
                                       "liburing-dev and reconfigure with -DZTRAIN_WITH_IO_URING=ON)");
}

}  // namespace ztrain::launcher
