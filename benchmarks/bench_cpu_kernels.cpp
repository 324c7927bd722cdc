// Throughput of the CPU ops on GPT-2 small shapes (h = 768, 4 x 256 = 1024 tokens, vocab 50304).
//
//   OMP_NUM_THREADS=2 ./bench_cpu_kernels [--peak_gflops=N] [--cold] [benchmark flags]
// --cold: caches flushed before every timed iteration (evict_caches), as the step leaves them.
//
// gemm reports GFLOP/s and "% of peak" per dtype (BM_Gemm fp32, BM_GemmBf16 bf16 operands: what
// ops::gemm runs; BM_GemmOnednn: fp32 through oneDNN; BM_GemmAvx2*: the own AVX2 GEMM), the peak
// being --peak_gflops, else $PARALLEL_CPU_PEAK_GFLOPS, else this CPU's peak for that precision
// measured at start on all OpenMP threads (hardware_peak.hpp: fp32 FMA; bf16 AMX / AVX512-BF16 or,
// without them, fp32 FMA); the
// header prints the ISA, every measured peak (context keys cpu_isa, cpu_peak) and the kernel each
// dtype's GEMM runs (gemm_fp32, gemm_bf16: oneDNN's implementation, or widened to fp32). Memory-bound ops
// report GB/s of the bytes they must move at minimum (stated per benchmark), also as Google
// Benchmark's bytes_per_second. Rates are computed here from wall-clock time of the timed loop (the
// kernels run on OpenMP threads, so the main thread's CPU time would lie), as a mean over
// iterations and for the best iteration (best_*).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../kernels/cpu/cpu_ops.hpp"
#include "../kernels/cpu/gemm_avx2.hpp"
#include "parallel/config.hpp"
#include "parallel/hardware_peak.hpp"
#include "parallel/init.hpp"
#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parameter.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {

double g_peak_gflops = 0.0;       // set in main: the flag, else cpu_peak_flops(fp32)
double g_peak_gflops_bf16 = 0.0;  // set in main: the flag, else cpu_peak_flops(bf16)

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape);
}

// Wall-clock seconds of the timed loop: the total (for the mean rate) and the fastest iteration.
// The build machine's 2 cores are shared, so the mean swings with other jobs; the best iteration
// is what the kernel achieves when it has the cores, and is the figure to compare with the peak.
// cpu_best: the fewest process CPU seconds an iteration took (all threads together): what the
// kernel costs when other jobs take its cores away, as long as its threads do not spin
// (OMP_WAIT_POLICY=passive).
struct Timing {
  double total = 0.0, best = 1e30, cpu_best = 1e30;
};

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Cold caches: before each timed iteration, 64 MiB (twice the L3 of the machines we measure on) are
// written outside the timing, so the operands come from memory as in a training step, where every
// GEMM's inputs were last touched by other ops and its output is a buffer last used a layer ago.
bool g_cold = false;

void evict_caches() {
  static std::vector<float> junk(size_t{16} << 20);
  static float v = 0.0f;
  v += 1.0f;
  std::fill(junk.begin(), junk.end(), v);
  benchmark::DoNotOptimize(junk.data());
}

template <typename F>
Timing timed_loop(benchmark::State& state, F&& body) {
  body();  // warm-up: primitive creation, first-touch page faults
  Timing t;
  for (auto _ : state) {
    if (g_cold) {
      state.PauseTiming();
      evict_caches();
      state.ResumeTiming();
    }
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_seconds();
    body();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.cpu_best = std::min(t.cpu_best, process_cpu_seconds() - cpu_start);
    t.total += s;
    t.best = std::min(t.best, s);
  }
  return t;
}

void report_bytes(benchmark::State& state, Timing t, double bytes_per_iter) {
  // bytes_per_second: over the benchmark's own (real) time, which is the timed loop's.
  state.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter * static_cast<double>(state.iterations())));
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_iter * static_cast<double>(state.iterations()) / t.total / 1e9);
  state.counters["best_GB/s"] = benchmark::Counter(bytes_per_iter / t.best / 1e9);
}

