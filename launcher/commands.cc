#include "launcher/commands.h"

#include <cstdio>

#include "core/config.h"
#include "core/logging.h"
#include "data/byte_tokenizer.h"
#include "engine/trainer.h"
#include "launcher/build_info.h"
#include "launcher/signals.h"

namespace ztrain::launcher {

int RunTrain(const std::string& config_path) {
  Config config = config_path.empty() ? ParseConfig(DefaultConfigJson())
                                      : LoadConfigFile(config_path);
  if (config_path.empty()) Log().info("no --config given: training the built-in default model");
  const std::atomic<bool>& stop = InstallStopHandlers();
  Trainer trainer(std::move(config));
  const TrainSummary summary = trainer.Run(&stop);
  return summary.interrupted ? kExitInterrupted : kExitOk;
}

int RunCheckConfig(const std::string& config_path, int world_size) {
  try {
    const Config config = LoadConfigFile(config_path, world_size);
    std::printf("%s\n", config.resolved.dump(2).c_str());
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
  auto yes = [](int on) { return on ? "yes" : "no"; };
  std::printf("ztrain %s\n", ZTRAIN_VERSION_STRING);
  std::printf("backends in this build:\n");
  std::printf("  CPU       yes (OpenBLAS %s, OpenMP)\n", ZTRAIN_BUILD_OPENBLAS);
  std::printf("  CUDA      no (toolkit found at configure: %s; CUDA kernels not built yet)\n",
              yes(ZTRAIN_BUILD_HAS_CUDA_TOOLKIT));
  std::printf("  NCCL      no (library found at configure: %s; communicator not built yet)\n",
              yes(ZTRAIN_BUILD_HAS_NCCL));
  std::printf("  MPI       no (library found at configure: %s; communicator not built yet)\n",
              yes(ZTRAIN_BUILD_HAS_MPI));
  std::printf("  io_uring  no (library found at configure: %s; offload not built yet)\n",
              yes(ZTRAIN_BUILD_HAS_IO_URING));
}

}  // namespace ztrain::launcher
