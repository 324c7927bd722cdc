// Scaled dot-product attention on the CPU, FlashAttention-2 style: the scores are produced one
// [Br, Bc] tile at a time and folded into the output with an online softmax, so memory is
// O((Br + Bc) * d + Br * Bc) per thread whatever the sequence length. The backward recomputes
// the probabilities of each tile from the saved log-sum-exp instead of storing them.
//
// Layouts: q, dq [s, b, hq, d]; k, dk [s, b, hkv, d]; v, dv [s, b, hkv, dv]; out, dout
// [s, b, hq, dv]; lse [b, hq, s] (d: query/key head size, dv: value head size). A head's rows are
// therefore strided by b * heads * d (or dv), but each row's d floats are contiguous, and every
// inner loop below runs along such a row (or along a tile row) so that GCC vectorises it without
// -ffast-math.
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
  end = std::max(end, start);
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

PARALLEL_HOT void dscores_tile_row(const float* __restrict p, float* __restrict dp, int64_t cols, float scale,
                                   float D) {
  for (int64_t j = 0; j < cols; j++) dp[j] = scale * p[j] * (dp[j] - D);
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

// Forward: kT [d, Bc], S [Br, Bc], acc [Br, dv], m, l. Backward: kT [d, Bc], vT [dv, Bc], P, dS
// [Br, Bc], dk_acc [Bc, d], dv_acc [Bc, dv], then the block ranges.
int64_t fp32_backward_tiles(const Dims& x) { return 2 * (x.d + x.dv) * kBc + 2 * kBr * kBc; }

Workspace fp32_workspace(const Dims& x, bool backward) {
  if (!backward) return {0, x.d * kBc + kBr * kBc + kBr * x.dv + 2 * kBr};
  return {x.B * x.hq * x.sq, ranges_offset(fp32_backward_tiles(x)) + ranges_words(x)};
}

}  // namespace attention_tiles

