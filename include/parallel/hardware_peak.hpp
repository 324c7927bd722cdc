#pragma once
// The peak FLOP/s of this CPU, measured rather than assumed: the reference for MFU and for the
// "% of peak" of the CPU benchmarks.
//
// What is measured, once per process (the first call of measured_cpu_peak(); later calls return
// the cached result, from any thread):
//   fp32_fma  the widest fp32 vector FMA the CPU runs: AVX-512 (vfmadd on zmm), else AVX2 + FMA
//             (ymm), else SSE (mulps + addps, the x86-64 baseline), chosen at run time, so the
//             library runs on any x86-64. 2 FLOPs per lane and FMA (1 + 1 for mul + add on SSE).
//   fp16_fma  AVX512-FP16 vfmaddph (32 lanes, 2 FLOPs each), when the CPU has it.
//   bf16_dot  AVX512-BF16 vdpbf16ps: 16 fp32 lanes, each adds two bf16 products, 4 FLOPs a lane.
//   amx_bf16  AMX tdpbf16ps on 16x16 fp32 tiles from 16x32 bf16 tiles (16 * 16 * 32 * 2 FLOPs an
//             instruction), when the CPU reports amx_bf16 and the kernel grants the tile state
//             (arch_prctl ARCH_REQ_XCOMP_PERM); otherwise "not available" with the reason.
// Each kernel keeps 12 independent accumulator chains (4 tiles for AMX), so it is bound by the
// throughput of the units, not by an instruction's latency, and touches no memory in its loop.
//
// Every OpenMP thread of the library (omp_get_max_threads() at the first call) runs the same kernel
// at the same time, so the figure is what that many busy cores give (shared frequency budget,
// SMT siblings sharing a core). First all threads spin for 30 ms (the team is spread over the CPUs,
// clocks and vector units are up); then, in at least two attempts 5 ms apart, the calling thread
// alone measures a reference rate and the whole team runs barrier-synchronised rounds of ~2 ms, each
// round timed with the thread's own CPU time (CLOCK_THREAD_CPUTIME_ID: other processes on a shared
// machine delay the rounds but do not lower the figure). Each thread keeps its best round over all
// attempts (a peak is a maximum: a slow round never lowers it), and attempts go on while some
// thread's best is below 3/4 of the lone rate although every thread has a physical core of its own
// (a host sharing the cores under a VM halved whole measurements before), up to 0.4 s. The process
// total is the mean per-thread rate times the threads that can run at once (min(threads, CPUs in
// the affinity mask)), so oversubscribed threads are not counted twice. The whole measurement takes
// about 0.1 s on an idle machine (bounded well under a second).
//
// On other architectures than x86-64 only a portable scalar fp32 loop is measured.
#include <string>

#include "parallel/dtype.hpp"

namespace parallel {

// One kernel's figure.
struct PeakFigure {
  bool available = false;
  std::string isa;                    // what ran: "avx512f", "avx2 fma", "sse", "avx512_bf16", ...
  std::string why_not;                // when !available: "CPU has no amx_bf16", "kernel refused ..."
  double flops_per_thread = 0.0;      // mean over the threads of each thread's best round
  double flops_per_thread_min = 0.0;  // the slowest thread's best round (spread across cores)
  double flops_total = 0.0;           // flops_per_thread * min(threads, cpus)
};

struct CpuPeak {
  std::string isa;      // vector ISAs found, e.g. "avx512f avx512_bf16" or "avx2 fma amx_bf16"
  int threads = 0;      // OpenMP threads measured on at once
  int cpus = 0;         // CPUs this process may run on (affinity mask)
  int online_cpus = 0;  // CPUs of the machine
  PeakFigure fp32_fma, fp16_fma, bf16_dot, amx_bf16;
  double seconds = 0.0;  // wall time the measurement took
};

// The measurement (see above); thread-safe, computed on the first call only.
const CpuPeak& measured_cpu_peak();

// The peak FLOP/s of the whole process for a training precision:
//   fp32 -> fp32_fma
//   bf16 -> the best of amx_bf16 and bf16_dot; fp32_fma when the CPU has neither, or when fp32 FMA is
//           faster (bf16 can always be widened), so the bf16 peak is never below the fp32 one
//   fp16 -> fp16_fma; fp32_fma on CPUs without fp16 arithmetic
// PARALLEL_CPU_PEAK_GFLOPS=<GFLOP/s> (read on every call) replaces the measurement for every
// precision, for reproducible MFU figures; it is the process total, and when it is set nothing is
// measured. A value that is not a positive number is an error (ConfigError).
double cpu_peak_flops(Precision precision);

// One MPI rank's share of cpu_peak_flops(precision) when `local_ranks` processes run on this machine.
// Ranks that are not bound to cores (every affinity mask holds every online CPU) share the CPUs, so
// each counts cpus / local_ranks of them, at most its own threads: 4 ranks of 1 thread on 2 cores
// get half a core's peak each, and the world's peak stays the machine's. Bound ranks (a smaller
// mask each) keep the process figure; so does PARALLEL_CPU_PEAK_GFLOPS.
double cpu_peak_flops_per_rank(Precision precision, int local_ranks);

// Whether PARALLEL_CPU_PEAK_GFLOPS is set (cpu_peak_flops then returns it).
bool cpu_peak_overridden();

// The figure cpu_peak_flops(precision) uses, by name, e.g. "avx512_bf16 dot" or "avx512f fma";
// "PARALLEL_CPU_PEAK_GFLOPS" when overridden.
std::string cpu_peak_source(Precision precision);

// One line for logs and benchmark headers:
// "ISA avx512f avx512_bf16 | 2 threads | fp32 fma (avx512f) 118.1/thread 236.2 total | bf16 dot ...
//  | amx_bf16 n/a (CPU has no amx_bf16) | GFLOP/s, measured in 102 ms"
std::string describe(const CpuPeak& peak);

}  // namespace parallel
