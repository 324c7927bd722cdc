// Scaled dot-product attention on bf16 tensors, on AVX512-BF16 dot products (vdpbf16ps): the
// FlashAttention-2 tiling of attention.cpp with every product read from bf16 operands and
// accumulated in fp32. As FlashAttention does (and our CUDA kernels), the probabilities P and dS
// are rounded to bf16 before the products that consume them (P V, P^T dO, dS^T Q, dS K); the
// scores, the online softmax, lse, D and every accumulator stay fp32. attention.cpp widened q, k
// and v to fp32 and ran fp32 FMAs instead: twice the multiply throughput and no fp32 copies here.
//
// vdpbf16ps works on pairs: acc[n] += a[2n] b[2n] + a[2n+1] b[2n+1] for 16 fp32 lanes n. A product
// C[m, n] += sum_k A(m, k) B(k, n) therefore walks k in pairs p: A's pair (A(m, 2p), A(m, 2p+1))
// is one 32-bit word, broadcast to all lanes, and B comes packed so that the word at
// Bp[p * ldb + n] holds (B(2p, n), B(2p+1, n)). Two layouts give such words without copying or
// after one cheap pass:
//   * a row-major bf16 matrix whose k runs along its rows: word (m, p) = word p of row m
//     (as A: q, dout, P and dS as they are; as B after transposing words: k and v for the scores);
//   * "row pairs": rows 2p and 2p+1 interleaved element by element, word (p, c) = (r[2p][c],
//     r[2p+1][c]) (as B: v, q, dout, k; read with its strides swapped, as A transposed: P^T, dS^T),
//     so that no product needs a transposed tile.
// An odd count of rows or keys is padded with a zero partner, never read from outside a tensor.
// GCC 12's AVX-512 headers make their "undefined" vectors with a self-initialisation that its own
// -Wuninitialized flags at -O2 (GCC bug 105593, fixed in 13): silence exactly that, for this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/attention_tiles.hpp"
#include "cpu/cpu_ops.hpp"
#include "parallel/dtype.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cpu {
namespace {

using namespace attention_tiles;

// bf16 element and bf16 pair, read through types that may alias the tensors' storage.
typedef uint16_t u16 __attribute__((may_alias));
typedef uint32_t u32 __attribute__((may_alias));

#ifndef PARALLEL_EMULATE_AVX512_BF16
#define PARALLEL_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// The file's two AVX512-BF16 instructions.
PARALLEL_BF16 inline __m512 dot_pairs_acc(__m512 acc, __m512bh a, __m512bh b) {
  return _mm512_dpbf16_ps(acc, a, b);
}
PARALLEL_BF16 inline __m256bh round_to_bf16(__m512 x) { return _mm512_cvtneps_pbh(x); }
#else
// The CMake option PARALLEL_EMULATE_AVX512_BF16, for scripts/avx512_emulated.sh only: the two
// instructions spelled in AVX-512F, so that an emulator without AVX512-BF16 (Bochs 2.7) runs every
// other line of this kernel (tiling, masks, tails, pair layouts). The arithmetic is the
// instructions' own (the odd pair's exact product added first, then the even one's, each rounded
// to nearest even; NaNs quieted), except that denormal inputs and results are kept, not flushed.
#define PARALLEL_BF16 __attribute__((target("avx512f,avx512bw,avx512vl")))

PARALLEL_BF16 inline __m512 dot_pairs_acc(__m512 acc, __m512bh a, __m512bh b) {
  const __m512i ai = (__m512i)a, bi = (__m512i)b, high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(ai, high)),
                        _mm512_castsi512_ps(_mm512_and_si512(bi, high)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(ai, 16)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(bi, 16)), acc);
}
PARALLEL_BF16 inline __m256bh round_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
  const __m512i r = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), quiet);
  return (__m256bh)_mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
#endif

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

