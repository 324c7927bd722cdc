// Scaled dot-product attention in fp32 with FlashAttention-2's algorithm (see ops.hpp for the
// contract and kernels/cpu/attention.cpp for the CPU twin). No [s, s] matrix ever reaches global
// memory: scores live one [Br, Bc] tile at a time in registers and shared memory.
//
// Layouts: q, dq [s, b, hq, d]; k, dk [s, b, hkv, d]; v, dv [s, b, hkv, dv]; out, dout
// [s, b, hq, dv] (query head h reads kv head h / (hq / hkv)); lse [b, hq, s]. Row i of a head is at
// ((i * b + bi) * heads + h) * d (or dv). d is the query/key head size, dv the value head size.
//
// Layering. Every kernel is a 128-thread block seen as a 16 x 8 grid of threads (ty = tid / 8,
// tx = tid % 8):
//   score tile   [Br, Bc] = [16 kR, 32]: thread (ty, tx) owns rows ty + 16 a (a < kR) and columns
//                tx + 8 c (c < 4), a kR x 4 register tile; a row's 32 scores sit in the 8 lanes of
//                one ty, so row max / row sum are 3 xor-shuffles.
//   [rows, d]    accumulators (O, dQ, dK, dV) live in shared memory; thread (ty, tx) owns rows
//                ty + 16 a and columns tx, tx + 8, ...: every element has exactly one owner, so
//                rescaling and accumulating need no synchronisation beyond the tile barriers.
//   tiles        Q / K / V / dO rows are staged in shared memory with a padded row length d + 1
//                (dv + 1 for V, dO and the [rows, dv] accumulators),
//                so the 4 (or 8) different rows a warp reads in one step fall into distinct banks.
//
//   forward      one block per (query block, b * hq + h): K/V tiles stream through shared memory,
//                online softmax (running max m, running sum l per row), O rescaled in place.
//   backward     D = rowsum(dO * O) first (one warp per row). Then two passes, both deterministic:
//                dK/dV: one block per (key block, b * hkv + hk), looping over the query heads of
//                the group and all query blocks: P = exp(scale S - lse), dP = dO V^T,
//                dS = scale P (dP - D); dV += P^T dO, dK += dS^T Q; written once at the end.
//                dQ: one block per (query block, b * hq + h) recomputing P and dS per key tile:
//                dQ += dS K. Two more tile products than an atomicAdd dQ, but no float atomics,
//                so the gradients are bit-identical run to run.
//   masking      AttentionBounds (parallel/attention_mask.hpp) in row indices (attention_tiles.hpp):
//                query row i sees key rows [first_key(i), i + diagonal] (all of them without
//                causal). A query tile loops over key tiles from the one holding the first key its
//                first row sees to the one holding the last key its last row sees (keys_seen); a
//                key tile of the dK/dV pass over the query tiles of queries_seeing. Inside those
//                tiles each element is tested against its row's first key (staged in shared
//                memory, sLo) and the diagonal. A row that sees nothing: out 0, lse -inf.
// fp32 CUDA cores, not tensor cores: correct and simple; the bf16 tensor-core version comes later.
#include <cmath>

#include "attention/attention_launch.hpp"
#include "attention/attention_tiles.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kBc = 32;  // keys per tile

struct Dims {
  int s, b, hq, hkv, d, dv, group;
  int bh0;  // the (batch, head) pair of blockIdx.y == 0: launches cover at most kMaxGridY pairs each
  // Between consecutive positions of one head: q, dq (q_stride); k, dk (k_stride); v, dv
  // (v_stride); out, dout (o_stride).
  int64_t q_stride, k_stride, v_stride, o_stride;
  AttentionBounds mask;
  int diag;  // causal: key j is masked for query i when j > i + diag (causal_diagonal)
  float scale;
};

// smem[r * lds + c] = g[r * gstride + c] for r < valid, 0 for valid <= r < rows.
__device__ __forceinline__ void load_rows(float* smem, int lds, const float* g, int64_t gstride, int rows,
                                          int valid, int d) {
  for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
    const int r = idx / d, c = idx % d;
    smem[r * lds + c] = r < valid ? g[r * gstride + c] : 0.0f;
  }
}