// ---- gemm -------------------------------------------------------------------------------------

struct GemmCase {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  float beta;
};

// A linear layer y = x W^T, W [out, in], over T tokens: forward gemm(x, W^T) is [T, out] x [in];
// dgrad gemm(dy, W) is [T, in] x [out]; wgrad gemm(dy^T, x, beta 1) is [out, in] x [T].
constexpr int64_t T = 1024, H = 768;
const GemmCase kGemmCases[] = {
    {"qkv_fwd", T, 3 * H, H, false, true, 0.0f},
    {"qkv_dgrad", T, H, 3 * H, false, false, 0.0f},
    {"qkv_wgrad", 3 * H, H, T, true, false, 1.0f},
    {"mlp_up_fwd", T, 4 * H, H, false, true, 0.0f},
    {"mlp_up_dgrad", T, H, 4 * H, false, false, 0.0f},
    {"mlp_up_wgrad", 4 * H, H, T, true, false, 1.0f},
    {"mlp_down_fwd", T, H, 4 * H, false, true, 0.0f},
    {"mlp_down_dgrad", T, 4 * H, H, false, false, 0.0f},
    {"mlp_down_wgrad", H, 4 * H, T, true, false, 1.0f},
    {"proj_fwd", T, H, H, false, true, 0.0f},
    {"proj_dgrad", T, H, H, false, false, 0.0f},
    {"proj_wgrad", H, H, T, true, false, 1.0f},
    // GPT-2's LM head (vocab 50257): k = 50257 for the input gradient, m = 50257 for the weight's.
    {"head_fwd", T, 50257, H, false, true, 0.0f},
    {"head_dgrad", T, H, 50257, false, false, 0.0f},
    {"head_wgrad", 50257, H, T, true, false, 1.0f},
    // The mini GPT of benchmarks/compare_pytorch2.sh (h = 384, vocab 8192, 1024 tokens a micro-batch).
    {"mini_qkv_fwd", T, 1152, 384, false, true, 0.0f},
    {"mini_qkv_dgrad", T, 384, 1152, false, false, 0.0f},
    {"mini_qkv_wgrad", 1152, 384, T, true, false, 1.0f},
    {"mini_proj_fwd", T, 384, 384, false, true, 0.0f},
    {"mini_proj_dgrad", T, 384, 384, false, false, 0.0f},
    {"mini_proj_wgrad", 384, 384, T, true, false, 1.0f},
    {"mini_mlp_up_fwd", T, 1536, 384, false, true, 0.0f},
    {"mini_mlp_up_dgrad", T, 384, 1536, false, false, 0.0f},
    {"mini_mlp_up_wgrad", 1536, 384, T, true, false, 1.0f},
    {"mini_mlp_down_fwd", T, 384, 1536, false, true, 0.0f},
    {"mini_mlp_down_dgrad", T, 1536, 384, false, false, 0.0f},
    {"mini_mlp_down_wgrad", 384, 1536, T, true, false, 1.0f},
    {"mini_head_fwd", T, 8192, 384, false, true, 0.0f},
    {"mini_head_dgrad", T, 384, 8192, false, false, 0.0f},
    {"mini_head_wgrad", 8192, 384, T, true, false, 1.0f},
};

