#pragma once
// Logging through spdlog. One named logger "ztrain"; the launcher sets the level and the
// rank prefix. Library code logs through these helpers and never prints to stdout itself.
#include <spdlog/spdlog.h>

#include <string>

namespace ztrain {

// Returns the shared "ztrain" logger (created on first use, writing to stderr).
spdlog::logger& Log();
// Sets the level from "trace", "debug", "info", "warn", "error" or "off".
void SetLogLevel(const std::string& level);
// Adds "[rank R] " to every line once ranks exist; empty prefix for a single process.
void SetLogRankPrefix(const std::string& prefix);

}  // namespace ztrain