// Zeroes this thread's elements of a [rows, d] accumulator (rows ty + 16 a, columns tx + 8 c).
template <int kRows>
__device__ __forceinline__ void zero_owned(float* acc, int ld, int d, int ty, int tx) {
#pragma unroll
  for (int a = 0; a < kRows; a++)
    for (int c = tx; c < d; c += 8) acc[(ty + 16 * a) * ld + c] = 0.0f;
}

// s[a][c] = sum_k A[ty + 16 a][k] * B[tx + 8 c][k] (both tiles with row length ld).
template <int kR>
__device__ __forceinline__ void tile_abt(const float* A, const float* B, int ld, int d, int ty, int tx,
                                         float (&s)[kR][4]) {
#pragma unroll
  for (int a = 0; a < kR; a++)
#pragma unroll
    for (int c = 0; c < 4; c++) s[a][c] = 0.0f;
  for (int k = 0; k < d; k++) {
    float av[kR], bv[4];
#pragma unroll
    for (int a = 0; a < kR; a++) av[a] = A[(ty + 16 * a) * ld + k];
#pragma unroll
    for (int c = 0; c < 4; c++) bv[c] = B[(tx + 8 * c) * ld + k];
#pragma unroll
    for (int a = 0; a < kR; a++)
#pragma unroll
      for (int c = 0; c < 4; c++) s[a][c] = fmaf(av[a], bv[c], s[a][c]);
  }
}

// Sum / max over the 8 lanes of one ty (lanes 8 q .. 8 q + 7 of a warp).
__device__ __forceinline__ float row8_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
}
__device__ __forceinline__ float row8_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

// lo: query i's first visible key (first_key; 0 without causal).
__device__ __forceinline__ bool masked(const Dims& x, int i, int j, int lo) {
  return i >= x.s || j >= x.s || (x.mask.causal && (j > i + x.diag || j < lo));
}

// sLo[r] = first_key of query row i0 + r for the rows of a tile (0 past s).
__device__ __forceinline__ void load_first_keys(int* sLo, const Dims& x, int bi, int i0, int rows) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x)
    sLo[r] = i0 + r < x.s ? static_cast<int>(first_key(x.mask, bi, i0 + r)) : 0;
}

// ---- forward ---------------------------------------------------------------------------------
template <int kR>
__global__ void __launch_bounds__(kAttnThreads)
    attn_fwd_kernel(const float* q, const float* k, const float* v, float* out, float* lse, const Dims x) {
  constexpr int kBr = 16 * kR;
  extern __shared__ float smem[];
  const int ld = x.d + 1, ldv = x.dv + 1, ldp = kBc + 1;
  float* sQ = smem;                                   // [Br, ld]
  float* sK = sQ + kBr * ld;                          // [Bc, ld]
  float* sV = sK + kBc * ld;                          // [Bc, ldv]
  float* sP = sV + kBc * ldv;                         // [Br, Bc + 1]
  float* sO = sP + kBr * ldp;                         // [Br, ldv]
  int* sLo = reinterpret_cast<int*>(sO + kBr * ldv);  // [Br]
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int i0 = blockIdx.x * kBr;
  const int bh = x.bh0 + static_cast<int>(blockIdx.y);
  const int bi = bh / x.hq, h = bh % x.hq, hk = h / x.group;
  const float* q_head = q + (static_cast<int64_t>(bi) * x.hq + h) * x.d;
  const float* k_head = k + (static_cast<int64_t>(bi) * x.hkv + hk) * x.d;
  const float* v_head = v + (static_cast<int64_t>(bi) * x.hkv + hk) * x.dv;

  load_rows(sQ, ld, q_head + i0 * x.q_stride, x.q_stride, kBr, min(kBr, x.s - i0), x.d);
  load_first_keys(sLo, x, bi, i0, kBr);
  zero_owned<kR>(sO, ldv, x.dv, ty, tx);
  float m[kR], l[kR];
#pragma unroll
  for (int a = 0; a < kR; a++) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
  }

  // Only the key tiles some row of the block sees (all of them without causal).
  const RowRange keys = keys_seen(x.mask, bi, i0, min(x.s, i0 + kBr), x.s);
  const int key_end = static_cast<int>(keys.end);
  for (int j0 = static_cast<int>(keys.begin) / kBc * kBc; j0 < key_end; j0 += kBc) {
    __syncthreads();  // the previous tile's sK, sV, sP are no longer read
    const int valid = min(kBc, x.s - j0);
    load_rows(sK, ld, k_head + j0 * x.k_stride, x.k_stride, kBc, valid, x.d);
    load_rows(sV, ldv, v_head + j0 * x.v_stride, x.v_stride, kBc, valid, x.dv);
    __syncthreads();

    float s[kR][4];
    tile_abt<kR>(sQ, sK, ld, x.d, ty, tx, s);
#pragma unroll
    for (int a = 0; a < kR; a++) {
      const int row = ty + 16 * a, i = i0 + row;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; c++) {
        s[a][c] = masked(x, i, j0 + tx + 8 * c, sLo[row]) ? -INFINITY : s[a][c] * x.scale;
        mx = fmaxf(mx, s[a][c]);
      }
      const float m_new = fmaxf(m[a], row8_max(mx));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const float p = expf(s[a][c] - m_use);  // exp(-inf) = 0 for masked entries
        sP[row * ldp + tx + 8 * c] = p;
        sum += p;
      }
      const float corr = expf(m[a] - m_use);  // 0 on the first visible tile (m = -inf)
      l[a] = l[a] * corr + row8_sum(sum);
      m[a] = m_new;
      for (int c = tx; c < x.dv; c += 8) sO[row * ldv + c] *= corr;
    }
    __syncthreads();  // sP complete

    // O += P V on the owned elements.
