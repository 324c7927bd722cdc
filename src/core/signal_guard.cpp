// Signals off the GEMM threads (include/parallel/signal_handler.hpp, "Why signals never reach a
// GEMM thread"): the guarded signals are blocked in every thread that computes, and one thread of
// the library's, which does nothing else, keeps them unblocked so that the kernel delivers every
// process-directed one there.
#include <omp.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "parallel/signal_handler.hpp"

namespace parallel {
namespace {

sigset_t guarded_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kGuardedSignals) sigaddset(&set, sig);
  return set;
}

// Process state, under g_mutex. g_state: 0 nothing yet, 1 the delivery thread runs (the guard is
// on), -1 it could not start (the guard stays off: blocking without it would lose the signals).
std::mutex g_mutex;
std::atomic<int> g_state{0};
bool g_atfork_registered = false;

// This thread's state: whether the guard ran here, and which of the guarded signals it blocked
// (those the thread had not blocked itself), which a forked child unblocks again.
thread_local bool t_guarded = false;
thread_local sigset_t t_blocked_here;

void* delivery_thread(void*) {
  pthread_setname_np(pthread_self(), "parallel-signal");
  // The thread starts with its creator's mask from before the guard. A guarded signal blocked
  // there already is the program's own business (a program that sigwait()s for SIGTERM on a
  // thread of its own): it stays blocked here, so that the program's thread still receives it.
  sigset_t inherited, take;
  pthread_sigmask(SIG_BLOCK, nullptr, &inherited);
  sigemptyset(&take);
  for (int sig : kGuardedSignals)
    if (!sigismember(&inherited, sig)) sigaddset(&take, sig);
  pthread_sigmask(SIG_UNBLOCK, &take, nullptr);
  // Handlers (the StopFlag's, or anyone's) run here, on this thread's own stack, between pauses;
  // a default action (terminate) acts on the whole process as before.
  for (;;) ::pause();
  return nullptr;
}

void block_here() {
  if (t_guarded) return;
  const sigset_t set = guarded_set();
  sigset_t before;
  pthread_sigmask(SIG_BLOCK, &set, &before);
  sigemptyset(&t_blocked_here);
  for (int sig : kGuardedSignals)
    if (!sigismember(&before, sig)) sigaddset(&t_blocked_here, sig);
  t_guarded = true;
}

// fork(): the child has only the forking thread and no delivery thread. It gets back the mask it
// had before the guard (an exec'd program inherits the mask) and starts afresh if it computes.
void atfork_prepare() { g_mutex.lock(); }
void atfork_parent() { g_mutex.unlock(); }
void atfork_child() {
  if (t_guarded) pthread_sigmask(SIG_UNBLOCK, &t_blocked_here, nullptr);
  t_guarded = false;
  g_state.store(0);
  g_mutex.unlock();
}

bool start_delivery() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_state.load() != 0) return g_state.load() > 0;
  if (!g_atfork_registered) {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    g_atfork_registered = true;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, delivery_thread, nullptr);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    std::fprintf(stderr,
                 "libparallel: cannot start the signal thread (%s); signals during GEMMs are unguarded\n",
                 std::strerror(rc));
    g_state.store(-1);
    return false;
  }
  g_state.store(1);
  return true;
}

}  // namespace

void guard_signals() {
  if (t_guarded) return;  // the fast path of every GEMM
  if (!start_delivery()) return;
  block_here();
  // This thread's OpenMP team as it stands (threads it creates later inherit the mask). Inside a
  // parallel region the team is someone else's: the thread itself is blocked, the rest is up to
  // whoever guarded the region's owner.
  if (!omp_in_parallel()) {
#pragma omp parallel num_threads(omp_get_max_threads())
    block_here();
  }
}

bool signals_guarded() { return t_guarded; }

}  // namespace parallel
