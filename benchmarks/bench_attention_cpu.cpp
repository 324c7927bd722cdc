// Throughput of the tiled CPU attention on GPT-2 small shapes per rank: hq = hkv = 12 heads of
// d = 64, causal, 1024 tokens per step as 4 x 256 or 1 x 1024, in fp32 and bf16 (the third
// argument: 0 fp32, 1 bf16; bf16 runs on AVX512-BF16 dot products where the CPU has them, else
// widened to fp32, and the label says which), and the mini GPT's (issue 28: 6 heads of 64, 4 x 256;
// the fourth argument is the head count).
//
// BM_Masked*: the same kernels under a mask (attention_mask.hpp), fp32, b = 1: {s, mask} with mask
// 0 full causal, 1 sixteen equal documents (reset_attention_mask), 2 a 512-token sliding window.
// Their figure is time per call: a packed sequence should cost about 1/16 of full causal (the sum
// of the documents' squared lengths), a window linear in s.
//
//   OMP_NUM_THREADS=2 ./bench_attention_cpu [benchmark flags]
//
// GFLOP/s are counted as FlashAttention counts them: the forward is two [s, s, d] matmuls per head,
// 4 s^2 d flops, halved under a causal mask; the backward is 2.5x the forward (five matmuls against
// two). Softmax and exp work is not counted. Rates are from wall-clock time of the timed loop (the
// kernels run on OpenMP threads, so the main thread's CPU time would lie). "%peak" is that rate
// against the machine's measured peak for the dtype (cpu_peak_flops, or $PARALLEL_CPU_PEAK_GFLOPS),
// printed first as "CPU peak".
#include <benchmark/benchmark.h>
#include <omp.h>
#include <time.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "parallel/hardware_peak.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {

constexpr int64_t kHeadDim = 64;
constexpr bool kCausal = true;
double g_peak_gflops[2] = {};  // fp32, bf16: set in main before any benchmark runs

Tensor random_tensor(const Shape& shape, uint32_t seed, DType dt) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape).to(dt);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Wall-clock seconds of the timed loop; "%peak_cpu" is set from the CPU seconds of every thread of
// the process over the same loop (a rate per busy core, against one core's share of the peak).
// On a shared machine the wall-clock rate measures the other jobs as much as the kernel, the CPU
// time much less so (a descheduled thread does not count; with OMP_WAIT_POLICY=passive a waiting
// one sleeps), so the two are reported side by side.
template <typename F>
double timed_loop(benchmark::State& state, F&& body, double flops_per_call = 0.0, int dtype = 0) {
  body();  // warm-up: first-touch page faults, thread pool start
  const double cpu0 = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) body();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = process_cpu_seconds() - cpu0;
  if (flops_per_call > 0 && cpu > 0)
    state.counters["%peak_cpu"] =
        benchmark::Counter(100.0 * flops_per_call * static_cast<double>(state.iterations()) / cpu / 1e9 /
                           (g_peak_gflops[dtype] / omp_get_max_threads()));
  return wall;
}

double forward_flops(int64_t s, int64_t b, int64_t heads) {
  const double f = 4.0 * static_cast<double>(s) * s * kHeadDim * heads * b;
  return kCausal ? f / 2 : f;
}

// fused: q, k, v are views of one [s, b, 3 heads d] tensor and dq, dk, dv of one fused gradient,
// as the self-attention layer passes them on the CPU (docs/ops.md); else contiguous tensors.
struct Inputs {
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
  float scale;
  Inputs(int64_t s, int64_t b, DType dt, int64_t heads = 12, bool fused = false) {
    const Shape shape{s, b, heads, kHeadDim};
    if (fused) {
      const int64_t n = heads * kHeadDim;
      const Tensor qkv = random_tensor({s, b, 3 * n}, 1, dt), dqkv = Tensor::zeros({s, b, 3 * n}, dt);
      q = qkv.narrow(2, 0, n).view(shape);
      k = qkv.narrow(2, n, n).view(shape);
      v = qkv.narrow(2, 2 * n, n).view(shape);
      dq = dqkv.narrow(2, 0, n).view(shape);
      dk = dqkv.narrow(2, n, n).view(shape);
      dv = dqkv.narrow(2, 2 * n, n).view(shape);
    } else {
      q = random_tensor(shape, 1, dt);
      k = random_tensor(shape, 2, dt);
      v = random_tensor(shape, 3, dt);
      dq = Tensor::zeros(shape, dt);
      dk = Tensor::zeros(shape, dt);
      dv = Tensor::zeros(shape, dt);
    }
    dout = random_tensor(shape, 4, dt);
    out = Tensor::zeros(shape, dt);
    lse = Tensor::zeros({b, heads, s}, DType::F32);
    scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  }
};

DType dtype_arg(const benchmark::State& state) { return state.range(2) ? DType::BF16 : DType::F32; }

void label(benchmark::State& state, int64_t s, int64_t b, const Tensor& q) {
  const std::string path = ops::attention_implementation(q.dtype(), q.size(3));
  state.SetLabel("s=" + std::to_string(s) + " b=" + std::to_string(b) + " hq=" + std::to_string(q.size(2)) +
                 " d=" + std::to_string(kHeadDim) + (kCausal ? " causal " : " ") + path +
                 (q.is_contiguous() ? "" : " fused qkv views"));
}

