// The AVX2/FMA GEMM (gemm_avx2.hpp): packing that widens, a 6 x 16 micro-kernel, cache blocking
// for Zen 3 (32 KiB L1d, 512 KiB L2 per core, 32 MiB L3) and an epilogue that narrows once.
//
// Loops, outer to inner (BLIS's names and order):
//   jc: column panels of c, at most kNC wide (equal widths, whole slivers).
//   pc: blocks of at most kKC of k (equal sizes). The threads pack op(b)[pc.., jc..] together
//       ([kc, nc] fp32, slivers of [kc][16], up to 4 MiB: in L3), then all read it. Two such
//       buffers alternate, so one barrier a block suffices (a thread packs block p + 1 only after
//       every thread has passed the barrier behind block p - 1's use of the same buffer).
//   rows: each thread owns a contiguous range of c's rows (whole kMR slivers, balanced to within
//       one sliver), so no two threads write the same element and no reduction is needed.
//   ic: the thread's rows in blocks of at most kMC (equal sizes, whole slivers). The thread packs
//       op(a)[ic.., pc..] ([mc, kc] fp32, in L2) and runs the micro-kernel over it.
//   jr, ir: a kNR sliver of the B block ([kc, 16], 16 KiB, in L1) against each kMR sliver of the
//       A block: the micro-kernel's 6 x 16 tile of c in 12 ymm registers over kc steps.
// Packing work: op(b) once (k n), op(a) once per column panel (m k n / kNC): for every shape of
// the GPT step but the 50257-wide LM head, each operand is packed (and widened) exactly once.
// (Until 2026-11-27 the B panel held the whole k, which made panels narrow for a long k: the
// GPT-2 LM head's input gradient, k = 50257, packed its A 48 times.)
//
// c: an fp32 c is accumulated in place (the first k block scales the old c by beta, the later
// ones add, the last adds the bias). A 16-bit c over one k block is finished and narrowed in the
// micro-kernel's epilogue; over several, the thread's rows of the panel accumulate in fp32 scratch
// and the last k block narrows: alpha op(a) op(b) + beta c + bias, rounded to nearest even
// exactly as narrow_from_f32 (dtype.hpp). Sums run in fp32 in k order within a k block; the
// blocks' partial sums are added in order. oneDNN's kernels block k their own way, so results
// can differ from its fp32 product in the last bits.
//
// The functions with intrinsics carry a target attribute; the OpenMP region lives in a function
// without one (GCC outlines the region into a function of its own, which would not inherit it),
// and gemm_avx2_can_implement keeps the code off CPUs without AVX2, FMA or F16C.
#include "cpu/gemm_avx2.hpp"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/widen.hpp"

#define PARALLEL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace parallel::cpu {
namespace {

constexpr int64_t kMR = 6, kNR = 16;
constexpr int64_t kKC = 256;    // a [kKC, 16] B sliver is 16 KiB: half of L1d
constexpr int64_t kMC = 144;    // a [kMC, kKC] A block is 144 KiB: under a third of L2
constexpr int64_t kNC = 4096;   // a [kKC, kNC] B block is 4 MiB of the 32 MiB L3
constexpr int64_t kAlign = 16;  // packed buffers start on a 64-byte line (16 floats)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Element i of a row-major storage of dtype D, as fp32 (exact for every dtype).
template <DType D>
PARALLEL_AVX2 inline float load_one(const void* base, int64_t i) {
  if constexpr (D == DType::F32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (D == DType::BF16) {
    const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  } else {
    return _cvtsh_ss(static_cast<const uint16_t*>(base)[i]);
  }
}

// Elements i .. i+7, as fp32.
template <DType D>
PARALLEL_AVX2 inline __m256 load_eight(const void* base, int64_t i) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (D == DType::BF16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else
      return _mm256_cvtph_ps(h);
  }
}

// r[0..7] := its transpose: afterwards r[q] holds element q of every input row, in row order.
PARALLEL_AVX2 inline void transpose_8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]),
               t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]),
               t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]),
               t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
               s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
               s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
               s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
               s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)),
               s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
               s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)),
               s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Lanes 0 .. n-1 set (0 <= n <= 8), for a blend.
