#pragma once
// A stop request from SIGTERM (the scheduler's "time is up": Slurm, Kubernetes) or SIGINT
// (Ctrl-C), turned into a flag the training loop polls at a step boundary, so that every rank saves
// a checkpoint and exits cleanly instead of dying mid-step.
//
//     StopFlag stop;                          // installs the handlers
//     for (step...) {
//       train_step();
//       if (should_stop(stop, world)) { checkpoint::save(...); break; }
//     }
//
// A second SIGINT while a stop is already pending gets the default action (ends the process), so
// a user can still kill a stuck job with Ctrl-C twice. SIGTERM never escalates: launchers may send
// it more than once during the grace period, and the save must be allowed to finish.
#include <csignal>
#include <string>

#include "parallel/communicator.hpp"

namespace parallel {

class StopFlag {
 public:
  // Installs the SIGTERM and SIGINT handlers. Only one StopFlag may exist at a time (the handlers
  // are process-wide); a second one throws parallel::Error.
  StopFlag();
  ~StopFlag();  // restores the previous handlers
  StopFlag(const StopFlag&) = delete;
  StopFlag& operator=(const StopFlag&) = delete;

  bool requested() const;  // this process got a signal (or request())
  int signal() const;      // the first signal received, 0 if none (request() counts as SIGTERM)
  void request();          // a stop from code (e.g. a wall-clock budget)
  void clear();

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
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
