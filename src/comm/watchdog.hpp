#pragma once
// The watchdog's pieces shared by the communication backends (internal; communicator.hpp has the
// public side: set_comm_timeout, comm_timeout, comm_wait_seconds).
//
// A backend's blocking wait polls its completion test with a WaitPacer between polls:
//
//     if (!test()) {
//       detail::WaitPacer pacer;
//       while (!test())
//         if (!pacer.pause()) detail::watchdog_expired(what, group, pacer.elapsed_s(), abort_job);
//     }
#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace parallel::detail {

// Paces the polls of one wait and keeps its deadline (comm_timeout(), read when the wait starts).
// How depends on whether this node's ranks have a core each (waits_share_cores()):
//  - a core each (local ranks <= the CPUs this process may run on): the first 2 ms poll back to
//    back. Nobody of the job needs the core (on the Zen 3 VM, under other sessions' builds, a 786
//    KB all-reduce took 0.27 ms with MPI_Wait and 3.6 ms with a yield between polls);
//  - ranks time-share cores (tests run more ranks than cores): the first 50 µs poll back to back,
//    so a transfer that is about to finish gets no added latency.
// Then the rank sleeps between polls, for 1/32 of the time waited so far (50 to 500 µs), so a rank
// waiting for a slow peer leaves the core to the ranks still computing, at a cost of at most ~3 %
// of the wait. It never yields (sched_yield): under Linux's EEVDF scheduler a yield pushes the
// yielder's deadline a slice later each time, so a rank that yield-polls falls behind every other
// runnable task of its core - the other ranks and any other process - and, when its message has
// come, gets the core back only after them; the core of a rank that polls never goes idle, so the
// kernel never moves a waiting-to-run rank onto it either. A sleeping rank leaves the run queue:
// the core goes to its peers (or idles, and the load balancer pulls a rank from the busy core),
// and the rank is placed afresh when it wakes. Measured on the tiny model's 4-rank layouts on 2
// cores (docs/planner.md, "28 November: waits that sleep"): steps 1.8-2.1 times faster (8 ranks:
// 1.5) than with the yield. Runtime turns Open MPI's own yield off for the same
// reason (mpi_yield_when_idle, which it turns on when a node is oversubscribed).
// The time waited is added to comm_wait_seconds() when the pacer goes.
class WaitPacer {
 public:
  WaitPacer();
  ~WaitPacer();
  WaitPacer(const WaitPacer&) = delete;
  WaitPacer& operator=(const WaitPacer&) = delete;

  // Call after a poll that found the operation pending: pauses as above. False once the deadline
  // has passed (the caller then calls watchdog_expired).
  bool pause();
  double elapsed_s() const;

 private:
  std::chrono::steady_clock::time_point start_;
  double limit_s_;
  bool share_cores_;
};

// Whether this node's ranks time-share its cores: the launcher's local size (OMPI_COMM_WORLD_LOCAL_SIZE
// and the like; 1 without a launcher) above the CPUs in this process's affinity mask. Read once.
bool waits_share_cores();

// "group NAME (world ranks 0,2)", or "group NAME" when `world_ranks` is empty.
std::string describe_group(std::string_view name, std::span<const int> world_ranks);

// Logs, on this rank,
//   watchdog: OPERATION on GROUP pending for 5.0 s (train.comm_timeout_s = 5): aborting the job
// then runs `abort_backend` (e.g. ncclCommAbort, so peers blocked in NCCL are released) and ends the
// job with MPI_Abort(MPI_COMM_WORLD, 1) (std::_Exit when MPI is not live).
[[noreturn]] void watchdog_expired(std::string_view operation, std::string_view group, double waited_s,
                                   const std::function<void()>& abort_backend = {});

}  // namespace parallel::detail
