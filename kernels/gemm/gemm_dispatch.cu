// Our mma.sync kernel (gemm_mma.cu) or cuBLASLt (kernels/cuda/gemm_cublaslt.cu) per problem:
// gemm_bf16_auto / gemm_f16_auto / gemm_16_auto. See gemm.hpp for the contract.
//
// By default the choice is gemm_rule (gemm_rule.hpp), a pure function of the problem and the
// device's compute capability: ranks and runs must not differ (the determinism contract of
// cuda_ops.hpp), which a choice by timing cannot promise when the timings are close. Timing stays
// available on request (PARALLEL_GEMM=timed) to measure what the rule should be.
//
// Host code only (no kernels here); a .cu file because the build compiles kernels/**/*.cu only when
// CUDA is present, which is also when cuBLASLt is.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "gemm/gemm.hpp"

namespace parallel::kernels {
namespace {

// Per candidate and round: kWarmupRuns untimed runs (the first round only: clocks up, cuBLASLt's
// heuristic query and workspace allocation), then kTimedRuns between two events. Two rounds,
// alternating the candidates, and the faster round of each counts: one slow round (another stream's
// work, a clock change) does not decide alone.
constexpr int kWarmupRuns = 2, kTimedRuns = 5, kRounds = 2;

struct KeyLess {
  static auto tie(const GemmKey& k) {
    return std::tie(k.device, k.m, k.n, k.k, k.trans_a, k.trans_b, k.beta_nonzero, k.dtype, k.c_dtype);
  }
  bool operator()(const GemmKey& a, const GemmKey& b) const { return tie(a) < tie(b); }
};

std::mutex g_mutex;  // guards g_choices
std::map<GemmKey, GemmChoice, KeyLess> g_choices;

// One problem: a, b of ab (BF16 or F16), c of c_dtype (F32 or ab).
struct Problem {
  DType ab;
  const void* a;
  bool ta;
  const void* b;
  bool tb;
  void* c;
  DType c_dtype;
  int64_t m, n, k;
  float alpha, beta;
};

// One GEMM through `impl`, no epilogue, into `c` (the problem's c or a scratch copy of it).
void run(GemmImpl impl, const Problem& p, void* c, void* stream) {
  if (impl == GemmImpl::Ours)
    gemm_mma(p.ab, p.a, p.ta, p.b, p.tb, c, p.c_dtype, p.m, p.n, p.k, p.alpha, p.beta, GemmEpilogue{},
             stream);
  else
    cuda::gemm_cublaslt_16(p.ab, p.a, p.ta, p.b, p.tb, c, p.c_dtype, p.m, p.n, p.k, p.alpha, p.beta, stream);
}

// A pair of CUDA events, destroyed on every path out (the timing may throw).
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    CUDA_OPS_CHECK(cudaEventCreate(&start));
    CUDA_OPS_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Mean milliseconds of one run of `impl` over kTimedRuns runs (after `warmup` untimed ones). c is
// the buffer the runs write (the caller's c, or a scratch copy when beta != 0).
float time_runs(GemmImpl impl, int warmup, const Problem& p, void* c, cudaStream_t stream) {
  for (int i = 0; i < warmup; i++) run(impl, p, c, stream);
  EventPair ev;
  CUDA_OPS_CHECK(cudaEventRecord(ev.start, stream));
  for (int i = 0; i < kTimedRuns; i++) run(impl, p, c, stream);
  CUDA_OPS_CHECK(cudaEventRecord(ev.stop, stream));
  CUDA_OPS_CHECK(cudaEventSynchronize(ev.stop));
  float ms = 0.0f;
  CUDA_OPS_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
  return ms / kTimedRuns;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_OPS_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// PARALLEL_GEMM=timed: the implementation to run for `key`, the cached choice or a new one timed
// now. `fallback` (the rule's choice) runs where timing is impossible.
GemmImpl choose_timed(const GemmKey& key, const Problem& p, cudaStream_t stream, GemmImpl fallback) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto it = g_choices.find(key);
    if (it != g_choices.end()) return it->second.impl;
  }
  // Event timing needs a synchronisation, which a stream under graph capture forbids.
  if (capturing(stream)) return fallback;

  // The timing runs write c several times. beta == 0: c is overwritten by the real run afterwards,
  // so they may go to c itself. beta != 0: they would accumulate into c, so they go to a scratch
  // copy of c instead, placed at the same address modulo 256 as c so that cuBLASLt sees the same
  // alignment (its algorithm choice depends on it) as in the real run.
  void* target = p.c;
  const std::size_t c_bytes =
      static_cast<std::size_t>(p.m) * static_cast<std::size_t>(p.n) * dtype_size(p.c_dtype);
  cuda::detail::Scratch scratch(p.beta != 0.0f ? c_bytes + 256 : 0, stream);
  if (p.beta != 0.0f) {
    const auto base = reinterpret_cast<uintptr_t>(scratch.as<char>());
    const uintptr_t shift = (reinterpret_cast<uintptr_t>(p.c) % 256 + 256 - base % 256) % 256;
    target = scratch.as<char>() + shift;
    CUDA_OPS_CHECK(cudaMemcpyAsync(target, p.c, c_bytes, cudaMemcpyDeviceToDevice, stream));
  }