namespace {

using namespace attention_tiles;

// C[m, n] += sum_k A(m, k) * B[k, n] with A(m, k) = A[m * a_rs + k * a_cs], so the same routine
// computes A @ B (a_cs = 1) and A^T @ B (a_rs = 1). This is the plain version, for the edges the
// register-blocked one below leaves: the n loop is the vectorised one, and k is unrolled by four
// so each C row is loaded and stored once per four rank-1 updates.
inline void matmul_acc_edge(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs,
                            int64_t a_cs, const float* __restrict B, int64_t ldb, int64_t M, int64_t N,
                            int64_t K) {
  for (int64_t m = 0; m < M; m++) {
    float* __restrict c = C + m * ldc;
    const float* a = A + m * a_rs;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
      const float a0 = a[k * a_cs], a1 = a[(k + 1) * a_cs], a2 = a[(k + 2) * a_cs], a3 = a[(k + 3) * a_cs];
      const float* __restrict b0 = B + k * ldb;
      const float* __restrict b1 = b0 + ldb;
      const float* __restrict b2 = b1 + ldb;
      const float* __restrict b3 = b2 + ldb;
      for (int64_t n = 0; n < N; n++) c[n] += a0 * b0[n] + a1 * b1[n] + a2 * b2[n] + a3 * b3[n];
    }
    for (; k < K; k++) {
      const float a0 = a[k * a_cs];
      const float* __restrict b0 = B + k * ldb;
      for (int64_t n = 0; n < N; n++) c[n] += a0 * b0[n];
    }
  }
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
    const float* __restrict B, int64_t ldb, int64_t M, int64_t N, int64_t K) {
  const int64_t M_blocked = M - M % kMr, N_blocked = N - N % kNr;
  for (int64_t m = 0; m < M_blocked; m += kMr) {
    const float* a = A + m * a_rs;
    for (int64_t n = 0; n < N_blocked; n += kNr) {
      float acc0[kNr] = {}, acc1[kNr] = {}, acc2[kNr] = {}, acc3[kNr] = {};
      for (int64_t k = 0; k < K; k++) {
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
      for (int64_t j = 0; j < kNr; j++) {
        c[j] += acc0[j];
        c[ldc + j] += acc1[j];
        c[2 * ldc + j] += acc2[j];
        c[3 * ldc + j] += acc3[j];
      }
    }
  }
  if (N_blocked < N)
    matmul_acc_edge(C + N_blocked, ldc, A, a_rs, a_cs, B + N_blocked, ldb, M_blocked, N - N_blocked, K);
  if (M_blocked < M)
    matmul_acc_edge(C + M_blocked * ldc, ldc, A + M_blocked * a_rs, a_rs, a_cs, B, ldb, M - M_blocked, N, K);
}

// AVX2 + FMA: the same per-element arithmetic (acc = fma(a, b, acc) over k from zero, then c + acc)
// as GCC vector types, so that the accumulators are registers.
typedef float v8f __attribute__((vector_size(32)));

[[gnu::target("avx2,fma"), gnu::always_inline]] inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void add_store8(float* p, v8f v) {
  v += load8(p);
  std::memcpy(p, &v, sizeof v);
}

// One R x 16 block of C over the whole k: 2 R accumulators, two loads of B and R broadcasts of A
// per k. R = 6 (12 accumulators, 12 FMAs per 8 loads) where the rows allow, else R = 4.
template <int R>
[[gnu::target("avx2,fma"), gnu::always_inline]] inline void block_avx2(float* __restrict c, int64_t ldc,
                                                                       const float* __restrict a,
                                                                       int64_t a_rs, int64_t a_cs,
                                                                       const float* __restrict b, int64_t ldb,
                                                                       int64_t K) {
  v8f lo[R] = {}, hi[R] = {};
  for (int64_t k = 0; k < K; k++) {
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
    add_store8(c + r * ldc, lo[r]);
    add_store8(c + r * ldc + 8, hi[r]);
  }
}

[[gnu::target("avx2,fma")]] void matmul_acc_avx2(float* __restrict C, int64_t ldc, const float* __restrict A,
                                                 int64_t a_rs, int64_t a_cs, const float* __restrict B,
                                                 int64_t ldb, int64_t M, int64_t N, int64_t K) {
  const int64_t N_blocked = N - N % kNr;
  const int64_t M6 = M / 6 * 6, M_blocked = M6 + (M - M6) / kMr * kMr;
  for (int64_t n = 0; n < N_blocked; n += kNr) {
    int64_t m = 0;
    for (; m < M6; m += 6) block_avx2<6>(C + m * ldc + n, ldc, A + m * a_rs, a_rs, a_cs, B + n, ldb, K);
    for (; m < M_blocked; m += kMr)
      block_avx2<kMr>(C + m * ldc + n, ldc, A + m * a_rs, a_rs, a_cs, B + n, ldb, K);
  }
  if (N_blocked < N)
    matmul_acc_edge(C + N_blocked, ldc, A, a_rs, a_cs, B + N_blocked, ldb, M_blocked, N - N_blocked, K);
  if (M_blocked < M)
    matmul_acc_edge(C + M_blocked * ldc, ldc, A + M_blocked * a_rs, a_rs, a_cs, B, ldb, M - M_blocked, N, K);
}

// AVX-512 and the baseline keep the cloned array version (no AVX2 clone of it: every CPU with
// AVX2 + FMA takes the explicit one). Decided once (CPUID through libgcc's cached model).
void matmul_acc(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t a_rs, int64_t a_cs,
                const float* __restrict B, int64_t ldb, int64_t M, int64_t N, int64_t K) {
  static const bool avx2_fma =
      !__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2_fma) return matmul_acc_avx2(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K);
  matmul_acc_arrays(C, ldc, A, a_rs, a_cs, B, ldb, M, N, K);
}

