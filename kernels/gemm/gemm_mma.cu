// Tensor-core GEMM for bf16 / fp16 inputs with fp32 accumulation: mma.sync.m16n8k16 (sm_80+),
// cp.async double buffering, ldmatrix, XOR-swizzled shared memory. See gemm.hpp for the contract.
//
// Layering (CUTLASS's vocabulary):
//   block tile   128 x 128 (M x N) of C per 128-thread block, K consumed 32 at a time. The A and B
//                tiles of step k live in one of two shared-memory stages; while the block computes
//                on stage s, cp.async fills stage s ^ 1 with step k + 1 (double buffering).
//   warp tile    4 warps as 2 x 2, each owns 64 x 64 of C: 4 (m16) x 8 (n8) mma tiles, i.e. 128
//                fp32 accumulators per thread, in registers for the whole K loop.
//   thread       per k16 step a warp loads its A fragments (4 ldmatrix.x4) and B fragments
//                (4 ldmatrix.x4, two n8 tiles each), then issues 32 mma.sync.
//
// Operand layouts. Each operand tile is stored in shared memory the way it lies in global memory,
// so that global loads are 16-byte vectors along the contiguous dimension:
//   K-major  (a not transposed: a[m][k]; b transposed: b[n][k]): tile [128 rows][32 k]
//   MN-major (a transposed: a[k][m];     b not transposed: b[k][n]): tile [32 k][128 cols]
// and ldmatrix (K-major) or ldmatrix.trans (MN-major) turns either into the mma fragments, which
// are the same in both cases. Swizzle: a tile row is split into 16-byte chunks (8 elements), and
// chunk c of row r is stored at chunk c ^ f(r) with f(r) = (r >> 1) & 3 for 32-wide rows (64 B)
// and r & 7 for 128-wide rows (256 B): the 8 rows an ldmatrix phase reads then hit 8 distinct
// 16-byte bank groups (conflict-free), where an unswizzled layout would be 4- or 8-way conflicted.
//
// Output: c is fp32, or the inputs' own 16-bit type (Params::c16, a runtime flag: one branch per
// element of the epilogue, uniform over the grid); then beta c is read in 16 bits, the fp32 value
// alpha acc + beta c (+ bias, GeLU) is rounded once to nearest even (common.cuh) and stored.
//
// Edges: a 16-byte chunk that is partly outside the matrix is fetched with cp.async's src-size
// (the rest zero-filled); rows outside get src-size 0. cp.async needs 16-byte aligned sources,
// i.e. a leading dimension that is a multiple of 8 and an aligned base; an operand without that
// is loaded element by element (same tiles, plain loads and 16-byte shared stores), so any shape
// works, only slower.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "gemm/gemm.hpp"

namespace parallel::kernels {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kThreadsGemm = 128;
constexpr int kTileElems = 128 * 32;  // both tile shapes hold 4096 elements (8 KiB)

// ---- shared-memory addressing --------------------------------------------------------------
// Element (r, c) of a tile with COLS columns (32 or 128), swizzled by 8-element chunks.
template <int COLS>
__device__ __forceinline__ int swz(int r, int c) {
  int chunk = c >> 3;
  if constexpr (COLS == 32)
    chunk ^= (r >> 1) & 3;
  else
    chunk ^= r & 7;
  return r * COLS + (chunk << 3) + (c & 7);
}

// The PTX wrappers (cp.async, ldmatrix, mma.sync) are shared with the attention kernels.
using namespace parallel::cuda::mma;
template <bool kBF16>
using Elem16 = std::conditional_t<kBF16, __nv_bfloat16, __half>;
using cuda::detail::to_f32;
using cuda::detail::to_storage;

// ---- block level: global -> shared tile loads -------------------------------------------------
// Tile [ROWS][COLS] of a row-major storage g (leading dimension ld) starting at (row0, col0), rows
// < row_ext and cols < col_ext valid, zero elsewhere. 512 chunks of 8 elements, 4 per thread.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(uint16_t* tile, const uint16_t* g, int64_t ld, int row0, int col0,
                                          int row_ext, int col_ext, bool vec_ok) {
  constexpr int kChunksPerRow = COLS / 8;
  static_assert(ROWS * kChunksPerRow == 4 * kThreadsGemm, "one tile = 4 chunks per thread");
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int q = threadIdx.x + i * kThreadsGemm;
    const int r = q / kChunksPerRow, c = (q % kChunksPerRow) * 8;
    const int gr = row0 + r, gc = col0 + c;
    uint16_t* dst = tile + swz<COLS>(r, c);
    const int valid = gr < row_ext ? max(0, min(8, col_ext - gc)) : 0;
    if (vec_ok) {
      const uint16_t* src = valid > 0 ? g + static_cast<int64_t>(gr) * ld + gc : g;
      cp_async16(smem_addr(dst), src, valid * 2);
    } else {
      alignas(16) uint16_t v[8];
#pragma unroll
      for (int e = 0; e < 8; e++) v[e] = e < valid ? g[static_cast<int64_t>(gr) * ld + gc + e] : uint16_t{0};
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
    }
  }
}