PARALLEL_AVX2 inline __m256 tail_mask(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes));
}

// Rows p0 .. p0+kc-1 of columns j0 .. j0+nr-1 of op(b) (nr <= 16) into dst as [kc][16], zero past
// nr.
template <DType D>
PARALLEL_AVX2 void pack_b_sliver(const void* B, bool trans_b, int64_t n, int64_t k, int64_t j0, int64_t nr,
                                 int64_t p0, int64_t kc, float* dst) {
  if (!trans_b) {  // op(b)[p][j] = B[p n + j]: 16 contiguous values per p
    if (nr == kNR) {
      for (int64_t p = 0; p < kc; p++) {
        _mm256_storeu_ps(dst + p * kNR, load_eight<D>(B, (p0 + p) * n + j0));
        _mm256_storeu_ps(dst + p * kNR + 8, load_eight<D>(B, (p0 + p) * n + j0 + 8));
      }
    } else {
      for (int64_t p = 0; p < kc; p++)
        for (int64_t j = 0; j < kNR; j++)
          dst[p * kNR + j] = j < nr ? load_one<D>(B, (p0 + p) * n + j0 + j) : 0.0f;
    }
    return;
  }
  // op(b)[p][j] = B[j k + p]: one contiguous row of b per column of the sliver. A full sliver
  // goes 8 x 8 at a time through registers (eight rows of b in, eight rows of the sliver out).
  int64_t p = 0;
  if (nr == kNR) {
    for (; p + 8 <= kc; p += 8)
      for (int64_t half = 0; half < kNR; half += 8) {
        __m256 r[8];
        for (int64_t j = 0; j < 8; j++) r[j] = load_eight<D>(B, (j0 + half + j) * k + p0 + p);
        transpose_8x8(r);
        for (int64_t q = 0; q < 8; q++) _mm256_storeu_ps(dst + (p + q) * kNR + half, r[q]);
      }
  }
  for (int64_t j = 0; j < kNR; j++) {
    if (j < nr) {
      const int64_t row = (j0 + j) * k + p0;
      for (int64_t q = p; q < kc; q++) dst[q * kNR + j] = load_one<D>(B, row + q);
    } else {
      for (int64_t q = p; q < kc; q++) dst[q * kNR + j] = 0.0f;
    }
  }
}

