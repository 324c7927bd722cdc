// Element-wise ops: bias, add, scale, rounding to bf16/fp16, gelu, swiglu, dropout. Each hot loop
// is a small function cloned for AVX-512 / AVX2 / baseline (chosen at load time) and called on
// per-thread chunks from an OpenMP loop: the clones cannot live inside the OpenMP region itself,
// because GCC outlines the region into a separate function that target_clones would not see.
// The loops are templates over the storage type: fp32 and bf16 tensors are read and written in
// place (bf16_io.hpp: the widen and the narrow happen inside the loop, one pass over memory, fp32
// arithmetic, results bitwise those of widening, the fp32 loop and narrowing). fp16 tensors are
// widened chunk by chunk into per-thread fp32 scratch (widen.hpp) and run the fp32 loops.
// Built with -ffp-contract=off (CMakeLists.txt), so that every instantiation and every part of a
// vectorised loop rounds each product and sum alike: the bitwise contract does not rest on GCC
// contracting the same multiply-adds everywhere.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/bf16_io.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dropout_mask.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/widen.hpp"

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel::cpu {
namespace {

// Chunks of this many elements per OpenMP iteration: large enough to amortise scheduling, small
// enough to balance 2 threads on modest tensors; below two chunks the loop runs on one thread.
constexpr int64_t kChunk = 1 << 14;

template <typename F>
void parallel_chunks(int64_t n, F&& body) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t begin = c * kChunk;
    body(begin, std::min(n, begin + kChunk));
  }
}

// ---- bias, add, scale ----
// Each loop is an always-inline template and a cloned function per storage type that calls it:
// target_clones on the templates themselves would not be seen through their instantiations.
// `uint16_t` is bf16 storage (bf16_io.hpp). out may be an input, element for element (add_,
// scale_), which `omp simd` tells GCC instead of a runtime overlap check.
using bf16_t = uint16_t;

template <class Y, class B>
[[gnu::always_inline]] inline void add_row_t(Y* y, const B* b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) store_elem(y, i, load_elem(y, i) + load_elem(b, i));
}
template <class T>
[[gnu::always_inline]] inline void add_into_t(const T* a, const T* b, T* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) store_elem(out, i, load_elem(a, i) + load_elem(b, i));
}
template <class T>
[[gnu::always_inline]] inline void scale_into_t(const T* a, T* out, float alpha, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) store_elem(out, i, load_elem(a, i) * alpha);
}

PARALLEL_CLONES void add_row(float* y, const float* b, int64_t n) { add_row_t(y, b, n); }
PARALLEL_CLONES void add_row(bf16_t* y, const float* b, int64_t n) { add_row_t(y, b, n); }
PARALLEL_CLONES void add_row(float* y, const bf16_t* b, int64_t n) { add_row_t(y, b, n); }
PARALLEL_CLONES void add_into(const float* a, const float* b, float* out, int64_t n) {
  add_into_t(a, b, out, n);
}
PARALLEL_CLONES void add_into(const bf16_t* a, const bf16_t* b, bf16_t* out, int64_t n) {
  add_into_t(a, b, out, n);
}
PARALLEL_CLONES void scale_into(const float* a, float* out, float alpha, int64_t n) {
  scale_into_t(a, out, alpha, n);
}
PARALLEL_CLONES void scale_into(const bf16_t* a, bf16_t* out, float alpha, int64_t n) {
  scale_into_t(a, out, alpha, n);
}

// ---- rounding to bf16 / fp16 (mixed-precision emulation) ----
// Bit arithmetic on the fp32 pattern, branch-free so that it vectorises; the results are bitwise
// those of float_to_bf16 / float_to_f16 (src/core/dtype.cpp) widened back to fp32.