__device__ __forceinline__ float gelu(float v) {
  const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  return v / (1.0f + expf(-2.0f * u));  // v * sigmoid(2u) == 0.5 v (1 + tanh(u))
}

struct Params {
  const uint16_t* a;
  const uint16_t* b;
  void* c;  // float, or the inputs' 16-bit type when c16
  bool c16;
  int m, n, k;
  int64_t lda, ldb;  // leading dimensions of the stored a and b
  float alpha, beta;
  const float* bias;
  bool gelu;
  float* pre_gelu;
  bool a_vec, b_vec;  // 16-byte cp.async allowed
};

// kAK: a is K-major (not transposed); kBKmaj: b is K-major (transposed).
template <bool kBF16, bool kAK, bool kBKmaj>
__global__ void __launch_bounds__(kThreadsGemm) gemm_mma_kernel(const Params p) {
  __shared__ __align__(128) uint16_t sA[2][kTileElems];
  __shared__ __align__(128) uint16_t sB[2][kTileElems];

  using C16 = std::conditional_t<kBF16, bf16, f16>;  // c's storage type when p.c16
  const int block_m = blockIdx.y * kBM, block_n = blockIdx.x * kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = (warp / 2) * 64, warp_n = (warp % 2) * 64;

  auto load_stage = [&](int kt, int stage) {
    const int k0 = kt * kBK;
    if constexpr (kAK)
      load_tile<kBM, kBK>(sA[stage], p.a, p.lda, block_m, k0, p.m, p.k, p.a_vec);
    else
      load_tile<kBK, kBM>(sA[stage], p.a, p.lda, k0, block_m, p.k, p.m, p.a_vec);
    if constexpr (kBKmaj)
      load_tile<kBN, kBK>(sB[stage], p.b, p.ldb, block_n, k0, p.n, p.k, p.b_vec);
    else
      load_tile<kBK, kBN>(sB[stage], p.b, p.ldb, k0, block_n, p.k, p.n, p.b_vec);
  };

  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

  // ldmatrix lane roles: lanes 8i..8i+7 give the row addresses of 8x8 matrix i.
  const int mat = lane >> 3, mrow = lane & 7;
  const int num_kt = (p.k + kBK - 1) / kBK;

  if (num_kt > 0) load_stage(0, 0);
  cp_async_commit();
  for (int kt = 0; kt < num_kt; kt++) {
    if (kt + 1 < num_kt) load_stage(kt + 1, (kt + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // every group but the newest is complete: stage kt & 1 has landed
    __syncthreads();

    const uint16_t* tA = sA[kt & 1];
    const uint16_t* tB = sB[kt & 1];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      // Warp level: A fragments of the 4 m16 tiles, B fragments of the 8 n8 tiles.
      uint32_t af[4][4], bf[8][2];
#pragma unroll
      for (int mi = 0; mi < 4; mi++) {
        const int m0 = warp_m + mi * 16;
        if constexpr (kAK)  // matrices: (m 0-7 | 8-15) x (k 0-7 | 8-15), m fastest
          ldmatrix_x4(af[mi], smem_addr(tA + swz<kBK>(m0 + mrow + (mat & 1) * 8, kk + (mat >> 1) * 8)));
        else  // tile rows are k: read k rows, transpose
          ldmatrix_x4_trans(af[mi], smem_addr(tA + swz<kBM>(kk + mrow + (mat >> 1) * 8, m0 + (mat & 1) * 8)));
      }
#pragma unroll
      for (int pj = 0; pj < 4; pj++) {
        const int n0 = warp_n + pj * 16;
        uint32_t r[4];
        if constexpr (kBKmaj)  // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
          ldmatrix_x4(r, smem_addr(tB + swz<kBK>(n0 + mrow + (mat >> 1) * 8, kk + (mat & 1) * 8)));
        else  // tile rows are k: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
          ldmatrix_x4_trans(r, smem_addr(tB + swz<kBN>(kk + mrow + (mat & 1) * 8, n0 + (mat >> 1) * 8)));
        bf[2 * pj][0] = r[0];
        bf[2 * pj][1] = r[1];
        bf[2 * pj + 1][0] = r[2];
        bf[2 * pj + 1][1] = r[3];
      }
      // Thread level: 32 mma per k16 step.
#pragma unroll
      for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int nj = 0; nj < 8; nj++) mma_16816<Elem16<kBF16>>(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
    }
    __syncthreads();  // everyone is done with stage kt & 1 before step kt + 2 overwrites it
  }
  cp_async_wait<0>();

  // Epilogue. Accumulator layout of an m16n8 tile: thread (g = lane / 4, t = lane % 4) holds
  // (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 4; mi++) {
#pragma unroll
    for (int nj = 0; nj < 8; nj++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int row = block_m + warp_m + mi * 16 + g + (e >> 1) * 8;
        const int col = block_n + warp_n + nj * 8 + 2 * t + (e & 1);
        if (row >= p.m || col >= p.n) continue;
        const int64_t idx = static_cast<int64_t>(row) * p.n + col;
        float v = p.alpha * acc[mi][nj][e];
        if (p.beta != 0.0f)
          v += p.beta *
               (p.c16 ? to_f32(static_cast<const C16*>(p.c)[idx]) : static_cast<const float*>(p.c)[idx]);
        if (p.bias) v += p.bias[col];
        if (p.gelu) {
          if (p.pre_gelu) p.pre_gelu[idx] = v;
          v = gelu(v);
        }
        if (p.c16)  // rounded once, to nearest even (common.cuh: the CPU's narrowing)
          static_cast<C16*>(p.c)[idx] = to_storage<C16>(v);
        else
          static_cast<float*>(p.c)[idx] = v;
      }
    }
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <bool kBF16>
void launch(const void* a, bool trans_a, const void* b, bool trans_b, void* c, bool c16, int64_t m, int64_t n,
            int64_t k, float alpha, float beta, const GemmEpilogue& epi, void* stream) {
  CUDA_OPS_REQUIRE(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "gemm_mma: dimensions must fit in int");
  if (m == 0 || n == 0) return;
  Params p;
  p.a = static_cast<const uint16_t*>(a);
  p.b = static_cast<const uint16_t*>(b);
  p.c = c;
  p.c16 = c16;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.lda = trans_a ? m : k;  // stored a: [k, m] or [m, k]
  p.ldb = trans_b ? k : n;  // stored b: [n, k] or [k, n]
  p.alpha = alpha;
  p.beta = beta;
  p.bias = epi.bias;
  p.gelu = epi.gelu;
  p.pre_gelu = epi.pre_gelu;
  p.a_vec = p.lda % 8 == 0 && aligned16(a);
  p.b_vec = p.ldb % 8 == 0 && aligned16(b);
  const dim3 grid(static_cast<unsigned>((n + kBN - 1) / kBN), static_cast<unsigned>((m + kBM - 1) / kBM));
  CUDA_OPS_REQUIRE(grid.y <= 65535u, "gemm_mma: m too large for the grid");
  const auto s = static_cast<cudaStream_t>(stream);
  const bool ak = !trans_a, bk = trans_b;
  if (ak && bk)
    gemm_mma_kernel<kBF16, true, true><<<grid, kThreadsGemm, 0, s>>>(p);
  else if (ak && !bk)
    gemm_mma_kernel<kBF16, true, false><<<grid, kThreadsGemm, 0, s>>>(p);
  else if (!ak && !bk)
    gemm_mma_kernel<kBF16, false, false><<<grid, kThreadsGemm, 0, s>>>(p);
  else
    gemm_mma_kernel<kBF16, false, true><<<grid, kThreadsGemm, 0, s>>>(p);
  CUDA_OPS_LAUNCHED();
}

}  // namespace

void gemm_bf16(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m, int64_t n,
               int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream) {
  launch<true>(a, trans_a, b, trans_b, c, false, m, n, k, alpha, beta, epilogue, stream);
}

void gemm_f16(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
              int64_t k, float alpha, float beta, const GemmEpilogue& epilogue, void* stream) {
  launch<false>(a, trans_a, b, trans_b, c, false, m, n, k, alpha, beta, epilogue, stream);
}

void gemm_mma(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
              DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
              const GemmEpilogue& epilogue, void* stream) {
  CUDA_OPS_REQUIRE(ab_dtype == DType::BF16 || ab_dtype == DType::F16,
                   "gemm_mma: a and b must be bf16 or fp16");
  CUDA_OPS_REQUIRE(c_dtype == DType::F32 || c_dtype == ab_dtype, "gemm_mma: c must be fp32 or a's dtype");
  const bool c16 = c_dtype != DType::F32;
  if (ab_dtype == DType::BF16)
    launch<true>(a, trans_a, b, trans_b, c, c16, m, n, k, alpha, beta, epilogue, stream);
  else
    launch<false>(a, trans_a, b, trans_b, c, c16, m, n, k, alpha, beta, epilogue, stream);
}

}  // namespace parallel::kernels
