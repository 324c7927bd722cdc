// Scaled dot-product attention on the CPU, FlashAttention-2 style: the scores are produced one
// [Br, Bc] tile at a time and folded into the output with an online softmax, so no [s, s] matrix
// exists: the forward's memory is O((Br + Bc) * d + Br * Bc) per thread whatever the sequence
// length, the backward's adds its task's packed rows (O(s * group * d) per thread, the size of
// the inputs' own rows, never O(s^2)). The backward recomputes the probabilities of each tile from
// the saved log-sum-exp instead of storing them. A mask's dead part of a tile is skipped inside the
// tile products too (Band), not only whole tiles.
//
// Layouts: q, dq [s, b, hq, d]; k, dk [s, b, hkv, d]; v, dv [s, b, hkv, dv]; out, dout
// [s, b, hq, dv]; lse [b, hq, s] (d: query/key head size, dv: value head size). A head's rows are
// therefore strided (by b * heads * d, or dv, when contiguous; q, k, v, dq, dk and dv may be views
// into the fused qkv tensor and its gradient, with their own position and batch strides:
// attention_tiles.hpp's Rows), but each row's d floats are contiguous, and every inner loop below
// runs along such a row (or along a tile row) so that GCC vectorises it without -ffast-math.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/attention_tiles.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/widen.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cpu {
namespace attention_tiles {

// x86-64-v3 (AVX2 + FMA), not plain "avx2": GCC's avx2 target has no FMA, so its clone of the tile
// products ran separate multiplies and adds at half the FMA peak (the avx512f clone has FMA).
#define PARALLEL_HOT __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))

PARALLEL_HOT float exp_tile_row(float* __restrict s, int64_t start, int64_t end, int64_t cols, float scale,
                                float shift) {
  // A row whose range starts past the tile would otherwise zero the next row (or, for a tile's last
  // row, the buffer after the tile).
  start = std::min(start, cols);
  end = std::clamp(end, start, cols);
  for (int64_t j = 0; j < start; j++) s[j] = 0.0f;
  for (int64_t j = start; j < end; j++) s[j] = clamp_exp_arg(scale * s[j] - shift);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = start; j < end; j++) {
    s[j] = exp_clamped(s[j]);
    sum += s[j];
  }
  for (int64_t j = end; j < cols; j++) s[j] = 0.0f;
  return sum;
}

PARALLEL_HOT float scaled_row_max(const float* __restrict s, int64_t start, int64_t end, float scale) {
  return lane_max(std::max<int64_t>(end - start, 0), [&](int64_t j) { return scale * s[start + j]; });
}

PARALLEL_HOT void dscores_tile_row(const float* __restrict p, float* __restrict dp, int64_t start,
                                   int64_t end, int64_t cols, float scale, float D) {
  start = std::min(start, cols);
  end = std::clamp(end, start, cols);
  for (int64_t j = 0; j < start; j++) dp[j] = 0.0f;
  for (int64_t j = start; j < end; j++) dp[j] = scale * p[j] * (dp[j] - D);
  for (int64_t j = end; j < cols; j++) dp[j] = 0.0f;
}

void online_softmax_tile(float* S, int64_t rows, int64_t cols, const BlockRanges& r, int64_t j0, float scale,
                         float* m, float* l, float* acc, int64_t d) {
  for (int64_t i = 0; i < rows; i++) {
    float* s_row = S + i * kBc;
    const int64_t start = r.start(i, j0), end = r.end(i, j0, cols);
    if (end <= start) {  // the row sees none of this tile: P = 0, m and l unchanged
      std::fill(s_row, s_row + cols, 0.0f);
      continue;
    }
    const float m_new = std::max(m[i], scaled_row_max(s_row, start, end, scale));
    const float sum = exp_tile_row(s_row, start, end, cols, scale, m_new);
    if (m_new != m[i]) {
      const float c = std::exp(m[i] - m_new);  // 0 on the first tile (m = -inf)
      float* a = acc + i * d;
      for (int64_t kk = 0; kk < d; kk++) a[kk] *= c;
      l[i] *= c;
    }
    l[i] += sum;
    m[i] = m_new;
  }
}

// The forward's query blocks per task: 4 x 64 rows, a whole sequence of 256 (the GPT steps'), so
// each key tile is transposed (and its values packed) once per head rather than once per block
// that sees it; the accumulators of the four blocks (66 KiB at dv = 64) stay in L2.
constexpr int64_t kForwardBlocks = 4;

Dims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v) {
  Dims x;
  x.dv = v.size(3);
  x.sq = q.size(0);
  x.B = q.size(1);
  x.hq = q.size(2);
  x.d = q.size(3);
  x.sk = k.size(0);
  x.hkv = k.size(2);
  PARALLEL_CHECK(x.hkv > 0 && x.hq % x.hkv == 0, "hq = {} is not a multiple of hkv = {}", x.hq, x.hkv);
  x.group = x.hq / x.hkv;
  return x;
}

// Forward: kT [d, Bc], S [Br, Bc], then acc [Br, dv], m and l of each of a task's kForwardBlocks
// query blocks. Backward: kT [d, Bc], vT [dv, Bc], P, dS [Br, Bc], dk_acc [Bc, d], dv_acc [Bc, dv],
// then the block ranges.
int64_t fp32_backward_tiles(const Dims& x) { return 2 * (x.d + x.dv) * kBc + 2 * kBr * kBc; }

Workspace fp32_workspace(const Dims& x, bool backward) {
  if (!backward) return {0, x.d * kBc + kBr * kBc + kForwardBlocks * (kBr * x.dv + 2 * kBr)};
  return {x.B * x.hq * x.sq, ranges_offset(fp32_backward_tiles(x)) + ranges_words(x)};
}

}  // namespace attention_tiles