// op(a)[i0 .. i0+mc, p0 .. p0+kc] into dst as slivers of kMR rows, each [kc][6], zero past mc.
// The vector paths store 8 floats for each p's 6: the 2 extra land in slots written after them, or
// past the last sliver: dst has kPackSlack floats to spare.
constexpr int64_t kPackSlack = 8;
template <DType D>
PARALLEL_AVX2 void pack_a_block(const void* A, bool trans_a, int64_t m, int64_t k, int64_t i0, int64_t mc,
                                int64_t p0, int64_t kc, float* dst) {
  const int64_t slivers = ceil_div(mc, kMR);
  if (trans_a) {
    // op(a)[i][p] = A[p m + i]: row p of A holds the block's mc values of p contiguously. Row by
    // row, so that each cache line of A is read once for all the slivers it feeds (one sliver at
    // a time would walk A with a stride of m floats, a multiple of 4 KiB for m = 1024 .. 8192,
    // and lose its lines to the L1's set conflicts before the next sliver reads them). An 8-float
    // store's 2 extra floats land in the same sliver's next p, written after it; the last p's
    // would land in the next sliver's p = 0, written before it, so the last p stores exactly 6.
    const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for (int64_t p = 0; p < kc; p++) {
      const int64_t row = (p0 + p) * m;
      for (int64_t s = 0; s < slivers; s++) {
        const int64_t ib = i0 + s * kMR, mr = std::min(kMR, i0 + mc - ib);
        float* d = dst + s * kc * kMR + p * kMR;
        if (ib + 8 <= m) {
          __m256 v = load_eight<D>(A, row + ib);
          if (mr < kMR) v = _mm256_blendv_ps(_mm256_setzero_ps(), v, tail_mask(mr));
          if (p + 1 < kc)
            _mm256_storeu_ps(d, v);
          else
            _mm256_maskstore_ps(d, six, v);
        } else {
          for (int64_t i = 0; i < kMR; i++) d[i] = i < mr ? load_one<D>(A, row + ib + i) : 0.0f;
        }
      }
    }
    return;
  }
  for (int64_t s = 0; s < slivers; s++) {
    const int64_t ib = i0 + s * kMR, mr = std::min(kMR, i0 + mc - ib);
    float* d = dst + s * kc * kMR;
    // op(a)[i][p] = A[i k + p]: one contiguous row of a per row of the sliver
    int64_t p = 0;
    if (mr == kMR)  // 8 values of each row at a time, transposed through registers
      for (; p + 8 <= kc; p += 8) {
        __m256 r[8];
        for (int64_t i = 0; i < kMR; i++) r[i] = load_eight<D>(A, (ib + i) * k + p0 + p);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose_8x8(r);
        for (int64_t q = 0; q < 8; q++) _mm256_storeu_ps(d + (p + q) * kMR, r[q]);
      }
    for (int64_t i = 0; i < kMR; i++) {
      if (i < mr) {
        const int64_t row = (ib + i) * k + p0;
        for (int64_t q = p; q < kc; q++) d[q * kMR + i] = load_one<D>(A, row + q);
      } else {
        for (int64_t q = p; q < kc; q++) d[q * kMR + i] = 0.0f;
      }
    }
  }
}

// The last k block of a 16-bit c: instead of storing the fp32 tile, finish it (beta times the old
// 16-bit c, the bias) and store it narrowed, so a 16-bit c's block never makes a pass of its own.
struct Narrow {
  void* c = nullptr;  // the tile's first element in c (16-bit, row stride ldc)
  int64_t ldc = 0;
  DType type = DType::BF16;
  float beta = 0.0f;            // times the old c (0: c is not read)
  const float* bias = nullptr;  // the tile's 16 widened bias values, or nullptr
};

// fp32 lanes rounded to bf16 bit patterns in the low halves (float_to_bf16's arithmetic).
PARALLEL_AVX2 inline __m256i round_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

// 16 fp32 values at v as bf16 / fp16 at dst, rounded to nearest even exactly as narrow_from_f32
// (bf16: dtype_convert.cpp's bit-pattern rounding, NaN quietened; fp16: F16C).
PARALLEL_AVX2 inline void narrow_sixteen(__m256 lo, __m256 hi, DType type, uint16_t* dst) {
  if (type == DType::F16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8),
                     _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return;
  }
  // packus packs within 128-bit lanes: [lo 0-3, hi 0-3, lo 4-7, hi 4-7]; the permute restores order.
  const __m256i packed = _mm256_packus_epi32(round_to_bf16(lo), round_to_bf16(hi));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
}

PARALLEL_AVX2 inline __m256 load_sixteen_half(const uint16_t* src, DType type, int half) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8 * half));
  return type == DType::F16 ? _mm256_cvtph_ps(h)
                            : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// c[0..mr, 0..nr] = alpha (A B) + beta c, A a packed [kc][6] sliver, B a packed [kc][16] sliver
