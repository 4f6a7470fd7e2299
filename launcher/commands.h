#pragma once
// The ztrain subcommands. Each returns the process exit code; errors propagate as
// exceptions to main(), which reports them.
#include <string>

namespace ztrain::launcher {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitConfigError = 2;
inline constexpr int kExitInterrupted = 130;

// Trains from a config file; an empty path trains the built-in default. Under mpirun (or
// srun, torchrun) with several ranks, trains data-parallel over all of them.
// `ztrain export`: the checkpoint as one model file (engine/checkpoint_export.h).
int RunExport(const std::string& checkpoint, const std::string& format, const std::string& out,
              const std::string& dtype);
// `resume`: "" (start fresh unless checkpoint.resume), "latest" or a step to resume from.
int RunTrain(const std::string& config_path, const std::string& resume = "");
// Prints the resolved config (exit 0) or every error found (exit 2); on stderr, where its
// device would put this process on this machine.
int RunCheckConfig(const std::string& config_path, int world_size);
// Turns UTF-8 text into a token shard with the byte-level tokenizer.
int RunData(const std::string& text_path, const std::string& shard_path);
// Version and the backends compiled into this binary.
void PrintVersion();

}  // namespace ztrain::launcher
