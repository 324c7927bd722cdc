#pragma once
// Inline PTX wrappers for sm_80+ tensor-core kernels: cp.async (global -> shared without a register
// round trip), ldmatrix (shared -> mma fragments) and mma.sync.m16n8k16 with fp32 accumulators, for
// bf16 or fp16 operands. Internal to kernels/ (not installed); used by the GEMM and attention kernels.
//
// Fragment layouts of mma.sync.aligned.m16n8k16.row.col (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), with g = lane / 4 (the "group", 0..7) and t = lane % 4 (0..3). Every register
// holds two 16-bit elements, the lower column (or k) index in the low half:
//   A (16 x 16, row-major, 4 regs)  a0: (g, 2t..2t+1)      a1: (g + 8, 2t..2t+1)
//                                   a2: (g, 2t+8..2t+9)    a3: (g + 8, 2t+8..2t+9)
//   B (16 x 8, "col", 2 regs)       b0: (k 2t..2t+1, n g)  b1: (k 2t+8..2t+9, n g)
//   C / D (16 x 8, fp32, 4 regs)    c0, c1: (g, 2t), (g, 2t+1)      c2, c3: (g + 8, 2t), (g + 8, 2t+1)
// ldmatrix.x4: lanes 8i .. 8i + 7 give the addresses of the 8 rows (16 bytes each) of 8x8 matrix i,
// and register i of every lane receives matrix i with lane holding (row g, cols 2t, 2t + 1); with
// .trans it receives the transpose, i.e. (rows 2t, 2t + 1, col g) of the matrix as stored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace parallel::cuda::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async --------------------------------------------------------------------------------
// Copies src_bytes (0 or 16) from global memory and zero-fills the rest of the 16-byte chunk.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix --------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- mma.sync --------------------------------------------------------------------------------
// c += a (16x16, row) * b (16x8, col), fp32 accumulators; T is __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or fp16 operands");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- 16-bit conversions ----------------------------------------------------------------------
// Two floats -> one register of two 16-bit values (round to nearest even), lo in the low half:
// the order mma fragments and little-endian memory both expect.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, sizeof(r));
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, sizeof(r));
  }
  return r;
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return __half2float(v);
}

}  // namespace parallel::cuda::mma