// C[m, :N] = (accumulate ? C : 0) + sum_p A(m, p) . Bp[p, :N] for MR rows, NV vectors of 16 lanes
// (the last masked by `tail`). A(m, p) = Aw[m * a_rs + p * a_ps], a bf16 pair.
template <int MR, int NV>
PARALLEL_BF16 inline void dot_block(float* C, int64_t ldc, const u32* Aw, int64_t a_rs, int64_t a_ps,
                                    const u32* Bp, int64_t ldb, int64_t P, __mmask16 tail, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; p++) {
    __m512bh b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++)
      b[v] =
          (__m512bh)_mm512_maskz_loadu_epi32(v == NV - 1 ? tail : __mmask16(0xFFFF), Bp + p * ldb + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(Aw[i * a_rs + p * a_ps]));
#pragma GCC unroll 2
      for (int v = 0; v < NV; v++) acc[i][v] = dot_pairs_acc(acc[i][v], a, b[v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) {
      const __mmask16 m = v == NV - 1 ? tail : __mmask16(0xFFFF);
      float* c = C + i * ldc + 16 * v;
      __m512 r = acc[i][v];
      if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, r);
    }
  }
}

template <int NV>
PARALLEL_BF16 void dot_columns(float* C, int64_t ldc, const u32* Aw, int64_t a_rs, int64_t a_ps,
                               const u32* Bp, int64_t ldb, int64_t M, int64_t P, __mmask16 tail,
                               bool accumulate) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    dot_block<4, NV>(C + m * ldc, ldc, Aw + m * a_rs, a_rs, a_ps, Bp, ldb, P, tail, accumulate);
  switch (M - m) {
    case 3:
      dot_block<3, NV>(C + m * ldc, ldc, Aw + m * a_rs, a_rs, a_ps, Bp, ldb, P, tail, accumulate);
      break;
    case 2:
      dot_block<2, NV>(C + m * ldc, ldc, Aw + m * a_rs, a_rs, a_ps, Bp, ldb, P, tail, accumulate);
      break;
    case 1:
      dot_block<1, NV>(C + m * ldc, ldc, Aw + m * a_rs, a_rs, a_ps, Bp, ldb, P, tail, accumulate);
      break;
    default:
      break;
  }
}

// C[M, N] (fp32, row stride ldc) = (accumulate ? C : 0) + A B over P pairs of k; register blocks
// of 4 rows x 32 columns (8 accumulators, 2 B vectors and a broadcast: 11 of the 32 zmm).
PARALLEL_BF16 void dot_pairs(float* C, int64_t ldc, bool accumulate, const u32* Aw, int64_t a_rs,
                             int64_t a_ps, const u32* Bp, int64_t ldb, int64_t M, int64_t N, int64_t P) {
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t w = std::min<int64_t>(32, N - n0);
    if (w > 16)
      dot_columns<2>(C + n0, ldc, Aw, a_rs, a_ps, Bp + n0, ldb, M, P, lanes(w - 16), accumulate);
    else
      dot_columns<1>(C + n0, ldc, Aw, a_rs, a_ps, Bp + n0, ldb, M, P, lanes(w), accumulate);
  }
}