// kT[kk, j] = rows[j][kk]: the key (or value) block transposed to [d, Bc], so that the score tile
// Q @ K^T becomes a plain A @ B whose inner loop runs along the keys.
void transpose_block(float* __restrict kT, const float* __restrict rows, int64_t row_stride, int64_t cols,
                     int64_t d) {
  for (int64_t j = 0; j < cols; j++) {
    const float* r = rows + j * row_stride;
    for (int64_t kk = 0; kk < d; kk++) kT[kk * kBc + j] = r[kk];
  }
}

// The same from rows of `dt` (row_stride in elements): each 16-bit row is widened on the way.
void transpose_block(float* __restrict kT, const char* rows, DType dt, int64_t row_stride, int64_t cols,
                     int64_t d) {
  if (dt == DType::F32) return transpose_block(kT, reinterpret_cast<const float*>(rows), row_stride, cols, d);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  float* r = scratch_f32(7, d);
  for (int64_t j = 0; j < cols; j++) {
    widen_to_f32(rows + j * row_stride * es, dt, r, d);
    for (int64_t kk = 0; kk < d; kk++) kT[kk * kBc + j] = r[kk];
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionBounds& mask, float softmax_scale) {
  if (attention_bf16_supported(q.dtype(), q.size(3)) && v.size(3) == q.size(3))
    return attention_forward_bf16(q, k, v, out, lse, mask, softmax_scale);
  // 16-bit inputs without AVX512-BF16 (fp16, or an older CPU): the fp32 kernel below, reading and
  // writing 16-bit rows. Each task widens the query rows of its block, each key tile is widened as it
  // is transposed and each value tile into thread-local scratch (widen.hpp), and the output rows are
  // narrowed as they are written: the same fp32 arithmetic as on fp32 inputs, no whole-tensor copy.
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
  const int64_t ldq = x.B * x.hq * x.d;  // stride between consecutive positions of one head
  const int64_t ldk = x.B * x.hkv * x.d;
  const int64_t ldv = x.B * x.hkv * x.dv;
  const int64_t d = x.d, dv = x.dv;
  const int64_t nqb = (x.sq + kBr - 1) / kBr;

  // Per-thread scratch comes from the library allocator so that memory tests see it.
  const int64_t per_thread = fp32_workspace(x, false).per_thread;
  const int nthreads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::F32);
  float* scratch_base = scratch.data<float>();

#pragma omp parallel
  {
    if (wide) {
      // 16-bit: every thread sizes its widening scratch before any task is handed out (the dynamic
      // schedule gives a thread different tasks on each call; growing in a later step would take
      // fresh pages inside that step).
      scratch_f32(0, kBr * d);
      scratch_f32(1, kBc * dv);
      scratch_f32(2, dv);
      scratch_f32(7, d);
    }
    float* kT = scratch_base + omp_get_thread_num() * per_thread;  // [d, Bc]
    float* S = kT + d * kBc;                                       // [Br, Bc] scores, then probs
    float* acc = S + kBr * kBc;                                    // [Br, dv] unnormalised output
    float* m = acc + kBr * dv;                                     // [Br] running max
    float* l = m + kBr;                                            // [Br] running sum
    BlockRanges ranges;

    // (b, head, query block) tasks write disjoint rows of out and lse. Under a causal mask later
    // blocks see more keys, so they are handed out first for a balanced dynamic schedule.
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < x.B; b++) {
      for (int64_t h = 0; h < x.hq; h++) {
        for (int64_t qb_rev = 0; qb_rev < nqb; qb_rev++) {
          const int64_t i0 = (nqb - 1 - qb_rev) * kBr;
          const int64_t rows = std::min(kBr, x.sq - i0);
          const int64_t hk = h / x.group;
          // The query block: in place for fp32, else its rows widened ([rows, d]).
          const float* q_blk = reinterpret_cast<const float*>(Q + ((i0 * x.B + b) * x.hq * d + h * d) * es);
          int64_t ldq_blk = ldq;
          if (wide) {
            float* qw = scratch_f32(0, kBr * d);
            for (int64_t i = 0; i < rows; i++)
              widen_to_f32(Q + (((i0 + i) * x.B + b) * x.hq * d + h * d) * es, dt, qw + i * d, d);
            q_blk = qw;
            ldq_blk = d;
          }
          const char* k_head = K + (b * x.hkv * d + hk * d) * es;
          const char* v_head = V + (b * x.hkv * dv + hk * dv) * es;

          std::fill(acc, acc + rows * dv, 0.0f);
          std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
          std::fill(l, l + rows, 0.0f);

          // Only the key tiles that meet some row's visible range (attention_mask.hpp): under a causal
          // mask none past the block's last query, under documents or a window none before the
          // block's first visible key. Tiles stay aligned to kBc.
          block_ranges(mask, b, i0, rows, x.sk, ranges);
          const int64_t key_end = ranges.empty() ? 0 : ranges.hi;
          for (int64_t j0 = ranges.empty() ? 0 : ranges.lo / kBc * kBc; j0 < key_end; j0 += kBc) {
            const int64_t cols = std::min(kBc, key_end - j0);
            transpose_block(kT, k_head + j0 * ldk * es, dt, ldk, cols, d);
            for (int64_t i = 0; i < rows; i++) std::fill(S + i * kBc, S + i * kBc + cols, 0.0f);
            matmul_acc(S, kBc, q_blk, ldq_blk, 1, kT, kBc, rows, cols, d);  // S = Q_blk K_blk^T
            online_softmax_tile(S, rows, cols, ranges, j0, softmax_scale, m, l, acc, dv);
            const float* v_blk = reinterpret_cast<const float*>(v_head + j0 * ldv * es);
            int64_t ldv_blk = ldv;
            if (wide) {
              float* vw = scratch_f32(1, kBc * dv);
              for (int64_t j = 0; j < cols; j++)
                widen_to_f32(v_head + (j0 + j) * ldv * es, dt, vw + j * dv, dv);
              v_blk = vw;
              ldv_blk = dv;
            }
            matmul_acc(acc, dv, S, kBc, 1, v_blk, ldv_blk, rows, dv, cols);  // acc += P V_blk
          }

          float* o_row = wide ? scratch_f32(2, dv) : nullptr;
          for (int64_t i = 0; i < rows; i++) {
            // l == 0: the row saw no key (possible for a block of context parallelism): zero
            // output, lse = -inf, which attention_merge and the backward read as "nothing here".
            const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            char* o_at = O + (((i0 + i) * x.B + b) * x.hq * dv + h * dv) * es;
            float* o = wide ? o_row : reinterpret_cast<float*>(o_at);
            const float* a = acc + i * dv;
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

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionBounds& mask, float softmax_scale) {
  if (attention_bf16_supported(q.dtype(), q.size(3)) && v.size(3) == q.size(3))
    return attention_backward_bf16(dout, q, k, v, out, lse, dq, dk, dv, mask, softmax_scale);
  // 16-bit without AVX512-BF16: the fp32 kernel below on 16-bit rows, as in the forward. A (b, kv
  // head) task widens the query and output-gradient rows of its heads once ([sq, group, d]), each
  // key tile as it is used, and accumulates its dQ rows in fp32 scratch, narrowed when the task
  // ends; dK and dV rows are narrowed from their accumulators. Same arithmetic, no whole copies.
  const DType dt = q.dtype();
  const bool wide = dt != DType::F32;
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
  const int64_t ldq = x.B * x.hq * x.d;
  const int64_t ldk = x.B * x.hkv * x.d;
  const int64_t ldv = x.B * x.hkv * x.dv;
  const int64_t ldo = x.B * x.hq * x.dv;  // out, dout
  const int64_t d = x.d, dvh = x.dv;

  // D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij, the softmax backward's per-row term, computed
  // once here instead of once per key tile. [b, hq, sq] like lse: O(s), not O(s^2).
  Tensor Dt = Tensor::empty({x.B, x.hq, x.sq}, DType::F32);
  float* Drow = Dt.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < x.B; b++) {
    for (int64_t h = 0; h < x.hq; h++) {
      for (int64_t i = 0; i < x.sq; i++) {
        const int64_t at = ((i * x.B + b) * x.hq * dvh + h * dvh) * es;
        const float* o = read_f32(O + at, dt, dvh, 0);
        const float* g = read_f32(dO + at, dt, dvh, 1);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t kk = 0; kk < dvh; kk++) sum += o[kk] * g[kk];
        Drow[(b * x.hq + h) * x.sq + i] = sum;
      }
    }
  }

  const int64_t per_thread = fp32_workspace(x, true).per_thread;
  const int nthreads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({nthreads, per_thread}, DType::F32);
  float* scratch_base = scratch.data<float>();

#pragma omp parallel
  {
    if (wide) {  // sized before any task is handed out, as in the forward
      scratch_f32(0, x.sq * x.group * d);
      scratch_f32(1, x.sq * x.group * dvh);
      scratch_f32(2, x.sq * x.group * d);
      scratch_f32(3, kBc * d);
      scratch_f32(7, std::max(d, dvh));
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

    // A (b, kv head) task owns dK and dV of that kv head and dQ of exactly the query heads of its
    // group, so no two threads ever write the same gradient row: no atomics, no reduction.
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < x.B; b++) {
      for (int64_t hk = 0; hk < x.hkv; hk++) {
        const int64_t h_first = hk * x.group;
        // The task's query, output-gradient and dQ rows: in place for fp32; for 16-bit widened
        // (dQ accumulated) in scratch laid out [sq, group, d], one row per position.
        const char* q_rows = Q + h_first * d * es;
        const char* do_rows = dO + h_first * dvh * es;
        const float* Qt = reinterpret_cast<const float*>(Q);
        const float* dOt = reinterpret_cast<const float*>(dO);
        float* dQt = reinterpret_cast<float*>(dQ);
        int64_t ldq_t = ldq, ldo_t = ldo, off_q = b * x.hq * d, off_o = b * x.hq * dvh;
        if (wide) {
          const int64_t gq = x.group * d, go = x.group * dvh;
          float* qw = scratch_f32(0, x.sq * gq);
          float* dow = scratch_f32(1, x.sq * go);
          for (int64_t i = 0; i < x.sq; i++) {
            widen_to_f32(q_rows + (i * x.B + b) * x.hq * d * es, dt, qw + i * gq, gq);
            widen_to_f32(do_rows + (i * x.B + b) * x.hq * dvh * es, dt, dow + i * go, go);
          }
          Qt = qw - h_first * d;  // indexed below as Qt[off_q + i * ldq_t + h * d]
          dOt = dow - h_first * dvh;
          dQt = scratch_f32(2, x.sq * gq) - h_first * d;
          ldq_t = gq;
          ldo_t = go;
          off_q = off_o = 0;
        }
        for (int64_t i = 0; i < x.sq; i++) {
          float* g = dQt + off_q + i * ldq_t + h_first * d;
          std::fill(g, g + x.group * d, 0.0f);
        }
        for (int64_t qb = 0; qb < nqb; qb++)
          block_ranges(mask, b, qb * kBr, std::min(kBr, x.sq - qb * kBr), x.sk, ranges[qb]);
        const char* k_head = K + (b * x.hkv * d + hk * d) * es;
        const char* v_head = V + (b * x.hkv * dvh + hk * dvh) * es;

        for (int64_t j0 = 0; j0 < x.sk; j0 += kBc) {
          const int64_t cols = std::min(kBc, x.sk - j0);
          transpose_block(kT, k_head + j0 * ldk * es, dt, ldk, cols, d);
          transpose_block(vT, v_head + j0 * ldv * es, dt, ldv, cols, dvh);
          // The key tile's rows for dQ += dS K: in place for fp32, else widened ([cols, d]).
          const float* k_blk = reinterpret_cast<const float*>(k_head + j0 * ldk * es);
          int64_t ldk_blk = ldk;
          if (wide) {
            float* kw = scratch_f32(3, kBc * d);
            for (int64_t j = 0; j < cols; j++) widen_to_f32(k_head + (j0 + j) * ldk * es, dt, kw + j * d, d);
            k_blk = kw;
            ldk_blk = d;
          }
          std::fill(dk_acc, dk_acc + cols * d, 0.0f);
          std::fill(dv_acc, dv_acc + cols * dvh, 0.0f);

          for (int64_t h = h_first; h < h_first + x.group; h++) {
            // Only the query blocks some row of which sees a key of this tile (attention_mask.hpp).
            for (int64_t i0 = 0; i0 < x.sq; i0 += kBr) {
              const BlockRanges& r = ranges[i0 / kBr];
              if (r.empty() || r.hi <= j0 || r.lo >= j0 + cols) continue;
              const int64_t rows = std::min(kBr, x.sq - i0);
              const float* q_blk = Qt + off_q + i0 * ldq_t + h * d;
              const float* do_blk = dOt + off_o + i0 * ldo_t + h * dvh;
              float* dq_blk = dQt + off_q + i0 * ldq_t + h * d;
              const float* lse_blk = L + (b * x.hq + h) * x.sq + i0;
              const float* D_blk = Drow + (b * x.hq + h) * x.sq + i0;

              // P = exp(scale * Q K^T - lse), recomputed rather than stored by the forward.
              for (int64_t i = 0; i < rows; i++) std::fill(P + i * kBc, P + i * kBc + cols, 0.0f);
              matmul_acc(P, kBc, q_blk, ldq_t, 1, kT, kBc, rows, cols, d);
              for (int64_t i = 0; i < rows; i++)
                exp_tile_row(P + i * kBc, r.start(i, j0), r.end(i, j0, cols), cols, softmax_scale,
                             lse_blk[i]);
              matmul_acc(dv_acc, dvh, P, 1, kBc, do_blk, ldo_t, cols, dvh, rows);  // dV += P^T dO

              // dS = scale * P * (dO V^T - D)
              for (int64_t i = 0; i < rows; i++) std::fill(dS + i * kBc, dS + i * kBc + cols, 0.0f);
              matmul_acc(dS, kBc, do_blk, ldo_t, 1, vT, kBc, rows, cols, dvh);
              for (int64_t i = 0; i < rows; i++)
                dscores_tile_row(P + i * kBc, dS + i * kBc, cols, softmax_scale, D_blk[i]);

              matmul_acc(dk_acc, d, dS, 1, kBc, q_blk, ldq_t, cols, d, rows);        // dK += dS^T Q
              matmul_acc(dq_blk, ldq_t, dS, kBc, 1, k_blk, ldk_blk, rows, d, cols);  // dQ += dS K
            }
          }

          for (int64_t j = 0; j < cols; j++) {
            const int64_t kv = (j0 + j) * x.B + b;
            narrow_from_f32(dk_acc + j * d, dt, dK + (kv * x.hkv * d + hk * d) * es, d);
            narrow_from_f32(dv_acc + j * dvh, dt, dV + (kv * x.hkv * dvh + hk * dvh) * es, dvh);
          }
        }
        if (wide)
          for (int64_t i = 0; i < x.sq; i++)
            narrow_from_f32(dQt + i * ldq_t + h_first * d, dt,
                            dQ + ((i * x.B + b) * x.hq * d + h_first * d) * es, x.group * d);
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
