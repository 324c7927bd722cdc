// FlashAttention-2 forward and backward on tensor cores, bf16 / fp16 inputs with fp32 accumulation
// (mma.sync.m16n8k16, sm_80+). See flash_attention_mma.hpp for the contract; the algorithm is the
// one of the fp32 kernel (flash_attention.cu), the arithmetic is FA2's.
//
// Layouts: q, out, dout, dq [s, b, hq, d]; k, v, dk, dv [s, b, hkv, d]; lse [b, hq, s]. Row i of
// head (bi, h) starts at element i * (b * heads * d) + (bi * heads + h) * d; its d values are
// contiguous (128 or 256 bytes), so every tile row is a whole number of 16-byte chunks.
//
// ---- Layering (every kernel: 128 threads = 4 warps) ---------------------------------------------
//   block   owns a tile of rows of one head (query rows in the forward and the dQ pass, key rows in
//           the dK/dV pass) and streams the other side's tiles through shared memory with cp.async.
//   warp    owns 16 * kM consecutive rows of the block's tile, as kM m16 tiles. Everything a warp
//           computes about its rows (scores, softmax statistics, accumulators) stays in its
//           registers; the only cross-warp sharing is the streamed tiles, so the block needs
//           barriers only around tile loads.
//   thread  holds mma fragments (layouts in cuda/mma.cuh): in an m16 x n8 accumulator, lane
//           (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t and 2t + 1.
//
// ---- Shared-memory tiles ----------------------------------------------------------------------
// A tile is [rows][D] in the 16-bit type (D = 64 or 128: 8 or 16 chunks of 16 bytes per row),
// stored with an XOR swizzle on 16-byte chunks: chunk c of row r lives at chunk c ^ (r & 7). A row
// is 128 or 256 bytes, i.e. it starts at bank 0, so without the swizzle the 8 rows one ldmatrix
// phase reads (same chunk, 8 consecutive rows) would all hit the same 4 banks (8-way conflict);
// with it they hit 8 distinct 16-byte bank groups. cp.async writes and the epilogue's 4-byte
// writes of (row g, columns 8n + 2t) are conflict-free for the same reason.
//
// ---- The three matrix products, as warp-level helpers -------------------------------------------
//   warp_gemm_nt   acc[rows, n] += A[rows, :D] . B[n, :D]^T    A, B both [rows][D] tiles in smem,
//                  both read with plain ldmatrix (A row-major, B "col" = its rows are the n index).
//                  Used for S = Q K^T, dP = dO V^T (forward, dQ pass) and S^T = K Q^T,
//                  dP^T = V dO^T (dK/dV pass).
//   warp_gemm_rn   acc[rows, :D] += P[rows, k] . B[k, :D]      P from registers (an accumulator
//                  converted to 16-bit A fragments, FA2's trick: P never touches shared memory),
//                  B a [k][D] tile read with ldmatrix.trans. Used for O += P V, dQ += dS K,
//                  dV += P^T dO, dK += dS^T Q.
// The dK/dV pass computes the *transposed* scores (keys as rows), so that P^T and dS^T are already
// in the A-operand layout: no shared-memory transpose, no P / dS tile in shared memory at all.
//
// ---- Kernels --------------------------------------------------------------------------------------
//   forward   one block per (64 kM query rows, b * hq + h); warps own 16 kM rows (kM = 2 for
//             d = 64, 1 for d = 128, see FwdCfg). K and V tiles of 64 keys stream through
//             single buffers, overlapped as in FA2: V(j) loads
//             while S(j) = Q K(j)^T and the softmax run, K(j + 1) loads while O += P V(j). Online
//             softmax in the log2 domain (x = scale * log2(e) * s, exp2), row statistics m (max)
//             and l (sum) per row, l reduced over the 4 lanes of a row only at the end. The output
//             goes back through the warp's own rows of the Q tile for 16-byte coalesced stores.
//   backward  three deterministic kernels, no atomics (the scheme of flash_attention.cu):
//             delta   D[i] = rowsum(dO[i] * O[i]) in fp32 (one warp per row).
//             dK/dV   one block per (64 keys, b * hkv + hk), warps own 16 keys; loops over the
//                     query heads of the group and their query tiles (double-buffered cp.async):
//                     S^T, dP^T, P^T = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - D),
//                     dV += P^T dO, dK += dS^T Q; dK scaled by softmax_scale at the end.
//             dQ      one block per (64 query rows, b * hq + h), warps own 16 rows; loops over key
//                     tiles (double-buffered): S, dP, P, dS as above, dQ += dS K; scaled at the end.
//             7 tile products per (query, key) tile pair instead of FA2's 5 (S and dP are
//             computed twice), in exchange for no fp32 atomics and no dQ workspace: gradients are
//             bit-identical from run to run and written directly in the 16-bit type.
//
// ---- Masking ------------------------------------------------------------------------------------
// AttentionBounds (parallel/attention_mask.hpp) in row indices (attention_tiles.hpp): query row i
// sees key rows [first_key(i), i + diag] with diag = q_pos0 - k_pos0 (every key without causal).
// Three instantiations: no mask; causal only (kCausal); causal with a window or documents (kCausal
// and kLo: each row's first key, in registers for the rows a thread owns, in shared memory for the
// dK/dV pass's query columns). Loop bounds skip the tiles no row of the block sees: a query block
// runs over the key tiles of keys_seen, a key block over the query tiles of queries_seeing, so a
// window costs O(s * window) and packed documents the sum of their squared lengths. Tiles are
// zero-filled past s (cp.async src-size 0). A warp evaluates the per-element mask only when its
// part of the tile can contain a masked element (keys or query rows past s, the diagonal, or a
// row's first key); masked scores become -inf before the max (forward) or P = 0 (backward). A row
// that sees no key gets out = 0 and lse = -inf.
//
// Resources (ptxas -v, CUDA 13, identical for bf16 and fp16; 0 bytes of spills in all 80
// instantiations, sm_80 and sm_90: 3 masks x 3 kernels x 2 head dims x 2 types, plus delta),
// registers per thread / dynamic shared memory per block:
//   forward  d = 64: 232-255 / 32 KiB (2 blocks per SM)    d = 128: 168-206 / 48 KiB (3 blocks per SM)
//   dK/dV    d = 64: 178-226 / 49.5 KiB (2)                d = 128: 239-245 / 64.75 KiB (2)
//   dQ       d = 64: 166-168 / 48 KiB (3)                  d = 128: 164-168 / 64 KiB (3)
//   delta    18-19 registers, no shared memory.
// (Blocks per SM as limited by registers, 64 K per SM. Shared memory allows as many on an H100;
// on an A100, 164 KiB per SM, the dQ kernel at d = 128 fits 2.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <string>
#include <type_traits>