// Row pairs of a bf16 matrix: out[p * ldo + c] = (r[2p][c], r[2p+1][c]) for c < width, with
// r[i] = rows + i * ld and a zero partner for the last row when n is odd.
PARALLEL_BF16 void pair_rows(u32* out, int64_t ldo, const u16* rows, int64_t ld, int64_t n, int64_t width) {
  for (int64_t p = 0; p < (n + 1) / 2; p++) {
    const u16* r0 = rows + 2 * p * ld;
    const u16* r1 = 2 * p + 1 < n ? r0 + ld : nullptr;
    u32* o = out + p * ldo;
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 m = lanes(width - c);
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + c));
      const __m512i hi =
          r1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1 + c)) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(o + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// 16 fp32 values rounded to bf16 (nearest even) in the low halves of 16 32-bit lanes.
PARALLEL_BF16 inline __m512i bf16_lanes(const float* x, __mmask16 m) {
  const __m256bh h = round_to_bf16(_mm512_maskz_loadu_ps(m, x));
  return _mm512_cvtepu16_epi32((__m256i)h);
}

// Row pairs of an fp32 tile rounded to bf16 (P, dS: probabilities and their gradients, never
// denormal enough to matter for vcvtneps2bf16's flush to zero).
PARALLEL_BF16 void pair_rows_f32(u32* out, int64_t ldo, const float* rows, int64_t ld, int64_t n,
                                 int64_t width) {
  for (int64_t p = 0; p < (n + 1) / 2; p++) {
    const float* r0 = rows + 2 * p * ld;
    const float* r1 = 2 * p + 1 < n ? r0 + ld : nullptr;
    u32* o = out + p * ldo;
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 m = lanes(width - c);
      const __m512i lo = bf16_lanes(r0 + c, m);
      const __m512i hi = r1 ? bf16_lanes(r1 + c, m) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(o + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// An fp32 tile rounded to a row-major bf16 one: out row i holds width values, then a zero when
// width is odd (so the last pair of the row is complete).
PARALLEL_BF16 void round_rows(u16* out, int64_t ldo, const float* rows, int64_t ld, int64_t n,
                              int64_t width) {
  for (int64_t i = 0; i < n; i++) {
    const float* r = rows + i * ld;
    u16* o = out + i * ldo;
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 m = lanes(width - c);
      const __m256bh h = round_to_bf16(_mm512_maskz_loadu_ps(m, r + c));
      _mm256_mask_storeu_epi16(o + c, m, (__m256i)h);
    }
    if (width % 2) o[width] = 0;
  }
}

// Word transpose: out[p * ldo + j] = word p of row j (j < n, p < pairs): k or v rows made into
// the B operand of a product that contracts over the head dimension (Q K^T, dO V^T).
void transpose_words(u32* out, int64_t ldo, const u16* rows, int64_t ld, int64_t n, int64_t pairs) {
  for (int64_t j = 0; j < n; j++) {
    const u32* r = reinterpret_cast<const u32*>(rows + j * ld);
    for (int64_t p = 0; p < pairs; p++) out[p * ldo + j] = r[p];
  }
}

// rowsum(a * b) over d bf16 values, in fp32.
PARALLEL_BF16 float dot_row(const u16* a, const u16* b, int64_t d) {
  __m512 s = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 16) {
    const __mmask16 m = lanes(d - c);
    const __m512 x =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + c)), 16));
    const __m512 y =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + c)), 16));
    s = _mm512_fmadd_ps(x, y, s);
  }
  return _mm512_reduce_add_ps(s);
}

const u16* bits(const Tensor& t) { return reinterpret_cast<const u16*>(t.data<bf16>()); }
u16* bits(Tensor& t) { return reinterpret_cast<u16*>(t.data<bf16>()); }
const u32* words(const u16* p) { return reinterpret_cast<const u32*>(p); }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

bool attention_bf16_supported(DType dtype, int64_t head_dim) {
#ifdef PARALLEL_EMULATE_AVX512_BF16
  constexpr bool emulated = true;  // the two instructions are spelled in AVX-512F (above)
#else
  constexpr bool emulated = false;
#endif
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          (emulated || __builtin_cpu_supports("avx512bf16"));
  return cpu && dtype == DType::BF16 && head_dim % 2 == 0;
}

namespace attention_tiles {

// The backward's tiles per thread, in words; the query blocks' ranges follow them.
int64_t backward_tiles(const Dims& x) {
  const int64_t d = x.d, half_d = d / 2, dd = round_up(d, 16);
  return 2 * half_d * kBc + kBc / 2 * dd + 2 * (kBr / 2) * dd + 2 * kBr * kBc + 2 * (kBr / 2) * kBc +
         kBr * kBc / 2 + 2 * kBc * dd + x.group * x.sq * d + 16;
}

// Forward: kp and vp of every (b, kv head), sk * d words each, shared; per thread S [Br, Bc] fp32,
// P [Br, Bc] bf16, acc [Br, d] fp32 (rows padded to 16), m and l [Br]. Backward: D [b, hq, sq]
// shared; per thread kp, vp [d/2, Bc]; kc [Bc/2, d]; qi, doi [Br/2, d]; P, dS [Br, Bc] fp32;
// pi, dsi [Br/2, Bc]; dSb [Br, Bc] bf16; dk_acc, dv_acc [Bc, d] fp32; dq_acc [group, sq, d] fp32
// (dQ of the task's query heads, summed over all key blocks); then the query blocks' ranges.
Workspace bf16_workspace(const Dims& x, bool backward) {
  const int64_t d = x.d, half_d = d / 2, dd = round_up(d, 16);
  if (!backward)
    return {x.B * x.hkv * (half_d * x.sk + (x.sk + 1) / 2 * d),
            kBr * kBc + kBr * kBc / 2 + kBr * dd + 2 * kBr + 16};
  return {x.B * x.hq * x.sq, ranges_offset(backward_tiles(x)) + ranges_words(x)};
}

}  // namespace attention_tiles

