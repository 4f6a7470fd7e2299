// The ztrain executable: parses the command line, runs a subcommand, and is the only place
// that catches errors and ends the process (DESIGN.md "Errors").
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/error.h"
#include "core/logging.h"
#include "launcher/commands.h"

namespace {

int Main(int argc, char** argv) {
  using namespace ztrain::launcher;
  CLI::App app{"ztrain: DeepSpeed-style transformer training in one C++ binary", "ztrain"};
  app.require_subcommand(0, 1);
  std::string config_path, log_level = "info";
  bool version = false;
  app.add_option("--config", config_path, "DeepSpeed-style JSON config (default: built-in)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  app.add_flag("--version", version, "print the version and the backends of this build");

  CLI::App* train = app.add_subcommand("train", "train a model (the default command)");
  train->add_option("--config", config_path, "DeepSpeed-style JSON config (default: built-in)");

  CLI::App* check = app.add_subcommand("check-config", "print the resolved config or its errors");
  std::string check_path;
  int world_size = 1;
  check->add_option("file", check_path, "config file")->required();
  check->add_option("--world-size", world_size, "data-parallel ranks to validate the batch for")
      ->check(CLI::PositiveNumber);

  CLI::App* data = app.add_subcommand("data", "turn UTF-8 text into an llm.c token shard");
  std::string text_path, shard_path;
  data->add_option("--text", text_path, "UTF-8 text file")->required();
  data->add_option("--out", shard_path, "output shard (.bin)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitConfigError;
  }
  ztrain::SetLogLevel(log_level);
  if (version) {
    PrintVersion();
    return kExitOk;
  }
  if (*check) return RunCheckConfig(check_path, world_size);
  if (*data) return RunData(text_path, shard_path);
  return RunTrain(config_path);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const ztrain::ConfigError& e) {
    std::fprintf(stderr, "ztrain: config error:\n%s\n", e.what());
    return ztrain::launcher::kExitConfigError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ztrain: error: %s\n", e.what());
    return ztrain::launcher::kExitError;
  }
}