// bf16 keeps the top 16 bits: add 0x7fff plus the lowest kept bit (ties to even), clear the rest.
// NaN: keep the top bits and set the quiet bit, as float_to_bf16 does.
PARALLEL_CLONES void round_bf16_chunk(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t nan = (u & 0xffff0000u) | 0x00400000u;
    x[i] = std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

// fp16 by magnitude: NaN -> quiet NaN; >= 65520 -> inf; normal range [2^-14, 65520): keep 10
// mantissa bits (add 0xfff plus the lowest kept bit, clear 13 bits); below 2^-14 the fp16 grid is
// multiples of 2^-24: adding 0.5 puts the value where the fp32 ulp is 2^-24, so the fp32 addition
// itself rounds (ties to even, the default rounding mode) and subtracting 0.5 back is exact.
PARALLEL_CLONES void round_f16_chunk(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t sign = u & 0x80000000u, abs = u & 0x7fffffffu;
    const uint32_t normal = (abs + 0x0fffu + ((abs >> 13) & 1u)) & 0xffffe000u;
    const float tiny = (std::bit_cast<float>(abs) + 0.5f) - 0.5f;
    uint32_t r = abs < 0x38800000u ? std::bit_cast<uint32_t>(tiny) : normal;
    r = abs >= 0x477ff000u ? 0x7f800000u : r;
    r = abs > 0x7f800000u ? 0x7fc00000u : r;
    x[i] = std::bit_cast<float>(sign | r);
  }
}

// ---- gelu ----
// 0.5 (1 + tanh(u)) == sigmoid(2u) exactly, so y = x * sigmoid(2u): the same function as the
// tanh form in ops.hpp, without tanh's cancellation near 0 and with an exp that vectorises.
// sigmoid(z) = 1 / (1 + exp(-z)) is fast_sigmoid spelled out so that the exp argument's clamp runs
// in a loop of its own over a block (vec_math.hpp: inside the exp loop GCC makes it a branch and
// the AVX2 clone stays scalar). Same operations in the same order: bitwise fast_sigmoid's result.
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr int64_t kExpBlock = 256;  // exp arguments staged on the stack, 1 KiB

template <class T>
[[gnu::always_inline]] inline void gelu_fwd_t(const T* x, T* y, int64_t n) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < n; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, n - b);
    const T* xb = x + b;
    T* yb = y + b;
    for (int64_t i = 0; i < m; i++) {
      const float v = load_elem(xb, i);
      const float u = kGeluC * (v + kGeluA * v * v * v);
      arg[i] = clamp_exp_arg(-(2.0f * u));
    }
    for (int64_t i = 0; i < m; i++)
      store_elem(yb, i, load_elem(xb, i) * (1.0f / (1.0f + exp_clamped(arg[i]))));
  }
}
// d/dx [x s(2u)] = s + x * 2 s (1 - s) * du/dx, du/dx = c (1 + 3 a x^2); s (1 - s) = (1 - tanh^2)/4.
template <class T>
[[gnu::always_inline]] inline void gelu_bwd_t(const T* dy, const T* x, T* dx, int64_t n) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < n; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, n - b);
    const T* xb = x + b;
    const T* dyb = dy + b;
    T* dxb = dx + b;
    for (int64_t i = 0; i < m; i++) {
      const float v = load_elem(xb, i);
      const float u = kGeluC * (v + kGeluA * v * v * v);
      arg[i] = clamp_exp_arg(-(2.0f * u));
    }
    for (int64_t i = 0; i < m; i++) {
      const float v = load_elem(xb, i);
      const float s = 1.0f / (1.0f + exp_clamped(arg[i]));
      const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
      store_elem(dxb, i, load_elem(dyb, i) * (s + 2.0f * v * s * (1.0f - s) * du));
    }
  }
}
PARALLEL_CLONES void gelu_fwd_chunk(const float* x, float* y, int64_t n) { gelu_fwd_t(x, y, n); }
PARALLEL_CLONES void gelu_fwd_chunk(const bf16_t* x, bf16_t* y, int64_t n) { gelu_fwd_t(x, y, n); }
PARALLEL_CLONES void gelu_bwd_chunk(const float* dy, const float* x, float* dx, int64_t n) {
  gelu_bwd_t(dy, x, dx, n);
}
PARALLEL_CLONES void gelu_bwd_chunk(const bf16_t* dy, const bf16_t* x, bf16_t* dx, int64_t n) {
  gelu_bwd_t(dy, x, dx, n);
}

