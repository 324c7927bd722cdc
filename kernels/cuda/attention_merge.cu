// ops::attention_merge on the GPU (contract in ops.hpp; the CPU kernel is
// kernels/cpu/attention_merge.cpp, the same formulas in fp32). One warp per query row (sample, head,
// position): every lane computes the row's weights from the two lse values, the lanes stride over
// the head dimension, lane 0 stores the new lse. Rows are independent, so no atomics and no order
// to fix: the result is deterministic. The exp/log are CUDA's fp32 expf/logf, so the values agree
// with the CPU's to a few fp32 ulps, not bit for bit. UNVERIFIED ON A GPU (2026-11).
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::to_f32;

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void attention_merge_kernel(float* __restrict__ out_acc, float* __restrict__ lse_acc,
                                       const T* __restrict__ out_blk, const float* __restrict__ lse_blk,
                                       int64_t S, int64_t b, int64_t h, int64_t d, int64_t n, int64_t q0) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= b * h * n) return;  // a whole warp leaves together: row is uniform across it
  const int64_t bh = row / n, t = row % n, bi = bh / h, hi = bh % h;
  float* la_ptr = lse_acc + bh * S + q0 + t;
  const float la = *la_ptr, lb = lse_blk[bh * n + t];
  if (lb == -INFINITY) return;  // the block masked every key of this row
  float wa = 0.0f, wb = 1.0f, l_new = lb;
  if (la != -INFINITY) {
    const float m = fmaxf(la, lb);
    l_new = m + logf(expf(la - m) + expf(lb - m));
    wa = expf(la - l_new);
    wb = expf(lb - l_new);
  }
  float* acc = out_acc + (((q0 + t) * b + bi) * h + hi) * d;
  const T* blk = out_blk + ((t * b + bi) * h + hi) * d;
  for (int64_t e = lane; e < d; e += 32) acc[e] = wa * acc[e] + wb * to_f32(blk[e]);
  __syncwarp();  // every lane has read la before lane 0 overwrites it
  if (lane == 0) *la_ptr = l_new;
}

}  // namespace

void attention_merge(float* out_acc, float* lse_acc, const void* out_blk, DType dtype, const float* lse_blk,
                     int64_t S, int64_t b, int64_t h, int64_t d, int64_t n, int64_t q0, stream_t stream) {
  const int64_t rows = b * h * n;
  if (rows == 0) return;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  CUDA_OPS_REQUIRE(blocks <= 0x7fffffff, "attention_merge: too many rows for one grid");
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    attention_merge_kernel<T>
        <<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream)>>>(
            out_acc, lse_acc, static_cast<const T*>(out_blk), lse_blk, S, b, h, d, n, q0);
  });
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