// (row stride kNR). beta == 0 does not read c. With `narrow`, the result goes on to the 16-bit c as
// Narrow says and C is only read. The full tile is stored from registers; an edge tile goes
// through a stack buffer with the same arithmetic (one fma per element; the library's scalar
// rounding, which the vector one matches).
PARALLEL_AVX2 void micro_kernel(int64_t kc, const float* A, const float* B, float* C, int64_t ldc, int64_t mr,
                                int64_t nr, float alpha, float beta, const Narrow* narrow) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
         c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
         c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
         c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int64_t i = 0; i < mr; i++) {  // c's tile is read or written after the loop: fetch it now
    if (narrow != nullptr) {
      _mm_prefetch(static_cast<const char*>(narrow->c) + 2 * i * narrow->ldc, _MM_HINT_T0);
      _mm_prefetch(static_cast<const char*>(narrow->c) + 2 * (i * narrow->ldc + kNR - 1), _MM_HINT_T0);
    }
    if (C != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + kNR - 1), _MM_HINT_T0);
    }
  }
  for (int64_t p = 0; p < kc; p++) {
    const __m256 b0 = _mm256_loadu_ps(B), b1 = _mm256_loadu_ps(B + 8);
    __m256 a = _mm256_broadcast_ss(A + 0);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(A + 1);
    c10 = _mm256_fmadd_ps(a, b0, c10);
    c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(A + 2);
    c20 = _mm256_fmadd_ps(a, b0, c20);
    c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(A + 3);
    c30 = _mm256_fmadd_ps(a, b0, c30);
    c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(A + 4);
    c40 = _mm256_fmadd_ps(a, b0, c40);
    c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(A + 5);
    c50 = _mm256_fmadd_ps(a, b0, c50);
    c51 = _mm256_fmadd_ps(a, b1, c51);
    A += kMR;
    B += kNR;
  }
  const __m256 acc[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (narrow != nullptr && mr == kMR && nr == kNR) {
    const __m256 vnb = _mm256_set1_ps(narrow->beta);
    for (int64_t i = 0; i < kMR; i++) {
      uint16_t* out = static_cast<uint16_t*>(narrow->c) + i * narrow->ldc;
      __m256 v[2];
      for (int h = 0; h < 2; h++) {
        v[h] = beta == 0.0f
                   ? _mm256_mul_ps(acc[i][h], va)
                   : _mm256_fmadd_ps(acc[i][h], va, _mm256_mul_ps(vb, _mm256_loadu_ps(C + i * ldc + 8 * h)));
        if (narrow->beta != 0.0f) v[h] = _mm256_fmadd_ps(vnb, load_sixteen_half(out, narrow->type, h), v[h]);
        if (narrow->bias != nullptr) v[h] = _mm256_add_ps(v[h], _mm256_loadu_ps(narrow->bias + 8 * h));
      }
      narrow_sixteen(v[0], v[1], narrow->type, out);
    }
    return;
  }
  if (narrow != nullptr) {
    alignas(32) float t[kMR * kNR];
    for (int64_t i = 0; i < kMR; i++) {
      _mm256_store_ps(t + i * kNR, acc[i][0]);
      _mm256_store_ps(t + i * kNR + 8, acc[i][1]);
    }
    for (int64_t i = 0; i < mr; i++) {
      uint16_t* out = static_cast<uint16_t*>(narrow->c) + i * narrow->ldc;
      for (int64_t j = 0; j < nr; j++) {
        const float x = t[i * kNR + j];
        float v = beta == 0.0f ? x * alpha : std::fma(x, alpha, beta * C[i * ldc + j]);
        if (narrow->beta != 0.0f) {
          const float old =
              narrow->type == DType::F16 ? f16_to_float(f16{out[j]}) : bf16_to_float(bf16{out[j]});
          v = std::fma(narrow->beta, old, v);
        }
        if (narrow->bias != nullptr) v += narrow->bias[j];
        out[j] = narrow->type == DType::F16 ? float_to_f16(v).bits : float_to_bf16(v).bits;
      }
    }
    return;
  }
  if (mr == kMR && nr == kNR) {
    for (int64_t i = 0; i < kMR; i++) {
      float* c = C + i * ldc;
      if (beta == 0.0f) {
        _mm256_storeu_ps(c, _mm256_mul_ps(acc[i][0], va));
        _mm256_storeu_ps(c + 8, _mm256_mul_ps(acc[i][1], va));
      } else {
        _mm256_storeu_ps(c, _mm256_fmadd_ps(acc[i][0], va, _mm256_mul_ps(vb, _mm256_loadu_ps(c))));
        _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(acc[i][1], va, _mm256_mul_ps(vb, _mm256_loadu_ps(c + 8))));
      }
    }
    return;
  }
  alignas(32) float t[kMR * kNR];
  for (int64_t i = 0; i < kMR; i++) {
    _mm256_store_ps(t + i * kNR, acc[i][0]);
    _mm256_store_ps(t + i * kNR + 8, acc[i][1]);
  }
  for (int64_t i = 0; i < mr; i++)
    for (int64_t j = 0; j < nr; j++) {
      float& c = C[i * ldc + j];
      c = beta == 0.0f ? t[i * kNR + j] * alpha : std::fma(t[i * kNR + j], alpha, beta * c);
    }
}

