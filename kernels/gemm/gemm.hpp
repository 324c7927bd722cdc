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

// ---- gemm_dispatch.cu: "ours where faster" -----------------------------------------------------
// The same contract as gemm_bf16 / gemm_f16, computed by our kernel or by cuBLASLt
// (parallel::cuda::gemm_cublaslt_bf16 / _f16, kernels/cuda/kernels.hpp), whichever is faster for the
// problem:
//   - with an epilogue (bias or gelu): ours (cuBLASLt's epilogues are not wired);
//   - k == 0: ours (cuBLASLt rejects k = 0);
//   - otherwise, per GemmKey: the first call with a key times both on the caller's stream and real
//     operands (2 rounds of 2 warm-up + 5 timed runs each, CUDA events; that first call therefore
//     synchronises the stream once) and caches the faster; every call then runs the cached winner.
//     With beta != 0 the timing runs go into a scratch copy of c, so c is updated exactly once. A
//     stream being captured into a CUDA graph cannot be timed: such calls run ours, uncached.
//     Shapes our kernel does not take (a dimension over INT_MAX, m over 65535 tiles) use cuBLASLt.
// PARALLEL_GEMM=ours|cublaslt|auto (read once, at the first call; default auto) forces the choice
// for calls without an epilogue (k == 0 still runs ours). Results of the two differ only in fp32
// summation order.
void gemm_bf16_auto(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m, int64_t n,
                    int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream);
void gemm_f16_auto(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
                   int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream);
// The automatic choice for a, b of ab_dtype (BF16 or F16) and c of c_dtype (F32 or ab_dtype): what
// ops::gemm runs on 16-bit tensors (kernels/cuda/cuda_ops.hpp), the operands read where they lie
// (no conversion). The candidates are gemm_mma and parallel::cuda::gemm_cublaslt_16
// (kernels/cuda/kernels.hpp), timed and cached per GemmKey (c_dtype included) as above.
void gemm_16_auto(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                  DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                  const GemmEpilogue& epilogue, void* stream);

enum class GemmMode : uint8_t { Auto, Ours, CublasLt };
enum class GemmImpl : uint8_t { Ours, CublasLt };

// The choice PARALLEL_GEMM asks for: parse_gemm_mode(getenv("PARALLEL_GEMM")), computed once.
GemmMode gemm_mode();
// "ours" / "cublaslt" / "auto" -> the mode; null or "" -> Auto. Anything else throws
// parallel::Error naming PARALLEL_GEMM and the allowed values.
GemmMode parse_gemm_mode(const char* value);
const char* gemm_impl_name(GemmImpl impl);  // "ours", "cublaslt"

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
// The timed choice made for `key`, or nullopt when none was made (key not seen in auto mode).
std::optional<GemmChoice> gemm_choice(const GemmKey& key);

}  // namespace parallel::kernels