// ---- swiglu ----
// The same blocking as gelu: clamp first, then exp and the rest.
template <class T>
[[gnu::always_inline]] inline void swiglu_fwd_t(const T* gate, const T* up, T* y, int64_t f) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < f; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, f - b);
    const T* gb = gate + b;
    const T* ub = up + b;
    T* yb = y + b;
    for (int64_t i = 0; i < m; i++) arg[i] = clamp_exp_arg(-load_elem(gb, i));
    for (int64_t i = 0; i < m; i++) {
      const float g = load_elem(gb, i);
      store_elem(yb, i, g * (1.0f / (1.0f + exp_clamped(arg[i]))) * load_elem(ub, i));
    }
  }
}
// y = g s(g) u: dy/dg = u s (1 + g (1 - s)), dy/du = g s.
template <class T>
[[gnu::always_inline]] inline void swiglu_bwd_t(const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                                int64_t f) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < f; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, f - b);
    const T* gb = gate + b;
    for (int64_t i = 0; i < m; i++) arg[i] = clamp_exp_arg(-load_elem(gb, i));
    for (int64_t i = 0; i < m; i++) {
      const int64_t k = b + i;
      const float g = load_elem(gate, k), s = 1.0f / (1.0f + exp_clamped(arg[i]));
      const float d = load_elem(dy, k);
      store_elem(dgate, k, d * load_elem(up, k) * s * (1.0f + g * (1.0f - s)));
      store_elem(dup, k, d * g * s);
    }
  }
}
PARALLEL_CLONES void swiglu_fwd_row(const float* gate, const float* up, float* y, int64_t f) {
  swiglu_fwd_t(gate, up, y, f);
}
PARALLEL_CLONES void swiglu_fwd_row(const bf16_t* gate, const bf16_t* up, bf16_t* y, int64_t f) {
  swiglu_fwd_t(gate, up, y, f);
}
PARALLEL_CLONES void swiglu_bwd_row(const float* dy, const float* gate, const float* up, float* dgate,
                                    float* dup, int64_t f) {
  swiglu_bwd_t(dy, gate, up, dgate, dup, f);
}
PARALLEL_CLONES void swiglu_bwd_row(const bf16_t* dy, const bf16_t* gate, const bf16_t* up, bf16_t* dgate,
                                    bf16_t* dup, int64_t f) {
  swiglu_bwd_t(dy, gate, up, dgate, dup, f);
}

// ---- dropout ----
// The mask is dropout_mask.hpp's, shared with the fused ops of norm.cpp.

PARALLEL_DROPOUT_CLONES void dropout_chunk(const DropoutMask& m, const float* x, float* y, int64_t n,
                                           uint64_t first) {
  dropout_row(m, x, y, n, first);
}
PARALLEL_DROPOUT_CLONES void dropout_chunk(const DropoutMask& m, const bf16_t* x, bf16_t* y, int64_t n,
                                           uint64_t first) {
  dropout_row(m, x, y, n, first);
}
PARALLEL_DROPOUT_CLONES void dropout_add_chunk(const DropoutMask& m, const float* branch,
                                               const float* residual, float* out, int64_t n, uint64_t first) {
  dropout_add_row(m, branch, residual, out, n, first);
}
PARALLEL_DROPOUT_CLONES void dropout_add_chunk(const DropoutMask& m, const bf16_t* branch,
                                               const bf16_t* residual, bf16_t* out, int64_t n,
                                               uint64_t first) {
  dropout_add_row(m, branch, residual, out, n, first);
}

