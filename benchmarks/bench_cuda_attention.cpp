// Attention benchmarks on the GPU (Google Benchmark, CUDA-event manual time):
//   - our tensor-core FlashAttention-2 (kernels/attention/flash_attention_mma.cu), bf16, forward
//     and backward, causal and not, in FlashAttention-2's paper setting: b * s = 16384 tokens,
//     hidden 2048 (16 heads of d = 128, or 32 heads of d = 64), s = 1024 .. 8192;
//   - our fp32 CUDA-core kernel (kernels::attention_forward / attention_backward) at s = 4096,
//     d = 128 in the same setting, as the side-by-side baseline;
//   - the plain path (kernels/attention/attention_plain.cu: batched cuBLAS products around a
//     row-softmax kernel, PARALLEL_ATTENTION=plain), bf16, s = 1024 and 4096, d = 128, in the same
//     setting: what training on the plain path costs while an own kernel fails its check;
//   - masks (issue 27; BM_AttentionMasked): one sequence (b = 1) of 16 heads of d = 128, full causal
//     against 16 packed documents of s / 16 tokens (should cost about 1/16 of it: the kernels skip
//     the tiles between documents) and against a 1024-token sliding window at s = 2k, 4k and 8k
//     (should grow linearly in s), bf16 tensor cores and (s = 4096) the fp32 kernel. Time per
//     call; TFLOP/s counts only the visible (query, key) pairs.
// TFLOP/s as FlashAttention counts them: 4 s^2 d heads b for the forward (two matmuls of 2 s^2 d),
// halved when causal, and 2.5x the forward for the backward (five matmuls; our backward does seven
// tile products, so its own arithmetic rate is 7/5 of the reported number). The backward's time
// includes the D = rowsum(dO * O) pass.
// Every benchmark skips with a message (SkipWithError) without a GPU; the file builds without CUDA.
#include <benchmark/benchmark.h>

#include "parallel/build_config.hpp"

#if PARALLEL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../kernels/attention/attention_plain.hpp"
#include "../kernels/attention/flash_attention_mma.hpp"
#include "../kernels/cuda/kernels.hpp"
#include "cuda_benchmark.hpp"
#include "parallel/tensor.hpp"

namespace {

using namespace parallel;

constexpr int64_t kTokens = 16384, kHidden = 2048;

using bench::no_gpu;
using bench::time_loop;

Tensor gpu_random(const Shape& shape, DType dtype) {
  // Values only need to be finite and varied: a deterministic pattern made on the host once per
  // shape and dtype, then copied on the GPU. Google Benchmark runs a case's body several times
  // (to size the iterations); making 33M values on the host each time took about 2.5 s per case on
  // the first GPU run (2026-11-28), most of the attention benchmarks' time.
  // Never destroyed: freeing device memory during static destruction can outlive the CUDA context.
  static auto& made = *new std::map<std::pair<Shape, DType>, Tensor>();
  auto it = made.find({shape, dtype});
  if (it == made.end()) {
    const int64_t n = shape_numel(shape);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; i++) v[i] = static_cast<float>((i * 7919) % 2003) / 2003.0f - 0.5f;
    Tensor t = Tensor::from_vector(v, shape);
    it = made.emplace(std::make_pair(shape, dtype),
                      (dtype == DType::F32 ? t : t.to(dtype)).to(Device::cuda(0)))
             .first;
  }
  return it->second.clone();
}

double attention_flops(int64_t s, int64_t d, int64_t heads, int64_t b, bool causal, bool backward) {
  return 4.0 * s * s * d * heads * b * (causal ? 0.5 : 1.0) * (backward ? 2.5 : 1.0);
}

