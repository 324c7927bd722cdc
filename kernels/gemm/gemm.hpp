#pragma once
// Our own tensor-core GEMM (gemm_mma.cu): bf16 or fp16 inputs, fp32 accumulation, fp32 output (or
// the inputs' 16-bit type: gemm_mma, gemm_16_auto).
//   c[m, n] = epilogue(alpha * op(a) @ op(b) + beta * c)    (row-major; op(x) = x^T when trans_x)
// with op(a) [m, k], op(b) [k, n]. beta = 1 accumulates (weight gradients into fp32 grads); beta = 0
// never reads c. The epilogue adds bias[n] (optional) then applies tanh-GeLU (optional, the formula
// of ops::gelu_forward); pre_gelu (optional) receives the value before the GeLU, for the backward.
// All four transposition cases; any m, n, k (edges are masked). Device pointers on the current
// device, work on `stream` (a cudaStream_t). Plain C++ (no CUDA or fmt headers). Throws
// parallel::Error on a launch failure.
#include <cstdint>
#include <optional>

#include "gemm_rule.hpp"
#include "parallel/dtype.hpp"

namespace parallel::kernels {

struct GemmEpilogue {
  const float* bias = nullptr;  // [n]
  bool gelu = false;
  float* pre_gelu = nullptr;  // [m, n], written when gelu (the input of the GeLU)
};

void gemm_bf16(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m, int64_t n,
               int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream);
void gemm_f16(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
              int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream);
// The same kernel for a, b of ab_dtype (BF16 or F16) and c of c_dtype: F32, or ab_dtype itself (a
// real 16-bit output: beta c is read in 16 bits, the fp32 result rounded once to nearest even).
void gemm_mma(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
              DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
              const GemmEpilogue& epilogue, void* stream);

// ---- gemm_dispatch.cu: our kernel or cuBLASLt, by a fixed rule -------------------------------
// The same contract as gemm_bf16 / gemm_f16, computed by our kernel or by cuBLASLt
// (parallel::cuda::gemm_cublaslt_bf16 / _f16, kernels/cuda/kernels.hpp). PARALLEL_GEMM (read once,
// at the first call) picks how:
//   auto (default)  gemm_rule (gemm_rule.hpp): a pure function of the shape, dtypes, GeLU epilogue and
//                   the device's compute capability, so every rank and every run choose the same
//                   (the determinism contract of cuda_ops.hpp).
//   ours, cublaslt  that one (a GeLU epilogue or k == 0 always runs ours; a bias alone runs
//                   cuBLASLt's bias epilogue except under ours, and ours where cuBLASLt has no
//                   algorithm for it).
//   timed           measured on request: the first call with a GemmKey times both on the caller's
//                   stream and real operands (2 rounds of 2 warm-up + 5 timed runs each, CUDA
//                   events; that first call therefore synchronises the stream once) and caches the
//                   faster; every call then runs the cached winner. With beta != 0 the timing runs go
//                   into a scratch copy of c, so c is updated exactly once. A stream being captured
//                   into a CUDA graph cannot be timed: such calls run the rule's choice, uncached.
//                   Per process, so ranks may choose differently: the trainer refuses it on more
//                   than one rank. For measuring what the rule should be (bench_cuda_kernels).
// Shapes our kernel does not take (a dimension over INT_MAX, m over 65535 tiles) use cuBLASLt in
// every mode but an epilogue's. Results of the two differ only in fp32 summation order.
void gemm_bf16_auto(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m, int64_t n,
                    int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream);
void gemm_f16_auto(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
                   int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream);
// The same for a, b of ab_dtype (BF16 or F16) and c of c_dtype (F32 or ab_dtype): what ops::gemm runs
// on 16-bit tensors (kernels/cuda/cuda_ops.hpp), the operands read where they lie (no conversion).
// The candidates are gemm_mma and parallel::cuda::gemm_cublaslt_16 (kernels/cuda/kernels.hpp).
void gemm_16_auto(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                  DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                  const GemmEpilogue& epilogue, void* stream);

// The choice PARALLEL_GEMM asks for: parse_gemm_mode(getenv("PARALLEL_GEMM")) (gemm_rule.hpp),
// computed once.
GemmMode gemm_mode();
const char* gemm_impl_name(GemmImpl impl);  // "ours", "cublaslt"
// The compute capability of the current device as major * 10 + minor (gemm_rule's arch).
int current_arch();

// What the automatic choice is cached under. device: the CUDA device current at the call.
struct GemmKey {
  int device = 0;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool beta_nonzero = false;
  DType dtype = DType::BF16;   // of a and b: BF16 or F16
  DType c_dtype = DType::F32;  // of c: F32 or dtype
};
struct GemmChoice {
  GemmImpl impl = GemmImpl::Ours;
  float ours_ms = 0.0f, cublaslt_ms = 0.0f;  // mean time of one run, as measured at the choice
};
// The timed choice made for `key`, or nullopt when none was made (key not seen in timed mode).
std::optional<GemmChoice> gemm_choice(const GemmKey& key);

}  // namespace parallel::kernels