// GFLOP/s and % of `dt`'s peak: mean and best over wall-clock time, and cpu_%peak over the best
// iteration's process CPU time shared by the OpenMP threads (the rate the cores reached while the
// kernel had them: on this shared machine the wall-clock rates mostly measure the other jobs).
void report_gemm(benchmark::State& state, const GemmCase& c, DType dt, const Timing& t) {
  const double peak = dt == DType::F32 ? g_peak_gflops : g_peak_gflops_bf16;
  const double flop = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  const double gflops = flop * static_cast<double>(state.iterations()) / t.total / 1e9,
               best = flop / t.best / 1e9, cpu = flop / (t.cpu_best / omp_get_max_threads()) / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflops);
  state.counters["%peak"] = benchmark::Counter(100.0 * gflops / peak);
  state.counters["best_GFLOP/s"] = benchmark::Counter(best);
  state.counters["best_%peak"] = benchmark::Counter(100.0 * best / peak);
  state.counters["cpu_%peak"] = benchmark::Counter(100.0 * cpu / peak);
}

// `dt`: the operands' dtype (the product is written in fp32). "%peak" is against the measured peak
// of that precision (hardware_peak.hpp: bf16 -> AMX or AVX512-BF16 where the CPU has them, else the
// fp32 FMA peak, as the bf16 GEMM then widens to fp32), so each dtype's GEMM says how close it runs
// to what this CPU can do for it.
void BM_Gemm(benchmark::State& state, GemmCase c, DType dt) {
  Tensor a = random_tensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, 1).to(dt);
  Tensor b = random_tensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, 2).to(dt);
  Tensor out = Tensor::zeros({c.m, c.n}, DType::F32);
  const Timing t = timed_loop(state, [&] { ops::gemm(a, c.ta, b, c.tb, out, 1.0f, c.beta); });
  report_gemm(state, c, dt, t);
  state.SetLabel(std::string(dtype_name(dt)) + " " + std::to_string(c.m) + "x" + std::to_string(c.k) +
                 (c.ta ? "^T" : "") + " @ " + std::to_string(c.k) + "x" + std::to_string(c.n) +
                 (c.tb ? "^T" : ""));
}

// fp32 through oneDNN (gemm:jit / dnnl_sgemm) whatever ops::gemm routes fp32 to on this CPU, so that
// the own GEMM's fp32 (BM_GemmAvx2) runs beside it in the same binary.
void BM_GemmOnednn(benchmark::State& state, GemmCase c) {
  Tensor a = random_tensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, 1);
  Tensor b = random_tensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, 2);
  Tensor out = Tensor::zeros({c.m, c.n}, DType::F32);
  const Timing t = timed_loop(state, [&] { cpu::gemm_onednn_f32(a, c.ta, b, c.tb, out, 1.0f, c.beta); });
  report_gemm(state, c, DType::F32, t);
  state.SetLabel("f32 oneDNN");
}

// The library's own AVX2/FMA GEMM (kernels/cpu/gemm_avx2.hpp) called directly, whatever ops::gemm
// routes to, so that it runs side by side with BM_Gemm / BM_GemmBf16 on the same shapes.
// `out`: c's dtype (the step's forward and input-gradient products write a 16-bit c).
void BM_GemmAvx2(benchmark::State& state, GemmCase c, DType dt, DType out_dt) {
  Tensor a = random_tensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, 1).to(dt);
  Tensor b = random_tensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, 2).to(dt);
  Tensor out = Tensor::zeros({c.m, c.n}, out_dt);
  cpu::GemmAvx2Problem p;
  p.m = c.m, p.n = c.n, p.k = c.k;
  p.a = a.data_ptr(), p.a_type = dt, p.trans_a = c.ta;
  p.b = b.data_ptr(), p.b_type = dt, p.trans_b = c.tb;
  p.c = out.data_ptr(), p.c_type = out_dt, p.beta = c.beta;
  if (!cpu::gemm_avx2_can_implement(p)) {
    state.SkipWithError("no AVX2 + FMA + F16C on this CPU");
    return;
  }
  const Timing t = timed_loop(state, [&] { cpu::gemm_avx2_run(p); });
  report_gemm(state, c, dt, t);
  state.SetLabel(std::string(dtype_name(dt)) + " -> " + std::string(dtype_name(out_dt)) + " avx2");
}

