// GPU kernel benchmarks (Google Benchmark), timed with CUDA events (manual time):
//   - GEMM, bf16 inputs / fp32 accumulation and output: our mma.sync kernel (kernels/gemm) vs
//     cuBLASLt, TFLOP/s = 2 M N K / time, at 4096^3, 8192^3 and GPT shapes (8192 tokens x
//     [h -> 3h (QKV), h -> 4h (MLP up), 4h -> h (MLP down)] for h = 768 (GPT-2 124M) and 4096 (7B));
//   - attention forward / backward (the fp32 FlashAttention-2 kernels of ops::attention_*; fp32 CUDA
//     cores, not tensor cores: expect a small fraction of the bf16 numbers), FlashAttention's
//     counting: 4 s^2 d heads b for the forward, halved when causal, 2.5x that for the backward;
//   - memory-bound kernels (layernorm, gelu, AdamW), GB/s and the fraction of the H100 SXM's
//     3.35 TB/s.
// Every benchmark skips with a message (SkipWithError) without a GPU, and the file builds without
// CUDA (PARALLEL_HAVE_CUDA = 0), registering a single benchmark that says so.
#include <benchmark/benchmark.h>

#include "parallel/build_config.hpp"

#if PARALLEL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "../kernels/cuda/kernels.hpp"
#include "../kernels/gemm/gemm.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace {

using namespace parallel;

constexpr double kPeakBandwidth = 3.35e12;  // H100 SXM HBM3, bytes/s

bool no_gpu(benchmark::State& state) {
  if (cuda_device_count() > 0) return false;
  state.SkipWithError("no CUDA device: GPU benchmarks skipped");
  return true;
}

// Runs fn once to warm up, then once per iteration between CUDA events; sets the manual time and
// returns the mean seconds per iteration (rates below are computed from it, not from CPU time).
template <typename F>
double time_loop(benchmark::State& state, F&& fn) {
  double total = 0.0;
  int64_t iters = 0;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();
  cudaDeviceSynchronize();
  for (auto _ : state) {
    cudaEventRecord(start);
    fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
    total += ms / 1e3;
    iters++;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return iters > 0 ? total / static_cast<double>(iters) : 0.0;
}

Tensor gpu_random(const Shape& shape, DType dtype) {
  // Values only need to be finite and varied; a cheap deterministic pattern on the host.
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++) v[i] = static_cast<float>((i * 7919) % 2003) / 2003.0f - 0.5f;
  Tensor t = Tensor::from_vector(v, shape);
  return (dtype == DType::F32 ? t : t.to(dtype)).to(Device::cuda(0));
}

// ---- GEMM ----
// Args: M, N, K, which (0 ours, 1 cuBLASLt). Forward layout: y[M, N] = x[M, K] W[N, K]^T.
void BM_GemmBf16(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const bool cublas = state.range(3) == 1;
  Tensor a = gpu_random({M, K}, DType::BF16), b = gpu_random({N, K}, DType::BF16);
  Tensor c = Tensor::zeros({M, N}, DType::F32, Device::cuda(0));
  const auto* A = static_cast<const bf16*>(a.data_ptr());
  const auto* B = static_cast<const bf16*>(b.data_ptr());
  auto* C = static_cast<float*>(c.data_ptr());
  const double sec = time_loop(state, [&] {
    if (cublas)
      cuda::gemm_cublaslt_bf16(A, false, B, true, C, M, N, K, 1.0f, 0.0f, nullptr);
    else
      kernels::gemm_bf16(A, false, B, true, C, M, N, K, 1.0f, 0.0f, {}, nullptr);
  });
  state.SetLabel(cublas ? "cuBLASLt" : "ours (mma.sync)");
  state.counters["TFLOP/s"] = sec > 0 ? 2.0 * M * N * K / sec / 1e12 : 0.0;
}

