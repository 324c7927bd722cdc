// GPU kernel benchmarks (Google Benchmark), timed with CUDA events (manual time):
//   - GEMM, bf16 inputs / fp32 accumulation and output: our mma.sync kernel (kernels/gemm), cuBLASLt
//     and the dispatch between them (kernels::gemm_bf16_auto) side by side, TFLOP/s =
//     2 M N K / time. Squares 4096^3 and 8192^3, and the linear layers of GPT-2 124M (h 768, ffn
//     3072), GPT 1.3B (h 2048, ffn 8192) and a 7B (h 4096, SwiGLU ffn 11008: the up projection
//     computes gate and up together, 2 x 11008 outputs) over 8192 tokens, with the GPT-2 vocabulary
//     padded to 50304 for the LM head. Each layer in its three GEMMs: forward y = x W^T (fwd), input
//     gradient dx = dy W (dgrad), weight gradient dW += dy^T x with beta = 1 (wgrad). Names:
//     BM_GemmBf16/<model>/<layer>/<fwd|dgrad|wgrad>/<ours|cublaslt|auto>; auto's label says which
//     one the fixed rule (kernels::gemm_rule) picks, or under PARALLEL_GEMM=timed the one timing
//     picked and the times it measured for both: the figures to revise the rule with.
//   - memory-bound kernels (norms, activations, rope, cross-entropy, embedding, AdamW, rounding,
//     sum of squares): bytes_per_second from the bytes each must move at minimum (stated per
//     benchmark), and pct_hbm = 100 x (GB/s) / the device's theoretical bandwidth (memory clock x
//     bus width x 2, from the driver: 3.35 TB/s on an H100 SXM, 4.9 on an H200).
// Attention has its own file (bench_cuda_attention.cpp).
//
//   ./bench_cuda_kernels --benchmark_filter='BM_GemmBf16/gpt2_124m'      (one model's GEMMs)
//
// Every benchmark skips with a message (SkipWithError) without a GPU, and the file builds without
// CUDA (PARALLEL_HAVE_CUDA = 0), registering a single benchmark that says so.
#include <benchmark/benchmark.h>

#include "parallel/build_config.hpp"

#if PARALLEL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "../kernels/cuda/cuda_ops.hpp"
#include "../kernels/cuda/kernels.hpp"
#include "../kernels/gemm/gemm.hpp"
#include "cuda_benchmark.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace {

using namespace parallel;

// The device's theoretical memory bandwidth in GB/s: two transfers per memory clock over the bus
// (H100 SXM: 2619 MHz x 5120 bits = 3.35 TB/s; H200: 3201 MHz x 6144 bits = 4.9 TB/s). 3350 when
// the driver does not say.
double peak_gbs() {
  static const double gbs = [] {
    int device = 0, khz = 0, bits = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess || khz <= 0 ||
        bits <= 0)
      return 3350.0;
    return 2.0 * khz * 1e3 * (bits / 8.0) / 1e9;
  }();
  return gbs;
}
constexpr int64_t kTokens = 8192;  // rows of every activation below
constexpr int64_t kVocab = 50304;  // GPT-2's 50257 padded to a multiple of 128

using bench::no_gpu;
using bench::time_loop;

// A GPU tensor of finite, varied values in [lo, hi). Built from a host pattern of at most 2^20
// elements, repeated on the device by doubling copies: generating gigabyte operands (the LM head's
// logits) on the host would take longer than the benchmark.
Tensor gpu_pattern(const Shape& shape, DType dtype, float lo = -0.5f, float hi = 0.5f) {
  const int64_t n = shape_numel(shape);
  Tensor t = Tensor::empty(shape, dtype, Device::cuda(0));
  if (n == 0) return t;
  const int64_t period = std::min<int64_t>(n, int64_t{1} << 20);
  std::vector<float> v(static_cast<std::size_t>(period));
  for (int64_t i = 0; i < period; i++)
    v[i] = lo + (hi - lo) * static_cast<float>((i * 7919) % 2003) / 2003.0f;
  Tensor src = Tensor::from_vector(v, {period});
  if (dtype != DType::F32) src = src.to(dtype);
  Tensor head = t.flatten().narrow(0, 0, period);
  head.copy_(src);
  auto* base = static_cast<char*>(t.data_ptr());
  const std::size_t es = dtype_size(dtype);
  for (int64_t done = period; done < n; done *= 2) {
    const int64_t count = std::min(done, n - done);
    cudaMemcpy(base + done * es, base, static_cast<std::size_t>(count) * es, cudaMemcpyDeviceToDevice);
  }
  cudaDeviceSynchronize();
  return t;
}