// The baseline run side by side with ours: the same product through Eigen (multithreaded with
// OpenMP), the library most C++ code would reach for first.
void BM_GemmEigen(benchmark::State& state, GemmCase c) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::setNbThreads(0);  // 0: follow OpenMP (OMP_NUM_THREADS)
  const RowMat a = RowMat::Random(c.ta ? c.k : c.m, c.ta ? c.m : c.k);
  const RowMat b = RowMat::Random(c.tb ? c.n : c.k, c.tb ? c.k : c.n);
  RowMat out = RowMat::Zero(c.m, c.n);
  const Timing t = timed_loop(state, [&] {
    if (c.beta == 0.0f) out.setZero();
    if (c.ta && !c.tb)
      out.noalias() += a.transpose() * b;
    else if (!c.ta && c.tb)
      out.noalias() += a * b.transpose();
    else if (c.ta && c.tb)
      out.noalias() += a.transpose() * b.transpose();
    else
      out.noalias() += a * b;
  });
  const double flop = 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  const double gflops = flop * static_cast<double>(state.iterations()) / t.total / 1e9,
               best = flop / t.best / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflops);
  state.counters["%peak"] = benchmark::Counter(100.0 * gflops / g_peak_gflops);
  state.counters["best_GFLOP/s"] = benchmark::Counter(best);
  state.counters["best_%peak"] = benchmark::Counter(100.0 * best / g_peak_gflops);
}

// ---- memory-bound ops -------------------------------------------------------------------------

// Arg 0 (where taken): the activations' dtype, 0 fp32, 1 bf16 (weights in the same dtype, as the
// model copy of a bf16 step; statistics and weight gradients fp32). Bytes count each dtype's own
// size, so fp32 and bf16 rows compare by time (the same element count) and by GB/s.
DType act_dtype(const benchmark::State& state) { return state.range(0) == 1 ? DType::BF16 : DType::F32; }
double act_bytes(DType dt) { return static_cast<double>(dtype_size(dt)); }

void BM_LayerNormForward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, H}, 3).to(dt), w = random_tensor({H}, 4).to(dt),
         b = random_tensor({H}, 5).to(dt);
  Tensor y = Tensor::zeros({T, H}, dt), mean = Tensor::zeros({T}, DType::F32);
  Tensor rstd = Tensor::zeros({T}, DType::F32);
  const Timing s = timed_loop(state, [&] { ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5f); });
  report_bytes(state, s, 2.0 * T * H * act_bytes(dt));  // read x, write y
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_LayerNormBackward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, H}, 3).to(dt), w = random_tensor({H}, 4).to(dt),
         b = random_tensor({H}, 5).to(dt);
  Tensor y = Tensor::zeros({T, H}, dt), mean = Tensor::zeros({T}, DType::F32);
  Tensor rstd = Tensor::zeros({T}, DType::F32), dy = random_tensor({T, H}, 6).to(dt),
         dx = Tensor::zeros({T, H}, dt);
  Tensor dw = Tensor::zeros({H}, DType::F32), db = Tensor::zeros({H}, DType::F32);
  ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5f);
  const Timing s = timed_loop(state, [&] { ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db); });
  report_bytes(state, s, 3.0 * T * H * act_bytes(dt));  // read dy and x, write dx
  state.SetLabel(std::string(dtype_name(dt)));
}