// The flat element-wise ops on any floating dtype, chunk by chunk: `body(begin, inputs..., out, n)`
// is a generic callable given the chunk's first element and typed pointers to the chunk. fp32 and bf16
// tensors are passed as they are (float, uint16_t); fp16 chunks are widened into scratch, run as fp32, and
// the output narrowed.
template <typename F>
void unary_chunks(const Tensor& x, Tensor& out, F&& body) {
  const DType dt = x.dtype();
  parallel_chunks(x.numel(), [&](int64_t b, int64_t e) {
    if (dt == DType::F32) {
      body(b, x.data<float>() + b, out.data<float>() + b, e - b);
    } else if (dt == DType::BF16) {
      body(b, static_cast<const bf16_t*>(x.data_ptr()) + b, static_cast<bf16_t*>(out.data_ptr()) + b, e - b);
    } else {
      const float* in = read_f32(offset_ptr(x.data_ptr(), dt, b), dt, e - b, 0);
      float* o = write_f32(offset_ptr(out.data_ptr(), dt, b), dt, e - b, 1);
      body(b, in, o, e - b);
      write_back(o, dt, offset_ptr(out.data_ptr(), dt, b), e - b);
    }
  });
}
template <typename F>
void binary_chunks(const Tensor& x, const Tensor& z, Tensor& out, F&& body) {
  const DType dt = x.dtype();
  parallel_chunks(x.numel(), [&](int64_t b, int64_t e) {
    if (dt == DType::F32) {
      body(b, x.data<float>() + b, z.data<float>() + b, out.data<float>() + b, e - b);
    } else if (dt == DType::BF16) {
      body(b, static_cast<const bf16_t*>(x.data_ptr()) + b, static_cast<const bf16_t*>(z.data_ptr()) + b,
           static_cast<bf16_t*>(out.data_ptr()) + b, e - b);
    } else {
      const float* in0 = read_f32(offset_ptr(x.data_ptr(), dt, b), dt, e - b, 0);
      const float* in1 = read_f32(offset_ptr(z.data_ptr(), dt, b), dt, e - b, 1);
      float* o = write_f32(offset_ptr(out.data_ptr(), dt, b), dt, e - b, 2);
      body(b, in0, in1, o, e - b);
      write_back(o, dt, offset_ptr(out.data_ptr(), dt, b), e - b);
    }
  });
}

void dropout(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset) {
  if (p == 0.0f) {
    if (y.data_ptr() != x.data_ptr()) std::memcpy(y.data_ptr(), x.data_ptr(), x.nbytes());
    return;
  }
  const DropoutMask m(p, seed, offset);
  unary_chunks(x, y, [&](int64_t b, const auto* in, auto* out, int64_t n) {
    dropout_chunk(m, in, out, n, m.first + static_cast<uint64_t>(b));
  });
}

}  // namespace

// y[r, :] += bias: the broadcast makes this row-wise rather than flat. The bias is widened once,
// on the calling thread, and shared read-only by the workers.
void add_bias(Tensor& y, const Tensor& bias) {
  const int64_t h = bias.numel(), rows = h == 0 ? 0 : y.numel() / h;
  const DType dt = y.dtype();
  const float* B = read_f32(bias.data_ptr(), bias.dtype(), h, 7);
#pragma omp parallel for schedule(static) if (rows * h > 2 * kChunk)
  for (int64_t r = 0; r < rows; r++) {
    if (dt == DType::F32) {
      add_row(y.data<float>() + r * h, B, h);
    } else if (dt == DType::BF16) {
      add_row(static_cast<bf16_t*>(y.data_ptr()) + r * h, B, h);
    } else {
      void* yr = offset_ptr(y.data_ptr(), dt, r * h);
      float* Y = write_f32(yr, dt, h, 0);
      widen_to_f32(yr, dt, Y, h);
      add_row(Y, B, h);
      write_back(Y, dt, yr, h);
    }
  }
}

namespace {

// Thread t's columns [c0, c0 + nc) of h among nt: ranges in multiples of 16 (whole cache lines of
// fp32 and bf16 rows), the last thread's up to h. Shared by bias_backward and gelu_backward_bias,
// whose column sums must split alike.
struct Columns {
  int64_t c0, nc;
};
Columns bias_columns(int64_t h, int64_t t, int64_t nt) {
  const int64_t c0 = std::min(h, (h * t / nt + 15) / 16 * 16);
  const int64_t c1 = t + 1 == nt ? h : std::min(h, (h * (t + 1) / nt + 15) / 16 * 16);
  return {c0, c1 - c0};
}

}  // namespace

