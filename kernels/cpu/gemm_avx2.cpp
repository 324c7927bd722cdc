// The AVX2/FMA GEMM (gemm_avx2.hpp): packing that widens, a 6 x 16 micro-kernel, cache blocking
// for Zen 3 (32 KiB L1d, 512 KiB L2 per core, 32 MiB L3), dynamic work sharing between the
// threads and an epilogue that narrows once.
//
// Loops, outer to inner (BLIS's names and order), in one OpenMP region with no barrier inside:
//   jc: column panels of c, at most kNC wide (equal widths, whole slivers).
//   pc: blocks of at most kKC of k (equal sizes). A (panel, k block) is a phase. The threads pack
//       op(b)[pc.., jc..] together ([kc, nc] fp32, slivers of [kc][16], up to 4 MiB: in L3),
//       sliver by sliver from a shared counter, and wait only for the slivers still being packed.
//       Two such buffers alternate: a thread free early packs the next phase while the other
//       finishes this one (it waits first for the phase before this one to be done with it).
//   ic: row blocks of c (equal sizes, whole slivers, at most kMC rows, at least
//       kRowBlocksPerThread a thread where m allows), taken from a shared counter by whichever
//       thread is free (a row block waits for its own previous phase only), so no two threads
//       write the same element and a thread that lost its core or started late costs the other at
//       most one block. The thread packs op(a)[ic.., pc..] ([mc, kc] fp32, in L2) and runs the
//       micro-kernel over it.
//   jr, ir: a kNR sliver of the B block ([kc, 16], 16 KiB, in L1) against each kMR sliver of the
//       A block: the micro-kernel's 6 x 16 tile of c in 12 ymm registers over kc steps.
// Packing work: op(b) once (k n), op(a) once per column panel (m k n / kNC): for every shape of
// the GPT step but the 50257-wide LM head, each operand is packed (and widened) exactly once.
// Why no barriers (2026-11-27, docs/benchmarks.md "The own fp32 GEMM inside the step"): with the
// OpenMP threads passive, each barrier puts the early thread to sleep, and a static split of the
// rows makes both threads wait for the slower; that waiting does not show in process CPU time,
// which is what the GEMM benchmark's cpu_%peak measured. Tried and dropped: op(b) packed for up
// to 8 MiB of k at a time (fewer phases) made the step's GEMMs ~1.1x slower (a larger packed
// block in a cache the step's activations already fill), and packing 4 slivers a task, a row of b
// at a time, measured no better.
// Tried for cold operands and dropped (2026-11-27, docs/benchmarks.md "The own GEMM on cold
// operands"): prefetchw of c's tile; prefetching each op(b) sliver's (and op(a) block's) source
// lines before packing it; prefetching the next row block's op(a) source and the next phase's op(b)
// source between micro-kernels; kc 384; and broadcasting an untransposed fp32 op(a) from its rows
// instead of packing it (with and without prefetch 4 / 8 lines ahead). None measured ahead, cold or
// in the step; the unpacked op(a) and the between-kernel prefetches measured behind.
// c: an fp32 c is accumulated in place (the first k block scales the old c by beta, the later
// ones add, the last adds the bias). A 16-bit c over one k block is finished and narrowed in the
// micro-kernel's epilogue; over several, the panel's rows accumulate in fp32 scratch ([m, nc],
// the calling thread's) and the last k block narrows: alpha op(a) op(b) + beta c + bias, rounded to nearest
// even exactly as narrow_from_f32 (dtype.hpp). Sums run in fp32 in k order within a k block; the blocks'
// partial sums are added in order. oneDNN's kernels block k their own way, so results can differ from its
// fp32 product in the last bits.
//
// The functions with intrinsics carry a target attribute; the OpenMP region lives in a function
// without one (GCC outlines the region into a function of its own, which would not inherit it),
// and gemm_avx2_can_implement keeps the code off CPUs without AVX2, FMA or F16C.
#include "cpu/gemm_avx2.hpp"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>

#include "cpu/widen.hpp"

