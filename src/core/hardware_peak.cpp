#include "parallel/hardware_peak.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "parallel/error.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Starting values read through volatile, so that the compiler can neither fold the loops nor merge
// chains that would start equal. They keep every chain in normal range for the loop lengths used
// here (a -> a * 0.999 + 1e-4 tends to 0.1).
volatile float g_mul = 0.999f;
volatile float g_add = 1e-4f;
volatile float g_start = 0.01f;
thread_local volatile double g_sink = 0.0;  // every kernel's checksum goes here (per thread: no race)

// The twelve independent accumulator chains, written out: no array the compiler might keep in memory.
#define PARALLEL_REP12(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A kernel runs `iters` loop iterations and returns a checksum; flops_per_iter says what one costs.
using Kernel = double (*)(int64_t iters);

struct KernelSpec {
  Kernel run = nullptr;
  double flops_per_iter = 0.0;
  std::string isa;
};

// Portable fallback (any architecture; on x86-64 the SSE kernel below is used instead).
[[maybe_unused]] double fp32_scalar(int64_t iters) {
  const float x = g_mul, y = g_add, s = g_start;
#define PARALLEL_INIT(i) float a##i = s * (i + 1);
#define PARALLEL_STEP(i) a##i = a##i * x + y;
#define PARALLEL_SUM(i) sum += a##i;
  PARALLEL_REP12(PARALLEL_INIT)
  for (int64_t n = 0; n < iters; ++n) {
    PARALLEL_REP12(PARALLEL_STEP)
  }
  double sum = 0;
  PARALLEL_REP12(PARALLEL_SUM)
#undef PARALLEL_INIT
#undef PARALLEL_STEP
#undef PARALLEL_SUM
  return sum;
}

#if defined(__x86_64__)

// AVX512-FP16 intrinsics need GCC >= 12 or clang >= 15 (clang 14 has no _Float16 on plain x86-64).
#if (defined(__clang__) && __clang_major__ >= 15) || (!defined(__clang__) && __GNUC__ >= 12)
#define PARALLEL_HAVE_FP16_KERNEL 1
#endif

// Two lanes of the result (not _mm512_reduce_add_ps, which GCC 12 warns about wrongly).
__attribute__((target("avx512f"))) double checksum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return lanes[0] + lanes[15];
}

// x86-64 baseline: no FMA, a multiply and an add per lane (2 FLOPs on 4 lanes).
double fp32_sse(int64_t iters) {
  const __m128 x = _mm_set1_ps(g_mul), y = _mm_set1_ps(g_add);
  const float s = g_start;
#define PARALLEL_INIT(i) __m128 a##i = _mm_set1_ps(s * (i + 1));
#define PARALLEL_STEP(i) a##i = _mm_add_ps(_mm_mul_ps(a##i, x), y);
#define PARALLEL_SUM(i) sum = _mm_add_ps(sum, a##i);
  PARALLEL_REP12(PARALLEL_INIT)
  for (int64_t n = 0; n < iters; ++n) {
    PARALLEL_REP12(PARALLEL_STEP)
  }
  __m128 sum = _mm_setzero_ps();
  PARALLEL_REP12(PARALLEL_SUM)
#undef PARALLEL_INIT
#undef PARALLEL_STEP
#undef PARALLEL_SUM
  return _mm_cvtss_f32(sum);
}

__attribute__((target("avx2,fma"))) double fp32_avx2(int64_t iters) {
  const __m256 x = _mm256_set1_ps(g_mul), y = _mm256_set1_ps(g_add);
  const float s = g_start;
#define PARALLEL_INIT(i) __m256 a##i = _mm256_set1_ps(s * (i + 1));
#define PARALLEL_STEP(i) a##i = _mm256_fmadd_ps(a##i, x, y);
#define PARALLEL_SUM(i) sum = _mm256_add_ps(sum, a##i);
  PARALLEL_REP12(PARALLEL_INIT)
  for (int64_t n = 0; n < iters; ++n) {
    PARALLEL_REP12(PARALLEL_STEP)
  }
  __m256 sum = _mm256_setzero_ps();
  PARALLEL_REP12(PARALLEL_SUM)
#undef PARALLEL_INIT
#undef PARALLEL_STEP
#undef PARALLEL_SUM
  return _mm_cvtss_f32(_mm256_castps256_ps128(sum));
}

