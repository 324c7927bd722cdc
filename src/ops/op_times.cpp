// Opt-in wall time of the real ops (op_times.hpp).
#include "parallel/op_times.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace parallel::ops {
namespace {

bool read_enabled() {
  const char* v = std::getenv("PARALLEL_OP_TIMES");
  return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// -1 until the first op asks: PARALLEL_OP_TIMES is read then, not at load time, so that a program
// (or a test) may set it before its first op. set_op_times_enabled overrides it. Relaxed atomics:
// every op reads it, and only its own value matters.
std::atomic<int> g_enabled{-1};
thread_local int t_depth = 0;
thread_local std::map<std::string, OpTime>* t_times = nullptr;

std::map<std::string, OpTime>& times() {
  if (t_times == nullptr) t_times = new std::map<std::string, OpTime>();  // lives with the thread's ops
  return *t_times;
}

}  // namespace

bool op_times_enabled() {
  int e = g_enabled.load(std::memory_order_relaxed);
  if (e < 0) {
    e = read_enabled() ? 1 : 0;
    g_enabled.store(e, std::memory_order_relaxed);
  }
  return e == 1;
}

void set_op_times_enabled(bool enabled) { g_enabled.store(enabled ? 1 : 0, std::memory_order_relaxed); }

std::map<std::string, OpTime> op_times() { return times(); }

void reset_op_times() { times().clear(); }

OpTimeSpan::OpTimeSpan(const char* op) {
  if (!op_times_enabled()) return;
  if (t_depth++ == 0) {
    op_ = op;
    start_ns_ = now_ns();
  }
}

OpTimeSpan::~OpTimeSpan() {
  if (!op_times_enabled()) return;
  --t_depth;
  if (op_ == nullptr) return;
  OpTime& t = times()[op_];
  ++t.calls;
  t.seconds += static_cast<double>(now_ns() - start_ns_) * 1e-9;
}

}  // namespace parallel::ops
