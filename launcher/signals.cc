#include "launcher/signals.h"

#include <signal.h>
#include <unistd.h>

namespace ztrain::launcher {
namespace {

std::atomic<bool> g_stop{false};  // written only from the signal handler

void OnSignal(int sig) {
  if (g_stop.exchange(true)) {
    // Second signal: the user wants out now. Only async-signal-safe calls here.
    static const char kMsg[] = "\nztrain: second interrupt, exiting immediately\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    _exit(128 + sig);
  }
  static const char kMsg[] =
      "\nztrain: stop requested (signal), stopping after the current step and saving a "
      "checkpoint when checkpoint.dir is set (again to force)\n";
  (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
}

}  // namespace

const std::atomic<bool>& InstallStopHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // Batch schedulers send SIGUSR1 (e.g. sbatch --signal=USR1@120) before a job's time is up.
  sigaction(SIGUSR1, &sa, nullptr);
  return g_stop;
}

}  // namespace ztrain::launcher