__attribute__((target("avx512f"))) double fp32_avx512(int64_t iters) {
  const __m512 x = _mm512_set1_ps(g_mul), y = _mm512_set1_ps(g_add);
  const float s = g_start;
#define PARALLEL_INIT(i) __m512 a##i = _mm512_set1_ps(s * (i + 1));
#define PARALLEL_STEP(i) a##i = _mm512_fmadd_ps(a##i, x, y);
#define PARALLEL_SUM(i) sum = _mm512_add_ps(sum, a##i);
  PARALLEL_REP12(PARALLEL_INIT)
  for (int64_t n = 0; n < iters; ++n) {
    PARALLEL_REP12(PARALLEL_STEP)
  }
  __m512 sum = _mm512_setzero_ps();
  PARALLEL_REP12(PARALLEL_SUM)
#undef PARALLEL_INIT
#undef PARALLEL_STEP
#undef PARALLEL_SUM
  return checksum(sum);
}

#if defined(PARALLEL_HAVE_FP16_KERNEL)
__attribute__((target("avx512f,avx512fp16"))) double fp16_avx512(int64_t iters) {
  const __m512h x = _mm512_set1_ph(static_cast<_Float16>(g_mul));
  const __m512h y = _mm512_set1_ph(static_cast<_Float16>(g_add));
  const float s = g_start;
#define PARALLEL_INIT(i) __m512h a##i = _mm512_set1_ph(static_cast<_Float16>(s * (i + 1)));
#define PARALLEL_STEP(i) a##i = _mm512_fmadd_ph(a##i, x, y);
#define PARALLEL_SUM(i) sum = _mm512_add_ps(sum, _mm512_castph_ps(a##i));
  PARALLEL_REP12(PARALLEL_INIT)
  for (int64_t n = 0; n < iters; ++n) {
    PARALLEL_REP12(PARALLEL_STEP)
  }
  __m512 sum = _mm512_setzero_ps();  // a checksum only: the bits need not mean anything
  PARALLEL_REP12(PARALLEL_SUM)
#undef PARALLEL_INIT
#undef PARALLEL_STEP
#undef PARALLEL_SUM
  return checksum(sum);
}
#endif

// vdpbf16ps: acc[i] += x[2i] * y[2i] + x[2i+1] * y[2i+1] on 16 fp32 lanes. The products (about
// 1e-4 each) keep the accumulators far from overflow and from denormals.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_avx512(int64_t iters) {
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(g_mul), _mm512_set1_ps(g_mul));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(g_add), _mm512_set1_ps(g_add));
  const float s = g_start;
#define PARALLEL_INIT(i) __m512 a##i = _mm512_set1_ps(s * (i + 1));
#define PARALLEL_STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
#define PARALLEL_SUM(i) sum = _mm512_add_ps(sum, a##i);
  PARALLEL_REP12(PARALLEL_INIT)
  for (int64_t n = 0; n < iters; ++n) {
    PARALLEL_REP12(PARALLEL_STEP)
  }
  __m512 sum = _mm512_setzero_ps();
  PARALLEL_REP12(PARALLEL_SUM)
#undef PARALLEL_INIT
#undef PARALLEL_STEP
#undef PARALLEL_SUM
  return checksum(sum);
}

