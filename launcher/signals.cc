#include "launcher/signals.h"

#include <signal.h>
#include <unistd.h>

namespace ztrain::launcher {
namespace {

std::atomic<bool> g_stop{false};  // written only from the signal handler
std::atomic<int> g_signal{0};     // the first signal that asked to stop

void OnSignal(int sig) {
  if (g_stop.exchange(true)) {
    // Batch systems send SIGTERM and SIGUSR1 to every process of a job, sometimes twice (srun
    // forwards what the step's tasks already got, scontrol requeue terminates the job while
    // it exits): those wait for the checkpoint. A second Ctrl-C is the user wanting out now.
    if (sig != SIGINT) return;
    // Only async-signal-safe calls here.
    static const char kMsg[] = "\nztrain: second interrupt, exiting immediately\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    _exit(128 + sig);
  }
  g_signal.store(sig);
  static const char kInt[] = "\nztrain: interrupted (SIGINT)";
  static const char kTerm[] = "\nztrain: SIGTERM";
  static const char kUsr1[] = "\nztrain: SIGUSR1";
  static const char kMsg[] =
      ": stopping after the current step and saving a checkpoint when checkpoint.dir is set "
      "(Ctrl-C again to force)\n";
  const char* name = sig == SIGINT ? kInt : sig == SIGTERM ? kTerm : kUsr1;
  const size_t length = sig == SIGINT ? sizeof kInt : sig == SIGTERM ? sizeof kTerm : sizeof kUsr1;
  (void)!write(STDERR_FILENO, name, length - 1);
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

int StopSignal() { return g_signal.load(); }

}  // namespace ztrain::launcher
