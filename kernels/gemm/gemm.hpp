#pragma once
// Our own tensor-core GEMM (gemm_mma.cu): bf16 or fp16 inputs, fp32 accumulation and output.
//   c[m, n] = epilogue(alpha * op(a) @ op(b) + beta * c)    (row-major; op(x) = x^T when trans_x)
// with op(a) [m, k], op(b) [k, n]. beta = 1 accumulates (weight gradients into fp32 grads); beta = 0
// never reads c. The epilogue adds bias[n] (optional) then applies tanh-GeLU (optional, the formula
// of ops::gelu_forward); pre_gelu (optional) receives the value before the GeLU, for the backward.
// All four transposition cases; any m, n, k (edges are masked). Device pointers on the current
// device, work on `stream` (a cudaStream_t). Plain C++ (no CUDA or fmt headers). Throws
// parallel::Error on a launch failure.
#include <cstdint>

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

}  // namespace parallel::kernels
