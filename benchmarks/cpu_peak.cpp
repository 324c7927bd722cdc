// cpu_peak: prints this process's measured CPU peak (hardware_peak.hpp) for scripts that time
// kernels in a process without libparallel (benchmarks/compare_onednn.sh: a second oneDNN cannot
// share a process with the one libparallel links).
//
//   OMP_NUM_THREADS=2 cpu_peak
//
// Output: "peak FP32_GFLOPS BF16_GFLOPS FP32_SOURCE | BF16_SOURCE" (the figures MFU and
// bench_cpu_kernels' "% of peak" divide by; $PARALLEL_CPU_PEAK_GFLOPS replaces both), then a comment
// line with every measured figure.
#include <fmt/format.h>

#include "parallel/hardware_peak.hpp"

int main() {
  using parallel::Precision;
  fmt::print("peak {:.1f} {:.1f} {} | {}\n", parallel::cpu_peak_flops(Precision::FP32) / 1e9,
             parallel::cpu_peak_flops(Precision::BF16) / 1e9, parallel::cpu_peak_source(Precision::FP32),
             parallel::cpu_peak_source(Precision::BF16));
  if (!parallel::cpu_peak_overridden())
    fmt::print("# {}\n", parallel::describe(parallel::measured_cpu_peak()));
  return 0;
}