#pragma unroll
    for (int a = 0; a < kR; a++) {
      const int row = ty + 16 * a;
      for (int c = tx; c < x.dv; c += 8) {
        float acc = sO[row * ldv + c];
        for (int j = 0; j < kBc; j++) acc = fmaf(sP[row * ldp + j], sV[j * ldv + c], acc);
        sO[row * ldv + c] = acc;
      }
    }
  }

#pragma unroll
  for (int a = 0; a < kR; a++) {
    const int row = ty + 16 * a, i = i0 + row;
    if (i >= x.s) continue;
    const float inv_l = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;
    float* o = out + i * x.o_stride + (static_cast<int64_t>(bi) * x.hq + h) * x.dv;
    for (int c = tx; c < x.dv; c += 8) o[c] = sO[row * ldv + c] * inv_l;
    if (tx == 0)
      lse[(static_cast<int64_t>(bi) * x.hq + h) * x.s + i] = l[a] > 0.0f ? m[a] + logf(l[a]) : -INFINITY;
  }
}

// ---- backward --------------------------------------------------------------------------------
// Dv[(bi * hq + h) * s + i] = sum_c dO[i, c] * O[i, c]; one warp per row.
__global__ void attn_bwd_dot_kernel(const float* dout, const float* out, float* Dv, const Dims x) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(x.b) * x.hq * x.s;
  if (row >= rows) return;
  const int64_t i = row % x.s, bh = row / x.s;  // bh = bi * hq + h
  const int64_t base = i * x.o_stride + bh * x.dv;
  float sum = 0.0f;
  for (int c = lane; c < x.dv; c += 32) sum += dout[base + c] * out[base + c];
  sum = cuda::detail::warp_sum(sum);
  if (lane == 0) Dv[row] = sum;
}

// Scores of one [Br, Bc] tile: p = exp(scale S - lse) (0 where masked) and ds = scale p (dp - D).
// sQ, sK have rows of ld (d values), sdO, sV rows of ldv (dv values).
template <int kR>
__device__ __forceinline__ void probs_and_dscores(const Dims& x, const float* sQ, const float* sK,
                                                  const float* sdO, const float* sV, const float* sL,
                                                  const float* sD, const int* sLo, int ld, int ldv, int i0,
                                                  int j0, int ty, int tx, float (&p)[kR][4],
                                                  float (&ds)[kR][4]) {
  tile_abt<kR>(sQ, sK, ld, x.d, ty, tx, p);
  tile_abt<kR>(sdO, sV, ldv, x.dv, ty, tx, ds);  // dP
#pragma unroll
  for (int a = 0; a < kR; a++) {
    const int row = ty + 16 * a;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const bool mk = masked(x, i0 + row, j0 + tx + 8 * c, sLo[row]);
      p[a][c] = mk ? 0.0f : expf(x.scale * p[a][c] - sL[row]);
      ds[a][c] = x.scale * p[a][c] * (ds[a][c] - sD[row]);
    }
  }
}