void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                            const AttentionBounds& mask, float softmax_scale) {
  const Dims x = attention_dims(q, k, v);
  if (x.sq == 0 || x.B == 0 || x.hq == 0) return;
  const u16* Q = bits(q);
  const u16* K = bits(k);
  const u16* V = bits(v);
  u16* O = bits(out);
  float* L = lse.data<float>();
  const Rows qr = rows_of(q), kr = rows_of(k), vr = rows_of(v), outr = rows_of(out);
  const int64_t ldq = qr.s, d = x.d, half_d = d / 2;
  const int64_t nqb = (x.sq + kBr - 1) / kBr;

  // Every query block of a head reads all its keys and values: pack them once per call. kp:
  // [b, hkv][d/2, sk] words (keys transposed by pairs of d); vp: [b, hkv][ceil(sk/2), d] row pairs.
  const int64_t kp_head = half_d * x.sk, vp_head = (x.sk + 1) / 2 * d;
  Tensor packed = Tensor::empty({x.B * x.hkv * (kp_head + vp_head)}, DType::I32);
  u32* kp_all = reinterpret_cast<u32*>(packed.data<int32_t>());
  u32* vp_all = kp_all + x.B * x.hkv * kp_head;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < x.B; b++) {
    for (int64_t hk = 0; hk < x.hkv; hk++) {
      const int64_t head = b * x.hkv + hk;
      transpose_words(kp_all + head * kp_head, x.sk, K + kr.at(0, b) + hk * d, kr.s, x.sk, half_d);
      pair_rows(vp_all + head * vp_head, d, V + vr.at(0, b) + hk * d, vr.s, x.sk, d);
    }
  }

  const int64_t per_thread = bf16_workspace(x, false).per_thread;  // S, P, acc, m, l
  Tensor scratch = Tensor::empty({omp_get_max_threads(), per_thread}, DType::F32);
  float* scratch_base = scratch.data<float>();

#pragma omp parallel
  {
    float* S = scratch_base + omp_get_thread_num() * per_thread;
    u16* Pb = reinterpret_cast<u16*>(S + kBr * kBc);
    float* acc = S + kBr * kBc + kBr * kBc / 2;
    float* m = acc + kBr * round_up(d, 16);
    float* l = m + kBr;
    BlockRanges ranges;

#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < x.B; b++) {
      for (int64_t h = 0; h < x.hq; h++) {
        for (int64_t qb_rev = 0; qb_rev < nqb; qb_rev++) {
          const int64_t i0 = (nqb - 1 - qb_rev) * kBr;
          const int64_t rows = std::min(kBr, x.sq - i0);
          const int64_t head = b * x.hkv + h / x.group;
          const u32* q_blk = words(Q + qr.at(i0, b) + h * d);
          const u32* kp = kp_all + head * kp_head;
          const u32* vp = vp_all + head * vp_head;

          std::fill(acc, acc + rows * d, 0.0f);
          std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
          std::fill(l, l + rows, 0.0f);

          // The key tiles that meet some row's visible range, aligned to kBc (so j0 is even for vp).
          block_ranges(mask, b, i0, rows, x.sk, ranges);
          const int64_t key_end = ranges.empty() ? 0 : ranges.hi;
          for (int64_t j0 = ranges.empty() ? 0 : ranges.lo / kBc * kBc; j0 < key_end; j0 += kBc) {
            const int64_t cols = std::min(kBc, key_end - j0);
            dot_pairs(S, kBc, false, q_blk, ldq / 2, 1, kp + j0, x.sk, rows, cols, half_d);  // S = Q K^T
            online_softmax_tile(S, rows, cols, ranges, j0, softmax_scale, m, l, acc, d);
            round_rows(Pb, kBc, S, kBc, rows, cols);
            dot_pairs(acc, d, true, words(Pb), kBc / 2, 1, vp + j0 / 2 * d, d, rows, d,
                      (cols + 1) / 2);  // += P V
          }

          for (int64_t i = 0; i < rows; i++) {
            const float inv_l = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            float* a = acc + i * d;
            for (int64_t kk = 0; kk < d; kk++) a[kk] *= inv_l;
            convert_block_from_f32(a, DType::BF16, O + outr.at(i0 + i, b) + h * d, d);
            L[(b * x.hq + h) * x.sq + i0 + i] =
                l[i] > 0.0f ? m[i] + std::log(l[i]) : -std::numeric_limits<float>::infinity();
          }
        }
      }
    }
  }
}

