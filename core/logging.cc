#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace ztrain {

spdlog::logger& Log() {
  // The logger is created once and lives in spdlog's registry; reconfiguring it is only done
  // by the launcher before work starts.
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("ztrain");
    if (!l) l = spdlog::stderr_color_mt("ztrain");
    l->set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
    return l;
  }();
  return *logger;
}

void SetLogLevel(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  ZTRAIN_CHECK(lvl != spdlog::level::off || level == "off", "unknown log level '", level,
               "'; use trace, debug, info, warn, error or off");
  Log().set_level(lvl);
}

void SetLogRankPrefix(const std::string& prefix) {
  Log().set_pattern("[%H:%M:%S.%e] %^%l%$ " + prefix + "%v");
}

}  // namespace ztrain