// AMX tile configuration (palette 1): the layout ldtilecfg reads.
struct alignas(64) TileConfig {
  uint8_t palette_id = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tdpbf16ps C[16 x 16 fp32] += A[16 x 32 bf16] . B[16 x (16 x 2) bf16]: 16 * 16 * 32 multiply-adds.
// Four accumulator tiles (tmm0-3) from two A tiles (tmm4, 5) and two B tiles (tmm6, 7), as in a
// GEMM micro-kernel, so consecutive instructions do not wait on each other. Only called after the
// kernel granted the tile state (request_amx_permission).
__attribute__((target("amx-tile,amx-bf16"))) double amx_bf16(int64_t iters) {
  TileConfig cfg;
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  alignas(64) uint16_t src[16 * 32];
  alignas(64) float out[16 * 16];
  const float v = g_add;
  uint32_t bits;
  __builtin_memcpy(&bits, &v, sizeof bits);
  for (uint16_t& e : src) e = static_cast<uint16_t>(bits >> 16);  // bf16 by truncation
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (int64_t n = 0; n < iters; ++n) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

bool cpuid_leaf7_edx(int bit) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> bit) & 1u;
}

// AVX512-FP16 and AMX are read from CPUID directly: not every compiler's __builtin_cpu_supports
// knows their names (clang 14 does not). AVX512-FP16 uses the zmm state, which avx512f's check
// (OS support included) already covers; AMX's tile state is checked by the kernel (below).
bool cpu_has_avx512fp16() { return __builtin_cpu_supports("avx512f") && cpuid_leaf7_edx(23); }
bool cpu_has_amx_bf16() { return cpuid_leaf7_edx(22) && cpuid_leaf7_edx(24); }

// Linux hands out the AMX tile data state (8 KiB per thread) only on request; without it the first
// tile instruction kills the process with SIGILL. Empty string: granted; else why not.
std::string request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return {};
  return "kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
#else
  return "AMX tile state is only requested on Linux";
#endif
}

#endif  // __x86_64__

std::string detected_isa() {
  std::vector<std::string> names;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) names.push_back("avx512f");
  if (__builtin_cpu_supports("avx512bf16")) names.push_back("avx512_bf16");
  if (cpu_has_avx512fp16()) names.push_back("avx512_fp16");
  if (!__builtin_cpu_supports("avx512f")) {
    if (__builtin_cpu_supports("avx2")) names.push_back("avx2");
    if (__builtin_cpu_supports("fma")) names.push_back("fma");
  }
  if (cpu_has_amx_bf16()) names.push_back("amx_bf16");
  if (names.empty()) names.push_back("sse2");
#else
  names.push_back("scalar");
#endif
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : " ") + n;
  return out;
}

int affinity_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

int online_cpus() {
#if defined(__linux__)
  if (const long n = sysconf(_SC_NPROCESSORS_ONLN); n > 0) return static_cast<int>(n);
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// Physical cores among the CPUs this process may run on (distinct package/core ids in sysfs); the
// affinity CPU count where the topology cannot be read. Threads on SMT siblings of one core share
// its vector units, so only up to this many threads are expected to each run at a lone thread's rate.
int affinity_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return affinity_cpus();
  std::vector<std::pair<long, long>> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    long ids[2] = {-1, -1};
    const char* names[2] = {"physical_package_id", "core_id"};
    for (int i = 0; i < 2; ++i) {
      const std::string path = fmt::format("/sys/devices/system/cpu/cpu{}/topology/{}", c, names[i]);
      if (std::FILE* f = std::fopen(path.c_str(), "r")) {
        if (std::fscanf(f, "%ld", &ids[i]) != 1) ids[i] = -1;
        std::fclose(f);
      }
    }
    if (ids[1] < 0) return affinity_cpus();
    cores.emplace_back(ids[0], ids[1]);
  }
  std::sort(cores.begin(), cores.end());
  cores.erase(std::unique(cores.begin(), cores.end()), cores.end());
  if (!cores.empty()) return static_cast<int>(cores.size());
#endif
  return affinity_cpus();
}

double flops_of(const KernelSpec& k, int64_t iters) { return k.flops_per_iter * static_cast<double>(iters); }