Tensor gpu_empty(const Shape& shape, DType dtype = DType::F32) {
  return Tensor::empty(shape, dtype, Device::cuda(0));
}

// bytes_per_second (from the manual time) and pct_hbm for `bytes` moved per iteration.
void set_bandwidth(benchmark::State& state, double bytes, double sec) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["pct_hbm"] = sec > 0 ? 100.0 * bytes / sec / 1e9 / peak_gbs() : 0.0;
}

// ---- GEMM -------------------------------------------------------------------------------------

struct GemmShape {
  std::string name;  // model/layer/case
  int64_t m, n, k;
  bool ta, tb;
  float beta;
};
enum GemmWhich { kOurs = 0, kCublasLt = 1, kAuto = 2 };
const char* const kWhichName[] = {"ours", "cublaslt", "auto"};

// The three GEMMs of a linear layer with W [out, in] over `tokens` rows (include/parallel/ops.hpp).
void add_linear(std::vector<GemmShape>& v, const std::string& name, int64_t tokens, int64_t in, int64_t out) {
  v.push_back({name + "/fwd", tokens, out, in, false, true, 0.0f});     // y[T, out] = x[T, in] W^T
  v.push_back({name + "/dgrad", tokens, in, out, false, false, 0.0f});  // dx[T, in] = dy[T, out] W
  v.push_back({name + "/wgrad", out, in, tokens, true, false, 1.0f});   // dW[out, in] += dy^T x
}

std::vector<GemmShape> gemm_shapes() {
  std::vector<GemmShape> v;
  add_linear(v, "square/4096", 4096, 4096, 4096);
  add_linear(v, "square/8192", 8192, 8192, 8192);
  struct Model {
    const char* name;
    int64_t h, mlp_up_out, ffn;
  };
  const Model models[] = {
      {"gpt2_124m", 768, 3072, 3072},
      {"gpt_1.3b", 2048, 8192, 8192},
      {"llama_7b", 4096, 2 * 11008, 11008},  // SwiGLU: gate and up in one GEMM
  };
  for (const Model& m : models) {
    const std::string p = m.name;
    add_linear(v, p + "/qkv", kTokens, m.h, 3 * m.h);
    add_linear(v, p + "/attn_out", kTokens, m.h, m.h);
    add_linear(v, p + "/mlp_up", kTokens, m.h, m.mlp_up_out);
    add_linear(v, p + "/mlp_down", kTokens, m.ffn, m.h);
    add_linear(v, p + "/lm_head", kTokens, m.h, kVocab);
  }
  return v;
}

void BM_GemmBf16(benchmark::State& state, GemmShape g, int which) {
  if (no_gpu(state)) return;
  const Tensor a = gpu_pattern(g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, DType::BF16);
  const Tensor b = gpu_pattern(g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, DType::BF16);
  Tensor c = Tensor::zeros({g.m, g.n}, DType::F32, Device::cuda(0));
  const auto* A = static_cast<const bf16*>(a.data_ptr());
  const auto* B = static_cast<const bf16*>(b.data_ptr());
  auto* C = static_cast<float*>(c.data_ptr());
  const double sec = time_loop(state, [&] {
    if (which == kOurs)
      kernels::gemm_bf16(A, g.ta, B, g.tb, C, g.m, g.n, g.k, 1.0f, g.beta, {}, nullptr);
    else if (which == kCublasLt)
      cuda::gemm_cublaslt_bf16(A, g.ta, B, g.tb, C, g.m, g.n, g.k, 1.0f, g.beta, nullptr);
    else
      kernels::gemm_bf16_auto(A, g.ta, B, g.tb, C, g.m, g.n, g.k, 1.0f, g.beta, {}, nullptr);
  });
  std::string label = std::to_string(g.m) + "x" + std::to_string(g.k) + (g.ta ? "^T" : "") + " @ " +
                      std::to_string(g.k) + "x" + std::to_string(g.n) + (g.tb ? "^T" : "");
  if (which == kAuto) {
    kernels::GemmKey key;
    key.device = 0;
    key.m = g.m;
    key.n = g.n;
    key.k = g.k;
    key.trans_a = g.ta;
    key.trans_b = g.tb;
    key.beta_nonzero = g.beta != 0.0f;
    key.dtype = DType::BF16;
    if (const auto choice = kernels::gemm_choice(key)) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " -> %s (timed: ours %.3f ms, cublaslt %.3f ms)",
                    kernels::gemm_impl_name(choice->impl), choice->ours_ms, choice->cublaslt_ms);
      label += buf;
    } else if (kernels::gemm_mode() == kernels::GemmMode::Auto) {
      kernels::GemmProblem problem;
      problem.m = g.m;
      problem.n = g.n;
      problem.k = g.k;
      problem.trans_a = g.ta;
      problem.trans_b = g.tb;
      problem.arch = kernels::current_arch();
      label += std::string(" -> ") + kernels::gemm_impl_name(kernels::gemm_rule(problem)) +
               " (fixed rule; PARALLEL_GEMM=timed measures)";
    } else {
      label += " -> forced by PARALLEL_GEMM";
    }
  }
  state.SetLabel(label);
  state.counters["TFLOP/s"] = sec > 0 ? 2.0 * g.m * g.n * g.k / sec / 1e12 : 0.0;
}

