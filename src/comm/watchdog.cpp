// The communication watchdog: deadlines for blocking waits, and the job's end when one passes.
#include "comm/watchdog.hpp"

#include <fmt/ranges.h>
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "parallel/communicator.hpp"
#include "parallel/error.hpp"
#include "parallel/launch.hpp"
#include "parallel/log.hpp"

namespace parallel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultTimeoutS = 600.0;  // NCCL's default
std::atomic<double> g_timeout_s{kDefaultTimeoutS};
std::atomic<int64_t> g_wait_ns{0};

}  // namespace

void set_comm_timeout(double seconds) {
  PARALLEL_CHECK(std::isfinite(seconds) && seconds > 0, "set_comm_timeout: {} s: must be a number > 0",
                 seconds);
  g_timeout_s.store(seconds, std::memory_order_relaxed);
}

double comm_timeout() { return g_timeout_s.load(std::memory_order_relaxed); }

double comm_wait_seconds() { return static_cast<double>(g_wait_ns.load(std::memory_order_relaxed)) * 1e-9; }

std::string describe_group(const Communicator& comm) {
  const std::vector<int> ranks = comm.world_ranks();
  return detail::describe_group(comm.name(), ranks);
}

namespace detail {

bool waits_share_cores() {
  static const bool share = [] {
    int local_ranks = 1;
    try {
      local_ranks = std::max(1, discover_launch_from_environment().local_size);
    } catch (const std::exception&) {
      // A malformed launcher variable is reported where the job reads its rank; here it only
      // chooses how to wait, and a rank a core is the cheaper assumption to get wrong.
    }
    int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
    return local_ranks > cpus;
  }();
  return share;
}

WaitPacer::WaitPacer() : start_(Clock::now()), limit_s_(comm_timeout()), share_cores_(waits_share_cores()) {}

WaitPacer::~WaitPacer() {
  g_wait_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count(),
                      std::memory_order_relaxed);
}

double WaitPacer::elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

bool WaitPacer::pause() {
  using std::chrono::microseconds;
  const auto waited = Clock::now() - start_;
  if (waited < microseconds(share_cores_ ? 50 : 2000)) return true;  // spin: the next poll follows at once
  if (std::chrono::duration<double>(waited).count() > limit_s_) return false;
  // Sleep, never yield: watchdog.hpp says why.
  const auto nap =
      std::clamp(std::chrono::duration_cast<microseconds>(waited) / 32, microseconds(50), microseconds(500));
  std::this_thread::sleep_for(nap);
  return true;
}

std::string describe_group(std::string_view name, std::span<const int> world_ranks) {
  std::string out = fmt::format("group {}", name);
  if (world_ranks.empty()) return out;
  out += fmt::format(" (world rank{} {})", world_ranks.size() == 1 ? "" : "s", fmt::join(world_ranks, ","));
  return out;
}

void watchdog_expired(std::string_view operation, std::string_view group, double waited_s,
                      const std::function<void()>& abort_backend) {
  logger().error("watchdog: {} on {} pending for {:.1f} s (train.comm_timeout_s = {}): aborting the job",
                 operation, group, waited_s, comm_timeout());
  logger().flush();
  std::fflush(stdout);
  std::fflush(stderr);
  if (abort_backend) abort_backend();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace detail
}  // namespace parallel
