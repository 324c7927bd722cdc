#pragma once
// The library's own GEMM for x86-64 CPUs with AVX2 + FMA + F16C and no 16-bit GEMM in oneDNN
// (Zen 2/3, Haswell .. Skylake client): c = alpha op(a) op(b) + beta c (+ bias), every operand
// fp32, bf16 or fp16, accumulated in fp32. ops::gemm runs it for 16-bit operands on such CPUs, and
// for fp32 on those without AVX-512 (gemm.cpp says for which shapes).
//
// GotoBLAS/BLIS layering, plain: a 6 x 16 register-blocked FMA micro-kernel (12 ymm accumulators)
// over packed blocks. op(b) is packed in [kKC x kNC] blocks shared by the threads; op(a) is packed
// per thread in [kMC x kKC] blocks. The threads share the work through counters (packing slivers,
// row blocks), not a static split with barriers. Results do not depend on the thread count or on
// which thread computes what (each element's sum runs in the same order). 16-bit operands are widened to fp32
// inside the packing (bf16: a shift by 16; fp16: F16C), so no operand is ever converted as a pass of its own,
// and a 16-bit c is narrowed once, in the epilogue, by the library's conversion (round to nearest even,
// dtype.hpp).
//
// Use: gemm_avx2_can_implement(p) says whether this CPU and these dtypes are supported;
// gemm_avx2_run(p) runs it on the OpenMP threads (one thread inside a parallel region). Its
// workspace is the calling and team threads' scratch_f32 slots 4 to 7 (widen.hpp), so it allocates
// nothing once the largest shape has run.
#include <cstdint>

#include "parallel/dtype.hpp"

namespace parallel::cpu {

struct GemmAvx2Problem {
  int64_t m = 0, n = 0, k = 0;  // c is [m, n] row-major; op(a) [m, k]; op(b) [k, n]
  const void* a = nullptr;
  DType a_type = DType::F32;
  bool trans_a = false;  // a's storage is [k, m]
  const void* b = nullptr;
  DType b_type = DType::F32;
  bool trans_b = false;  // b's storage is [n, k]
  void* c = nullptr;
  DType c_type = DType::F32;
  float alpha = 1.0f, beta = 0.0f;  // beta == 0: c is not read (it may hold NaN)
  const void* bias = nullptr;       // [n], added after alpha op(a) op(b) + beta c; nullptr: none
  DType bias_type = DType::F32;
};

// The CPU has AVX2, FMA and F16C, every dtype is F32, BF16 or F16, and m, n, k > 0.
bool gemm_avx2_can_implement(const GemmAvx2Problem& p);
void gemm_avx2_run(const GemmAvx2Problem& p);

}  // namespace parallel::cpu