namespace {

using namespace attention_tiles;

// C[m, n] += sum_k A(m, k) * B[k, n] with A(m, k) = A[m * a_rs + k * a_cs], so the same routine
// computes A @ B (a_cs = 1) and A^T @ B (a_rs = 1).
//
// A mask makes most of a diagonal tile dead, and the products skip it (`Band`): each row m of C
// either needs only the columns [lo[m], hi[m]) (`Bound::columns`: a score tile, whose other entries
// nobody reads) or only the depth [lo[m], hi[m]) (`Bound::depth`: A's row m is zero outside it, as a
// probability row outside its visible keys is). Register blocks take the hull of their rows'
// ranges; a row with lo >= hi needs nothing. Skipping zero terms of a depth sum leaves each sum
// exactly as it was (an FMA with a zero product returns its addend), so only the work changes.
// `overwrite`: C = A B instead of C += A B (C need not be zeroed first; under Bound::columns the
// entries outside the rows' ranges are left as they were).
enum class Bound { none, columns, depth };
struct Band {
  Bound bound = Bound::none;
  const int32_t* lo = nullptr;
  const int32_t* hi = nullptr;
  bool overwrite = false;
  // [a, b) = the hull of rows [m, m + R)'s ranges clipped to [0, limit) (a = b = 0 when all are empty);
  // [0, limit) for the bound this band does not apply to.
  void hull(Bound which, int64_t m, int64_t R, int64_t limit, int64_t& a, int64_t& b) const {
    if (bound != which) {
      a = 0, b = limit;
      return;
    }
    a = limit, b = 0;
    for (int64_t r = m; r < m + R; r++)
      if (lo[r] < hi[r]) a = std::min<int64_t>(a, lo[r]), b = std::max<int64_t>(b, hi[r]);
    a = std::max<int64_t>(a, 0), b = std::min(b, limit);
    if (a >= b) a = b = 0;
  }
};

// The plain version, for the edges the register-blocked ones leave, one row of C at a time: the n
// loop is the vectorised one, and k is unrolled by four so each C row is loaded and stored once
// per four rank-1 updates. A depth band is rounded out to the groups of four, so that every sum is
// grouped as without a band (the groups skipped are all zero).
inline void matmul_acc_edge(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs,
                            int64_t a_cs, const float* __restrict B, int64_t ldb, int64_t M, int64_t N,
                            int64_t K, const Band& band, int64_t m0, int64_t n0) {
  for (int64_t m = 0; m < M; m++) {
    int64_t n_lo = 0, n_hi = N, k = 0, k_hi = K;
    if (band.bound == Bound::columns) {
      band.hull(Bound::columns, m0 + m, 1, n0 + N, n_lo, n_hi);
      n_lo = std::max<int64_t>(n_lo - n0, 0), n_hi = std::max<int64_t>(n_hi - n0, 0);
    } else if (band.bound == Bound::depth) {
      band.hull(Bound::depth, m0 + m, 1, K, k, k_hi);
      k = k / 4 * 4;
      k_hi = std::min((k_hi + 3) / 4 * 4, K);
    }
    float* __restrict c = C + m * ldc;
    if (band.overwrite)
      for (int64_t n = n_lo; n < n_hi; n++) c[n] = 0.0f;
    const float* a = A + m * a_rs;
    for (; k + 4 <= k_hi; k += 4) {
      const float a0 = a[k * a_cs], a1 = a[(k + 1) * a_cs], a2 = a[(k + 2) * a_cs], a3 = a[(k + 3) * a_cs];
      const float* __restrict b0 = B + k * ldb;
      const float* __restrict b1 = b0 + ldb;
      const float* __restrict b2 = b1 + ldb;
      const float* __restrict b3 = b2 + ldb;
      for (int64_t n = n_lo; n < n_hi; n++) c[n] += a0 * b0[n] + a1 * b1[n] + a2 * b2[n] + a3 * b3[n];
    }
    for (; k < k_hi; k++) {
      const float a0 = a[k * a_cs];
      const float* __restrict b0 = B + k * ldb;
      for (int64_t n = n_lo; n < n_hi; n++) c[n] += a0 * b0[n];
    }
  }
}

// The edges of a product whose first M_blocked rows and N_blocked columns the blocked kernel did.
inline void matmul_acc_edges(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs,
                             int64_t a_cs, const float* __restrict B, int64_t ldb, int64_t M, int64_t N,
                             int64_t K, int64_t M_blocked, int64_t N_blocked, const Band& band) {
  if (N_blocked < N)
    matmul_acc_edge(C + N_blocked, ldc, A, a_rs, a_cs, B + N_blocked, ldb, M_blocked, N - N_blocked, K, band,
                    0, N_blocked);
  if (M_blocked < M)
    matmul_acc_edge(C + M_blocked * ldc, ldc, A + M_blocked * a_rs, a_rs, a_cs, B, ldb, M - M_blocked, N, K,
                    band, M_blocked, 0);
}

// The same product, register-blocked: a 4 x kNr block of C is accumulated in registers over the
// whole k loop (one load of B's row segment and four broadcasts of A per k, for 4 kNr FMAs), where
// the plain loop loads and stores C every few FMAs. Four named accumulators rather than a 2-D
// array, because GCC turns these into registers (one zmm each under AVX-512) but not the array.
// On AVX2 each accumulator is two ymm and GCC spilled them to the stack on every k (the clone ran
// at memory speed); matmul_acc_avx2 below keeps its accumulators in named ymm values instead.
constexpr int64_t kMr = 4, kNr = 16;

__attribute__((target_clones("avx512f", "default"))) void matmul_acc_arrays(
    float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs, int64_t a_cs,
    const float* __restrict B, int64_t ldb, int64_t M, int64_t N, int64_t K, const Band& band) {
  const int64_t M_blocked = M - M % kMr, N_blocked = N - N % kNr;
  for (int64_t m = 0; m < M_blocked; m += kMr) {
    const float* a = A + m * a_rs;
    int64_t n_lo, n_hi, k_lo, k_hi;
    band.hull(Bound::columns, m, kMr, N_blocked, n_lo, n_hi);
    band.hull(Bound::depth, m, kMr, K, k_lo, k_hi);
    if (k_lo >= k_hi && !band.overwrite) continue;  // every row's A is zero: C += 0
    for (int64_t n = n_lo / kNr * kNr; n < n_hi; n += kNr) {
      float acc0[kNr] = {}, acc1[kNr] = {}, acc2[kNr] = {}, acc3[kNr] = {};
      for (int64_t k = k_lo; k < k_hi; k++) {
        const float* b = B + k * ldb + n;
        const float a0 = a[k * a_cs], a1 = a[a_rs + k * a_cs], a2 = a[2 * a_rs + k * a_cs],
                    a3 = a[3 * a_rs + k * a_cs];
        for (int64_t j = 0; j < kNr; j++) {
          acc0[j] += a0 * b[j];
          acc1[j] += a1 * b[j];
          acc2[j] += a2 * b[j];
          acc3[j] += a3 * b[j];
        }
      }
      float* c = C + m * ldc + n;
      if (band.overwrite) {
        for (int64_t j = 0; j < kNr; j++) {
          c[j] = acc0[j];
          c[ldc + j] = acc1[j];
          c[2 * ldc + j] = acc2[j];
          c[3 * ldc + j] = acc3[j];
        }
      } else {
        for (int64_t j = 0; j < kNr; j++) {
          c[j] += acc0[j];
          c[ldc + j] += acc1[j];
          c[2 * ldc + j] += acc2[j];
          c[3 * ldc + j] += acc3[j];
        }
      }
    }
  }
  matmul_acc_edges(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, M_blocked, N_blocked, band);
}

// AVX2 + FMA: the same per-element arithmetic (acc = fma(a, b, acc) over k from zero, then c + acc)
// as GCC vector types, so that the accumulators are registers.
typedef float v8f __attribute__((vector_size(32)));

[[gnu::target("avx2,fma"), gnu::always_inline]] inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void store8(float* p, v8f v, bool overwrite) {
  if (!overwrite) v += load8(p);
  std::memcpy(p, &v, sizeof v);
}

// One R x 16 block of C over k in [k_lo, k_hi): 2 R accumulators, two loads of B and R broadcasts
// of A per k. R = 6 (12 accumulators, 12 FMAs per 8 loads) where the rows allow, else R = 4.
template <int R>
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void block_avx2(
    float* __restrict c, int64_t ldc, const float* __restrict a, int64_t a_rs, int64_t a_cs,
    const float* __restrict b, int64_t ldb, int64_t k_lo, int64_t k_hi, bool overwrite) {
  v8f lo[R] = {}, hi[R] = {};
  for (int64_t k = k_lo; k < k_hi; k++) {
    const v8f b0 = load8(b + k * ldb), b1 = load8(b + k * ldb + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
      const float ar = a[r * a_rs + k * a_cs];
      lo[r] += ar * b0;
      hi[r] += ar * b1;
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
    store8(c + r * ldc, lo[r], overwrite);
    store8(c + r * ldc + 8, hi[r], overwrite);
  }
}

template <int R>
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void row_block_avx2(
    float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs, int64_t a_cs,
    const float* __restrict B, int64_t ldb, int64_t m, int64_t N_blocked, int64_t K, const Band& band) {
  int64_t n_lo, n_hi, k_lo, k_hi;
  band.hull(Bound::columns, m, R, N_blocked, n_lo, n_hi);
  band.hull(Bound::depth, m, R, K, k_lo, k_hi);
  if (k_lo >= k_hi && !band.overwrite) return;  // every row's A is zero: C += 0
  for (int64_t n = n_lo / kNr * kNr; n < n_hi; n += kNr)
    block_avx2<R>(C + m * ldc + n, ldc, A + m * a_rs, a_rs, a_cs, B + n, ldb, k_lo, k_hi, band.overwrite);
}

[[gnu::target("avx2,fma")]] void matmul_acc_avx2(float* __restrict C, int64_t ldc, const float* __restrict A,
                                                 int64_t a_rs, int64_t a_cs, const float* __restrict B,
                                                 int64_t ldb, int64_t M, int64_t N, int64_t K,
                                                 const Band& band) {
  const int64_t N_blocked = N - N % kNr;
  const int64_t M6 = M / 6 * 6, M_blocked = M6 + (M - M6) / kMr * kMr;
  int64_t m = 0;
  for (; m < M6; m += 6) row_block_avx2<6>(C, ldc, A, a_rs, a_cs, B, ldb, m, N_blocked, K, band);
  for (; m < M_blocked; m += kMr) row_block_avx2<kMr>(C, ldc, A, a_rs, a_cs, B, ldb, m, N_blocked, K, band);
  matmul_acc_edges(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, M_blocked, N_blocked, band);
}

// AVX-512 and the baseline keep the cloned array version (no AVX2 clone of it: every CPU with
// AVX2 + FMA takes the explicit one). Decided once (CPUID through libgcc's cached model).
void matmul_acc(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs, int64_t a_cs,
                const float* __restrict B, int64_t ldb, int64_t M, int64_t N, int64_t K,
                const Band& band = {}) {
  static const bool avx2_fma =
      !__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2_fma) return matmul_acc_avx2(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, band);
  matmul_acc_arrays(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K, band);
}

// The per-row bands of one tile [j0, j0 + cols) of a query block: rows_lo/hi[i] = row i's visible
// columns of the tile (empty: lo >= hi).
void tile_bands(const BlockRanges& r, int64_t rows, int64_t j0, int64_t cols, int32_t* rows_lo,
                int32_t* rows_hi) {
  for (int64_t i = 0; i < rows; i++) {
    const int64_t lo = std::min(r.start(i, j0), cols);
    rows_lo[i] = static_cast<int32_t>(lo);
    rows_hi[i] = static_cast<int32_t>(std::max(r.end(i, j0, cols), lo));
  }
}

// From a tile's row bands: cols_lo/hi[j] = the hull of the rows that see column j (empty when none
// does), for the products whose rows are the tile's keys. O(rows * cols): only for tiles that some
// row sees in part (a tile every row sees whole needs no band).
void column_bands(int64_t rows, int64_t cols, const int32_t* rows_lo, const int32_t* rows_hi,
                  int32_t* cols_lo, int32_t* cols_hi) {
  for (int64_t j = 0; j < cols; j++) cols_lo[j] = static_cast<int32_t>(rows), cols_hi[j] = 0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = rows_lo[i]; j < rows_hi[i]; j++) {
      cols_lo[j] = std::min<int32_t>(cols_lo[j], static_cast<int32_t>(i));
      cols_hi[j] = static_cast<int32_t>(i + 1);
    }
}