#include "attention/attention_tiles.hpp"
#include "attention/flash_attention_mma.hpp"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

namespace parallel::kernels {
namespace {

namespace mma = cuda::mma;

constexpr int kFaThreads = 128;
constexpr int kFaWarps = kFaThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// Tile configurations. kM: m16 tiles per warp (rows per warp = 16 kM, per block = 64 kM). The
// choices are the largest tiles that compile without register spills (ptxas -v, sm_80 and sm_90):
// Forward: 64 keys per tile; 128 query rows (kM = 2) for d = 64 (O 32 + S 64 floats per thread),
// 64 rows (kM = 1) for d = 128 (O 64 + S 32 floats). 128 rows at d = 128 (FA2's sm_80 choice)
// spills with this code, even with 32-key tiles.
template <int D>
struct FwdCfg {
  static constexpr int kM = D == 64 ? 2 : 1, kBr = kFaWarps * 16 * kM, kBc = 64;
  static constexpr std::size_t kSmem = sizeof(uint16_t) * (kBr + 2 * kBc) * D;  // Q, K, V: 32 / 48 KiB
};
// dK/dV: 64 keys per block (16 per warp), query tiles of kBrQ rows double-buffered. kBrQ = 32 for
// d = 128 keeps the dK, dV accumulators (2 x 64 floats per thread) plus the two score tiles
// (2 x 16) in registers and the shared memory at 64.5 KiB.
template <int D>
struct DkdvCfg {
  static constexpr int kBc = kFaWarps * 16, kBrQ = D == 64 ? 64 : 32;
  static constexpr std::size_t kSmem =
      sizeof(uint16_t) * (2 * kBc + 4 * kBrQ) * D + sizeof(float) * 6 * kBrQ;  // K, V, 2x(Q, dO, lse, D, lo)
};
// dQ: 64 query rows per block (16 per warp), key tiles of kBc double-buffered.
template <int D>
struct DqCfg {
  static constexpr int kBr = kFaWarps * 16, kBc = D == 64 ? 64 : 32;
  static constexpr std::size_t kSmem = sizeof(uint16_t) * (2 * kBr + 4 * kBc) * D;  // Q, dO, 2x(K, V)
};

template <typename T>
struct Args {
  const T* q;
  const T* k;
  const T* v;
  const T* out;   // backward: the forward's output
  const T* dout;  // backward
  T* o;           // forward output
  T* dq;
  T* dk;
  T* dv;
  float* lse_out;      // forward
  const float* lse;    // backward
  float* delta_out;    // backward, delta kernel
  const float* delta;  // backward, dK/dV and dQ kernels
  int s, b, hq, hkv, group;
  int64_t q_stride, k_stride;  // elements between consecutive positions of one head
  AttentionBounds mask;
  int diag;          // causal: key j is masked for query i when j > i + diag (causal_diagonal)
  float scale;       // softmax_scale
  float scale_log2;  // softmax_scale * log2(e)
};

// ---- shared-memory tiles ----------------------------------------------------------------------
// Offset of element (r, c) in a [rows][D] tile, 16-byte chunks XOR-swizzled by r & 7.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  static_assert(D == 64 || D == 128, "rows of 8 or 16 chunks");
  return r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
}

// Block-wide: tile[r][:] = g[r * stride + :] for r < valid_rows, zero for valid_rows <= r < kRows,
// with cp.async (the caller commits). g points at row 0 of the tile, inside the tensor. Thread x
// copies chunk x % (D / 8) of rows x / (D / 8) + kRowsPerPass * it: kRowsPerPass (16 or 8) is a
// multiple of 8, so all its rows have the same swizzle and its destinations are one base address
// plus compile-time offsets.
template <int kRows, int D, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* g, int64_t stride, int valid_rows) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kRowsPerPass = kFaThreads / kChunksPerRow;
  static_assert(kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "whole passes, swizzle-aligned");
  const int r0 = threadIdx.x / kChunksPerRow, c = (threadIdx.x % kChunksPerRow) * 8;
  const uint32_t dst0 = mma::smem_addr(tile + swz<D>(r0, c));
  const T* src0 = g + r0 * stride + c;
#pragma unroll
  for (int it = 0; it < kRows / kRowsPerPass; it++) {
    const int r = r0 + it * kRowsPerPass;
    const bool ok = r < valid_rows;
    // src-size 0 reads nothing and zero-fills; the address must still be a valid one.
    mma::cp_async16(dst0 + it * kRowsPerPass * D * 2, ok ? src0 + it * kRowsPerPass * stride : g,
                    ok ? 16 : 0);
  }
}

// Warp-level: acc converted to T into the warp's rows row0 .. row0 + 16 kM - 1 of a tile. Lane
// (g, t) holds rows g, g + 8 and columns 8n + 2t, 8n + 2t + 1 of every m16 x n8 accumulator.
template <typename T, int D, int kM>
__device__ __forceinline__ void store_acc(T* tile, int row0, const float (&acc)[kM][D / 8][4], int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int r = row0 + 16 * mi + g + 8 * hf, c = 8 * n + 2 * t;
        *reinterpret_cast<uint32_t*>(tile + swz<D>(r, c)) =
            mma::pack2<T>(acc[mi][n][2 * hf], acc[mi][n][2 * hf + 1]);
      }
}

// Warp-level: rows row0 .. row0 + kRows - 1 of a tile to g[r * stride + :] for r < valid_rows, in
// 16-byte chunks (consecutive lanes write consecutive chunks of a row: coalesced).
template <int kRows, int D, typename T>
__device__ __forceinline__ void store_rows_global(const T* tile, int row0, T* g, int64_t stride,
                                                  int valid_rows, int lane) {
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int idx = lane; idx < kRows * kChunksPerRow; idx += 32) {
    const int r = idx / kChunksPerRow, c = (idx % kChunksPerRow) * 8;
    if (r < valid_rows)
      *reinterpret_cast<uint4*>(g + r * stride + c) =
          *reinterpret_cast<const uint4*>(tile + swz<D>(row0 + r, c));
  }
}