// Ours, cuBLASLt and auto registered next to each other for every shape.
[[maybe_unused]] const bool g_gemm_registered = [] {
  for (const GemmShape& g : gemm_shapes()) {
    for (int which = 0; which < 3; which++) {
      const std::string name = "BM_GemmBf16/" + g.name + "/" + kWhichName[which];
      benchmark::RegisterBenchmark(name.c_str(), BM_GemmBf16, g, which)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

// ---- normalisation ----------------------------------------------------------------------------
// Arg: h. Rows: kTokens. Bytes: the [rows, h] tensors read and written; the per-row statistics and
// the [h] parameters are included (small).

void BM_LayerNormForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = kTokens, h = state.range(0);
  Tensor x = gpu_pattern({rows, h}, DType::F32), w = gpu_pattern({h}, DType::F32),
         b = gpu_pattern({h}, DType::F32);
  Tensor y = gpu_empty({rows, h}), mean = gpu_empty({rows}), rstd = gpu_empty({rows});
  const double sec = time_loop(state, [&] { ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5f); });
  set_bandwidth(state, 4.0 * (2.0 * rows * h + 2.0 * rows + 2.0 * h), sec);  // x, y; mean, rstd; w, b
}
BENCHMARK(BM_LayerNormForward)->Arg(768)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_LayerNormBackward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = kTokens, h = state.range(0);
  Tensor x = gpu_pattern({rows, h}, DType::F32), w = gpu_pattern({h}, DType::F32),
         b = gpu_pattern({h}, DType::F32);
  Tensor dy = gpu_pattern({rows, h}, DType::F32);
  Tensor y = gpu_empty({rows, h}), mean = gpu_empty({rows}), rstd = gpu_empty({rows}),
         dx = gpu_empty({rows, h});
  Tensor dw = Tensor::zeros({h}, DType::F32, Device::cuda(0)),
         db = Tensor::zeros({h}, DType::F32, Device::cuda(0));
  ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5f);
  const double sec = time_loop(state, [&] { ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db); });
  // dy, x read, dx written; mean, rstd read; w read, dw and db read and written.
  set_bandwidth(state, 4.0 * (3.0 * rows * h + 2.0 * rows + 5.0 * h), sec);
}
BENCHMARK(BM_LayerNormBackward)->Arg(768)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_RmsNormForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = kTokens, h = state.range(0);
  Tensor x = gpu_pattern({rows, h}, DType::F32), w = gpu_pattern({h}, DType::F32);
  Tensor y = gpu_empty({rows, h}), rstd = gpu_empty({rows});
  const double sec = time_loop(state, [&] { ops::rmsnorm_forward(x, w, y, rstd, 1e-6f); });
  set_bandwidth(state, 4.0 * (2.0 * rows * h + rows + h), sec);  // x, y; rstd; w
}
BENCHMARK(BM_RmsNormForward)->Arg(2048)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_RmsNormBackward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = kTokens, h = state.range(0);
  Tensor x = gpu_pattern({rows, h}, DType::F32), w = gpu_pattern({h}, DType::F32);
  Tensor dy = gpu_pattern({rows, h}, DType::F32);
  Tensor y = gpu_empty({rows, h}), rstd = gpu_empty({rows}), dx = gpu_empty({rows, h});
  Tensor dw = Tensor::zeros({h}, DType::F32, Device::cuda(0));
  ops::rmsnorm_forward(x, w, y, rstd, 1e-6f);
  const double sec = time_loop(state, [&] { ops::rmsnorm_backward(dy, x, w, rstd, dx, dw); });
  set_bandwidth(state, 4.0 * (3.0 * rows * h + rows + 3.0 * h), sec);  // dy, x, dx; rstd; w, dw r/w
}
BENCHMARK(BM_RmsNormBackward)->Arg(2048)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- activations ------------------------------------------------------------------------------
// GeLU, arg: width (kTokens rows): GPT-2 124M's MLP (3072) and a 7B-sized one (16384).