void gemm_args(benchmark::internal::Benchmark* b) {
  for (int which = 0; which < 2; which++) {
    b->Args({4096, 4096, 4096, which});
    b->Args({8192, 8192, 8192, which});
    for (int64_t h : {768, 4096}) {
      b->Args({8192, 3 * h, h, which});  // QKV projection
      b->Args({8192, 4 * h, h, which});  // MLP up
      b->Args({8192, h, 4 * h, which});  // MLP down
    }
  }
}
BENCHMARK(BM_GemmBf16)->Apply(gemm_args)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- attention (fp32) ----
// Args: s, causal, backward. b = 1, 16 heads of d = 128.
void BM_AttentionFp32(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t s = state.range(0), b = 1, heads = 16, d = 128;
  const bool causal = state.range(1) == 1, backward = state.range(2) == 1;
  Tensor q = gpu_random({s, b, heads, d}, DType::F32), k = gpu_random({s, b, heads, d}, DType::F32);
  Tensor v = gpu_random({s, b, heads, d}, DType::F32), dout = gpu_random({s, b, heads, d}, DType::F32);
  Tensor out = Tensor::empty({s, b, heads, d}, DType::F32, Device::cuda(0));
  Tensor lse = Tensor::empty({b, heads, s}, DType::F32, Device::cuda(0));
  Tensor dq = Tensor::empty(q.shape(), DType::F32, Device::cuda(0)),
         dk = Tensor::empty(k.shape(), DType::F32, Device::cuda(0));
  Tensor dv = Tensor::empty(v.shape(), DType::F32, Device::cuda(0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::attention_forward(q, k, v, out, lse, causal, scale);
  const double sec = time_loop(state, [&] {
    if (backward)
      ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, causal, scale);
    else
      ops::attention_forward(q, k, v, out, lse, causal, scale);
  });
  double flops = 4.0 * s * s * d * heads * b * (causal ? 0.5 : 1.0) * (backward ? 2.5 : 1.0);
  state.SetLabel("fp32 CUDA cores (no tensor cores yet)");
  state.counters["TFLOP/s"] = sec > 0 ? flops / sec / 1e12 : 0.0;
}
BENCHMARK(BM_AttentionFp32)
    ->Args({4096, 0, 0})
    ->Args({4096, 1, 0})
    ->Args({4096, 0, 1})
    ->Args({4096, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- memory-bound ----
void set_bandwidth(benchmark::State& state, double bytes, double sec) {
  if (sec <= 0) return;
  state.counters["GB/s"] = bytes / sec / 1e9;
  state.counters["of_3.35TB/s"] = bytes / sec / kPeakBandwidth;
}

void BM_LayerNormForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = 8192, h = state.range(0);
  Tensor x = gpu_random({rows, h}, DType::F32), w = gpu_random({h}, DType::F32),
         bias = gpu_random({h}, DType::F32);
  Tensor y = Tensor::empty({rows, h}, DType::F32, Device::cuda(0));
  Tensor mean = Tensor::empty({rows}, DType::F32, Device::cuda(0)),
         rstd = Tensor::empty({rows}, DType::F32, Device::cuda(0));
  const double sec = time_loop(state, [&] { ops::layernorm_forward(x, w, bias, y, mean, rstd, 1e-5f); });
  set_bandwidth(state, 2.0 * rows * h * sizeof(float), sec);
}
BENCHMARK(BM_LayerNormForward)->Arg(768)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_GeluForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = state.range(0);
  Tensor x = gpu_random({n}, DType::F32), y = Tensor::empty({n}, DType::F32, Device::cuda(0));
  const double sec = time_loop(state, [&] { ops::gelu_forward(x, y); });
  set_bandwidth(state, 2.0 * n * sizeof(float), sec);
}
BENCHMARK(BM_GeluForward)
    ->Arg(8192 * 3072)
    ->Arg(8192 * 16384)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_AdamW(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = state.range(0);
  Tensor p = gpu_random({n}, DType::F32), g = gpu_random({n}, DType::F32);
  Tensor m = Tensor::zeros({n}, DType::F32, Device::cuda(0)),
         v = Tensor::zeros({n}, DType::F32, Device::cuda(0));
  Tensor model = Tensor::empty({n}, DType::BF16, Device::cuda(0));
  cuda::AdamWHyper hp;
  hp.weight_decay = 0.1;
  const double sec = time_loop(state, [&] {
    cuda::adamw_step(static_cast<float*>(p.data_ptr()), static_cast<const float*>(g.data_ptr()),
                     static_cast<float*>(m.data_ptr()), static_cast<float*>(v.data_ptr()),
                     static_cast<bf16*>(model.data_ptr()), n, hp, nullptr, 0, n, nullptr);
  });
  set_bandwidth(state, (7.0 * sizeof(float) + sizeof(uint16_t)) * n, sec);  // 4 reads, 3 writes, bf16 copy
}
BENCHMARK(BM_AdamW)->Arg(int64_t{124} << 20)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

#else  // no CUDA in this build

namespace {
void BM_CudaKernels(benchmark::State& state) {
  state.SkipWithError("this build has no CUDA backend (PARALLEL_WITH_CUDA=OFF): GPU benchmarks skipped");
  for (auto _ : state) {
  }
}
BENCHMARK(BM_CudaKernels);
}  // namespace

#endif

BENCHMARK_MAIN();
