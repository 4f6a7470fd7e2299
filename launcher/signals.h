#pragma once
// Ctrl-C / SIGTERM / SIGUSR1 handling for the ztrain executable: the first signal asks the
// trainer to stop after the step in flight (it then saves a checkpoint when checkpoint.dir is
// set, and what else it was told to save, and reports); a second one ends the process at
// once.
#include <atomic>

namespace ztrain::launcher {

// Installs the handlers and returns the flag they set.
const std::atomic<bool>& InstallStopHandlers();

}  // namespace ztrain::launcher