// The residual stream's fused ops (ops.hpp) as a GPT layer runs them: sum = residual + branch and
// LayerNorm(sum); the backward with the residual gradient added. Dropout off (the default).
void BM_ResidualNormForward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor r = random_tensor({T, H}, 3).to(dt), br = random_tensor({T, H}, 13).to(dt);
  Tensor w = random_tensor({H}, 4).to(dt), b = random_tensor({H}, 5).to(dt);
  Tensor sum = Tensor::zeros({T, H}, dt), y = Tensor::zeros({T, H}, dt),
         mean = Tensor::zeros({T}, DType::F32);
  Tensor rstd = Tensor::zeros({T}, DType::F32);
  const Timing s = timed_loop(
      state, [&] { ops::residual_norm_forward(r, br, ops::DropoutSpec{}, w, b, sum, y, mean, rstd, 1e-5f); });
  report_bytes(state, s, 4.0 * T * H * act_bytes(dt));  // read residual and branch, write sum and y
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_NormBackwardResidual(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, H}, 3).to(dt), w = random_tensor({H}, 4).to(dt),
         b = random_tensor({H}, 5).to(dt);
  Tensor y = Tensor::zeros({T, H}, dt), mean = Tensor::zeros({T}, DType::F32);
  Tensor rstd = Tensor::zeros({T}, DType::F32), dy = random_tensor({T, H}, 6).to(dt),
         dres = random_tensor({T, H}, 14).to(dt), dx = Tensor::zeros({T, H}, dt), none;
  Tensor dw = Tensor::zeros({H}, DType::F32), db = Tensor::zeros({H}, DType::F32);
  ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5f);
  const Timing s = timed_loop(state, [&] {
    ops::norm_backward_residual(dy, dres, x, w, mean, rstd, dx, dw, db, ops::DropoutSpec{}, none);
  });
  report_bytes(state, s, 4.0 * T * H * act_bytes(dt));  // read dy, dresidual and x, write dx
  state.SetLabel(std::string(dtype_name(dt)));
}

// out = residual + dropout(branch) with p = 0.1 over [T, H].
void BM_DropoutAdd(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor r = random_tensor({T, H}, 3).to(dt), br = random_tensor({T, H}, 13).to(dt),
         out = Tensor::zeros({T, H}, dt);
  const Timing s = timed_loop(state, [&] { ops::dropout_add(br, r, out, ops::DropoutSpec{0.1f, 7, 0}); });
  report_bytes(state, s, 3.0 * T * H * act_bytes(dt));
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_GeluForward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, 4 * H}, 7).to(dt), y = Tensor::zeros({T, 4 * H}, dt);
  const Timing s = timed_loop(state, [&] { ops::gelu_forward(x, y); });
  report_bytes(state, s, 2.0 * T * 4 * H * act_bytes(dt));
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_GeluBackward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, 4 * H}, 7).to(dt), dy = random_tensor({T, 4 * H}, 8).to(dt),
         dx = Tensor::zeros({T, 4 * H}, dt);
  const Timing s = timed_loop(state, [&] { ops::gelu_backward(dy, x, dx); });
  report_bytes(state, s, 3.0 * T * 4 * H * act_bytes(dt));
  state.SetLabel(std::string(dtype_name(dt)));
}

// y[T, 4H] += bias and dbias += column sums of dy[T, 4H] (the MLP's first linear).
void BM_BiasForward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor y = random_tensor({T, 4 * H}, 7).to(dt), bias = random_tensor({4 * H}, 8).to(dt);
  const Timing s = timed_loop(state, [&] { ops::add_bias(y, bias); });
  report_bytes(state, s, 2.0 * T * 4 * H * act_bytes(dt));
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_BiasBackward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor dy = random_tensor({T, 4 * H}, 7).to(dt), db = Tensor::zeros({4 * H}, DType::F32);
  const Timing s = timed_loop(state, [&] { ops::bias_backward(dy, db); });
  report_bytes(state, s, 1.0 * T * 4 * H * act_bytes(dt));
  state.SetLabel(std::string(dtype_name(dt)));
}