// Iterations for a round of about `seconds` of this thread's CPU time (growing from 1000 until a
// round is long enough to time; these runs also power up the vector units).
int64_t calibrate(const KernelSpec& k, double seconds) {
  int64_t iters = 1000;
  double t = 0;
  for (;;) {
    const double t0 = thread_cpu_seconds();
    g_sink = g_sink + k.run(iters);
    t = thread_cpu_seconds() - t0;
    if (t >= seconds / 4 || iters >= (int64_t{1} << 30)) break;
    iters *= 4;
  }
  return std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(t, 1e-9)));
}

// One round on the calling thread: FLOP/s over its own CPU time (0 when the clock did not move).
double round_rate(const KernelSpec& k, int64_t iters) {
  const double t0 = thread_cpu_seconds();
  g_sink = g_sink + k.run(iters);
  const double t = thread_cpu_seconds() - t0;
  return t > 0 ? flops_of(k, iters) / t : 0.0;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Constants of the measurement (see measure()).
constexpr double kWarmupSeconds = 0.03;  // all threads busy before anything is timed
constexpr double kRoundSeconds = 2e-3;   // CPU time of one round
constexpr int kAloneRounds = 3;          // rounds of the lone-thread reference
constexpr int kTeamRounds = 5;           // barrier-synchronised rounds of the whole team, per attempt
constexpr int kMinAttempts = 2;          // attempts always made, a few ms apart
constexpr double kLowFraction = 0.75;    // a thread below this share of the lone rate: measure again
constexpr double kBudgetSeconds = 0.4;   // no new attempt starts after this (whole measurement)

PeakFigure unavailable(std::string why) {
  PeakFigure f;
  f.why_not = std::move(why);
  return f;
}

CpuPeak measure() {
  const auto start = Clock::now();
  CpuPeak peak;
  peak.isa = detected_isa();
  peak.cpus = affinity_cpus();
  peak.online_cpus = online_cpus();

  // Which kernels this CPU runs; a figure without a kernel stays "not available".
  KernelSpec fp32, fp16, bf16, amx;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f"))
    fp32 = {fp32_avx512, 12 * 16 * 2, "avx512f"};
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    fp32 = {fp32_avx2, 12 * 8 * 2, "avx2 fma"};
  else
    fp32 = {fp32_sse, 12 * 4 * 2, "sse"};
  if (!cpu_has_avx512fp16()) {
    peak.fp16_fma = unavailable("CPU has no avx512_fp16");
  } else {
#if defined(PARALLEL_HAVE_FP16_KERNEL)
    fp16 = {fp16_avx512, 12 * 32 * 2, "avx512_fp16"};
#else
    peak.fp16_fma = unavailable("built by a compiler without AVX512-FP16 intrinsics");
#endif
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
    bf16 = {bf16_dot_avx512, 12 * 16 * 4, "avx512_bf16"};
  else
    peak.bf16_dot = unavailable("CPU has no avx512_bf16");
  if (!cpu_has_amx_bf16()) {
    peak.amx_bf16 = unavailable("CPU has no amx_bf16");
  } else if (std::string why = request_amx_permission(); !why.empty()) {
    peak.amx_bf16 = unavailable(why);
  } else {
    amx = {amx_bf16, 4 * 16 * 16 * 32 * 2, "amx_bf16"};
  }
#else
  fp32 = {fp32_scalar, 12 * 2, "scalar"};
  peak.fp16_fma = unavailable("not x86-64");
  peak.bf16_dot = unavailable("not x86-64");
  peak.amx_bf16 = unavailable("not x86-64");
#endif

  struct Slot {
    const KernelSpec* spec;
    PeakFigure* figure;
  };
  const std::vector<Slot> slots = {
      {&fp32, &peak.fp32_fma}, {&fp16, &peak.fp16_fma}, {&bf16, &peak.bf16_dot}, {&amx, &peak.amx_bf16}};
  const int max_threads = std::max(1, omp_get_max_threads());
  // Each thread's best rate so far (across rounds and attempts), and the lone thread's reference.
  std::vector<std::vector<double>> rates(slots.size(), std::vector<double>(max_threads, 0.0));
  std::vector<double> alone(slots.size(), 0.0);
  std::vector<int64_t> iters(slots.size(), 0);
  int threads = 1;

  // Warm-up: every thread runs the fp32 kernel for kWarmupSeconds of wall time, so that the team
  // exists and its threads are spread over the CPUs, the clocks have ramped up and the wide vector
  // units are powered before anything is timed.
#pragma omp parallel num_threads(max_threads)
  {
#pragma omp single
    threads = omp_get_num_threads();
    const auto t0 = Clock::now();
    const int64_t n = calibrate(fp32, kRoundSeconds / 4);
    while (seconds_since(t0) < kWarmupSeconds) g_sink = g_sink + fp32.run(n);
  }

  // The round length of each kernel, on the calling thread.
  for (size_t s = 0; s < slots.size(); ++s)
    if (slots[s].spec->run != nullptr) iters[s] = calibrate(*slots[s].spec, kRoundSeconds);

  // Attempts (at least kMinAttempts, 5 ms apart: a slowdown of the whole machine, e.g. a host
  // sharing the cores under the VM, rarely lasts over both) of a lone-thread reference and then
  // kTeamRounds rounds per kernel, all threads starting each round together (barrier),
  // so that every round is timed while the whole team is busy. Each thread keeps its best round over
  // all attempts (a peak is a maximum: a slow round never lowers it). While some thread's best stays
  // far below the lone rate although every thread has a core of its own (a thread that had to share
  // a core, with another thread or with a vCPU of its host, for the whole attempt), measure again,
  // until kBudgetSeconds.
  const bool own_cores = threads <= affinity_cores();
  for (int attempt = 1;; ++attempt) {
    // The lone-thread reference, best over the attempts: the calling thread alone, the others idle.
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].spec->run != nullptr)
        for (int r = 0; r < kAloneRounds; ++r)
          alone[s] = std::max(alone[s], round_rate(*slots[s].spec, iters[s]));
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      for (size_t s = 0; s < slots.size(); ++s) {
        if (slots[s].spec->run == nullptr) continue;
        for (int r = 0; r < kTeamRounds; ++r) {
#pragma omp barrier
          rates[s][t] = std::max(rates[s][t], round_rate(*slots[s].spec, iters[s]));
        }
      }
    }
    bool low = false;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].spec->run == nullptr) continue;
      for (int t = 0; t < threads; ++t) low = low || rates[s][t] < kLowFraction * alone[s];
    }
    if ((attempt >= kMinAttempts && (!own_cores || !low)) || seconds_since(start) > kBudgetSeconds) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the (v)CPUs be placed anew
  }
  peak.threads = threads;
  const int concurrent = std::min(threads, peak.cpus);
  for (size_t s = 0; s < slots.size(); ++s) {
    if (slots[s].spec->run == nullptr) continue;
    const std::vector<double> r(rates[s].begin(), rates[s].begin() + threads);
    PeakFigure& f = *slots[s].figure;
    f.available = true;
    f.isa = slots[s].spec->isa;
    double sum = 0;
    for (double v : r) sum += v;
    f.flops_per_thread = sum / threads;
    f.flops_per_thread_min = *std::min_element(r.begin(), r.end());
    f.flops_total = f.flops_per_thread * concurrent;
  }
  peak.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return peak;
}