// ---- warp-level matrix products ------------------------------------------------------------------
// ldmatrix.x4 addressing. Each lane addresses one 16-byte row of one of the four 8x8 matrices: tile
// row r0 + (lane & 7) + 8 rsel, chunk 2 ci + csel, where (rsel, csel) is (lane >> 3 & 1, lane >> 4)
// or the reverse depending on the operand, and r0, ci are compile-time after unrolling (r0 a
// multiple of 8). Since r0 is a multiple of 8, the row's swizzle key r & 7 is lane & 7, and
//   swizzled chunk = (2 ci + csel) ^ (lane & 7) = ((2 ci) & 8) + (((2 ci) & 7) ^ x),  x = csel ^ (lane & 7)
// (2 ci is even and csel a single bit). FragBase keeps the lane's row address and x, so that every
// fragment address is base + a compile-time offset + one of four XOR terms: a handful of registers,
// where recomputing swz() for every (row, chunk) lets the compiler hoist dozens of addresses.
template <int D>
struct FragBase {
  uint32_t row_addr;  // shared address of the lane's row (r0 = 0), chunk 0
  int x;              // csel ^ (lane & 7)
  __device__ __forceinline__ FragBase(const void* tile, int row0, int lane, int rsel, int csel)
      : row_addr(mma::smem_addr(tile) + (row0 + (lane & 7) + 8 * rsel) * D * 2), x(csel ^ (lane & 7)) {}
  // r0: a multiple of 8; ci: 16-column block index (0 .. D / 16 - 1).
  __device__ __forceinline__ uint32_t at(int r0, int ci) const {
    return row_addr + r0 * D * 2 + ((2 * ci) & 8) * 16 + ((((2 * ci) & 7) ^ x) << 4);
  }
};

// acc[mi][n] += A[a_row0 + 16 mi + (0..15)][0..D) . B[b_row0 + 8 n + (0..7)][0..D)^T
// (an m16 x n8 accumulator per (mi, n); kN8 n8 tiles, kN8 even). Per k16 step kk:
//   A fragment of m tile mi: ldmatrix.x4, lanes 0-7 / 8-15 / 16-23 / 24-31 addressing
//     (rows 0-7, k 0-7) / (rows 8-15, k 0-7) / (rows 0-7, k 8-15) / (rows 8-15, k 8-15), i.e. the
//     a0 / a1 / a2 / a3 blocks of the A layout: rsel = lane >> 3 & 1, csel = lane >> 4.
//   B fragments of n tiles 2np, 2np + 1: B[n][k] stored n-major is exactly mma's "col" B, so plain
//     ldmatrix.x4 of (n 0-7, k 0-7) / (n 0-7, k 8-15) / (n 8-15, k 0-7) / (n 8-15, k 8-15) gives
//     b0, b1 of n tile 2np and b0, b1 of n tile 2np + 1: rsel = lane >> 4, csel = lane >> 3 & 1.
template <typename T, int D, int kM, int kN8>
__device__ __forceinline__ void warp_gemm_nt(float (&acc)[kM][kN8][4], const T* sA, int a_row0, const T* sB,
                                             int b_row0, int lane) {
  static_assert(kN8 % 2 == 0, "n tiles come in pairs (one ldmatrix.x4)");
  const FragBase<D> fa(sA, a_row0, lane, (lane >> 3) & 1, lane >> 4);
  const FragBase<D> fb(sB, b_row0, lane, lane >> 4, (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t af[kM][4];
#pragma unroll
    for (int mi = 0; mi < kM; mi++) mma::ldmatrix_x4(af[mi], fa.at(16 * mi, kk));
#pragma unroll
    for (int np = 0; np < kN8 / 2; np++) {
      uint32_t bf[4];
      mma::ldmatrix_x4(bf, fb.at(16 * np, kk));
#pragma unroll
      for (int mi = 0; mi < kM; mi++) {
        mma::mma_16816<T>(acc[mi][2 * np], af[mi], bf[0], bf[1]);
        mma::mma_16816<T>(acc[mi][2 * np + 1], af[mi], bf[2], bf[3]);
      }
    }
  }
}

// acc[mi][n] += P[16 mi + (0..15)][0..16 kK16) . B[b_row0 + (0..16 kK16)][8 n + (0..7)], n < D / 8,
// with P given as A fragments pf[mi][kk] (k step kk covers P columns 16 kk .. 16 kk + 15) and B a
// [k][D] tile, i.e. k-major ("row" B): ldmatrix.x4.trans of the blocks (k 0-7, n 0-7) /
// (k 8-15, n 0-7) / (k 0-7, n 8-15) / (k 8-15, n 8-15) (rsel = lane >> 3 & 1, csel = lane >> 4)
// hands each lane B[2t, 2t+1][g] of each block = b0, b1 of n tile 2np and of n tile 2np + 1.
template <typename T, int D, int kM, int kK16>
__device__ __forceinline__ void warp_gemm_rn(float (&acc)[kM][D / 8][4], const uint32_t (&pf)[kM][kK16][4],
                                             const T* sB, int b_row0, int lane) {
  const FragBase<D> fb(sB, b_row0, lane, (lane >> 3) & 1, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < kK16; kk++) {
#pragma unroll
    for (int np = 0; np < D / 16; np++) {
      uint32_t bf[4];
      mma::ldmatrix_x4_trans(bf, fb.at(16 * kk, np));
#pragma unroll
      for (int mi = 0; mi < kM; mi++) {
        mma::mma_16816<T>(acc[mi][2 * np], pf[mi][kk], bf[0], bf[1]);
        mma::mma_16816<T>(acc[mi][2 * np + 1], pf[mi][kk], bf[2], bf[3]);
      }
    }
  }
}

// fp32 accumulators of an m16 x (16 kK16) tile -> 16-bit A fragments for the next product. The
// accumulator n8 tile 2kk holds (row g, k 16kk + 2t, +1) in c0, c1 and (row g + 8, same k) in c2,
// c3: exactly a0 and a1 of k step kk; n8 tile 2kk + 1 holds k + 8: a2 and a3.
template <typename T, int kM, int kK16>
__device__ __forceinline__ void acc_to_afrag(const float (&acc)[kM][2 * kK16][4],
                                             uint32_t (&af)[kM][kK16][4]) {
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int kk = 0; kk < kK16; kk++) {
      af[mi][kk][0] = mma::pack2<T>(acc[mi][2 * kk][0], acc[mi][2 * kk][1]);
      af[mi][kk][1] = mma::pack2<T>(acc[mi][2 * kk][2], acc[mi][2 * kk][3]);
      af[mi][kk][2] = mma::pack2<T>(acc[mi][2 * kk + 1][0], acc[mi][2 * kk + 1][1]);
      af[mi][kk][3] = mma::pack2<T>(acc[mi][2 * kk + 1][2], acc[mi][2 * kk + 1][3]);
    }
}

