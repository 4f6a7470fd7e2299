#pragma once
// Ctrl-C / SIGTERM / SIGUSR1 handling for the ztrain executable: the first signal asks the
// trainer to stop after the step in flight (it then saves a checkpoint when checkpoint.dir is
// set, and what else it was told to save, and reports); a second SIGINT ends the process at
// once, a repeated SIGTERM or SIGUSR1 (batch systems send them more than once) does not.
#include <atomic>

namespace ztrain::launcher {

// Installs the handlers and returns the flag they set.
const std::atomic<bool>& InstallStopHandlers();
// The signal that asked this process to stop (SIGINT, SIGTERM, SIGUSR1), or 0.
int StopSignal();

}  // namespace ztrain::launcher
