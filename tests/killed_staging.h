#pragma once
// The staging name (Note [Staged outputs], core/staged_output.h) that a run killed on this host
// would have left for the output `out`: the tests lay out what such a run leaves behind.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace ztrain::testing {

// `dir/.<name>.ztrain-staging.<pid>@<host>` for a pid that has exited (a child reaped here).
inline std::string KilledRunStaging(const std::string& out) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::filesystem::path p(out);
  return (p.parent_path() / ("." + p.filename().string() + ".ztrain-staging." +
                             std::to_string(child) + "@" + host))
      .string();
}

}  // namespace ztrain::testing