// kT[kk, j] = rows[j][kk] for j in [j_lo, j_hi), kk in [k_lo, k_hi): the plain loop, for what
// the 8 x 8 blocks below leave.
// `packed` (when given): the same rows also copied as [cols, d].
inline void transpose_scalar(float* __restrict kT, float* __restrict packed, const float* __restrict rows,
                             int64_t row_stride, int64_t d, int64_t j_lo, int64_t j_hi, int64_t k_lo,
                             int64_t k_hi) {
  for (int64_t j = j_lo; j < j_hi; j++) {
    const float* r = rows + j * row_stride;
    for (int64_t kk = k_lo; kk < k_hi; kk++) kT[kk * kBc + j] = r[kk];
    if (packed != nullptr)
      for (int64_t kk = k_lo; kk < k_hi; kk++) packed[j * d + kk] = r[kk];
  }
}

// AVX2: 8 x 8 blocks transposed in registers (8 row loads, 24 shuffles, 8 stores), where the plain
// loop moves one float per load and store: the forward transposes a key tile for every query block
// that meets it, and the scalar loop cost about a tenth of the tile products.
// With `packed`, the rows loaded are also stored as [cols, d] (the backward's key tile for dQ += dS K),
// so that the strided rows are read once for both.
[[gnu::target("avx2")]] void transpose_avx2(float* __restrict kT, float* __restrict packed,
                                            const float* __restrict rows, int64_t row_stride, int64_t cols,
                                            int64_t d) {
  const int64_t cols8 = cols / 8 * 8, d8 = d / 8 * 8;
  for (int64_t j = 0; j < cols8; j += 8) {
    const float* r = rows + j * row_stride;
    for (int64_t kk = 0; kk < d8; kk += 8) {
      __m256 a[8], t[8];
      for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(r + i * row_stride + kk);
      if (packed != nullptr)
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(packed + (j + i) * d + kk, a[i]);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        a[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        a[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        a[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        a[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      float* out = kT + kk * kBc + j;
      for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(out + i * kBc, _mm256_permute2f128_ps(a[i], a[i + 4], 0x20));
        _mm256_storeu_ps(out + (i + 4) * kBc, _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
      }
    }
    transpose_scalar(kT, packed, rows, row_stride, d, j, j + 8, d8, d);
  }
  transpose_scalar(kT, packed, rows, row_stride, d, cols8, cols, 0, d);
}

// kT[kk, j] = rows[j][kk]: the key (or value) block transposed to [d, Bc], so that the score tile
// Q @ K^T becomes a plain A @ B whose inner loop runs along the keys.
// packed (optional): the rows also copied as [cols, d].
void transpose_block(float* __restrict kT, float* __restrict packed, const float* __restrict rows,
                     int64_t row_stride, int64_t cols, int64_t d) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return transpose_avx2(kT, packed, rows, row_stride, cols, d);
  transpose_scalar(kT, packed, rows, row_stride, d, 0, cols, 0, d);
}

// The same from rows of `dt` (row_stride in elements): each 16-bit row is widened on the way.
void transpose_block(float* __restrict kT, float* __restrict packed, const char* rows, DType dt,
                     int64_t row_stride, int64_t cols, int64_t d) {
  if (dt == DType::F32)
    return transpose_block(kT, packed, reinterpret_cast<const float*>(rows), row_stride, cols, d);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  // Widened a row at a time into [cols, d] (packed, or scratch), then transposed as fp32 rows.
  float* r = packed != nullptr ? packed : scratch_f32(7, kBc * d);
  for (int64_t j = 0; j < cols; j++) widen_to_f32(rows + j * row_stride * es, dt, r + j * d, d);
  transpose_block(kT, nullptr, r, d, cols, d);
}

// Asks for the `lines` 64-byte lines from each of `n` rows `stride` bytes apart into L2 (T1) ahead
// of use: rows far apart defeat the hardware's stride prefetchers (the row copies run through one
// memcpy whose loads alternate between operands), and their first touch was a tenth of the backward.
inline void prefetch_rows(const char* p, int64_t n, int64_t stride, int64_t bytes) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + i * stride + o, _MM_HINT_T1);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionBounds& mask, float softmax_scale) {
  if (attention_bf16_supported(q.dtype(), q.size(3)) && v.size(3) == q.size(3))
    return attention_forward_bf16(q, k, v, out, lse, mask, softmax_scale);
  // fp32, and 16-bit inputs without AVX512-BF16 (fp16, or an older CPU): the same fp32 kernel reads
  // and writes 16-bit rows. Each task widens the query rows of its blocks, each key tile is widened
  // as it is transposed and each value tile into thread-local scratch (widen.hpp), and the output
  // rows are narrowed as they are written: the same fp32 arithmetic as on fp32 inputs, no
  // whole-tensor copy.
  const DType dt = q.dtype();
  const bool wide = dt != DType::F32;
  PARALLEL_CHECK(k.dtype() == dt && v.dtype() == dt && out.dtype() == dt,
                 "attention_forward: q, k, v and out must share a dtype (q {}, k {}, v {}, out {})",
                 dtype_name(dt), dtype_name(k.dtype()), dtype_name(v.dtype()), dtype_name(out.dtype()));
  const Dims x = attention_dims(q, k, v);
  if (x.sq == 0 || x.B == 0 || x.hq == 0) return;
  const char* Q = static_cast<const char*>(q.data_ptr());
  const char* K = static_cast<const char*>(k.data_ptr());
  const char* V = static_cast<const char*>(v.data_ptr());
  char* O = static_cast<char*>(out.data_ptr());
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  float* L = lse.data<float>();
  const Rows qr = rows_of(q), kr = rows_of(k), vr = rows_of(v), outr = rows_of(out);
  const int64_t ldq = qr.s;  // stride between consecutive positions of one head
  const int64_t ldk = kr.s;
  const int64_t ldv = vr.s;
  const int64_t d = x.d, dv = x.dv;
  const int64_t nqb = (x.sq + kBr - 1) / kBr;
  const int64_t nqg = (nqb + kForwardBlocks - 1) / kForwardBlocks;

  // Per-thread scratch comes from the library allocator so that memory tests see it.
  const int64_t per_thread = fp32_workspace(x, false).per_thread;
  const int nthreads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::F32);
  float* scratch_base = scratch.data<float>();

#pragma omp parallel
  {
    // Every thread sizes its widening scratch before any task is handed out (the dynamic schedule
    // gives a thread different tasks on each call; growing in a later step would take fresh pages
    // inside that step).
    if (wide) scratch_f32(0, kForwardBlocks * kBr * d);
    scratch_f32(1, kBc * dv);
    scratch_f32(2, dv);
    scratch_f32(7, kBc * d);
    float* kT = scratch_base + omp_get_thread_num() * per_thread;  // [d, Bc]
    float* S = kT + d * kBc;                                       // [Br, Bc] scores, then probs
    float* acc_all = S + kBr * kBc;                                // [blocks, Br, dv] unnormalised outputs
    float* m_all = acc_all + kForwardBlocks * kBr * dv;            // [blocks, Br] running max
    float* l_all = m_all + kForwardBlocks * kBr;                   // [blocks, Br] running sum
    BlockRanges ranges[kForwardBlocks];
    int32_t band_lo[kBr], band_hi[kBr];  // each row's visible columns of the current tile

    // A task is (b, head, group of kForwardBlocks query blocks): it visits each key tile once for
    // the whole group (one transpose of K, one packed copy of V) and folds it into every block of
    // the group that sees it. Tasks write disjoint rows of out and lse. Under a causal mask later
    // groups see more keys, so they are handed out first for a balanced dynamic schedule.
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < x.B; b++) {
      for (int64_t h = 0; h < x.hq; h++) {
        for (int64_t qg_rev = 0; qg_rev < nqg; qg_rev++) {
          const int64_t qb0 = (nqg - 1 - qg_rev) * kForwardBlocks;
          const int64_t nblk = std::min(kForwardBlocks, nqb - qb0);
          const int64_t hk = h / x.group;
          const char* k_head = K + (kr.at(0, b) + hk * d) * es;
          const char* v_head = V + (vr.at(0, b) + hk * dv) * es;
          // The group's key range: the union of its blocks' (attention_mask.hpp).
          int64_t lo = x.sk, hi = 0;
          for (int64_t t = 0; t < nblk; t++) {
            const int64_t i0 = (qb0 + t) * kBr, rows = std::min(kBr, x.sq - i0);
            block_ranges(mask, b, i0, rows, x.sk, ranges[t]);
            if (!ranges[t].empty()) lo = std::min(lo, ranges[t].lo), hi = std::max(hi, ranges[t].hi);
            std::fill(acc_all + t * kBr * dv, acc_all + (t + 1) * kBr * dv, 0.0f);
            std::fill(m_all + t * kBr, m_all + (t + 1) * kBr, -std::numeric_limits<float>::infinity());
            std::fill(l_all + t * kBr, l_all + (t + 1) * kBr, 0.0f);
            if (wide) {
              float* qw = scratch_f32(0, kForwardBlocks * kBr * d) + t * kBr * d;
              for (int64_t i = 0; i < rows; i++)
                widen_to_f32(Q + (qr.at(i0 + i, b) + h * d) * es, dt, qw + i * d, d);
            }
          }

          // Only the key tiles that meet some row's visible range: under a causal mask none past
          // the group's last query, under documents or a window none before its first visible
          // key. Tiles stay aligned to kBc.
          const int64_t j_first = lo < hi ? lo / kBc * kBc : 0;
          for (int64_t j0 = j_first; j0 < hi; j0 += kBc) {
            const int64_t cols = std::min(kBc, hi - j0);
            transpose_block(kT, nullptr, k_head + j0 * ldk * es, dt, ldk, cols, d);
            // The value tile packed ([cols, dv]): in place its rows lie b * hkv * dv floats apart
            // and alias in L1, and the group's blocks reread it.
            float* v_blk = scratch_f32(1, kBc * dv);
            for (int64_t j = 0; j < cols; j++)
              widen_to_f32(v_head + (j0 + j) * ldv * es, dt, v_blk + j * dv, dv);
            if (j0 + kBc < hi) {  // the next tile's rows, while this one is computed
              const int64_t next = std::min(kBc, hi - j0 - kBc);
              prefetch_rows(k_head + (j0 + kBc) * ldk * es, next, ldk * es, d * es);
              prefetch_rows(v_head + (j0 + kBc) * ldv * es, next, ldv * es, dv * es);
            }

            for (int64_t t = 0; t < nblk; t++) {
              const BlockRanges& r = ranges[t];
              if (r.empty() || r.hi <= j0 || r.lo >= j0 + cols) continue;
              const int64_t i0 = (qb0 + t) * kBr, rows = std::min(kBr, x.sq - i0);
              // The block's output rows, written after its last tile: fetched while it is computed.
              if (r.hi <= j0 + kBc)
                prefetch_rows(O + (outr.at(i0, b) + h * dv) * es, rows, outr.s * es, dv * es);
              // fp32 reads the query rows in place: the next block's, while this one is computed.
              if (!wide && j0 == j_first && t + 1 < nblk)
                prefetch_rows(Q + (qr.at(i0 + kBr, b) + h * d) * es, std::min(kBr, x.sq - i0 - kBr), ldq * es,
                              d * es);
              // The query block: in place for fp32, else its rows widened ([rows, d]).
              const float* q_blk = wide ? scratch_f32(0, kForwardBlocks * kBr * d) + t * kBr * d
                                        : reinterpret_cast<const float*>(Q + (qr.at(i0, b) + h * d) * es);
              const int64_t ldq_blk = wide ? d : ldq;
              float* acc = acc_all + t * kBr * dv;
              // Only the scores each row sees (the diagonal tile's masked half is never computed),
              // and P V only over them (P is zero elsewhere).
              tile_bands(r, rows, j0, cols, band_lo, band_hi);
              const Band scores{Bound::columns, band_lo, band_hi, true},
                  visible{Bound::depth, band_lo, band_hi};
              matmul_acc(S, kBc, q_blk, ldq_blk, 1, kT, kBc, rows, cols, d, scores);  // S = Q_blk K_blk^T
              online_softmax_tile(S, rows, cols, r, j0, softmax_scale, m_all + t * kBr, l_all + t * kBr, acc,
                                  dv);
              matmul_acc(acc, dv, S, kBc, 1, v_blk, dv, rows, dv, cols, visible);  // acc += P V_blk
            }
          }

          float* o_row = wide ? scratch_f32(2, dv) : nullptr;
          for (int64_t t = 0; t < nblk; t++) {
            const int64_t i0 = (qb0 + t) * kBr, rows = std::min(kBr, x.sq - i0);
            const float* m = m_all + t * kBr;
            const float* l = l_all + t * kBr;
            for (int64_t i = 0; i < rows; i++) {
              // l == 0: the row saw no key (possible for a block of context parallelism): zero
              // output, lse = -inf, which attention_merge and the backward read as "nothing here".
              const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
              char* o_at = O + (outr.at(i0 + i, b) + h * dv) * es;
              float* o = wide ? o_row : reinterpret_cast<float*>(o_at);
              const float* a = acc_all + (t * kBr + i) * dv;
              for (int64_t kk = 0; kk < dv; kk++) o[kk] = a[kk] * inv_l;
              if (wide) narrow_from_f32(o_row, dt, o_at, dv);
              L[(b * x.hq + h) * x.sq + i0 + i] =
                  l[i] > 0.0f ? m[i] + std::log(l[i]) : -std::numeric_limits<float>::infinity();
            }
          }
        }
      }
    }
  }
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionBounds& mask, float softmax_scale) {
  if (attention_bf16_supported(q.dtype(), q.size(3)) && v.size(3) == q.size(3))
    return attention_backward_bf16(dout, q, k, v, out, lse, dq, dk, dv, mask, softmax_scale);
  // fp32, and 16-bit without AVX512-BF16 (the same fp32 kernel on 16-bit rows, as in the forward).
  // A (b, kv head) task packs (widens) the query and output-gradient rows of its heads once into
  // thread-local scratch ([sq, group, d]), each key tile as it is used, and accumulates its dQ rows
  // in fp32 scratch, written (narrowed) when the task ends; dK and dV rows are written from their
  // accumulators. Packed for fp32 too: in place, a block's 64 rows lie b * hq * d floats apart, a
  // multiple of 4 KiB at GPT-2's shapes, and fall into a few L1 sets, which the products reread.
  // Same arithmetic either way, no whole-tensor copies.
  const DType dt = q.dtype();
  PARALLEL_CHECK(dout.dtype() == dt && k.dtype() == dt && v.dtype() == dt && out.dtype() == dt &&
                     dq.dtype() == dt && dk.dtype() == dt && dv.dtype() == dt,
                 "attention_backward: dout, q, k, v, out, dq, dk and dv must share a dtype (q {})",
                 dtype_name(dt));
  const Dims x = attention_dims(q, k, v);
  if (x.B == 0 || x.hq == 0) return;
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const char* dO = static_cast<const char*>(dout.data_ptr());
  const char* Q = static_cast<const char*>(q.data_ptr());
  const char* K = static_cast<const char*>(k.data_ptr());
  const char* V = static_cast<const char*>(v.data_ptr());
  const char* O = static_cast<const char*>(out.data_ptr());
  const float* L = lse.data<float>();
  char* dQ = static_cast<char*>(dq.data_ptr());
  char* dK = static_cast<char*>(dk.data_ptr());
  char* dV = static_cast<char*>(dv.data_ptr());
  const Rows qr = rows_of(q), kr = rows_of(k), vr = rows_of(v), outr = rows_of(out), dor = rows_of(dout);
  const Rows dqr = rows_of(dq), dkr = rows_of(dk), dvr = rows_of(dv);
  const int64_t ldk = kr.s;
  const int64_t ldv = vr.s;
  const int64_t d = x.d, dvh = x.dv;

  // D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij, the softmax backward's per-row term, computed
  // once per row (by the task that owns the row's head) instead of once per key tile. [b, hq, sq]
  // like lse: O(s), not O(s^2).
  Tensor Dt = Tensor::empty({x.B, x.hq, x.sq}, DType::F32);
  float* Drow = Dt.data<float>();

  const int64_t per_thread = fp32_workspace(x, true).per_thread;
  const int nthreads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::F32);
  float* scratch_base = scratch.data<float>();