#define PARALLEL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace parallel::cpu {
namespace {

constexpr int64_t kMR = 6, kNR = 16;
constexpr int64_t kKC = 256;                // a [kKC, 16] B sliver is 16 KiB: half of L1d
constexpr int64_t kMC = 144;                // a [kMC, kKC] A block is 144 KiB: under a third of L2
constexpr int64_t kNC = 4096;               // a [kKC, kNC] B block is 4 MiB of the 32 MiB L3
constexpr int64_t kAlign = 16;              // packed buffers start on a 64-byte line (16 floats)
constexpr int64_t kRowBlocksPerThread = 4;  // dynamic row blocks: the last ones even out the threads

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

namespace {

// One phase's shared counters: packing tasks handed out and finished, row blocks handed out and
// finished.
struct PhaseCounters {
  std::atomic<int64_t> pack_next{0}, pack_done{0}, row_next{0}, rows_done{0};
};

// Until `done` reaches `target`. Every wait is for work another thread has already taken, so it
// is short unless that thread lost its core, in which case yielding gives it back.
void wait_for(const std::atomic<int64_t>& done, int64_t target) {
  for (int spins = 0; done.load(std::memory_order_acquire) < target; spins++) {
    _mm_pause();
    if (spins >= 2000) sched_yield();
  }
}

}  // namespace

void gemm_avx2_run(const GemmAvx2Problem& p) {
  const int64_t m = p.m, n = p.n, k = p.k;
  const bool narrow = p.c_type != DType::F32;
  // k blocks of equal size (k = 384: two of 192, not 256 + 128); column panels of equal size,
  // whole slivers. A phase is one k block of one panel, panel by panel.
  const int64_t k_blocks = ceil_div(k, kKC), kc_max = ceil_div(k, k_blocks);
  const int64_t nc_max = round_up(ceil_div(n, ceil_div(n, kNC)), kNR);
  const int64_t phases = ceil_div(n, nc_max) * k_blocks;
  // Row blocks of equal size, whole slivers, at most kMC rows, and at least kRowBlocksPerThread a
  // thread where m allows, so that the last blocks even out what the threads got done.
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t row_blocks_min = std::min(ceil_div(m, kMR), kRowBlocksPerThread * threads);
  const int64_t mc_max = round_up(ceil_div(m, std::max(ceil_div(m, kMC), row_blocks_min)), kMR);
  const int64_t row_blocks = ceil_div(m, mc_max);
  // Two phases' packed op(b), the calling thread's scratch, shared by the team: phase ph + 1 is
  // packed while phase ph's last row blocks run.
  const int64_t b_block = kc_max * nc_max;
  float* b_blocks = aligned(scratch_f32(4, 2 * b_block + kAlign));
  // A 16-bit c over several k blocks accumulates the panel in fp32 here (row block ic at row ic).
  float* c_acc = narrow && k_blocks > 1 ? aligned(scratch_f32(6, m * nc_max + kAlign)) : nullptr;
  std::unique_ptr<PhaseCounters[]> counters(new PhaseCounters[phases]);
  // Per row block, the phases done: a row block starts a phase only after it has finished the
  // phase before (same panel: the earlier k blocks of the same c; another panel: a 16-bit c's
  // fp32 rows in c_acc, which the panels share).
  std::unique_ptr<std::atomic<int64_t>[]> row_phases(new std::atomic<int64_t>[row_blocks]);
  for (int64_t r = 0; r < row_blocks; r++) row_phases[r].store(0, std::memory_order_relaxed);
  const PackA pack_a = pack_a_for(p.a_type);
  const PackB pack_b = pack_b_for(p.b_type);
  const int64_t cs = static_cast<int64_t>(dtype_size(p.c_type));
  char* C = static_cast<char*>(p.c);
#pragma omp parallel
  {
    float* a_block = aligned(scratch_f32(5, mc_max * kc_max + kPackSlack + kAlign));
    float* bias_row = p.bias != nullptr ? scratch_f32(7, nc_max) : nullptr;  // the panel's widened bias
    int64_t bias_jc = -1;                                                    // the panel it holds
    for (int64_t ph = 0; ph < phases; ph++) {
      PhaseCounters& ctr = counters[ph];
      const int64_t jc = ph / k_blocks * nc_max, nc = std::min(nc_max, n - jc),
                    panel_slivers = ceil_div(nc, kNR);
      const int64_t pc = ph % k_blocks * kc_max, kc = std::min(kc_max, k - pc);
      const bool last = pc + kc >= k;
      float* panel = b_blocks + (ph % 2) * b_block;
      // Pack op(b)'s block, a [kc, 16] sliver a task, whoever is free, once every row block of
      // phase ph - 2 (the buffer's last user) is done.
      if (ph >= 2 && ctr.pack_next.load(std::memory_order_relaxed) < panel_slivers)
        wait_for(counters[ph - 2].rows_done, row_blocks);
      for (int64_t s; (s = ctr.pack_next.fetch_add(1, std::memory_order_relaxed)) < panel_slivers;) {
        pack_b(p.b, p.trans_b, n, k, jc + s * kNR, std::min(kNR, nc - s * kNR), pc, kc, panel + s * kc * kNR);
        ctr.pack_done.fetch_add(1, std::memory_order_release);
      }
      wait_for(ctr.pack_done, panel_slivers);
      if (bias_row != nullptr && bias_jc != jc) {
        widen_to_f32(offset_ptr(p.bias, p.bias_type, jc), p.bias_type, bias_row, nc);
        bias_jc = jc;
      }
      // Row blocks, whoever is free.
      for (int64_t r; (r = ctr.row_next.fetch_add(1, std::memory_order_relaxed)) < row_blocks;) {
        wait_for(row_phases[r], ph);
        const int64_t ic = r * mc_max, mc = std::min(mc_max, m - ic);
        pack_a(p.a, p.trans_a, m, k, ic, mc, pc, kc, a_block);
        float* block = narrow ? (c_acc != nullptr ? c_acc + ic * nc_max : nullptr)
                              : reinterpret_cast<float*>(C) + ic * n + jc;
        const int64_t ldc = narrow ? nc_max : n;
        const float beta = pc > 0 ? 1.0f : narrow ? 0.0f : p.beta;
        // A 16-bit c: the last k block finishes and narrows each tile in the micro-kernel.
        Narrow fin;
        fin.c = C + (ic * n + jc) * cs, fin.ldc = n, fin.type = p.c_type, fin.beta = p.beta;
        fin.bias = bias_row;
        macro_kernel(mc, nc, kc, a_block, panel, kc * kNR, block, ldc, p.alpha, beta,
                     narrow && last ? &fin : nullptr);
        if (!narrow && bias_row != nullptr && last)
          for (int64_t i = 0; i < mc; i++) add_bias_row(block + i * ldc, bias_row, nc);
        row_phases[r].store(ph + 1, std::memory_order_release);
        ctr.rows_done.fetch_add(1, std::memory_order_release);
      }
    }
  }
}

}  // namespace parallel::cpu