// The [mc, nc] block of c at C (row stride ldc) over one k block: A the packed block, B the first
// sliver of the packed panel (slivers b_stride floats apart, each starting at row pc).
// `narrow` (last k block of a 16-bit c): Narrow for the block's first element; each tile's is
// derived from it.
PARALLEL_AVX2 void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const float* A, const float* B,
                                int64_t b_stride, float* C, int64_t ldc, float alpha, float beta,
                                const Narrow* narrow) {
  for (int64_t jr = 0; jr < nc; jr += kNR) {
    const float* b = B + (jr / kNR) * b_stride;
    for (int64_t ir = 0; ir < mc; ir += kMR) {
      Narrow tile;
      if (narrow != nullptr) {
        tile = *narrow;
        tile.c = static_cast<uint16_t*>(narrow->c) + ir * narrow->ldc + jr;
        if (narrow->bias != nullptr) tile.bias = narrow->bias + jr;
      }
      micro_kernel(kc, A + (ir / kMR) * kc * kMR, b, C != nullptr ? C + ir * ldc + jr : nullptr, ldc,
                   std::min(kMR, mc - ir), std::min(kNR, nc - jr), alpha, beta,
                   narrow != nullptr ? &tile : nullptr);
    }
  }
}

// An fp32 c's row after the last k block: the bias (beta was taken in the first k block).
PARALLEL_AVX2 void add_bias_row(float* r, const float* bias, int64_t nc) {
  for (int64_t j = 0; j < nc; j++) r[j] += bias[j];
}

using PackB = void (*)(const void*, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
using PackA = void (*)(const void*, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*);

PackB pack_b_for(DType d) {
  switch (d) {
    case DType::BF16:
      return pack_b_sliver<DType::BF16>;
    case DType::F16:
      return pack_b_sliver<DType::F16>;
    default:
      return pack_b_sliver<DType::F32>;
  }
}

PackA pack_a_for(DType d) {
  switch (d) {
    case DType::BF16:
      return pack_a_block<DType::BF16>;
    case DType::F16:
      return pack_a_block<DType::F16>;
    default:
      return pack_a_block<DType::F32>;
  }
}

bool supported(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

}  // namespace

bool gemm_avx2_can_implement(const GemmAvx2Problem& p) {
  // F16C from CPUID leaf 1 directly (clang 14's __builtin_cpu_supports does not know "f16c").
  static const bool cpu = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return cpu && p.m > 0 && p.n > 0 && p.k > 0 && supported(p.a_type) && supported(p.b_type) &&
         supported(p.c_type) && (p.bias == nullptr || supported(p.bias_type));
}

// p rounded up to the next 64-byte boundary (scratch slots are allocated kAlign floats larger).
float* aligned(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~static_cast<uintptr_t>(63));
}