template <int kM, int kN8>
__device__ __forceinline__ void zero(float (&acc)[kM][kN8][4]) {
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int n = 0; n < kN8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[mi][n][e] = 0.0f;
}

// Max / sum over the 4 lanes (t = 0..3) that share a row g.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFull, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 1);
  return v + __shfl_xor_sync(kFull, v, 2);
}

extern __shared__ __align__(128) unsigned char fa_smem[];

// ---- forward ----------------------------------------------------------------------------------
// Accumulators per thread: O kM * D / 2 floats, scores kM * kBc / 2, m and l 4 kM.
template <typename T, int D, bool kCausal, bool kLo>
__global__ void __launch_bounds__(kFaThreads) fa_fwd_kernel(const Args<T> p) {
  using Cfg = FwdCfg<D>;
  constexpr int kM = Cfg::kM, kBr = Cfg::kBr, kBc = Cfg::kBc;
  constexpr int kN8 = kBc / 8, kD8 = D / 8;
  T* sQ = reinterpret_cast<T*>(fa_smem);  // [kBr][D]
  T* sK = sQ + kBr * D;                   // [kBc][D]
  T* sV = sK + kBc * D;                   // [kBc][D]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16 * kM;  // first row of this warp inside the block's tile
  // Causal: the last query blocks have the most key tiles; start them first (better tail).
  const int i0 = (kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBr;
  const int bh = blockIdx.y, bi = bh / p.hq, h = bh % p.hq, hk = h / p.group;
  const T* q_head = p.q + static_cast<int64_t>(bh) * D;
  const T* k_head = p.k + (static_cast<int64_t>(bi) * p.hkv + hk) * D;
  const T* v_head = p.v + (static_cast<int64_t>(bi) * p.hkv + hk) * D;

  // The key tiles some row of the block sees.
  const RowRange keys = keys_seen(p.mask, bi, i0, min(p.s, i0 + kBr), p.s);
  const int jt0 = static_cast<int>(keys.begin) / kBc;
  const int n_tiles = (static_cast<int>(keys.end) + kBc - 1) / kBc - jt0;
  load_tile_async<kBr, D>(sQ, q_head + i0 * p.q_stride, p.q_stride, p.s - i0);
  if (n_tiles > 0) load_tile_async<kBc, D>(sK, k_head + jt0 * kBc * p.k_stride, p.k_stride, p.s - jt0 * kBc);
  mma::cp_async_commit();

  // kLo: the first key of each of the thread's rows, and of the warp's last row (the largest).
  int lo_row[kM][2] = {};
  int warp_lo_max = 0;
  if constexpr (kLo) {
#pragma unroll
    for (int mi = 0; mi < kM; mi++)
#pragma unroll
      for (int hf = 0; hf < 2; hf++)
        lo_row[mi][hf] =
            static_cast<int>(first_key(p.mask, bi, min(p.s - 1, i0 + warp_row0 + 16 * mi + g + 8 * hf)));
    warp_lo_max = static_cast<int>(first_key(p.mask, bi, min(p.s - 1, i0 + warp_row0 + 16 * kM - 1)));
  }

  float o[kM][kD8][4];
  zero(o);
  float m[kM][2], l[kM][2];  // per row (g + 8 hf of m tile mi): running max (log2 domain), partial sum
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      m[mi][hf] = -INFINITY;
      l[mi][hf] = 0.0f;
    }

  for (int it = 0; it < n_tiles; it++) {
    const int j0 = (jt0 + it) * kBc;
    mma::cp_async_wait<0>();  // K(j) (and, first time, Q) has landed for this thread...
    __syncthreads();          // ...and for all; every warp is also done with V(j - 1)
    load_tile_async<kBc, D>(sV, v_head + j0 * p.k_stride, p.k_stride, p.s - j0);
    mma::cp_async_commit();

    // S = Q K^T for the warp's rows: sc[mi][n] is rows 16 mi + (g, g + 8), keys j0 + 8n + (2t, 2t+1).
    float sc[kM][kN8][4];
    zero(sc);
    warp_gemm_nt<T, D, kM, kN8>(sc, sQ, warp_row0, sK, 0, lane);

    // Online softmax, log2 domain: x = scale log2(e) s, p = exp2(x - m), O and l rescaled by
    // exp2(m_old - m_new). Masked scores are -inf (p = 0). A row with nothing visible yet keeps
    // m = -inf and uses 0 as its reference so that no inf - inf appears.
    const bool need_mask =
        j0 + kBc > p.s || (kCausal && j0 + kBc - 1 > i0 + warp_row0 + p.diag) || (kLo && j0 < warp_lo_max);
#pragma unroll
    for (int mi = 0; mi < kM; mi++) {
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int row = i0 + warp_row0 + 16 * mi + g + 8 * hf;
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kN8; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            float x = sc[mi][n][2 * hf + e] * p.scale_log2;
            if (need_mask) {
              const int col = j0 + 8 * n + 2 * t + e;
              if (col >= p.s || (kCausal && col > row + p.diag) || (kLo && col < lo_row[mi][hf]))
                x = -INFINITY;
            }
            sc[mi][n][2 * hf + e] = x;
            mx = fmaxf(mx, x);
          }
        const float m_new = fmaxf(m[mi][hf], quad_max(mx));
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m[mi][hf] - m_use);  // 0 while m was -inf
        m[mi][hf] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kN8; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const float pv = exp2f(sc[mi][n][2 * hf + e] - m_use);
            sc[mi][n][2 * hf + e] = pv;
            sum += pv;
          }
        l[mi][hf] = l[mi][hf] * corr + sum;  // this lane's columns only; quad-reduced at the end