// Args: s, d, causal, backward (d = 64: 32 heads; d = 128: 16 heads; b = 16384 / s).
void BM_FlashAttentionBf16(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t s = state.range(0), d = state.range(1), heads = kHidden / d, b = kTokens / s;
  const bool causal = state.range(2) == 1, backward = state.range(3) == 1;
  const Shape qs{s, b, heads, d};
  const Device dev = Device::cuda(0);
  Tensor q = gpu_random(qs, DType::BF16), k = gpu_random(qs, DType::BF16), v = gpu_random(qs, DType::BF16);
  Tensor dout = gpu_random(qs, DType::BF16);
  Tensor out = Tensor::empty(qs, DType::BF16, dev), lse = Tensor::empty({b, heads, s}, DType::F32, dev);
  Tensor dq = Tensor::empty(qs, DType::BF16, dev), dk = Tensor::empty(qs, DType::BF16, dev),
         dv = Tensor::empty(qs, DType::BF16, dev);
  const kernels::AttentionShape sh{s, b, heads, heads, d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto bp = [](const Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
  auto fp = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  kernels::flash_attention_forward_bf16(bp(q), bp(k), bp(v), bp(out), fp(lse), sh, AttentionBounds{causal},
                                        scale, nullptr);
  const double sec = time_loop(state, [&] {
    if (backward)
      kernels::flash_attention_backward_bf16(bp(dout), bp(q), bp(k), bp(v), bp(out), fp(lse), bp(dq), bp(dk),
                                             bp(dv), sh, AttentionBounds{causal}, scale, nullptr);
    else
      kernels::flash_attention_forward_bf16(bp(q), bp(k), bp(v), bp(out), fp(lse), sh,
                                            AttentionBounds{causal}, scale, nullptr);
  });
  state.SetLabel("bf16 mma.sync FlashAttention-2");
  state.counters["TFLOP/s"] = sec > 0 ? attention_flops(s, d, heads, b, causal, backward) / sec / 1e12 : 0.0;
}

void flash_args(benchmark::internal::Benchmark* bm) {
  for (int64_t d : {128, 64})
    for (int64_t backward : {0, 1})
      for (int64_t causal : {0, 1})
        for (int64_t s : {1024, 2048, 4096, 8192}) bm->Args({s, d, causal, backward});
}
BENCHMARK(BM_FlashAttentionBf16)->Apply(flash_args)->UseManualTime()->Unit(benchmark::kMillisecond);

// Args: causal, backward. s = 4096, d = 128, 16 heads, b = 4: the bf16 benchmark's setting.
void BM_AttentionFp32Baseline(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t s = 4096, d = 128, heads = kHidden / d, b = kTokens / s;
  const bool causal = state.range(0) == 1, backward = state.range(1) == 1;
  const Shape qs{s, b, heads, d};
  const Device dev = Device::cuda(0);
  Tensor q = gpu_random(qs, DType::F32), k = gpu_random(qs, DType::F32), v = gpu_random(qs, DType::F32);
  Tensor dout = gpu_random(qs, DType::F32);
  Tensor out = Tensor::empty(qs, DType::F32, dev), lse = Tensor::empty({b, heads, s}, DType::F32, dev);
  Tensor dq = Tensor::empty(qs, DType::F32, dev), dk = Tensor::empty(qs, DType::F32, dev),
         dv = Tensor::empty(qs, DType::F32, dev);
  const kernels::AttentionShape sh{s, b, heads, heads, d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto fp = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  kernels::attention_forward(fp(q), fp(k), fp(v), fp(out), fp(lse), sh, AttentionBounds{causal}, scale,
                             nullptr);
  const double sec = time_loop(state, [&] {
    if (backward)
      kernels::attention_backward(fp(dout), fp(q), fp(k), fp(v), fp(out), fp(lse), fp(dq), fp(dk), fp(dv), sh,
                                  AttentionBounds{causal}, scale, nullptr);
    else
      kernels::attention_forward(fp(q), fp(k), fp(v), fp(out), fp(lse), sh, AttentionBounds{causal}, scale,
                                 nullptr);
  });
  state.SetLabel("fp32 CUDA cores (baseline)");
  state.counters["TFLOP/s"] = sec > 0 ? attention_flops(s, d, heads, b, causal, backward) / sec / 1e12 : 0.0;
}
BENCHMARK(BM_AttentionFp32Baseline)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Args: s, causal, backward. d = 128, 16 heads, b = 16384 / s; the same FLOP count as the others
// (the plain path does the full s x s products even when causal).
void BM_AttentionPlainBf16(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t s = state.range(0), d = 128, heads = kHidden / d, b = kTokens / s;
  const bool causal = state.range(1) == 1, backward = state.range(2) == 1;
  const Shape qs{s, b, heads, d};
  const Device dev = Device::cuda(0);
  Tensor q = gpu_random(qs, DType::BF16), k = gpu_random(qs, DType::BF16), v = gpu_random(qs, DType::BF16);
  Tensor dout = gpu_random(qs, DType::BF16), out16 = gpu_random(qs, DType::BF16);
  Tensor out = Tensor::empty(qs, DType::F32, dev), lse = Tensor::zeros({b, heads, s}, DType::F32, dev);
  Tensor dq = Tensor::empty(qs, DType::F32, dev), dk = Tensor::empty(qs, DType::F32, dev),
         dv = Tensor::empty(qs, DType::F32, dev);
  const kernels::AttentionShape sh{s, b, heads, heads, d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto fp = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  const double sec = time_loop(state, [&] {
    if (backward)
      kernels::attention_plain_backward(dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        out16.data_ptr(), fp(lse), DType::BF16, fp(dq), fp(dk), fp(dv), sh,
                                        AttentionBounds{causal}, scale, nullptr);
    else
      kernels::attention_plain_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), DType::BF16, fp(out),
                                       fp(lse), sh, AttentionBounds{causal}, scale, nullptr);
  });
  state.SetLabel("plain: cuBLAS batched GEMMs + row softmax");
  state.counters["TFLOP/s"] = sec > 0 ? attention_flops(s, d, heads, b, causal, backward) / sec / 1e12 : 0.0;
}
BENCHMARK(BM_AttentionPlainBf16)
    ->ArgsProduct({{1024, 4096}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Args: mask (0 causal, 1 sixteen documents, 2 window of 1024), s, backward, kernel (0 bf16 tensor
// cores, 1 fp32).
void BM_AttentionMasked(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t kind = state.range(0), s = state.range(1), d = 128, heads = 16, b = 1, window = 1024;
  const bool backward = state.range(2) == 1, fp32 = state.range(3) == 1;
  const DType dt = fp32 ? DType::F32 : DType::BF16;
  const Shape qs{s, b, heads, d};
  const Device dev = Device::cuda(0);
  Tensor q = gpu_random(qs, dt), k = gpu_random(qs, dt), v = gpu_random(qs, dt), dout = gpu_random(qs, dt);
  Tensor out = Tensor::empty(qs, dt, dev), lse = Tensor::empty({b, heads, s}, DType::F32, dev);
  Tensor dq = Tensor::empty(qs, dt, dev), dk = Tensor::empty(qs, dt, dev), dv = Tensor::empty(qs, dt, dev);
  std::vector<int32_t> starts(static_cast<std::size_t>(s));
  for (int64_t p = 0; p < s; p++) starts[p] = static_cast<int32_t>(p / (s / 16) * (s / 16));
  const Tensor doc_start = Tensor::from_vector(starts, {b, s}).to(dev);
  AttentionBounds mask;
  if (kind == 1) {
    mask.doc_start = static_cast<const int32_t*>(doc_start.data_ptr());
    mask.doc_stride = s;
  }
  if (kind == 2) mask.window = window;
  double pairs = 0;  // visible (query, key) pairs of one head
  for (int64_t p = 0; p < s; p++)
    pairs += static_cast<double>(p -
                                 (kind == 1   ? starts[p]
                                  : kind == 2 ? std::max<int64_t>(0, p - window + 1)
                                              : 0) +
                                 1);
  const kernels::AttentionShape sh{s, b, heads, heads, d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto fp = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  auto bp = [](const Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
  auto forward = [&] {
    if (fp32)
      kernels::attention_forward(fp(q), fp(k), fp(v), fp(out), fp(lse), sh, mask, scale, nullptr);
    else
      kernels::flash_attention_forward_bf16(bp(q), bp(k), bp(v), bp(out), fp(lse), sh, mask, scale, nullptr);
  };
  forward();
  const double sec = time_loop(state, [&] {
    if (!backward)
      forward();
    else if (fp32)
      kernels::attention_backward(fp(dout), fp(q), fp(k), fp(v), fp(out), fp(lse), fp(dq), fp(dk), fp(dv), sh,
                                  mask, scale, nullptr);
    else
      kernels::flash_attention_backward_bf16(bp(dout), bp(q), bp(k), bp(v), bp(out), fp(lse), bp(dq), bp(dk),
                                             bp(dv), sh, mask, scale, nullptr);
  });
  state.SetLabel(std::string(kind == 0   ? "full causal"
                             : kind == 1 ? "16 documents"
                                         : "window 1024") +
                 (fp32 ? ", fp32 kernel" : ", bf16 mma.sync"));
  state.counters["TFLOP/s"] =
      sec > 0 ? 4.0 * d * heads * b * pairs * (backward ? 2.5 : 1.0) / sec / 1e12 : 0.0;
}
// 12 cases (the GPU check's bench step has 20 s for every attention benchmark): bf16 full causal vs
// 16 documents at 4k, windows at 2k, 4k, 8k, forward and backward; the fp32 kernel's forward at 4k.
void masked_args(benchmark::internal::Benchmark* bm) {
  for (int64_t backward : {0, 1}) {
    for (int64_t kind : {0, 1}) bm->Args({kind, 4096, backward, 0});
    for (int64_t s : {2048, 4096, 8192}) bm->Args({2, s, backward, 0});
  }
  for (int64_t kind : {0, 1}) bm->Args({kind, 4096, 0, 1});
}
BENCHMARK(BM_AttentionMasked)->Apply(masked_args)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

#else  // no CUDA in this build

namespace {
void BM_CudaAttention(benchmark::State& state) {
  state.SkipWithError("this build has no CUDA backend (PARALLEL_WITH_CUDA=OFF): GPU benchmarks skipped");
  for (auto _ : state) {
  }
}
BENCHMARK(BM_CudaAttention);
}  // namespace

#endif

BENCHMARK_MAIN();