template <int kR>
__global__ void __launch_bounds__(kAttnThreads)
    attn_bwd_dkdv_kernel(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                         const float* Dv, float* dk, float* dv, const Dims x) {
  constexpr int kBr = 16 * kR;
  extern __shared__ float smem[];
  const int ld = x.d + 1, ldv = x.dv + 1, ldp = kBc + 1;
  float* sK = smem;                             // [Bc, ld]
  float* sV = sK + kBc * ld;                    // [Bc, ldv]
  float* sdK = sV + kBc * ldv;                  // [Bc, ld]
  float* sdV = sdK + kBc * ld;                  // [Bc, ldv]
  float* sQ = sdV + kBc * ldv;                  // [Br, ld]
  float* sdO = sQ + kBr * ld;                   // [Br, ldv]
  float* sP = sdO + kBr * ldv;                  // [Br, Bc + 1]
  float* sdS = sP + kBr * ldp;                  // [Br, Bc + 1]
  float* sL = sdS + kBr * ldp;                  // [Br]
  float* sD = sL + kBr;                         // [Br]
  int* sLo = reinterpret_cast<int*>(sD + kBr);  // [Br]
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int j0 = blockIdx.x * kBc;
  const int bh = x.bh0 + static_cast<int>(blockIdx.y);
  const int bi = bh / x.hkv, hk = bh % x.hkv;
  const int64_t k_off = (static_cast<int64_t>(bi) * x.hkv + hk) * x.d;
  const int64_t v_off = (static_cast<int64_t>(bi) * x.hkv + hk) * x.dv;

  load_rows(sK, ld, k + k_off + j0 * x.k_stride, x.k_stride, kBc, min(kBc, x.s - j0), x.d);
  load_rows(sV, ldv, v + v_off + j0 * x.v_stride, x.v_stride, kBc, min(kBc, x.s - j0), x.dv);
  zero_owned<2>(sdK, ld, x.d, ty, tx);  // Bc = 32 = 2 x 16 key rows
  zero_owned<2>(sdV, ldv, x.dv, ty, tx);

  for (int h = hk * x.group; h < (hk + 1) * x.group; h++) {
    const int64_t q_off = (static_cast<int64_t>(bi) * x.hq + h) * x.d;
    const int64_t o_off = (static_cast<int64_t>(bi) * x.hq + h) * x.dv;
    const float* lse_h = lse + (static_cast<int64_t>(bi) * x.hq + h) * x.s;
    const float* D_h = Dv + (static_cast<int64_t>(bi) * x.hq + h) * x.s;
    // Only the query tiles with a row that sees one of these keys.
    const RowRange rows = queries_seeing(x.mask, bi, j0, min(x.s, j0 + kBc), x.s);
    for (int i0 = static_cast<int>(rows.begin) / kBr * kBr; i0 < static_cast<int>(rows.end); i0 += kBr) {
      __syncthreads();  // previous sQ, sdO, sP, sdS no longer read (and sK, sV loaded, first time)
      const int valid = min(kBr, x.s - i0);
      load_rows(sQ, ld, q + q_off + i0 * x.q_stride, x.q_stride, kBr, valid, x.d);
      load_rows(sdO, ldv, dout + o_off + i0 * x.o_stride, x.o_stride, kBr, valid, x.dv);
      for (int r = threadIdx.x; r < kBr; r += blockDim.x) {
        sL[r] = r < valid ? lse_h[i0 + r] : 0.0f;
        sD[r] = r < valid ? D_h[i0 + r] : 0.0f;
      }
      load_first_keys(sLo, x, bi, i0, kBr);
      __syncthreads();

      float p[kR][4], ds[kR][4];
      probs_and_dscores<kR>(x, sQ, sK, sdO, sV, sL, sD, sLo, ld, ldv, i0, j0, ty, tx, p, ds);
#pragma unroll
      for (int a = 0; a < kR; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          sP[(ty + 16 * a) * ldp + tx + 8 * c] = p[a][c];
          sdS[(ty + 16 * a) * ldp + tx + 8 * c] = ds[a][c];
        }
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q on the owned key rows.
#pragma unroll
      for (int a = 0; a < 2; a++) {
        const int kr = ty + 16 * a;
        for (int c = tx; c < x.dv; c += 8) {
          float acc_v = sdV[kr * ldv + c];
          for (int i = 0; i < kBr; i++) acc_v = fmaf(sP[i * ldp + kr], sdO[i * ldv + c], acc_v);
          sdV[kr * ldv + c] = acc_v;
        }
        for (int c = tx; c < x.d; c += 8) {
          float acc_k = sdK[kr * ld + c];
          for (int i = 0; i < kBr; i++) acc_k = fmaf(sdS[i * ldp + kr], sQ[i * ld + c], acc_k);
          sdK[kr * ld + c] = acc_k;
        }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < 2; a++) {
    const int kr = ty + 16 * a, j = j0 + kr;
    if (j >= x.s) continue;
    for (int c = tx; c < x.d; c += 8) dk[j * x.k_stride + k_off + c] = sdK[kr * ld + c];
    for (int c = tx; c < x.dv; c += 8) dv[j * x.v_stride + v_off + c] = sdV[kr * ldv + c];
  }
}

template <int kR>
__global__ void __launch_bounds__(kAttnThreads)
    attn_bwd_dq_kernel(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                       const float* Dv, float* dq, const Dims x) {
  constexpr int kBr = 16 * kR;
  extern __shared__ float smem[];
  const int ld = x.d + 1, ldv = x.dv + 1, ldp = kBc + 1;
  float* sQ = smem;                             // [Br, ld]
  float* sdO = sQ + kBr * ld;                   // [Br, ldv]
  float* sdQ = sdO + kBr * ldv;                 // [Br, ld]
  float* sK = sdQ + kBr * ld;                   // [Bc, ld]
  float* sV = sK + kBc * ld;                    // [Bc, ldv]
  float* sdS = sV + kBc * ldv;                  // [Br, Bc + 1]
  float* sL = sdS + kBr * ldp;                  // [Br]
  float* sD = sL + kBr;                         // [Br]
  int* sLo = reinterpret_cast<int*>(sD + kBr);  // [Br]
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int i0 = blockIdx.x * kBr;
  const int bh = x.bh0 + static_cast<int>(blockIdx.y);
  const int bi = bh / x.hq, h = bh % x.hq, hk = h / x.group;
  const int64_t q_off = (static_cast<int64_t>(bi) * x.hq + h) * x.d;
  const int64_t o_off = (static_cast<int64_t>(bi) * x.hq + h) * x.dv;
  const int64_t k_off = (static_cast<int64_t>(bi) * x.hkv + hk) * x.d;
  const int64_t v_off = (static_cast<int64_t>(bi) * x.hkv + hk) * x.dv;
  const int valid_q = min(kBr, x.s - i0);

  load_rows(sQ, ld, q + q_off + i0 * x.q_stride, x.q_stride, kBr, valid_q, x.d);
  load_rows(sdO, ldv, dout + o_off + i0 * x.o_stride, x.o_stride, kBr, valid_q, x.dv);
  for (int r = threadIdx.x; r < kBr; r += blockDim.x) {
    sL[r] = r < valid_q ? lse[(static_cast<int64_t>(bi) * x.hq + h) * x.s + i0 + r] : 0.0f;
    sD[r] = r < valid_q ? Dv[(static_cast<int64_t>(bi) * x.hq + h) * x.s + i0 + r] : 0.0f;
  }
  zero_owned<kR>(sdQ, ld, x.d, ty, tx);
  load_first_keys(sLo, x, bi, i0, kBr);

  const RowRange keys = keys_seen(x.mask, bi, i0, min(x.s, i0 + kBr), x.s);
  const int key_end = static_cast<int>(keys.end);
  for (int j0 = static_cast<int>(keys.begin) / kBc * kBc; j0 < key_end; j0 += kBc) {
    __syncthreads();
    const int valid = min(kBc, x.s - j0);
    load_rows(sK, ld, k + k_off + j0 * x.k_stride, x.k_stride, kBc, valid, x.d);
    load_rows(sV, ldv, v + v_off + j0 * x.v_stride, x.v_stride, kBc, valid, x.dv);
    __syncthreads();

    float p[kR][4], ds[kR][4];
    probs_and_dscores<kR>(x, sQ, sK, sdO, sV, sL, sD, sLo, ld, ldv, i0, j0, ty, tx, p, ds);
#pragma unroll
    for (int a = 0; a < kR; a++)
#pragma unroll
      for (int c = 0; c < 4; c++) sdS[(ty + 16 * a) * ldp + tx + 8 * c] = ds[a][c];
    __syncthreads();

    // dQ += dS K on the owned elements.
#pragma unroll
    for (int a = 0; a < kR; a++) {
      const int row = ty + 16 * a;
      for (int c = tx; c < x.d; c += 8) {
        float acc = sdQ[row * ld + c];
        for (int j = 0; j < kBc; j++) acc = fmaf(sdS[row * ldp + j], sK[j * ld + c], acc);
        sdQ[row * ld + c] = acc;
      }
    }
  }

#pragma unroll
  for (int a = 0; a < kR; a++) {
    const int row = ty + 16 * a, i = i0 + row;
    if (i >= x.s) continue;
    float* g = dq + i * x.q_stride + q_off;
    for (int c = tx; c < x.d; c += 8) g[c] = sdQ[row * ld + c];
  }
}

// ---- host side -------------------------------------------------------------------------------
Dims make_dims(const AttentionShape& sh, const AttentionBounds& mask, float scale) {
  const char* why = attention_bounds_error(mask);
  if (why != nullptr) throw_error(__FILE__, __LINE__, why);
  CUDA_OPS_REQUIRE(
      sh.s < (int64_t{1} << 31) && sh.d <= 256 && sh.value_dim() <= 256 && sh.hkv > 0 && sh.hq % sh.hkv == 0,
      "attention: unsupported shape (d, dv <= 256, hq a multiple of hkv)");
  CUDA_OPS_REQUIRE(sh.b * sh.hq < (int64_t{1} << 31),
                   "attention: b * hq = " + std::to_string(sh.b * sh.hq) + " (batch x heads) must be < 2^31");
  Dims x;
  x.bh0 = 0;
  x.s = static_cast<int>(sh.s);
  x.b = static_cast<int>(sh.b);
  x.hq = static_cast<int>(sh.hq);
  x.hkv = static_cast<int>(sh.hkv);
  x.d = static_cast<int>(sh.d);
  x.dv = static_cast<int>(sh.value_dim());
  x.group = x.hq / x.hkv;
  x.q_stride = sh.b * sh.hq * sh.d;
  x.k_stride = sh.b * sh.hkv * sh.d;
  x.v_stride = sh.b * sh.hkv * x.dv;
  x.o_stride = sh.b * sh.hq * x.dv;
  x.mask = mask;
  x.diag = static_cast<int>(causal_diagonal(mask, sh.s));
  x.scale = scale;
  return x;
}

int max_smem_optin() {
  int v = 0;
  CUDA_OPS_CHECK(
      cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, cuda::detail::current_device()));
  return v;
}

// Bytes of shared memory per kernel for a query tile of Br rows (the kernels' layouts above).
std::size_t fwd_smem(int br, int d, int dv) {
  return sizeof(float) *
         (br * (d + 1) + br * (dv + 1) + kBc * (d + 1) + kBc * (dv + 1) + br * (kBc + 1) + br);
}
std::size_t dkdv_smem(int br, int d, int dv) {
  return sizeof(float) * (2 * kBc * (d + 1) + 2 * kBc * (dv + 1) + br * (d + 1) + br * (dv + 1) +
                          2 * br * (kBc + 1) + 3 * br);
}
std::size_t dq_smem(int br, int d, int dv) {
  return sizeof(float) *
         (2 * br * (d + 1) + br * (dv + 1) + kBc * (d + 1) + kBc * (dv + 1) + br * (kBc + 1) + 3 * br);
}

// Launches kernel<4> (64-row query tiles) when its shared memory fits, else kernel<2> (32 rows),
// over `pairs` (batch, head) pairs on grid.y: one launch per chunk of at most kMaxGridY pairs
// (grid_y_chunks), each told its first pair in x.bh0. The kernels' last argument is the Dims.
template <typename K4, typename K2, typename Size, typename... Args>
void launch_tiled(K4 k4, K2 k2, Size smem_of, unsigned grid_x_rows_of_64, unsigned grid_x_rows_of_32,
                  int64_t pairs, cudaStream_t stream, Dims x, Args... args) {
  const int limit = max_smem_optin();
  const std::size_t s4 = smem_of(64, x.d, x.dv), s2 = smem_of(32, x.d, x.dv);
  const bool tall = s4 <= static_cast<std::size_t>(limit);
  if (tall) {
    CUDA_OPS_CHECK(
        cudaFuncSetAttribute(k4, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s4)));
  } else {
    CUDA_OPS_REQUIRE(s2 <= static_cast<std::size_t>(limit),
                     "attention: head dimensions " + std::to_string(x.d) + " (qk), " + std::to_string(x.dv) +
                         " (v) need " + std::to_string(s2) + " bytes of shared memory, the device allows " +
                         std::to_string(limit));
    CUDA_OPS_CHECK(
        cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s2)));
  }
  for (const GridChunk& chunk : grid_y_chunks(pairs)) {
    x.bh0 = static_cast<int>(chunk.first);
    const auto grid_y = static_cast<unsigned>(chunk.count);
    if (tall)
      k4<<<dim3(grid_x_rows_of_64, grid_y), kAttnThreads, s4, stream>>>(args..., x);
    else
      k2<<<dim3(grid_x_rows_of_32, grid_y), kAttnThreads, s2, stream>>>(args..., x);
    CUDA_OPS_LAUNCHED();
  }
}