// dbias += column sums of dy. Threads own disjoint column blocks (no partial buffers, no races,
// and the sum order is fixed, so the result does not depend on the thread count or the blocking).
// The blocks are at most kCols wide and come in a multiple of the thread count, so that every
// thread sums as many columns: h = 384 in blocks of 256 left one of two threads a third idle.
// Each thread owns one contiguous range of columns and walks the rows in order, adding each row's
// slice into an fp32 accumulator row (per-thread scratch, L1/L2-resident), then adds it to dbias.
// Every column is summed over the rows in row order from 0 and then added to dbias, whatever the
// split: the result does not depend on the thread count. The rows are read front to back as long
// contiguous slices; blocks of <= 256 columns walked down the rows one after the other (before)
// read each row in 1 KB pieces at a stride of h and ran at ~6 GB/s.
void bias_backward(const Tensor& dy, Tensor& dbias) {
  const int64_t h = dbias.numel();
  if (h == 0) return;
  const int64_t rows = dy.numel() / h;
  const DType dt = dy.dtype();
  float* dB = dbias.data<float>();
  const bool parallel = rows * h > 2 * kChunk;
  const int threads = parallel ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    const auto [c0, nc] = bias_columns(h, omp_get_thread_num(), omp_get_num_threads());
    if (nc > 0) {
      float* acc = scratch_f32(5, nc);
      std::fill_n(acc, nc, 0.0f);
      for (int64_t r = 0; r < rows; r++) {
        if (dt == DType::BF16)
          add_row(acc, static_cast<const bf16_t*>(dy.data_ptr()) + r * h + c0, nc);
        else
          add_row(acc, read_f32(offset_ptr(dy.data_ptr(), dt, r * h + c0), dt, nc, 0), nc);
      }
      add_row(dB + c0, acc, nc);
    }
  }
}

// gelu_backward and bias_backward of its output in one pass: the same column split as
// bias_backward, and each thread computes its columns of a row's dx, then adds the slice (as
// stored: bf16 dx is summed as rounded) into its accumulator row while it is in L1. Every dx element
// is gelu_bwd_chunk's, and every column sum bias_backward's (rows in order from 0, then into
// dbias): bitwise the two ops one after the other, whatever the thread count. dx is then not read
// a second time. fp16 (widened through scratch) runs the two ops.
void gelu_backward_bias(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& dbias) {
  const int64_t h = dbias.numel();
  const DType dt = dx.dtype();
  if (dt == DType::F16 || h == 0) {
    gelu_backward(dy, x, dx);
    bias_backward(dx, dbias);
    return;
  }
  const int64_t rows = dx.numel() / h;
  float* dB = dbias.data<float>();
  const bool parallel = rows * h > 2 * kChunk;
  const int threads = parallel ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(threads)
  {
    const auto [c0, nc] = bias_columns(h, omp_get_thread_num(), omp_get_num_threads());
    if (nc > 0) {
      float* acc = scratch_f32(5, nc);
      std::fill_n(acc, nc, 0.0f);
      for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * h + c0;
        if (dt == DType::BF16) {
          bf16_t* d = static_cast<bf16_t*>(dx.data_ptr()) + off;
          gelu_bwd_chunk(static_cast<const bf16_t*>(dy.data_ptr()) + off,
                         static_cast<const bf16_t*>(x.data_ptr()) + off, d, nc);
          add_row(acc, static_cast<const bf16_t*>(d), nc);
        } else {
          float* d = dx.data<float>() + off;
          gelu_bwd_chunk(dy.data<float>() + off, x.data<float>() + off, d, nc);
          add_row(acc, static_cast<const float*>(d), nc);
        }
      }
      add_row(dB + c0, acc, nc);
    }
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  binary_chunks(a, b, out,
                [](int64_t, const auto* A, const auto* B, auto* O, int64_t n) { add_into(A, B, O, n); });
}

void add_(Tensor& a, const Tensor& b) {
  binary_chunks(a, b, a,
                [](int64_t, const auto* A, const auto* B, auto* O, int64_t n) { add_into(A, B, O, n); });
}

void scale_(Tensor& a, float alpha) {
  unary_chunks(a, a, [alpha](int64_t, const auto* A, auto* O, int64_t n) { scale_into(A, O, alpha, n); });
}

void round_to_bf16_(Tensor& x) {
  float* X = x.data<float>();
  parallel_chunks(x.numel(), [&](int64_t s, int64_t e) { round_bf16_chunk(X + s, e - s); });
}

