// StopFlag: SIGTERM / SIGUSR1 / SIGINT -> an atomic flag the training loop polls
// (include/parallel/signal_handler.hpp). The handler runs on the library's signal thread
// (guard_signals(), src/core/signal_guard.cpp), never on a GEMM thread.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <string>

#include "parallel/signal_handler.hpp"

namespace parallel {
namespace {

// Signal handlers may only touch lock-free atomics.
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<int> g_signal{0};
std::atomic<bool> g_installed{false};
std::atomic<bool> g_signalled{false};  // a signal (not request()) reached the handler

extern "C" void on_stop_signal(int sig) {
  g_signalled.store(true);
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) return;
  if (sig == SIGINT) {
    // Second Ctrl-C: the user wants out now. sigaction and raise are async-signal-safe.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGINT, &dfl, nullptr);
    ::raise(SIGINT);
  }
}

bool pending_stop_signal() {
  sigset_t pending;
  if (sigpending(&pending) != 0) return false;
  return sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGUSR1) == 1 ||
         sigismember(&pending, SIGINT) == 1;
}

}  // namespace

StopFlag::StopFlag() {
  bool expected = false;
  PARALLEL_CHECK(g_installed.compare_exchange_strong(expected, true),
                 "StopFlag: another StopFlag already handles SIGTERM, SIGUSR1 and SIGINT in this process");
  g_signal.store(0);
  g_signalled.store(false);
  // Before the handlers: from their first signal on, they run on the delivery thread.
  guard_signals();
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking I/O and MPI calls carry on; the loop polls the flag
  if (::sigaction(SIGTERM, &action, &old_term_) != 0 || ::sigaction(SIGINT, &action, &old_int_) != 0 ||
      ::sigaction(SIGUSR1, &action, &old_usr1_) != 0) {
    g_installed.store(false);
    PARALLEL_FAIL("StopFlag: cannot install signal handlers");
  }
}

StopFlag::~StopFlag() {
  // A signal sent before this point may still be pending: the signal thread handles it when it is
  // next scheduled, which on a busy machine can come after a stop that another rank's signal
  // started has already been saved. Let it meet this handler rather than the default action it
  // would find once restored (trainer_resume's SIGTERM loop lost 2 of 150 runs with status 143 so).
  // Bounded: a signal raise()d in a guarded thread stays pending there for good.
  for (int i = 0; i < 1000 && pending_stop_signal(); ++i) ::usleep(1000);
  // After a stop signal the process is on its way out (saved, finalising MPI): a repeated SIGTERM
  // from the launcher must not end it with status 143 now, so the handler stays for SIGTERM and
  // SIGUSR1 (it only sets the flag; exec() resets it). A signal storm outlasting the trainer did
  // exactly that (tests/scripts/signal_storm_trainer.sh, one thread).
  if (!g_signalled.load()) {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  }
  ::sigaction(SIGINT, &old_int_, nullptr);
  g_installed.store(false);
}

bool StopFlag::requested() const { return g_signal.load() != 0; }
int StopFlag::signal() const { return g_signal.load(); }
void StopFlag::request() {
  int none = 0;
  g_signal.compare_exchange_strong(none, SIGTERM);
}
void StopFlag::clear() { g_signal.store(0); }

bool should_stop(const StopFlag& flag, Communicator& world) { return agreed_stop_signal(flag, world) != 0; }

int agreed_stop_signal(const StopFlag& flag, Communicator& world) {
  // The signal number itself is reduced, not a yes/no: the rank that reports the stop (rank 0) must
  // be able to name the signal even when only another rank received it.
  Tensor sig = Tensor::from_vector<int32_t>({flag.signal()}, {1});
  world.all_reduce(sig, ReduceOp::Max);
  return sig.data<int32_t>()[0];
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "signal " + std::to_string(sig);
  }
}

}  // namespace parallel