// PARALLEL_CPU_PEAK_GFLOPS as FLOP/s; 0 when unset.
double override_flops() {
  const char* env = std::getenv("PARALLEL_CPU_PEAK_GFLOPS");
  if (env == nullptr || *env == '\0') return 0.0;
  char* end = nullptr;
  const double gflops = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(gflops > 0) || !std::isfinite(gflops))
    throw ConfigError(fmt::format(
        "PARALLEL_CPU_PEAK_GFLOPS = '{}': must be a positive number (the process's peak in GFLOP/s)", env));
  return gflops * 1e9;
}

// The figure a precision uses (see cpu_peak_flops), and its name.
const PeakFigure& figure_for(const CpuPeak& p, Precision precision) {
  switch (precision) {
    case Precision::FP32:
      return p.fp32_fma;
    case Precision::FP16:
      return p.fp16_fma.available ? p.fp16_fma : p.fp32_fma;
    case Precision::BF16: {
      // The fastest way this CPU multiplies bf16. fp32 FMA counts too: bf16 can always be widened,
      // and on a CPU whose bf16 dot product is no faster, the fp32 units are the peak to beat.
      const PeakFigure* best = &p.fp32_fma;
      if (p.bf16_dot.available && p.bf16_dot.flops_total > best->flops_total) best = &p.bf16_dot;
      if (p.amx_bf16.available && p.amx_bf16.flops_total > best->flops_total) best = &p.amx_bf16;
      return *best;
    }
  }
  return p.fp32_fma;
}