// The whole vocab-parallel cross-entropy on one rank: local stats, sum of exps, backward. The
// logits are read three times and dlogits written once: 4 passes over [T, V]. Arg: fp32, bf16.
void BM_SoftmaxCrossEntropy(benchmark::State& state) {
  constexpr int64_t V = 50304, vocab = 50257;
  const DType dt = act_dtype(state);
  Tensor logits = random_tensor({T, V}, 9, -5.0f, 5.0f).to(dt), dlogits = Tensor::zeros({T, V}, dt);
  std::vector<int32_t> tv(T);
  for (int64_t i = 0; i < T; i++) tv[i] = static_cast<int32_t>((i * 7919) % vocab);
  Tensor targets = Tensor::from_vector(tv, {T}), g = Tensor::full({T}, 1.0 / T, DType::F32);
  Tensor row_max = Tensor::zeros({T}, DType::F32), tl = Tensor::zeros({T}, DType::F32);
  Tensor sum_exp = Tensor::zeros({T}, DType::F32);
  const Timing s = timed_loop(state, [&] {
    ops::cross_entropy_local_stats(logits, targets, 0, vocab, row_max, tl);
    ops::cross_entropy_sum_exp(logits, row_max, 0, vocab, sum_exp);
    ops::cross_entropy_backward(logits, targets, row_max, sum_exp, g, 0, vocab, dlogits);
  });
  report_bytes(state, s, 4.0 * T * V * act_bytes(dt));
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_RmsNormForward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, H}, 3).to(dt), w = random_tensor({H}, 4).to(dt);
  Tensor y = Tensor::zeros({T, H}, dt), rstd = Tensor::zeros({T}, DType::F32);
  const Timing s = timed_loop(state, [&] { ops::rmsnorm_forward(x, w, y, rstd, 1e-6f); });
  report_bytes(state, s, 2.0 * T * H * act_bytes(dt));  // read x, write y
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_RmsNormBackward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, H}, 3).to(dt), w = random_tensor({H}, 4).to(dt),
         dy = random_tensor({T, H}, 6).to(dt);
  Tensor y = Tensor::zeros({T, H}, dt), rstd = Tensor::zeros({T}, DType::F32);
  Tensor dx = Tensor::zeros({T, H}, dt), dw = Tensor::zeros({H}, DType::F32);
  ops::rmsnorm_forward(x, w, y, rstd, 1e-6f);
  const Timing s = timed_loop(state, [&] { ops::rmsnorm_backward(dy, x, w, rstd, dx, dw); });
  report_bytes(state, s, 3.0 * T * H * act_bytes(dt));  // read dy and x, write dx
  state.SetLabel(std::string(dtype_name(dt)));
}

// SwiGLU with f = 2048 (~8/3 h, the usual SwiGLU width for h = 768): x [T, 2f] -> y [T, f].
constexpr int64_t F = 2048;

void BM_SwigluForward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, 2 * F}, 7, -4.0f, 4.0f).to(dt), y = Tensor::zeros({T, F}, dt);
  const Timing s = timed_loop(state, [&] { ops::swiglu_forward(x, y); });
  report_bytes(state, s, 3.0 * T * F * act_bytes(dt));  // read x (2f), write y (f)
  state.SetLabel(std::string(dtype_name(dt)));
}

void BM_SwigluBackward(benchmark::State& state) {
  const DType dt = act_dtype(state);
  Tensor x = random_tensor({T, 2 * F}, 7, -4.0f, 4.0f).to(dt), dy = random_tensor({T, F}, 8).to(dt);
  Tensor dx = Tensor::zeros({T, 2 * F}, dt);
  const Timing s = timed_loop(state, [&] { ops::swiglu_backward(dy, x, dx); });
  report_bytes(state, s, 5.0 * T * F * act_bytes(dt));  // read dy (f) and x (2f), write dx (2f)
  state.SetLabel(std::string(dtype_name(dt)));
}

// RoPE over q of the T tokens: [s 256, b 4, heads 12, d 64], rotated in place (read and write).
void BM_RopeForward(benchmark::State& state) {
  Tensor x = random_tensor({256, 4, 12, 64}, 9);
  const Timing s = timed_loop(state, [&] { ops::rope_forward(x, 0, 10000.0f); });
  report_bytes(state, s, 2.0 * static_cast<double>(x.numel()) * sizeof(float));
}