#pragma omp parallel
  {
    {  // sized before any task is handed out, as in the forward
      scratch_f32(0, x.sq * x.group * d);
      scratch_f32(1, x.sq * x.group * dvh);
      scratch_f32(2, x.sq * x.group * d);
      scratch_f32(3, kBc * d);
      scratch_f32(4, x.group * dvh);
      scratch_f32(7, kBc * std::max(d, dvh));
    }
    float* kT = scratch_base + omp_get_thread_num() * per_thread;  // [d, Bc]
    float* vT = kT + d * kBc;                                      // [dv, Bc]
    float* P = vT + dvh * kBc;                                     // [Br, Bc]
    float* dS = P + kBr * kBc;                                     // [Br, Bc] dP, then dS
    float* dk_acc = dS + kBr * kBc;                                // [Bc, d]
    float* dv_acc = dk_acc + kBc * d;                              // [Bc, dv]
    const int64_t nqb = (x.sq + kBr - 1) / kBr;
    // Of b's query blocks, after the tiles (an aggregate: the scratch words hold it as they are).
    BlockRanges* ranges = reinterpret_cast<BlockRanges*>(scratch_base + omp_get_thread_num() * per_thread +
                                                         ranges_offset(fp32_backward_tiles(x)));
    // A tile's bands (tile_bands): each query row's visible columns, each key column's rows.
    int32_t rows_lo[kBr], rows_hi[kBr], cols_lo[kBc], cols_hi[kBc];

    // A (b, kv head) task owns dK and dV of that kv head and dQ of exactly the query heads of its
    // group, so no two threads ever write the same gradient row: no atomics, no reduction.
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < x.B; b++) {
      for (int64_t hk = 0; hk < x.hkv; hk++) {
        const int64_t h_first = hk * x.group;
        // The task's query, output-gradient and dQ rows, packed in scratch laid out [sq, group, d]
        // (one row per position, the group's heads side by side), and D of each of its rows (from
        // the packed dO row).
        const int64_t gq = x.group * d, go = x.group * dvh;
        float* qw = scratch_f32(0, x.sq * gq);
        float* dow = scratch_f32(1, x.sq * go);
        constexpr int64_t kAhead = 8;  // rows prefetched ahead of the packing
        prefetch_rows(Q + (qr.at(0, b) + h_first * d) * es, std::min(kAhead, x.sq), qr.s * es, gq * es);
        prefetch_rows(dO + (dor.at(0, b) + h_first * dvh) * es, std::min(kAhead, x.sq), dor.s * es, go * es);
        prefetch_rows(O + (outr.at(0, b) + h_first * dvh) * es, std::min(kAhead, x.sq), outr.s * es, go * es);
        for (int64_t i = 0; i < x.sq; i++) {
          if (i + kAhead < x.sq) {
            prefetch_rows(Q + (qr.at(i + kAhead, b) + h_first * d) * es, 1, 0, gq * es);
            prefetch_rows(dO + (dor.at(i + kAhead, b) + h_first * dvh) * es, 1, 0, go * es);
            prefetch_rows(O + (outr.at(i + kAhead, b) + h_first * dvh) * es, 1, 0, go * es);
          }
          widen_to_f32(Q + (qr.at(i, b) + h_first * d) * es, dt, qw + i * gq, gq);
          widen_to_f32(dO + (dor.at(i, b) + h_first * dvh) * es, dt, dow + i * go, go);
          const float* o_rows = read_f32(O + (outr.at(i, b) + h_first * dvh) * es, dt, go, 4);
          for (int64_t g = 0; g < x.group; g++) {
            const float* o = o_rows + g * dvh;
            const float* gr = dow + i * go + g * dvh;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t kk = 0; kk < dvh; kk++) sum += o[kk] * gr[kk];
            Drow[(b * x.hq + h_first + g) * x.sq + i] = sum;
          }
        }
        const float* Qt = qw - h_first * d;  // indexed below as Qt[i * ldq_t + h * d]
        const float* dOt = dow - h_first * dvh;
        float* dQt = scratch_f32(2, x.sq * gq) - h_first * d;
        const int64_t ldq_t = gq, ldo_t = go;
        std::fill(dQt + h_first * d, dQt + h_first * d + x.sq * gq, 0.0f);
        for (int64_t qb = 0; qb < nqb; qb++)
          block_ranges(mask, b, qb * kBr, std::min(kBr, x.sq - qb * kBr), x.sk, ranges[qb]);
        const char* k_head = K + (kr.at(0, b) + hk * d) * es;
        const char* v_head = V + (vr.at(0, b) + hk * dvh) * es;

        for (int64_t j0 = 0; j0 < x.sk; j0 += kBc) {
          const int64_t cols = std::min(kBc, x.sk - j0);
          // The key tile transposed for the scores and, from the same loads, packed ([cols, d])
          // for dQ += dS K.
          float* k_blk = scratch_f32(3, kBc * d);
          transpose_block(kT, k_blk, k_head + j0 * ldk * es, dt, ldk, cols, d);
          transpose_block(vT, nullptr, v_head + j0 * ldv * es, dt, ldv, cols, dvh);
          if (j0 + kBc < x.sk) {  // the next tile's rows, while this one is computed
            const int64_t next = std::min(kBc, x.sk - j0 - kBc);
            prefetch_rows(k_head + (j0 + kBc) * ldk * es, next, ldk * es, d * es);
            prefetch_rows(v_head + (j0 + kBc) * ldv * es, next, ldv * es, dvh * es);
          }
          // The rows this tile writes at its end (dK, dV) and, spread over the tiles, the task's dQ
          // rows: their first touch (read for ownership) overlaps the products instead of stalling
          // the copies out.
          prefetch_rows(dK + (dkr.at(j0, b) + hk * d) * es, cols, dkr.s * es, d * es);
          prefetch_rows(dV + (dvr.at(j0, b) + hk * dvh) * es, cols, dvr.s * es, dvh * es);
          if (j0 < x.sq)
            prefetch_rows(dQ + (dqr.at(j0, b) + h_first * d) * es, std::min(kBc, x.sq - j0), dqr.s * es,
                          x.group * d * es);
          const int64_t ldk_blk = d;
          std::fill(dk_acc, dk_acc + cols * d, 0.0f);
          std::fill(dv_acc, dv_acc + cols * dvh, 0.0f);

          for (int64_t h = h_first; h < h_first + x.group; h++) {
            // Only the query blocks some row of which sees a key of this tile (attention_mask.hpp).
            for (int64_t i0 = 0; i0 < x.sq; i0 += kBr) {
              const BlockRanges& r = ranges[i0 / kBr];
              if (r.empty() || r.hi <= j0 || r.lo >= j0 + cols) continue;
              const int64_t rows = std::min(kBr, x.sq - i0);
              const float* q_blk = Qt + i0 * ldq_t + h * d;
              const float* do_blk = dOt + i0 * ldo_t + h * dvh;
              float* dq_blk = dQt + i0 * ldq_t + h * d;
              const float* lse_blk = L + (b * x.hq + h) * x.sq + i0;
              const float* D_blk = Drow + (b * x.hq + h) * x.sq + i0;

              // The products see only the tile's visible part: the scores P and dP of each row's
              // visible columns, and the sums over a row's (dQ) or a column's (dK, dV) visible
              // entries (P and dS are zero elsewhere). A tile every row sees whole needs no band.
              tile_bands(r, rows, j0, cols, rows_lo, rows_hi);
              bool whole = rows == kBr;
              for (int64_t i = 0; i < rows && whole; i++) whole = rows_lo[i] == 0 && rows_hi[i] == cols;
              if (!whole) column_bands(rows, cols, rows_lo, rows_hi, cols_lo, cols_hi);
              const Bound columns = whole ? Bound::none : Bound::columns,
                          depth = whole ? Bound::none : Bound::depth;
              const Band scores{columns, rows_lo, rows_hi, true}, row_sums{depth, rows_lo, rows_hi},
                  col_sums{depth, cols_lo, cols_hi};

              // P = exp(scale * Q K^T - lse), recomputed rather than stored by the forward.
              matmul_acc(P, kBc, q_blk, ldq_t, 1, kT, kBc, rows, cols, d, scores);
              for (int64_t i = 0; i < rows; i++)
                exp_tile_row(P + i * kBc, rows_lo[i], rows_hi[i], cols, softmax_scale, lse_blk[i]);
              matmul_acc(dv_acc, dvh, P, 1, kBc, do_blk, ldo_t, cols, dvh, rows, col_sums);  // dV += P^T dO

              // dS = scale * P * (dO V^T - D)
              matmul_acc(dS, kBc, do_blk, ldo_t, 1, vT, kBc, rows, cols, dvh, scores);
              for (int64_t i = 0; i < rows; i++)
                dscores_tile_row(P + i * kBc, dS + i * kBc, rows_lo[i], rows_hi[i], cols, softmax_scale,
                                 D_blk[i]);

              matmul_acc(dk_acc, d, dS, 1, kBc, q_blk, ldq_t, cols, d, rows, col_sums);        // dK += dS^T Q
              matmul_acc(dq_blk, ldq_t, dS, kBc, 1, k_blk, ldk_blk, rows, d, cols, row_sums);  // dQ += dS K
            }
          }

          for (int64_t j = 0; j < cols; j++) {
            narrow_from_f32(dk_acc + j * d, dt, dK + (dkr.at(j0 + j, b) + hk * d) * es, d);
            narrow_from_f32(dv_acc + j * dvh, dt, dV + (dvr.at(j0 + j, b) + hk * dvh) * es, dvh);
          }
        }
        for (int64_t i = 0; i < x.sq; i++)
          narrow_from_f32(dQt + i * ldq_t + h_first * d, dt, dQ + (dqr.at(i, b) + h_first * d) * es,
                          x.group * d);
      }
    }
  }
}

int64_t attention_workspace_bytes(DType dtype, int64_t s, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                                  int64_t dv, bool backward, int threads) {
  PARALLEL_CHECK(hkv > 0 && hq % hkv == 0, "hq = {} is not a multiple of hkv = {}", hq, hkv);
  const Dims x{s, s, b, hq, hkv, d, hq / hkv, dv};
  if (attention_bf16_supported(dtype, d) && dv == d) return bf16_workspace(x, backward).bytes(threads);
  // 16-bit rows are widened into the kernels' thread-local scratch (widen.hpp), not into tensors.
  return fp32_workspace(x, backward).bytes(threads);
}

}  // namespace parallel::cpu