  GemmChoice choice;
  float best[2] = {1e30f, 1e30f};  // indexed by GemmImpl
  for (int round = 0; round < kRounds; round++) {
    const int warmup = round == 0 ? kWarmupRuns : 0;
    for (const GemmImpl impl : {GemmImpl::Ours, GemmImpl::CublasLt}) {
      const float ms = time_runs(impl, warmup, p, target, stream);
      float& slot = best[static_cast<int>(impl)];
      slot = std::min(slot, ms);
    }
  }
  choice.ours_ms = best[static_cast<int>(GemmImpl::Ours)];
  choice.cublaslt_ms = best[static_cast<int>(GemmImpl::CublasLt)];
  // Ours only where it is strictly faster: on a tie the vendor library is the safer default.
  choice.impl = choice.ours_ms < choice.cublaslt_ms ? GemmImpl::Ours : GemmImpl::CublasLt;

  std::lock_guard<std::mutex> lock(g_mutex);
  // Another thread may have timed the same key meanwhile: the first entry stays, so every caller
  // keeps seeing one answer per key.
  return g_choices.emplace(key, choice).first->second.impl;
}

void gemm_auto(const Problem& p, const GemmEpilogue& epilogue, void* stream) {
  if (p.m == 0 || p.n == 0) return;
  CUDA_OPS_REQUIRE(p.ab == DType::BF16 || p.ab == DType::F16, "gemm_16_auto: a and b must be bf16 or fp16");
  CUDA_OPS_REQUIRE(p.c_dtype == DType::F32 || p.c_dtype == p.ab, "gemm_16_auto: c must be fp32 or a's dtype");
  const GemmMode mode = gemm_mode();  // throws on an invalid PARALLEL_GEMM, also for epilogue calls
  if (epilogue.gelu || p.k == 0 || mode == GemmMode::Ours) {
    gemm_mma(p.ab, p.a, p.ta, p.b, p.tb, p.c, p.c_dtype, p.m, p.n, p.k, p.alpha, p.beta, epilogue, stream);
    return;
  }
  if (epilogue.bias != nullptr) {
    // A bias alone: cuBLASLt's bias epilogue, as the rule sends every call without GeLU (gemm_rule.hpp),
    // in every mode but ours (timing is for calls without an epilogue); our kernel when cuBLASLt has
    // no algorithm for it. Either adds the bias in fp32 before c's one rounding.
    if (cuda::gemm_cublaslt_16_bias(p.ab, p.a, p.ta, p.b, p.tb, p.c, p.c_dtype, p.m, p.n, p.k, p.alpha,
                                    p.beta, epilogue.bias, DType::F32, stream))
      return;
    gemm_mma(p.ab, p.a, p.ta, p.b, p.tb, p.c, p.c_dtype, p.m, p.n, p.k, p.alpha, p.beta, epilogue, stream);
    return;
  }
  if (mode == GemmMode::CublasLt || !gemm_ours_supports(p.m, p.n, p.k)) {
    run(GemmImpl::CublasLt, p, p.c, stream);
    return;
  }
  GemmProblem problem;
  problem.m = p.m;
  problem.n = p.n;
  problem.k = p.k;
  problem.trans_a = p.ta;
  problem.trans_b = p.tb;
  problem.dtype = p.ab;
  problem.c_dtype = p.c_dtype;
  problem.gelu = false;
  problem.arch = current_arch();
  const GemmImpl rule = gemm_rule(problem);
  if (mode == GemmMode::Auto) {
    run(rule, p, p.c, stream);
    return;
  }
  GemmKey key;
  key.device = cuda::detail::current_device();
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.trans_a = p.ta;
  key.trans_b = p.tb;
  key.beta_nonzero = p.beta != 0.0f;
  key.dtype = p.ab;
  key.c_dtype = p.c_dtype;
  const auto s = static_cast<cudaStream_t>(stream);
  run(choose_timed(key, p, s, rule), p, p.c, stream);
}

}  // namespace

GemmMode gemm_mode() {
  // A function-local static: read once; if parsing throws, the next call reads (and throws) again.
  static const GemmMode mode = parse_gemm_mode(std::getenv("PARALLEL_GEMM"));
  return mode;
}

const char* gemm_impl_name(GemmImpl impl) { return impl == GemmImpl::Ours ? "ours" : "cublaslt"; }

int current_arch() {
  // Per device, asked once each: gemm_auto runs on every GEMM call.
  static std::mutex mutex;
  static std::map<int, int> arch_of;
  const int device = cuda::detail::current_device();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = arch_of.find(device);
  if (it == arch_of.end()) {
    int major = 0, minor = 0;
    CUDA_OPS_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_OPS_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    it = arch_of.emplace(device, major * 10 + minor).first;
  }
  return it->second;
}

std::optional<GemmChoice> gemm_choice(const GemmKey& key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_choices.find(key);
  if (it == g_choices.end()) return std::nullopt;
  return it->second;
}

void gemm_bf16_auto(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m, int64_t n,
                    int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream) {
  gemm_auto({DType::BF16, a, trans_a, b, trans_b, c, DType::F32, m, n, k, alpha, beta}, epilogue, stream);
}

void gemm_f16_auto(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
                   int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream) {
  gemm_auto({DType::F16, a, trans_a, b, trans_b, c, DType::F32, m, n, k, alpha, beta}, epilogue, stream);
}

void gemm_16_auto(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                  DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                  const GemmEpilogue& epilogue, void* stream) {
  gemm_auto({ab_dtype, a, trans_a, b, trans_b, c, c_dtype, m, n, k, alpha, beta}, epilogue, stream);
}

}  // namespace parallel::kernels
