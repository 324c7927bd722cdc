#pragma once
// An opt-in record of the time each CPU GEMM call takes, by route and shape, for finding where a
// training step's GEMM time goes (docs/benchmarks.md, "The own fp32 GEMM inside the step").
//
// PARALLEL_OP_TIMES (parallel/op_times.hpp) gives each op's total; this splits the CPU GEMMs by
// route and shape, with the CPU time beside the wall time. PARALLEL_GEMM_TIMES=1 turns it on: every ops::gemm
// / gemm_bias call on the CPU is timed (wall clock around the whole call, operands as the step leaves them in
// cache) and, at process exit, a table goes to stderr: route, m, n, k, transposes, bias, calls, median and
// total milliseconds, GFLOP/s at the median, and the median process CPU time a call takes over the thread
// count (what the threads computed, not counting a thread's waits: the benchmark's cpu_%peak). Unset, a call
// costs one load of a static flag.
#include <chrono>
#include <cstdint>

namespace parallel::cpu {

bool gemm_times_enabled();

// Adds one call's seconds to the table.
void gemm_times_add(const char* route, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool bias,
                    double seconds, double cpu_seconds);

double process_cpu_seconds();

// Times the enclosing scope and records it when the record is on.
class GemmTimer {
 public:
  GemmTimer(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool bias)
      : on_(gemm_times_enabled()), m_(m), n_(n), k_(k), ta_(trans_a), tb_(trans_b), bias_(bias) {
    if (on_) t0_ = std::chrono::steady_clock::now(), cpu0_ = process_cpu_seconds();
  }
  void set_route(const char* route) { route_ = route; }
  ~GemmTimer() {
    if (!on_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    gemm_times_add(route_, m_, n_, k_, ta_, tb_, bias_, s, process_cpu_seconds() - cpu0_);
  }
  GemmTimer(const GemmTimer&) = delete;
  GemmTimer& operator=(const GemmTimer&) = delete;

 private:
  bool on_;
  int64_t m_, n_, k_;
  bool ta_, tb_, bias_;
  const char* route_ = "onednn";
  std::chrono::steady_clock::time_point t0_{};
  double cpu0_ = 0;
};

}  // namespace parallel::cpu