std::string figure_name(const PeakFigure& f, const CpuPeak& p) {
  // The AVX2 kernel's ISA already says "avx2 fma".
  if (&f == &p.fp32_fma) return f.isa.ends_with("fma") ? f.isa : f.isa + " fma";
  if (&f == &p.fp16_fma) return "avx512_fp16 fma";
  if (&f == &p.bf16_dot) return "avx512_bf16 dot";
  return "amx_bf16 tdpbf16ps";
}

}  // namespace

const CpuPeak& measured_cpu_peak() {
  static const CpuPeak peak = measure();  // C++ guarantees one initialisation, even across threads
  return peak;
}

double cpu_peak_flops_per_rank(Precision precision, int local_ranks) {
  const double process = cpu_peak_flops(precision);
  if (local_ranks <= 1 || cpu_peak_overridden()) return process;
  const CpuPeak& p = measured_cpu_peak();
  if (p.cpus < p.online_cpus) return process;  // bound to its own cores
  const double per_thread = process / std::min(p.threads, p.cpus);
  return per_thread * std::min(static_cast<double>(p.threads), static_cast<double>(p.cpus) / local_ranks);
}

bool cpu_peak_overridden() { return override_flops() > 0; }

double cpu_peak_flops(Precision precision) {
  if (const double o = override_flops(); o > 0) return o;
  return figure_for(measured_cpu_peak(), precision).flops_total;
}

std::string cpu_peak_source(Precision precision) {
  if (cpu_peak_overridden()) return "PARALLEL_CPU_PEAK_GFLOPS";
  const CpuPeak& p = measured_cpu_peak();
  return figure_name(figure_for(p, precision), p);
}

std::string describe(const CpuPeak& p) {
  std::string line = fmt::format("ISA {} | {} thread{} on {} CPU{}", p.isa, p.threads,
                                 p.threads == 1 ? "" : "s", p.cpus, p.cpus == 1 ? "" : "s");
  const std::pair<const char*, const PeakFigure*> figures[] = {{"fp32 fma", &p.fp32_fma},
                                                               {"fp16 fma", &p.fp16_fma},
                                                               {"bf16 dot", &p.bf16_dot},
                                                               {"amx bf16", &p.amx_bf16}};
  for (const auto& [name, f] : figures) {
    if (f->available)
      line += fmt::format(" | {} ({}) {:.1f}/thread {:.1f} total", name, f->isa, f->flops_per_thread / 1e9,
                          f->flops_total / 1e9);
    else
      line += fmt::format(" | {} n/a ({})", name, f->why_not);
  }
  line += fmt::format(" | GFLOP/s, measured in {:.0f} ms", p.seconds * 1e3);
  return line;
}

}  // namespace parallel