void BM_GeluForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = kTokens * state.range(0);
  Tensor x = gpu_pattern({n}, DType::F32, -4.0f, 4.0f), y = gpu_empty({n});
  const double sec = time_loop(state, [&] { ops::gelu_forward(x, y); });
  set_bandwidth(state, 2.0 * n * sizeof(float), sec);  // x, y
}
BENCHMARK(BM_GeluForward)->Arg(3072)->Arg(16384)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_GeluBackward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = kTokens * state.range(0);
  Tensor x = gpu_pattern({n}, DType::F32, -4.0f, 4.0f), dy = gpu_pattern({n}, DType::F32),
         dx = gpu_empty({n});
  const double sec = time_loop(state, [&] { ops::gelu_backward(dy, x, dx); });
  set_bandwidth(state, 3.0 * n * sizeof(float), sec);  // dy, x, dx
}
BENCHMARK(BM_GeluBackward)->Arg(3072)->Arg(16384)->UseManualTime()->Unit(benchmark::kMicrosecond);

// SwiGLU, arg: f (x [kTokens, 2f] -> y [kTokens, f]); 11008: the 7B MLP.
void BM_SwigluForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = kTokens, f = state.range(0);
  Tensor x = gpu_pattern({rows, 2 * f}, DType::F32, -4.0f, 4.0f), y = gpu_empty({rows, f});
  const double sec = time_loop(state, [&] { ops::swiglu_forward(x, y); });
  set_bandwidth(state, 3.0 * rows * f * sizeof(float), sec);  // x (2f), y (f)
}
BENCHMARK(BM_SwigluForward)->Arg(11008)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_SwigluBackward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t rows = kTokens, f = state.range(0);
  Tensor x = gpu_pattern({rows, 2 * f}, DType::F32, -4.0f, 4.0f), dy = gpu_pattern({rows, f}, DType::F32);
  Tensor dx = gpu_empty({rows, 2 * f});
  const double sec = time_loop(state, [&] { ops::swiglu_backward(dy, x, dx); });
  set_bandwidth(state, 5.0 * rows * f * sizeof(float), sec);  // dy (f), x (2f), dx (2f)
}
BENCHMARK(BM_SwigluBackward)->Arg(11008)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- rope -------------------------------------------------------------------------------------
// x [s 2048, b 4, heads 32, d 128] (the 7B's q over 8192 tokens), rotated in place. Arg: backward.
void BM_Rope(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t s = 2048, b = 4, heads = 32, d = 128;
  const bool backward = state.range(0) == 1;
  Tensor x = gpu_pattern({s, b, heads, d}, DType::F32);
  const double sec = time_loop(state, [&] {
    if (backward)
      ops::rope_backward(x, 0, 10000.0f);
    else
      ops::rope_forward(x, 0, 10000.0f);
  });
  set_bandwidth(state, 2.0 * x.numel() * sizeof(float), sec);  // read and write x
}
BENCHMARK(BM_Rope)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- softmax cross-entropy --------------------------------------------------------------------
// The whole vocab-parallel loss on one rank over [kTokens, 50304] logits (50257 real): local stats,
// sum of exps, backward. The logits are read three times and dlogits written once: 4 passes.
void BM_SoftmaxCrossEntropy(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = kTokens, v = kVocab, vocab = 50257;
  Tensor logits = gpu_pattern({n, v}, DType::F32, -5.0f, 5.0f), dlogits = gpu_empty({n, v});
  std::vector<int32_t> tv(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++) tv[i] = static_cast<int32_t>((i * 7919) % vocab);
  Tensor targets = Tensor::from_vector(tv, {n}).to(Device::cuda(0));
  Tensor g = Tensor::full({n}, 1.0 / static_cast<double>(n), DType::F32, Device::cuda(0));
  Tensor row_max = gpu_empty({n}), tl = gpu_empty({n}), sum_exp = gpu_empty({n});
  const double sec = time_loop(state, [&] {
    ops::cross_entropy_local_stats(logits, targets, 0, vocab, row_max, tl);
    ops::cross_entropy_sum_exp(logits, row_max, 0, vocab, sum_exp);
    ops::cross_entropy_backward(logits, targets, row_max, sum_exp, g, 0, vocab, dlogits);
  });
  set_bandwidth(state, 4.0 * n * v * sizeof(float), sec);
}
BENCHMARK(BM_SoftmaxCrossEntropy)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- embedding --------------------------------------------------------------------------------
// tokens [b 4, s 2048], weight [50304, h]. Arg: h.
std::vector<int32_t> token_ids(int64_t n) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++) t[i] = static_cast<int32_t>((i * 7919 + 13) % 50257);
  return t;
}