void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionBounds& mask, float softmax_scale) {
  const Dims x = attention_dims(q, k, v);
  if (x.B == 0 || x.hq == 0) return;
  const u16* dO = bits(dout);
  const u16* Q = bits(q);
  const u16* K = bits(k);
  const u16* V = bits(v);
  const u16* O = bits(out);
  const float* L = lse.data<float>();
  u16* dQ = bits(dq);
  u16* dK = bits(dk);
  u16* dV = bits(dv);
  const Rows qr = rows_of(q), kr = rows_of(k), vr = rows_of(v), outr = rows_of(out), dor = rows_of(dout);
  const Rows dqr = rows_of(dq), dkr = rows_of(dk), dvr = rows_of(dv);
  const int64_t ldq = qr.s, ldo = dor.s, ldk = kr.s, ldv = vr.s, d = x.d, half_d = d / 2;

  // D_i = rowsum(dO_i * O_i), once per row rather than once per key tile.
  Tensor Dt = Tensor::empty({x.B, x.hq, x.sq}, DType::F32);
  float* Dv = Dt.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < x.B; b++)
    for (int64_t h = 0; h < x.hq; h++)
      for (int64_t i = 0; i < x.sq; i++)
        Dv[(b * x.hq + h) * x.sq + i] = dot_row(O + outr.at(i, b) + h * d, dO + dor.at(i, b) + h * d, d);

  // Per thread, in 32-bit words (bf16_workspace): kp, vp, kc, qi, doi, P, dS, pi, dsi, dSb,
  // dk_acc, dv_acc, dq_acc.
  const int64_t dd = round_up(d, 16);
  const int64_t per_thread = bf16_workspace(x, true).per_thread;
  Tensor scratch = Tensor::empty({omp_get_max_threads(), per_thread}, DType::F32);
  float* scratch_base = scratch.data<float>();