void round_to_f16_(Tensor& x) {
  float* X = x.data<float>();
  parallel_chunks(x.numel(), [&](int64_t s, int64_t e) { round_f16_chunk(X + s, e - s); });
}

void gelu_forward(const Tensor& x, Tensor& y) {
  unary_chunks(x, y, [](int64_t, const auto* X, auto* Y, int64_t n) { gelu_fwd_chunk(X, Y, n); });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  binary_chunks(dy, x, dx, [](int64_t, const auto* D, const auto* X, auto* dX, int64_t n) {
    gelu_bwd_chunk(D, X, dX, n);
  });
}

// Row-wise: x is [rows, 2f] (gate | up), y [rows, f]. fp32 and bf16 rows are used in place.
void swiglu_forward(const Tensor& x, Tensor& y) {
  const int64_t f = y.size(-1), rows = f == 0 ? 0 : y.numel() / f;
  const DType dt = x.dtype();
#pragma omp parallel for schedule(static) if (rows * f > 2 * kChunk)
  for (int64_t r = 0; r < rows; r++) {
    if (dt == DType::F32) {
      const float* X = x.data<float>() + r * 2 * f;
      swiglu_fwd_row(X, X + f, y.data<float>() + r * f, f);
    } else if (dt == DType::BF16) {
      const bf16_t* X = static_cast<const bf16_t*>(x.data_ptr()) + r * 2 * f;
      swiglu_fwd_row(X, X + f, static_cast<bf16_t*>(y.data_ptr()) + r * f, f);
    } else {
      const float* X = read_f32(offset_ptr(x.data_ptr(), dt, r * 2 * f), dt, 2 * f, 0);
      void* yr = offset_ptr(y.data_ptr(), dt, r * f);
      float* Y = write_f32(yr, dt, f, 1);
      swiglu_fwd_row(X, X + f, Y, f);
      write_back(Y, dt, yr, f);
    }
  }
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t f = dy.size(-1), rows = f == 0 ? 0 : dy.numel() / f;
  const DType dt = x.dtype();
#pragma omp parallel for schedule(static) if (rows * f > 2 * kChunk)
  for (int64_t r = 0; r < rows; r++) {
    if (dt == DType::F32) {
      const float* X = x.data<float>() + r * 2 * f;
      float* dX = dx.data<float>() + r * 2 * f;
      swiglu_bwd_row(dy.data<float>() + r * f, X, X + f, dX, dX + f, f);
    } else if (dt == DType::BF16) {
      const bf16_t* X = static_cast<const bf16_t*>(x.data_ptr()) + r * 2 * f;
      bf16_t* dX = static_cast<bf16_t*>(dx.data_ptr()) + r * 2 * f;
      swiglu_bwd_row(static_cast<const bf16_t*>(dy.data_ptr()) + r * f, X, X + f, dX, dX + f, f);
    } else {
      const float* D = read_f32(offset_ptr(dy.data_ptr(), dt, r * f), dt, f, 0);
      const float* X = read_f32(offset_ptr(x.data_ptr(), dt, r * 2 * f), dt, 2 * f, 1);
      void* dxr = offset_ptr(dx.data_ptr(), dt, r * 2 * f);
      float* dX = write_f32(dxr, dt, 2 * f, 2);
      swiglu_bwd_row(D, X, X + f, dX, dX + f, f);
      write_back(dX, dt, dxr, 2 * f);
    }
  }
}

void dropout_forward(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset) {
  dropout(x, y, p, seed, offset);
}
// The backward is the same mask and scale applied to the gradient.
void dropout_backward(const Tensor& dy, Tensor& dx, float p, uint64_t seed, uint64_t offset) {
  dropout(dy, dx, p, seed, offset);
}

void dropout_add(const Tensor& branch, const Tensor& residual, Tensor& out, float p, uint64_t seed,
                 uint64_t offset) {
  const DropoutMask m(p, seed, offset);
  binary_chunks(branch, residual, out, [&](int64_t b, const auto* br, const auto* re, auto* o, int64_t n) {
    dropout_add_chunk(m, br, re, o, n, m.first + static_cast<uint64_t>(b));
  });
}

}  // namespace parallel::cpu