#pragma unroll
        for (int n = 0; n < kD8; n++) {
          o[mi][n][2 * hf] *= corr;
          o[mi][n][2 * hf + 1] *= corr;
        }
      }
    }
    // P in 16-bit A fragments (FA2: P is rounded to the input type for the P V product).
    uint32_t pf[kM][kBc / 16][4];
    acc_to_afrag<T, kM, kBc / 16>(sc, pf);

    mma::cp_async_wait<0>();  // V(j) has landed
    __syncthreads();          // for every thread; every warp is also done reading K(j)
    if (it + 1 < n_tiles)
      load_tile_async<kBc, D>(sK, k_head + (j0 + kBc) * p.k_stride, p.k_stride, p.s - j0 - kBc);
    mma::cp_async_commit();

    warp_gemm_rn<T, D, kM, kBc / 16>(o, pf, sV, 0, lane);  // O += P V
  }

  // Epilogue: l summed over the row's 4 lanes, O / l, lse = ln(sum exp(scale s)) = m ln2 + ln l.
#pragma unroll
  for (int mi = 0; mi < kM; mi++)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      const float lt = quad_sum(l[mi][hf]);
      const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
#pragma unroll
      for (int n = 0; n < kD8; n++) {
        o[mi][n][2 * hf] *= inv;
        o[mi][n][2 * hf + 1] *= inv;
      }
      const int row = i0 + warp_row0 + 16 * mi + g + 8 * hf;
      if (t == 0 && row < p.s)
        p.lse_out[static_cast<int64_t>(bh) * p.s + row] = lt > 0.0f ? m[mi][hf] * kLn2 + logf(lt) : -INFINITY;
    }
  // The warp's rows of sQ are read by this warp only, and it has finished its last Q K^T: reuse
  // them to stage O for coalesced 16-byte stores (once every copy into sQ has landed: a block that
  // sees no key ran no tile).
  mma::cp_async_wait<0>();
  __syncthreads();
  store_acc<T, D, kM>(sQ, warp_row0, o, lane);
  __syncwarp();
  store_rows_global<16 * kM, D>(sQ, warp_row0,
                                p.o + static_cast<int64_t>(bh) * D + (i0 + warp_row0) * p.q_stride,
                                p.q_stride, p.s - i0 - warp_row0, lane);
}

// ---- backward: D = rowsum(dO * O) -------------------------------------------------------------
// delta[(bi * hq + h) * s + i], one warp per row, fp32 sum of the 16-bit products.
template <typename T, int D>
__global__ void fa_bwd_delta_kernel(const Args<T> p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(p.b) * p.hq * p.s) return;
  const int64_t i = row % p.s, bh = row / p.s;
  const int64_t base = i * p.q_stride + bh * D;
  float sum = 0.0f;
#pragma unroll
  for (int c = lane; c < D; c += 32) sum += mma::to_float(p.dout[base + c]) * mma::to_float(p.out[base + c]);
  sum = cuda::detail::warp_sum(sum);
  if (lane == 0) p.delta_out[row] = sum;
}