unsigned blocks_of(int s, int rows) { return static_cast<unsigned>((s + rows - 1) / rows); }

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       const AttentionShape& shape, const AttentionBounds& mask, float softmax_scale,
                       stream_t stream) {
  const Dims x = make_dims(shape, mask, softmax_scale);
  if (x.s == 0 || x.b == 0 || x.hq == 0) return;
  launch_tiled(attn_fwd_kernel<4>, attn_fwd_kernel<2>, fwd_smem, blocks_of(x.s, 64), blocks_of(x.s, 32),
               int64_t{x.b} * x.hq, static_cast<cudaStream_t>(stream), x, q, k, v, out, lse);
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, float* dq, float* dk, float* dv, const AttentionShape& shape,
                        const AttentionBounds& mask, float softmax_scale, stream_t stream) {
  const Dims x = make_dims(shape, mask, softmax_scale);
  if (x.s == 0 || x.b == 0 || x.hq == 0) return;
  const auto cs = static_cast<cudaStream_t>(stream);
  const int64_t rows = static_cast<int64_t>(x.b) * x.hq * x.s;
  cuda::detail::Scratch Dv(static_cast<std::size_t>(rows) * sizeof(float), cs);
  attn_bwd_dot_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, cs>>>(dout, out, Dv.as<float>(), x);
  CUDA_OPS_LAUNCHED();
  // dK, dV: one block per key tile of 32 (grid x is the same for both tile heights).
  launch_tiled(attn_bwd_dkdv_kernel<4>, attn_bwd_dkdv_kernel<2>, dkdv_smem, blocks_of(x.s, kBc),
               blocks_of(x.s, kBc), int64_t{x.b} * x.hkv, cs, x, dout, q, k, v, lse,
               static_cast<const float*>(Dv.as<float>()), dk, dv);
  launch_tiled(attn_bwd_dq_kernel<4>, attn_bwd_dq_kernel<2>, dq_smem, blocks_of(x.s, 64), blocks_of(x.s, 32),
               int64_t{x.b} * x.hq, cs, x, dout, q, k, v, lse, static_cast<const float*>(Dv.as<float>()), dq);
}

}  // namespace parallel::kernels