void BM_AttentionForward(benchmark::State& state) {
  const int64_t s = state.range(0), b = state.range(1), heads = state.range(3);
  Inputs x(s, b, dtype_arg(state), heads, state.range(4) != 0);
  const double seconds = timed_loop(
      state, [&] { ops::attention_forward(x.q, x.k, x.v, x.out, x.lse, kCausal, x.scale); },
      forward_flops(s, b, heads), state.range(2) ? 1 : 0);
  const double gflops = forward_flops(s, b, heads) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflops);
  state.counters["%peak"] = benchmark::Counter(100.0 * gflops / g_peak_gflops[state.range(2) ? 1 : 0]);
  label(state, s, b, x.q);
}

void BM_AttentionBackward(benchmark::State& state) {
  const int64_t s = state.range(0), b = state.range(1), heads = state.range(3);
  Inputs x(s, b, dtype_arg(state), heads, state.range(4) != 0);
  ops::attention_forward(x.q, x.k, x.v, x.out, x.lse, kCausal, x.scale);
  const double seconds = timed_loop(
      state,
      [&] {
        ops::attention_backward(x.dout, x.q, x.k, x.v, x.out, x.lse, x.dq, x.dk, x.dv, kCausal, x.scale);
      },
      2.5 * forward_flops(s, b, heads), state.range(2) ? 1 : 0);
  const double gflops =
      2.5 * forward_flops(s, b, heads) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflops);
  state.counters["%peak"] = benchmark::Counter(100.0 * gflops / g_peak_gflops[state.range(2) ? 1 : 0]);
  label(state, s, b, x.q);
}

ops::AttentionMask masked(int64_t s, int64_t mode) {
  ops::AttentionMask m;
  if (mode == 2) m.window = 512;
  if (mode == 1) {
    std::vector<int32_t> starts(static_cast<size_t>(s));
    const int64_t doc = s / 16;
    for (int64_t p = 0; p < s; ++p) starts[static_cast<size_t>(p)] = static_cast<int32_t>(p / doc * doc);
    m.doc_start = Tensor::from_vector(starts, {1, s});
  }
  return m;
}

void mask_label(benchmark::State& state, int64_t s, int64_t mode) {
  static const char* names[] = {"full causal", "16 documents", "window 512"};
  state.SetLabel("s=" + std::to_string(s) + " b=1 hq=12" + " d=" + std::to_string(kHeadDim) + " fp32 " +
                 names[mode]);
}

void BM_MaskedForward(benchmark::State& state) {
  const int64_t s = state.range(0), mode = state.range(1);
  Inputs x(s, 1, DType::F32);
  const ops::AttentionMask m = masked(s, mode);
  timed_loop(state, [&] { ops::attention_forward(x.q, x.k, x.v, x.out, x.lse, m, x.scale); });
  mask_label(state, s, mode);
}

void BM_MaskedBackward(benchmark::State& state) {
  const int64_t s = state.range(0), mode = state.range(1);
  Inputs x(s, 1, DType::F32);
  const ops::AttentionMask m = masked(s, mode);
  ops::attention_forward(x.q, x.k, x.v, x.out, x.lse, m, x.scale);
  timed_loop(state, [&] {
    ops::attention_backward(x.dout, x.q, x.k, x.v, x.out, x.lse, x.dq, x.dk, x.dv, m, x.scale);
  });
  mask_label(state, s, mode);
}

}  // namespace

// {s, mask}: full causal against 16 documents at 4096 tokens; a window at 2k, 4k, 8k.
BENCHMARK(BM_MaskedForward)
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Args({2048, 2})
    ->Args({4096, 2})
    ->Args({8192, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskedBackward)
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Args({2048, 2})
    ->Args({4096, 2})
    ->Args({8192, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// {s, b, bf16, heads, fused}: 1024 tokens either way; GPT-2 small's 12 heads and the mini GPT's 6;
// contiguous q, k, v, then views of a fused qkv at the step shapes (s = 256).
static void step_shapes(benchmark::internal::Benchmark* b) {
  for (const auto& [s, batch, heads] : {std::array<int64_t, 3>{256, 4, 6}, {256, 4, 12}, {1024, 1, 12}})
    for (int64_t bf16 : {0, 1})
      for (int64_t fused : {0, 1})
        if (!fused || s == 256) b->Args({s, batch, bf16, heads, fused});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_AttentionForward)->Apply(step_shapes);
BENCHMARK(BM_AttentionBackward)->Apply(step_shapes);

int main(int argc, char** argv) {
  // The measured peaks, taken before any benchmark loads the cores.
  g_peak_gflops[0] = cpu_peak_flops(Precision::FP32) / 1e9;
  g_peak_gflops[1] = cpu_peak_flops(Precision::BF16) / 1e9;
  std::printf("CPU peak: %.1f GFLOP/s fp32 (%s), %.1f GFLOP/s bf16 (%s)\n", g_peak_gflops[0],
              cpu_peak_source(Precision::FP32).c_str(), g_peak_gflops[1],
              cpu_peak_source(Precision::BF16).c_str());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