// ---- backward: dK, dV -------------------------------------------------------------------------
// Block: 64 keys (j0 ..) of kv head (bi, hk); warp: keys j0 + warp_row0 + (0..15). The transposed
// score tile sc[0][n] holds keys (g, g + 8) x queries i0 + 8n + (2t, 2t + 1), so the lse and D a
// lane needs are those of its query columns (from shared memory, per query tile).
template <typename T, int D, bool kCausal, bool kLo>
__global__ void __launch_bounds__(kFaThreads) fa_bwd_dkdv_kernel(const Args<T> p) {
  using Cfg = DkdvCfg<D>;
  constexpr int kBc = Cfg::kBc, kBrQ = Cfg::kBrQ;
  constexpr int kN8 = kBrQ / 8, kD8 = D / 8;
  static_assert(kBrQ <= kFaThreads, "one thread per query row loads lse and D");
  T* sK = reinterpret_cast<T*>(fa_smem);                     // [kBc][D]
  T* sV = sK + kBc * D;                                      // [kBc][D]
  T* sQ = sV + kBc * D;                                      // [2][kBrQ][D]
  T* sdO = sQ + 2 * kBrQ * D;                                // [2][kBrQ][D]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kBrQ * D);  // [2][kBrQ] lse * log2(e) (+inf past s)
  float* sD = sL + 2 * kBrQ;                                 // [2][kBrQ] D (0 past s)
  int* sLo = reinterpret_cast<int*>(sD + 2 * kBrQ);          // [2][kBrQ] kLo: first key (INT_MAX past s)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16;
  const int j0 = blockIdx.x * kBc;
  const int bi = blockIdx.y / p.hkv, hk = blockIdx.y % p.hkv;
  const int64_t kv_off = (static_cast<int64_t>(bi) * p.hkv + hk) * D;

  // The query tiles with a row that sees one of these keys (none: dK = dV = 0).
  const RowRange rows = queries_seeing(p.mask, bi, j0, min(p.s, j0 + kBc), p.s);
  const int q_tile0 = static_cast<int>(rows.begin) / kBrQ;
  const int n_q = (static_cast<int>(rows.end) + kBrQ - 1) / kBrQ - q_tile0;  // query tiles per head
  const int total = n_q > 0 ? p.group * n_q : 0;                             // over the group's heads

  // Issues the loads of step `it` (query head, query tile) into buffer `stage`.
  auto prefetch = [&](int it, int stage) {
    const int h = hk * p.group + it / n_q;
    const int i0 = (q_tile0 + it % n_q) * kBrQ;
    const int64_t q_off = (static_cast<int64_t>(bi) * p.hq + h) * D + i0 * p.q_stride;
    load_tile_async<kBrQ, D>(sQ + stage * kBrQ * D, p.q + q_off, p.q_stride, p.s - i0);
    load_tile_async<kBrQ, D>(sdO + stage * kBrQ * D, p.dout + q_off, p.q_stride, p.s - i0);
    // lse and D with plain loads: this buffer was last read before the previous step's final
    // barrier, and these stores are read after the next step's first barrier.
    if (threadIdx.x < kBrQ) {
      const int i = i0 + threadIdx.x;
      const int64_t r = (static_cast<int64_t>(bi) * p.hq + h) * p.s + i;
      sL[stage * kBrQ + threadIdx.x] = i < p.s ? p.lse[r] * kLog2e : INFINITY;
      sD[stage * kBrQ + threadIdx.x] = i < p.s ? p.delta[r] : 0.0f;
      if constexpr (kLo)
        sLo[stage * kBrQ + threadIdx.x] = i < p.s ? static_cast<int>(first_key(p.mask, bi, i)) : INT_MAX;
    }
  };

  load_tile_async<kBc, D>(sK, p.k + kv_off + j0 * p.k_stride, p.k_stride, p.s - j0);
  load_tile_async<kBc, D>(sV, p.v + kv_off + j0 * p.k_stride, p.k_stride, p.s - j0);
  if (total > 0) prefetch(0, 0);
  mma::cp_async_commit();

  float dk[1][kD8][4], dv[1][kD8][4];
  zero(dk);
  zero(dv);
  const int key_lo = j0 + warp_row0;  // the warp's first key
  for (int it = 0; it < total; it++) {
    const int st = it & 1;
    if (it + 1 < total) prefetch(it + 1, st ^ 1);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();  // all groups but the newest (step it + 1) are complete
    __syncthreads();
    const int i0 = (q_tile0 + it % n_q) * kBrQ;
    const T* tQ = sQ + st * kBrQ * D;
    const T* tdO = sdO + st * kBrQ * D;
    const float* tL = sL + st * kBrQ;
    const float* tD = sD + st * kBrQ;
    const int* tLo = sLo + st * kBrQ;

    float sc[1][kN8][4], dp[1][kN8][4];
    zero(sc);
    zero(dp);
    warp_gemm_nt<T, D, 1, kN8>(sc, sK, warp_row0, tQ, 0, lane);   // S^T = K Q^T
    warp_gemm_nt<T, D, 1, kN8>(dp, sV, warp_row0, tdO, 0, lane);  // dP^T = V dO^T

    // P^T = exp2(scale log2e S^T - lse log2e), 0 where masked; dS^T = P^T (dP^T - D) (the
    // softmax_scale factor of dS is applied to dK at the end).
    const bool need_mask = i0 + kBrQ > p.s || j0 + kBc > p.s || (kCausal && key_lo + 15 > i0 + p.diag) ||
                           (kLo && key_lo < tLo[kBrQ - 1]);
#pragma unroll
    for (int n = 0; n < kN8; n++) {
      const int cq = 8 * n + 2 * t;  // query column (within the tile) of e = 0
      const float2 lq = *reinterpret_cast<const float2*>(tL + cq);
      const float2 dd = *reinterpret_cast<const float2*>(tD + cq);
      int2 lq0 = make_int2(0, 0);
      if constexpr (kLo) lq0 = *reinterpret_cast<const int2*>(tLo + cq);
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int key = key_lo + g + 8 * hf;
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float pv = exp2f(sc[0][n][2 * hf + e] * p.scale_log2 - (e ? lq.y : lq.x));
          if (need_mask) {
            const int i = i0 + cq + e;
            if (i >= p.s || key >= p.s || (kCausal && key > i + p.diag) || (kLo && key < (e ? lq0.y : lq0.x)))
              pv = 0.0f;
          }
          sc[0][n][2 * hf + e] = pv;
          dp[0][n][2 * hf + e] = pv * (dp[0][n][2 * hf + e] - (e ? dd.y : dd.x));
        }
      }
    }

    uint32_t af[1][kBrQ / 16][4];
    acc_to_afrag<T, 1, kBrQ / 16>(sc, af);
    warp_gemm_rn<T, D, 1, kBrQ / 16>(dv, af, tdO, 0, lane);  // dV += P^T dO
    acc_to_afrag<T, 1, kBrQ / 16>(dp, af);
    warp_gemm_rn<T, D, 1, kBrQ / 16>(dk, af, tQ, 0, lane);  // dK += dS^T Q
    __syncthreads();  // buffer st is refilled by the next step's prefetch
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // with no query tile, the K and V copies have only now landed for every thread

#pragma unroll
  for (int n = 0; n < kD8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[0][n][e] *= p.scale;
  // The warp's rows of sK and sV are read by this warp only: stage dK, dV there.
  __syncwarp();
  store_acc<T, D, 1>(sK, warp_row0, dk, lane);
  store_acc<T, D, 1>(sV, warp_row0, dv, lane);
  __syncwarp();
  const int64_t out_off = kv_off + key_lo * p.k_stride;
  store_rows_global<16, D>(sK, warp_row0, p.dk + out_off, p.k_stride, p.s - key_lo, lane);
  store_rows_global<16, D>(sV, warp_row0, p.dv + out_off, p.k_stride, p.s - key_lo, lane);
}