void BM_EmbeddingForward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t b = 4, s = kTokens / 4, h = state.range(0);
  Tensor tokens = Tensor::from_vector(token_ids(b * s), {b, s}).to(Device::cuda(0));
  Tensor w = gpu_pattern({kVocab, h}, DType::F32), out = gpu_empty({s, b, h});
  const double sec = time_loop(state, [&] { ops::embedding_forward(tokens, w, 0, out); });
  // ids read; one weight row read and one output row written per token.
  set_bandwidth(state, 4.0 * b * s + 2.0 * b * s * h * sizeof(float), sec);
}
BENCHMARK(BM_EmbeddingForward)->Arg(768)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_EmbeddingBackward(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t b = 4, s = kTokens / 4, h = state.range(0);
  const std::vector<int32_t> ids = token_ids(b * s);
  const double distinct = static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
  Tensor tokens = Tensor::from_vector(ids, {b, s}).to(Device::cuda(0));
  Tensor dout = gpu_pattern({s, b, h}, DType::F32),
         dw = Tensor::zeros({kVocab, h}, DType::F32, Device::cuda(0));
  const double sec = time_loop(state, [&] { ops::embedding_backward(tokens, dout, 0, dw); });
  // ids and dout read; each distinct id's dweight row read and written (accumulate).
  set_bandwidth(state, 4.0 * b * s + (b * s + 2.0 * distinct) * h * sizeof(float), sec);
}
BENCHMARK(BM_EmbeddingBackward)->Arg(768)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- optimizer and mixed precision ------------------------------------------------------------
// AdamW over 124M fp32 parameters (GPT-2 small). Arg: 1 also writes the bf16 model copy.
void BM_AdamW(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = 124'000'000;
  const bool model_copy = state.range(0) == 1;
  Tensor p = gpu_pattern({n}, DType::F32), g = gpu_pattern({n}, DType::F32);
  Tensor m = Tensor::zeros({n}, DType::F32, Device::cuda(0)),
         v = Tensor::zeros({n}, DType::F32, Device::cuda(0));
  Tensor model = model_copy ? gpu_empty({n}, DType::BF16) : Tensor();
  cuda::AdamWHyper hp;
  hp.weight_decay = 0.1;
  const double sec = time_loop(state, [&] {
    cuda::adamw_step(static_cast<float*>(p.data_ptr()), static_cast<const float*>(g.data_ptr()),
                     static_cast<float*>(m.data_ptr()), static_cast<float*>(v.data_ptr()),
                     model_copy ? static_cast<bf16*>(model.data_ptr()) : nullptr, n, hp, nullptr, 0, n,
                     nullptr);
  });
  // param, exp_avg, exp_avg_sq read and written, grad read; the bf16 copy written.
  set_bandwidth(state, (7.0 * sizeof(float) + (model_copy ? sizeof(uint16_t) : 0)) * n, sec);
  state.SetLabel(model_copy ? "with bf16 model copy" : "fp32 only");
}
BENCHMARK(BM_AdamW)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// round_to_precision_ over a [kTokens, 4096] activation, in place. Arg: 0 bf16, 1 fp16.
void BM_RoundToPrecision(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = kTokens * 4096;
  const DType precision = state.range(0) == 0 ? DType::BF16 : DType::F16;
  Tensor x = gpu_pattern({n}, DType::F32, -8.0f, 8.0f);
  const double sec = time_loop(state, [&] { cuda::round_to_precision_(x, precision, {}); });
  set_bandwidth(state, 2.0 * n * sizeof(float), sec);  // read and write x
  state.SetLabel(std::string(dtype_name(precision)));
}
BENCHMARK(BM_RoundToPrecision)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The global gradient norm's reduction over 124M fp32 gradients (synchronises, as the op does).
void BM_SumOfSquares(benchmark::State& state) {
  if (no_gpu(state)) return;
  const int64_t n = 124'000'000;
  Tensor x = gpu_pattern({n}, DType::F32);
  double sink = 0.0;
  const double sec = time_loop(state, [&] { sink += ops::sum_of_squares(x); });
  benchmark::DoNotOptimize(sink);
  set_bandwidth(state, static_cast<double>(n) * sizeof(float), sec);
}
BENCHMARK(BM_SumOfSquares)->UseManualTime()->Unit(benchmark::kMicrosecond);

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