#pragma omp parallel
  {
    u32* kp = reinterpret_cast<u32*>(scratch_base + omp_get_thread_num() * per_thread);
    u32* vp = kp + half_d * kBc;
    u32* kc = vp + half_d * kBc;
    u32* qi = kc + kBc / 2 * dd;
    u32* doi = qi + kBr / 2 * dd;
    float* P = reinterpret_cast<float*>(doi + kBr / 2 * dd);
    float* dS = P + kBr * kBc;
    u32* pi = reinterpret_cast<u32*>(dS + kBr * kBc);
    u32* dsi = pi + kBr / 2 * kBc;
    u16* dSb = reinterpret_cast<u16*>(dsi + kBr / 2 * kBc);
    float* dk_acc = reinterpret_cast<float*>(dSb + kBr * kBc);
    float* dv_acc = dk_acc + kBc * dd;
    float* dq_acc = dv_acc + kBc * dd;
    const int64_t nqb = (x.sq + kBr - 1) / kBr;
    BlockRanges* ranges =
        reinterpret_cast<BlockRanges*>(scratch_base + omp_get_thread_num() * per_thread +
                                       ranges_offset(backward_tiles(x)));  // b's query blocks

    // A (b, kv head) task owns dK, dV of that kv head and dQ of the query heads of its group.
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < x.B; b++) {
      for (int64_t hk = 0; hk < x.hkv; hk++) {
        const int64_t h_first = hk * x.group;
        std::fill(dq_acc, dq_acc + x.group * x.sq * d, 0.0f);
        for (int64_t qb = 0; qb < nqb; qb++)
          block_ranges(mask, b, qb * kBr, std::min(kBr, x.sq - qb * kBr), x.sk, ranges[qb]);
        const u16* k_head = K + kr.at(0, b) + hk * d;
        const u16* v_head = V + vr.at(0, b) + hk * d;

        for (int64_t j0 = 0; j0 < x.sk; j0 += kBc) {
          const int64_t cols = std::min(kBc, x.sk - j0);
          transpose_words(kp, kBc, k_head + j0 * ldk, ldk, cols, half_d);
          transpose_words(vp, kBc, v_head + j0 * ldv, ldv, cols, half_d);
          pair_rows(kc, d, k_head + j0 * ldk, ldk, cols, d);
          std::fill(dk_acc, dk_acc + cols * d, 0.0f);
          std::fill(dv_acc, dv_acc + cols * d, 0.0f);

          for (int64_t h = h_first; h < h_first + x.group; h++) {
            for (int64_t i0 = 0; i0 < x.sq; i0 += kBr) {
              const BlockRanges& r = ranges[i0 / kBr];
              if (r.empty() || r.hi <= j0 || r.lo >= j0 + cols) continue;
              const int64_t rows = std::min(kBr, x.sq - i0), row_pairs = (rows + 1) / 2;
              const u16* q_blk = Q + qr.at(i0, b) + h * d;
              const u16* do_blk = dO + dor.at(i0, b) + h * d;
              const float* lse_blk = L + (b * x.hq + h) * x.sq + i0;
              const float* D_blk = Dv + (b * x.hq + h) * x.sq + i0;
              pair_rows(qi, d, q_blk, ldq, rows, d);
              pair_rows(doi, d, do_blk, ldo, rows, d);

              // P = exp(scale * Q K^T - lse), recomputed rather than stored by the forward.
              dot_pairs(P, kBc, false, words(q_blk), ldq / 2, 1, kp, kBc, rows, cols, half_d);
              for (int64_t i = 0; i < rows; i++)
                exp_tile_row(P + i * kBc, r.start(i, j0), r.end(i, j0, cols), cols, softmax_scale,
                             lse_blk[i]);
              pair_rows_f32(pi, kBc, P, kBc, rows, cols);
              dot_pairs(dv_acc, d, true, pi, 1, kBc, doi, d, cols, d, row_pairs);  // dV += P^T dO

              // dS = scale * P * (dO V^T - D)
              dot_pairs(dS, kBc, false, words(do_blk), ldo / 2, 1, vp, kBc, rows, cols, half_d);
              for (int64_t i = 0; i < rows; i++)
                dscores_tile_row(P + i * kBc, dS + i * kBc, 0, cols, cols, softmax_scale, D_blk[i]);
              pair_rows_f32(dsi, kBc, dS, kBc, rows, cols);
              dot_pairs(dk_acc, d, true, dsi, 1, kBc, qi, d, cols, d, row_pairs);  // dK += dS^T Q
              round_rows(dSb, kBc, dS, kBc, rows, cols);
              dot_pairs(dq_acc + ((h - h_first) * x.sq + i0) * d, d, true, words(dSb), kBc / 2, 1, kc, d,
                        rows, d,
                        (cols + 1) / 2);  // dQ += dS K
            }
          }

          for (int64_t j = 0; j < cols; j++) {
            convert_block_from_f32(dk_acc + j * d, DType::BF16, dK + dkr.at(j0 + j, b) + hk * d, d);
            convert_block_from_f32(dv_acc + j * d, DType::BF16, dV + dvr.at(j0 + j, b) + hk * d, d);
          }
        }

        for (int64_t g = 0; g < x.group; g++)
          for (int64_t i = 0; i < x.sq; i++)
            convert_block_from_f32(dq_acc + (g * x.sq + i) * d, DType::BF16,
                                   dQ + dqr.at(i, b) + (h_first + g) * d, d);
      }
    }
  }
}

}  // namespace parallel::cpu