// One AdamW step (parallel::AdamW, clipping on) over a flat 16M-element parameter. Arg 0: fp32, the
// global norm reads the gradient once, the update reads param, grad, exp_avg, exp_avg_sq and writes
// param, exp_avg, exp_avg_sq: 8 x 4 bytes per element. Arg 1: bf16, the same on the fp32 main
// weights plus the bf16 model copy written: 8 x 4 + 2 bytes per element.
void BM_AdamWStep(benchmark::State& state) {
  constexpr int64_t rows = 4096, cols = 4096;
  const bool bf16 = state.range(0) == 1;
  Parameter p;
  p.name = "flat.weight";
  p.value = random_tensor({rows, cols}, 10);
  if (bf16) p.value = p.value.to(DType::BF16);
  p.grad = random_tensor({rows, cols}, 11, -1e-3f, 1e-3f);
  p.global_shape = {rows, cols};  // 2-D: decayed, as a weight matrix
  OptimizerConfig config;
  AdamW opt({&p}, config, bf16 ? Precision::BF16 : Precision::FP32);
  const Timing s = timed_loop(state, [&] { opt.step(1e-4); });
  report_bytes(state, s, (8.0 * sizeof(float) + (bf16 ? 2.0 : 0.0)) * rows * cols);
  state.SetLabel(bf16 ? "bf16" : "fp32");
}

// init_normal of a GPT-2 MLP weight [3072, 768] (2.4M Philox normals, fp32): start-up time of a
// model is this per element times its parameters (124M for GPT-2 small). Reported as M elements/s.
void BM_InitNormal(benchmark::State& state) {
  Parameter p;
  p.name = "layers.0.mlp.fc1.weight";
  p.value = Tensor::zeros({3072, 768}, DType::F32);
  p.global_shape = {3072, 768};
  const Timing s = timed_loop(state, [&] { init_normal(p, 1234, 0.02f); });
  const double n = static_cast<double>(p.value.numel());
  state.counters["Melem/s"] = benchmark::Counter(n * static_cast<double>(state.iterations()) / s.total / 1e6);
  state.counters["best_Melem/s"] = benchmark::Counter(n / s.best / 1e6);
}

// round_to_precision_ over the MLP activation [T, 4H], in place (read and write). Arg: 0 bf16, 1 fp16.
void BM_RoundToPrecision(benchmark::State& state) {
  const DType precision = state.range(0) == 0 ? DType::BF16 : DType::F16;
  Tensor x = random_tensor({T, 4 * H}, 12, -8.0f, 8.0f);
  const Timing s = timed_loop(state, [&] { ops::round_to_precision_(x, precision); });
  report_bytes(state, s, 2.0 * T * 4 * H * sizeof(float));
  state.SetLabel(std::string(dtype_name(precision)));
}

// Word embedding of [b 4, s 256] ids from a [50304, H] table.
std::vector<int32_t> token_ids() {
  std::vector<int32_t> t(T);
  for (int64_t i = 0; i < T; i++) t[i] = static_cast<int32_t>((i * 7919 + 13) % 50257);
  return t;
}

void BM_EmbeddingForward(benchmark::State& state) {
  Tensor tokens = Tensor::from_vector(token_ids(), {4, T / 4});
  Tensor w = random_tensor({50304, H}, 13), out = Tensor::zeros({T / 4, 4, H}, DType::F32);
  const Timing s = timed_loop(state, [&] { ops::embedding_forward(tokens, w, 0, out); });
  report_bytes(state, s,
               4.0 * T + 2.0 * T * H * sizeof(float));  // ids; a weight row read, an output row written
}

