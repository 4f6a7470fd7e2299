#pragma once
// Helpers shared by the config tests.
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "core/error.h"

namespace ztrain::testing {

// The ConfigError message of parsing `j`; fails the test when it parses.
inline std::string ConfigErrorOf(const nlohmann::json& j, int world_size = 1) {
  try {
    ParseConfig(j, world_size);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "config parsed without error: " << j.dump();
  return "";
}

}  // namespace ztrain::testing