void gemm_avx2_run(const GemmAvx2Problem& p) {
  const int64_t m = p.m, n = p.n, k = p.k;
  const bool narrow = p.c_type != DType::F32;
  // k blocks of equal size (k = 384: two of 192, not 256 + 128); column panels of equal size,
  // whole slivers.
  const int64_t k_blocks = ceil_div(k, kKC), kc_max = ceil_div(k, k_blocks);
  const int64_t nc_max = round_up(ceil_div(n, ceil_div(n, kNC)), kNR);
  // Two B blocks, the calling thread's: shared by the team. While the threads multiply with one,
  // the first to finish packs the next k block into the other, so one barrier a block suffices.
  const int64_t b_block = kc_max * nc_max;
  float* b_blocks = aligned(scratch_f32(4, 2 * b_block + kAlign));
  const PackA pack_a = pack_a_for(p.a_type);
  const PackB pack_b = pack_b_for(p.b_type);
  const int64_t cs = static_cast<int64_t>(dtype_size(p.c_type));
  char* C = static_cast<char*>(p.c);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t slivers = ceil_div(m, kMR);
    const int64_t r0 = std::min(m, slivers * t / threads * kMR),
                  r1 = std::min(m, slivers * (t + 1) / threads * kMR);
    // The thread's rows in blocks of equal size (192 rows: two of 96, not 144 + 48), whole slivers.
    const int64_t rows = r1 - r0,
                  mc_max = rows > 0 ? round_up(ceil_div(rows, ceil_div(rows, kMC)), kMR) : kMR;
    float* a_block = aligned(scratch_f32(5, mc_max * kc_max + kPackSlack + kAlign));
    // A 16-bit c over several k blocks: the thread's rows of the panel accumulate in fp32 here.
    float* c_acc = narrow && k_blocks > 1
                       ? aligned(scratch_f32(6, std::max<int64_t>(rows, 1) * nc_max + kAlign))
                       : nullptr;
    float* bias_row = p.bias != nullptr ? scratch_f32(7, nc_max) : nullptr;  // the panel's widened bias
    int64_t use = 0;  // B blocks packed so far: which of the two the next one goes to
    for (int64_t jc = 0; jc < n; jc += nc_max) {
      const int64_t nc = std::min(nc_max, n - jc), panel_slivers = ceil_div(nc, kNR);
      if (bias_row != nullptr) widen_to_f32(offset_ptr(p.bias, p.bias_type, jc), p.bias_type, bias_row, nc);
      for (int64_t pc = 0; pc < k; pc += kc_max, use++) {
        const int64_t kc = std::min(kc_max, k - pc);
        const bool last = pc + kc >= k;
        float* panel = b_blocks + (use % 2) * b_block;
#pragma omp for schedule(static)
        for (int64_t s = 0; s < panel_slivers; s++)
          pack_b(p.b, p.trans_b, n, k, jc + s * kNR, std::min(kNR, nc - s * kNR), pc, kc,
                 panel + s * kc * kNR);
        // (the loop's barrier: the block is complete before anyone reads it, and everyone is done
        // with the block before last in this buffer)
        for (int64_t ic = r0; ic < r1; ic += mc_max) {
          const int64_t mc = std::min(mc_max, r1 - ic);
          pack_a(p.a, p.trans_a, m, k, ic, mc, pc, kc, a_block);
          float* block = narrow ? (c_acc != nullptr ? c_acc + (ic - r0) * nc_max : nullptr)
                                : reinterpret_cast<float*>(C) + ic * n + jc;
          const int64_t ldc = narrow ? nc_max : n;
          const float beta = pc > 0 ? 1.0f : narrow ? 0.0f : p.beta;
          // A 16-bit c: the last k block finishes and narrows each tile in the micro-kernel.
          Narrow fin;
          fin.c = C + (ic * n + jc) * cs, fin.ldc = n, fin.type = p.c_type, fin.beta = p.beta;
          fin.bias = bias_row;
          macro_kernel(mc, nc, kc, a_block, panel, kc * kNR, block, ldc, p.alpha, beta,
                       narrow && last ? &fin : nullptr);
          if (narrow || bias_row == nullptr || !last) continue;
          for (int64_t i = 0; i < mc; i++) add_bias_row(block + i * ldc, bias_row, nc);
        }
      }
    }
  }
}

}  // namespace parallel::cpu