void BM_EmbeddingBackward(benchmark::State& state) {
  const std::vector<int32_t> ids = token_ids();
  const double distinct = static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
  Tensor tokens = Tensor::from_vector(ids, {4, T / 4});
  Tensor dout = random_tensor({T / 4, 4, H}, 14), dw = Tensor::zeros({50304, H}, DType::F32);
  const Timing s = timed_loop(state, [&] { ops::embedding_backward(tokens, dout, 0, dw); });
  // ids and dout read; each distinct id's dweight row read and written (accumulate).
  report_bytes(state, s, 4.0 * T + (T + 2.0 * distinct) * H * sizeof(float));
}

}  // namespace

BENCHMARK(BM_LayerNormForward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerNormBackward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ResidualNormForward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NormBackwardResidual)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DropoutAdd)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GeluForward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GeluBackward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BiasForward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BiasBackward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SoftmaxCrossEntropy)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RmsNormForward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RmsNormBackward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SwigluForward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SwigluBackward)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RopeForward)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamWStep)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_InitNormal)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RoundToPrecision)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EmbeddingForward)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EmbeddingBackward)->UseRealTime()->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  // Our flag first, removed from argv so that Google Benchmark does not reject it.
  int kept = 1;
  for (int i = 1; i < argc; i++) {
    if (std::strncmp(argv[i], "--peak_gflops=", 14) == 0)
      g_peak_gflops = std::atof(argv[i] + 14);
    else if (std::strcmp(argv[i], "--cold") == 0)
      g_cold = true;
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  // The measured peak (or $PARALLEL_CPU_PEAK_GFLOPS), taken before any benchmark loads the cores.
  std::string peak_source = "--peak_gflops";
  if (g_peak_gflops <= 0) {
    g_peak_gflops = cpu_peak_flops(Precision::FP32) / 1e9;
    peak_source = cpu_peak_source(Precision::FP32);
    g_peak_gflops_bf16 = cpu_peak_flops(Precision::BF16) / 1e9;
  } else {
    g_peak_gflops_bf16 = g_peak_gflops;  // one figure given for every precision
  }
  // Ours and the Eigen baseline alternate, so both see the same machine load.
  for (const GemmCase& c : kGemmCases) {
    benchmark::RegisterBenchmark((std::string("BM_Gemm/") + c.name).c_str(), BM_Gemm, c, DType::F32)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("BM_GemmOnednn/") + c.name).c_str(), BM_GemmOnednn, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("BM_GemmBf16/") + c.name).c_str(), BM_Gemm, c, DType::BF16)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("BM_GemmAvx2/") + c.name).c_str(), BM_GemmAvx2, c, DType::F32,
                                 DType::F32)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("BM_GemmAvx2Bf16/") + c.name).c_str(), BM_GemmAvx2, c,
                                 DType::BF16, DType::F32)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    // A 16-bit c where the step has one (forward and input gradient; the weight gradient
    // accumulates into fp32).
    if (c.beta == 0.0f)
      benchmark::RegisterBenchmark((std::string("BM_GemmAvx2Bf16Out/") + c.name).c_str(), BM_GemmAvx2, c,
                                   DType::BF16, DType::BF16)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("BM_GemmEigen/") + c.name).c_str(), BM_GemmEigen, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("peak_gflops", fmt::format("{:.1f} (fp32, {})", g_peak_gflops, peak_source));
  benchmark::AddCustomContext("peak_gflops_bf16",
                              fmt::format("{:.1f} (bf16, BM_GemmBf16's %peak)", g_peak_gflops_bf16));
  // Which kernel each dtype's GEMM runs: on a CPU without AVX-512 oneDNN has no bf16 matmul and
  // the bf16 GEMM is widened to fp32 ("widened to fp32 ..."), the widening passes included in its time.
  benchmark::AddCustomContext("gemm_fp32", ops::gemm_implementation(DType::F32));
  benchmark::AddCustomContext("gemm_bf16", ops::gemm_implementation(DType::BF16));
  benchmark::AddCustomContext("cpu_isa", measured_cpu_peak().isa);
  benchmark::AddCustomContext("cpu_peak", describe(measured_cpu_peak()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