// ---- backward: dQ -----------------------------------------------------------------------------
// Block: 64 query rows (i0 ..) of head (bi, h); warp: rows i0 + warp_row0 + (0..15), with lse and
// D of its rows g, g + 8 in registers.
template <typename T, int D, bool kCausal, bool kLo>
__global__ void __launch_bounds__(kFaThreads) fa_bwd_dq_kernel(const Args<T> p) {
  using Cfg = DqCfg<D>;
  constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc;
  constexpr int kN8 = kBc / 8, kD8 = D / 8;
  T* sQ = reinterpret_cast<T*>(fa_smem);  // [kBr][D]
  T* sdO = sQ + kBr * D;                  // [kBr][D]
  T* sK = sdO + kBr * D;                  // [2][kBc][D]
  T* sV = sK + 2 * kBc * D;               // [2][kBc][D]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int warp_row0 = warp * 16;
  const int i0 = (kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBr;
  const int bh = blockIdx.y, bi = bh / p.hq, h = bh % p.hq, hk = h / p.group;
  const int64_t q_off = static_cast<int64_t>(bh) * D + i0 * p.q_stride;
  const int64_t kv_off = (static_cast<int64_t>(bi) * p.hkv + hk) * D;

  load_tile_async<kBr, D>(sQ, p.q + q_off, p.q_stride, p.s - i0);
  load_tile_async<kBr, D>(sdO, p.dout + q_off, p.q_stride, p.s - i0);
  auto prefetch = [&](int jt, int stage) {
    const int j0 = jt * kBc;
    load_tile_async<kBc, D>(sK + stage * kBc * D, p.k + kv_off + j0 * p.k_stride, p.k_stride, p.s - j0);
    load_tile_async<kBc, D>(sV + stage * kBc * D, p.v + kv_off + j0 * p.k_stride, p.k_stride, p.s - j0);
  };
  // The key tiles some row of the block sees.
  const RowRange keys = keys_seen(p.mask, bi, i0, min(p.s, i0 + kBr), p.s);
  const int jt0 = static_cast<int>(keys.begin) / kBc;
  const int n_tiles = (static_cast<int>(keys.end) + kBc - 1) / kBc - jt0;
  if (n_tiles > 0) prefetch(jt0, 0);
  mma::cp_async_commit();

  int lo_row[2] = {0, 0};  // kLo: the first key of rows g, g + 8, and of the warp's last row
  int warp_lo_max = 0;
  if constexpr (kLo) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
      lo_row[hf] = static_cast<int>(first_key(p.mask, bi, min(p.s - 1, i0 + warp_row0 + g + 8 * hf)));
    warp_lo_max = static_cast<int>(first_key(p.mask, bi, min(p.s - 1, i0 + warp_row0 + 15)));
  }

  float lse2[2], dlt[2];  // rows g, g + 8: lse log2(e) (+inf past s: P = 0) and D
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int row = i0 + warp_row0 + g + 8 * hf;
    lse2[hf] = row < p.s ? p.lse[static_cast<int64_t>(bh) * p.s + row] * kLog2e : INFINITY;
    dlt[hf] = row < p.s ? p.delta[static_cast<int64_t>(bh) * p.s + row] : 0.0f;
  }

  float dqa[1][kD8][4];
  zero(dqa);
  for (int it = 0; it < n_tiles; it++) {
    const int st = it & 1, j0 = (jt0 + it) * kBc;
    if (it + 1 < n_tiles) prefetch(jt0 + it + 1, st ^ 1);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();
    const T* tK = sK + st * kBc * D;
    const T* tV = sV + st * kBc * D;

    float sc[1][kN8][4], dp[1][kN8][4];
    zero(sc);
    zero(dp);
    warp_gemm_nt<T, D, 1, kN8>(sc, sQ, warp_row0, tK, 0, lane);   // S = Q K^T
    warp_gemm_nt<T, D, 1, kN8>(dp, sdO, warp_row0, tV, 0, lane);  // dP = dO V^T

    const bool need_mask =
        j0 + kBc > p.s || (kCausal && j0 + kBc - 1 > i0 + warp_row0 + p.diag) || (kLo && j0 < warp_lo_max);
#pragma unroll
    for (int n = 0; n < kN8; n++)
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int row = i0 + warp_row0 + g + 8 * hf;
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float pv = exp2f(sc[0][n][2 * hf + e] * p.scale_log2 - lse2[hf]);
          if (need_mask) {
            const int col = j0 + 8 * n + 2 * t + e;
            if (col >= p.s || (kCausal && col > row + p.diag) || (kLo && col < lo_row[hf])) pv = 0.0f;
          }
          dp[0][n][2 * hf + e] = pv * (dp[0][n][2 * hf + e] - dlt[hf]);  // dS (unscaled)
        }
      }

    uint32_t af[1][kBc / 16][4];
    acc_to_afrag<T, 1, kBc / 16>(dp, af);
    warp_gemm_rn<T, D, 1, kBc / 16>(dqa, af, tK, 0, lane);  // dQ += dS K
    __syncthreads();  // buffer st is refilled by the next step's prefetch
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // with no key tile, the Q and dO copies have only now landed for every thread

#pragma unroll
  for (int n = 0; n < kD8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dqa[0][n][e] *= p.scale;
  __syncwarp();  // the warp's rows of sQ are read by this warp only
  store_acc<T, D, 1>(sQ, warp_row0, dqa, lane);
  __syncwarp();
  store_rows_global<16, D>(sQ, warp_row0, p.dq + q_off + warp_row0 * p.q_stride, p.q_stride,
                           p.s - i0 - warp_row0, lane);
}

// ---- host side ----------------------------------------------------------------------------------
bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T>
Args<T> make_args(const AttentionShape& sh, const AttentionBounds& mask, float scale) {
  const char* why = attention_bounds_error(mask);
  if (why != nullptr) throw_error(__FILE__, __LINE__, why);
  CUDA_OPS_REQUIRE(
      sh.d == 64 || sh.d == 128,
      "flash_attention (tensor cores): head dimension must be 64 or 128, got " + std::to_string(sh.d));
  CUDA_OPS_REQUIRE(sh.value_dim() == sh.d,
                   "flash_attention (tensor cores): the value head size must equal the query/key one, got " +
                       std::to_string(sh.value_dim()) + " and " + std::to_string(sh.d));
  CUDA_OPS_REQUIRE(sh.s >= 0 && sh.b >= 0 && sh.hq >= 0 && sh.hkv > 0 && sh.hq % sh.hkv == 0,
                   "flash_attention (tensor cores): hq must be a multiple of hkv > 0");
  CUDA_OPS_REQUIRE(sh.s < (int64_t{1} << 30) && sh.b * sh.hq <= 65535,
                   "flash_attention (tensor cores): s < 2^30 and b * hq <= 65535 (grid limits)");
  Args<T> a{};
  a.s = static_cast<int>(sh.s);
  a.b = static_cast<int>(sh.b);
  a.hq = static_cast<int>(sh.hq);
  a.hkv = static_cast<int>(sh.hkv);
  a.group = a.hq / a.hkv;
  a.q_stride = sh.b * sh.hq * sh.d;
  a.k_stride = sh.b * sh.hkv * sh.d;
  a.mask = mask;
  a.diag = static_cast<int>(causal_diagonal(mask, sh.s));
  a.scale = scale;
  a.scale_log2 = scale * kLog2e;
  return a;
}

void require_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* ptr : ptrs)
    CUDA_OPS_REQUIRE(aligned16(ptr), "flash_attention (tensor cores): tensors must be 16-byte aligned");
}

