#pragma once
// Signals, in two parts: where they are delivered (so that none can corrupt memory during a GEMM),
// and the stop request the training loop polls.
//
// ---- A stop request --------------------------------------------------------------------------
// SIGTERM (the scheduler's "time is up": Slurm, Kubernetes), SIGUSR1 (Slurm's early warning,
// `sbatch --signal=USR1@120`, which mpirun forwards to the ranks) or SIGINT (Ctrl-C), turned into a
// flag the training loop polls at a step boundary, so that every rank saves a checkpoint and exits
// cleanly instead of dying mid-step.
//
//     StopFlag stop;                          // installs the handlers
//     for (step...) {
//       train_step();
//       if (should_stop(stop, world)) { checkpoint::save(...); break; }
//     }
//
// A second SIGINT while a stop is already pending gets the default action (ends the process), so
// a user can still kill a stuck job with Ctrl-C twice. SIGTERM and SIGUSR1 never escalate:
// launchers may send SIGTERM more than once during the grace period, and the save must be allowed
// to finish. SIGUSR2 is not a stop request: the library leaves its action alone (profilers and
// host programs use it), but delivers it like the others (below).
//
// ---- Why signals never reach a GEMM thread ---------------------------------------------------
// oneDNN's JIT f32 GEMM kernels (before oneDNN 3.11.2; Debian ships 2.6) point the stack pointer
// into a heap buffer while they run (oneDNN issue 4845). A signal handler that runs on such a
// thread has its frame written by the kernel below that stack pointer: into the heap. Any handler
// does it, an empty one too; glibc later aborts in free() ("corrupted size vs. prev_size"), or the
// damage stays silent. Sending a storm of signals during steps reproduced it within seconds
// (tests/scripts/signal_storm.sh).
//
// The library therefore keeps SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 (kGuardedSignals) blocked in
// every thread that computes, and runs one thread of its own, "parallel-signal", that has them
// unblocked and does nothing but wait. The kernel delivers a process-directed signal (kill,
// Ctrl-C, a scheduler, mpirun forwarding one) to a thread that does not block it: that thread, on
// its own ordinary stack. guard_signals() installs this:
//   - it blocks the signals in the calling thread and in every thread of its current OpenMP team;
//     threads created later (OpenMP growing its pool, MPI's progress threads, std::thread) inherit
//     the blocked mask from their creator, so they are covered without a hook;
//   - Runtime calls it first thing (before MPI_Init, so MPI's threads inherit it too), StopFlag
//     calls it, and every CPU GEMM calls it (a thread-local check after the first call in a
//     thread), so a program that uses the ops without a Runtime is covered as well.
// Why this and not an alternate signal stack (sigaltstack + SA_ONSTACK):
//   - an alternate stack protects only handlers installed with SA_ONSTACK. A handler installed
//     from outside the library (a profiler, a host program, a preloaded library) usually is not,
//     and it corrupted the heap the same way. Blocking moves every handler, whoever installed it
//     and whenever, off the GEMM threads;
//   - an alternate stack is per thread and is not inherited: every OpenMP worker, including the
//     ones the runtime creates later, would need one installed from inside it. A signal mask is
//     inherited at thread creation;
//   - the handlers' behaviour is unchanged: the delivery thread waits with pause(), not sigwait(),
//     so the process's dispositions stay in force. A handler runs as before (only on another
//     thread), a default action still ends the process, and a second Ctrl-C still kills it. A
//     sigwait()/signalfd loop would instead consume the signals, silencing outside handlers and
//     turning an unhandled SIGINT into nothing.
// What follows from it:
//   - raise() (and pthread_kill) aimed at a guarded thread stays pending in that thread: a program
//     that stops itself calls StopFlag::request(), or kill(getpid(), sig), which the delivery
//     thread receives;
//   - blocking calls on the computing threads are no longer interrupted by these signals (no
//     EINTR);
//   - a fork()ed child gets back the mask its thread had before the guard (an exec'd program
//     inherits the mask). posix_spawn() and system() bypass fork handlers: children they start
//     from a guarded thread inherit the blocked mask. The library starts no processes;
//   - other signals (SIGPROF of a sampling profiler, SIGALRM) are not moved: a profiler's samples
//     must land on the threads it measures. With oneDNN < 3.11.2 such a profiler can still hit
//     issue 4845; oneDNN 3.11.2 fixed the kernels.
//   - a thread that existed before the guard and never runs a GEMM keeps its mask and may receive
//     these signals: harmless, its stack is an ordinary one. The one gap: OpenMP workers that a
//     program created before the library's first call and that are idle outside the caller's
//     current team when it is guarded (LLVM's libomp keeps such a pool; GCC's libgomp ends the
//     workers a smaller team leaves over) keep their mask, and would compute unguarded if a later,
//     larger team took them back. Runtime guards before any parallel region of the library's, so
//     pretrain_gpt and programs that start with a Runtime have no such worker;
//   - a guarded signal that the thread starting the guard already blocked is left blocked on the
//     signal thread too: a program that takes SIGTERM with sigwait() on a thread of its own keeps
//     receiving it there.
#include <array>
#include <csignal>
#include <string>

#include "parallel/communicator.hpp"

namespace parallel {

// The signals kept off the computing threads.
inline constexpr std::array<int, 4> kGuardedSignals{SIGTERM, SIGINT, SIGUSR1, SIGUSR2};

// Starts the delivery thread (once per process) and blocks kGuardedSignals in the calling thread
// and its current OpenMP team. Idempotent, thread-safe; after the first call in a thread it costs a
// thread-local load. If the delivery thread cannot be started, nothing is blocked (a message says
// so): blocking without it would lose the signals.
void guard_signals();
// Whether guard_signals() has blocked the signals in the calling thread.
bool signals_guarded();

class StopFlag {
 public:
  // Installs the SIGTERM, SIGINT and SIGUSR1 handlers and calls guard_signals(). Only one StopFlag
  // may exist at a time (the handlers are process-wide); a second one throws parallel::Error.
  StopFlag();
  // Restores the previous handlers; but once a signal has requested a stop, SIGTERM and SIGUSR1
  // keep this handler to the end of the process, so that a launcher repeating them while the
  // program saves and exits cannot end it with status 143 (SIGINT is restored: Ctrl-C kills).
  // A stop signal still pending (sent, not yet taken by the signal thread) is waited for first,
  // at most 1 s, so that it meets the handler and not the restored action.
  ~StopFlag();
  StopFlag(const StopFlag&) = delete;
  StopFlag& operator=(const StopFlag&) = delete;

  // The flag is set by the delivery thread: after kill(getpid(), SIGTERM) it is set a moment later,
  // not when kill() returns.
  bool requested() const;  // this process got a signal (or request())
  int signal() const;      // the first signal received, 0 if none (request() counts as SIGTERM)
  void request();          // a stop from code (e.g. a wall-clock budget)
  void clear();

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
  struct sigaction old_usr1_ {};
};

// Collective over `world`: true on every rank when any rank's flag is set (all_reduce max), so all
// ranks leave the loop at the same step. `world` must accept CPU tensors (an MpiCommunicator).
bool should_stop(const StopFlag& flag, Communicator& world);

// Collective like should_stop(): the signal that stopped some rank (the largest number if ranks got
// different ones), 0 on every rank when none did. Rank 0 may not have received the signal itself.
int agreed_stop_signal(const StopFlag& flag, Communicator& world);

// "SIGTERM", "SIGINT", ...; "signal N" for a number without a name here.
std::string signal_name(int sig);

}  // namespace parallel