template <typename Kernel, typename A>
void launch(Kernel kernel, dim3 grid, std::size_t smem, cudaStream_t stream, const A& args) {
  int limit = 0;
  CUDA_OPS_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        cuda::detail::current_device()));
  CUDA_OPS_REQUIRE(smem <= static_cast<std::size_t>(limit),
                   "flash_attention (tensor cores): needs " + std::to_string(smem) +
                       " bytes of shared memory per block, the device allows " + std::to_string(limit));
  CUDA_OPS_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kFaThreads, smem, stream>>>(args);
  CUDA_OPS_LAUNCHED();
}

unsigned blocks_of(int s, int rows) { return static_cast<unsigned>((s + rows - 1) / rows); }

template <typename T, int D, bool kCausal, bool kLo>
void forward_d(const Args<T>& a, cudaStream_t stream) {
  using Cfg = FwdCfg<D>;
  launch(fa_fwd_kernel<T, D, kCausal, kLo>, dim3(blocks_of(a.s, Cfg::kBr), static_cast<unsigned>(a.b * a.hq)),
         Cfg::kSmem, stream, a);
}

template <typename T, int D, bool kCausal, bool kLo>
void backward_d(Args<T> a, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(a.b) * a.hq * a.s;
  cuda::detail::Scratch delta(static_cast<std::size_t>(rows) * sizeof(float), stream);
  a.delta_out = delta.as<float>();
  a.delta = delta.as<float>();
  fa_bwd_delta_kernel<T, D><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(a);
  CUDA_OPS_LAUNCHED();
  launch(fa_bwd_dkdv_kernel<T, D, kCausal, kLo>,
         dim3(blocks_of(a.s, DkdvCfg<D>::kBc), static_cast<unsigned>(a.b * a.hkv)), DkdvCfg<D>::kSmem, stream,
         a);
  launch(fa_bwd_dq_kernel<T, D, kCausal, kLo>,
         dim3(blocks_of(a.s, DqCfg<D>::kBr), static_cast<unsigned>(a.b * a.hq)), DqCfg<D>::kSmem, stream, a);
}

// Calls f(D, kCausal, kLo) with the instantiation for the head dim and the mask: no mask, causal
// only, or causal with a window or documents.
template <int D, typename F>
void with_mask_kind(const AttentionBounds& mask, F&& f) {
  if (!mask.causal)
    f(std::integral_constant<int, D>{}, std::false_type{}, std::false_type{});
  else if (mask.plain())
    f(std::integral_constant<int, D>{}, std::true_type{}, std::false_type{});
  else
    f(std::integral_constant<int, D>{}, std::true_type{}, std::true_type{});
}
template <typename F>
void with_instance(int64_t d, const AttentionBounds& mask, F&& f) {
  if (d == 64)
    with_mask_kind<64>(mask, f);
  else
    with_mask_kind<128>(mask, f);
}

template <typename T>
void forward(const T* q, const T* k, const T* v, T* out, float* lse, const AttentionShape& shape,
             const AttentionBounds& mask, float softmax_scale, void* stream) {
  Args<T> a = make_args<T>(shape, mask, softmax_scale);
  require_aligned({q, k, v, out});
  if (a.s == 0 || a.b == 0 || a.hq == 0) return;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = out;
  a.lse_out = lse;
  const auto cs = static_cast<cudaStream_t>(stream);
  with_instance(shape.d, mask, [&](auto d, auto causal, auto lo) {
    forward_d<T, decltype(d)::value, decltype(causal)::value, decltype(lo)::value>(a, cs);
  });
}

template <typename T>
void backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const float* lse, T* dq, T* dk,
              T* dv, const AttentionShape& shape, const AttentionBounds& mask, float softmax_scale,
              void* stream) {
  Args<T> a = make_args<T>(shape, mask, softmax_scale);
  require_aligned({dout, q, k, v, out, dq, dk, dv});
  if (a.s == 0 || a.b == 0 || a.hq == 0) return;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.dout = dout;
  a.lse = lse;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  const auto cs = static_cast<cudaStream_t>(stream);
  with_instance(shape.d, mask, [&](auto d, auto causal, auto lo) {
    backward_d<T, decltype(d)::value, decltype(causal)::value, decltype(lo)::value>(a, cs);
  });
}

template <typename To, typename From>
const To* as(const From* p) {
  return reinterpret_cast<const To*>(p);
}
template <typename To, typename From>
To* as(From* p) {
  return reinterpret_cast<To*>(p);
}

}  // namespace

static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) && sizeof(f16) == sizeof(__half), "16-bit storage types");

void flash_attention_forward_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                                  const AttentionShape& shape, const AttentionBounds& mask,
                                  float softmax_scale, void* stream) {
  forward<__nv_bfloat16>(as<__nv_bfloat16>(q), as<__nv_bfloat16>(k), as<__nv_bfloat16>(v),
                         as<__nv_bfloat16>(out), lse, shape, mask, softmax_scale, stream);
}

void flash_attention_forward_f16(const f16* q, const f16* k, const f16* v, f16* out, float* lse,
                                 const AttentionShape& shape, const AttentionBounds& mask,
                                 float softmax_scale, void* stream) {
  forward<__half>(as<__half>(q), as<__half>(k), as<__half>(v), as<__half>(out), lse, shape, mask,
                  softmax_scale, stream);
}

void flash_attention_backward_bf16(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                   const bf16* out, const float* lse, bf16* dq, bf16* dk, bf16* dv,
                                   const AttentionShape& shape, const AttentionBounds& mask,
                                   float softmax_scale, void* stream) {
  using B = __nv_bfloat16;
  backward<B>(as<B>(dout), as<B>(q), as<B>(k), as<B>(v), as<B>(out), lse, as<B>(dq), as<B>(dk), as<B>(dv),
              shape, mask, softmax_scale, stream);
}

void flash_attention_backward_f16(const f16* dout, const f16* q, const f16* k, const f16* v, const f16* out,
                                  const float* lse, f16* dq, f16* dk, f16* dv, const AttentionShape& shape,
                                  const AttentionBounds& mask, float softmax_scale, void* stream) {
  using H = __half;
  backward<H>(as<H>(dout), as<H>(q), as<H>(k), as<H>(v), as<H>(out), lse, as<H>(dq), as<H>(dk), as<H>(dv),
              shape, mask, softmax_scale, stream);
}

}  // namespace parallel::kernels
