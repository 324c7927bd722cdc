// Element-wise ops: bias, add, scale, rounding to bf16/fp16, gelu, swiglu, dropout. Each hot loop
// is a small function cloned for AVX-512 / AVX2 / baseline (chosen at load time) and called on
// per-thread chunks from an OpenMP loop: the clones cannot live inside the OpenMP region itself,
// because GCC outlines the region into a separate function that target_clones would not see.
// bf16/fp16 tensors are widened chunk by chunk into per-thread fp32 scratch (widen.hpp), so the
// same fp32 loops serve every dtype.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

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

PARALLEL_CLONES void add_row(float* y, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += b[i];
}
PARALLEL_CLONES void add_into(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
PARALLEL_CLONES void scale_into(float* a, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; i++) a[i] *= alpha;
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

PARALLEL_CLONES void gelu_fwd_chunk(const float* x, float* y, int64_t n) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < n; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, n - b);
    const float* xb = x + b;
    for (int64_t i = 0; i < m; i++) {
      const float v = xb[i];
      const float u = kGeluC * (v + kGeluA * v * v * v);
      arg[i] = clamp_exp_arg(-(2.0f * u));
    }
    for (int64_t i = 0; i < m; i++) y[b + i] = xb[i] * (1.0f / (1.0f + exp_clamped(arg[i])));
  }
}
// d/dx [x s(2u)] = s + x * 2 s (1 - s) * du/dx, du/dx = c (1 + 3 a x^2); s (1 - s) = (1 - tanh^2)/4.
PARALLEL_CLONES void gelu_bwd_chunk(const float* dy, const float* x, float* dx, int64_t n) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < n; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, n - b);
    const float* xb = x + b;
    for (int64_t i = 0; i < m; i++) {
      const float v = xb[i];
      const float u = kGeluC * (v + kGeluA * v * v * v);
      arg[i] = clamp_exp_arg(-(2.0f * u));
    }
    for (int64_t i = 0; i < m; i++) {
      const float v = xb[i];
      const float s = 1.0f / (1.0f + exp_clamped(arg[i]));
      const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
      dx[b + i] = dy[b + i] * (s + 2.0f * v * s * (1.0f - s) * du);
    }
  }
}

// ---- swiglu ----
// The same blocking as gelu: clamp first, then exp and the rest.
PARALLEL_CLONES void swiglu_fwd_row(const float* gate, const float* up, float* y, int64_t f) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < f; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, f - b);
    for (int64_t i = 0; i < m; i++) arg[i] = clamp_exp_arg(-gate[b + i]);
    for (int64_t i = 0; i < m; i++) {
      const float g = gate[b + i];
      y[b + i] = g * (1.0f / (1.0f + exp_clamped(arg[i]))) * up[b + i];
    }
  }
}
// y = g s(g) u: dy/dg = u s (1 + g (1 - s)), dy/du = g s.
PARALLEL_CLONES void swiglu_bwd_row(const float* dy, const float* gate, const float* up, float* dgate,
                                    float* dup, int64_t f) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < f; b += kExpBlock) {
    const int64_t m = std::min(kExpBlock, f - b);
    for (int64_t i = 0; i < m; i++) arg[i] = clamp_exp_arg(-gate[b + i]);
    for (int64_t i = 0; i < m; i++) {
      const int64_t k = b + i;
      const float g = gate[k], s = 1.0f / (1.0f + exp_clamped(arg[i]));
      dgate[k] = dy[k] * up[k] * s * (1.0f + g * (1.0f - s));
      dup[k] = dy[k] * g * s;
    }
  }
}

// ---- dropout ----
// The mask is dropout_mask.hpp's, shared with the fused ops of norm.cpp.

PARALLEL_DROPOUT_CLONES void dropout_chunk(const DropoutMask& m, const float* x, float* y, int64_t n,
                                           uint64_t first) {
  dropout_row(m, x, y, n, first);
}
PARALLEL_DROPOUT_CLONES void dropout_add_chunk(const DropoutMask& m, const float* branch,
                                               const float* residual, float* out, int64_t n, uint64_t first) {
  dropout_add_row(m, branch, residual, out, n, first);
}

void dropout(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset) {
  const DType dt = x.dtype();
  const int64_t n = x.numel();
  if (p == 0.0f) {
    if (y.data_ptr() != x.data_ptr()) std::memcpy(y.data_ptr(), x.data_ptr(), x.nbytes());
    return;
  }
  const DropoutMask m(p, seed, offset);
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    const float* in = read_f32(offset_ptr(x.data_ptr(), dt, b), dt, e - b, 0);
    float* out = write_f32(offset_ptr(y.data_ptr(), dt, b), dt, e - b, 1);
    dropout_chunk(m, in, out, e - b, m.first + b);
    write_back(out, dt, offset_ptr(y.data_ptr(), dt, b), e - b);
  });
}

// The flat element-wise ops on any floating dtype: widen the inputs' chunk, run the fp32 loop,
// narrow the output chunk. `body(inputs..., out, n)` sees fp32 pointers.
template <typename F>
void unary_chunks(const Tensor& x, Tensor& out, F&& body) {
  const DType dt = x.dtype();
  parallel_chunks(x.numel(), [&](int64_t b, int64_t e) {
    const float* in = read_f32(offset_ptr(x.data_ptr(), dt, b), dt, e - b, 0);
    float* o = write_f32(offset_ptr(out.data_ptr(), dt, b), dt, e - b, 1);
    body(in, o, e - b);
    write_back(o, dt, offset_ptr(out.data_ptr(), dt, b), e - b);
  });
}
template <typename F>
void binary_chunks(const Tensor& x, const Tensor& z, Tensor& out, F&& body) {
  const DType dt = x.dtype();
  parallel_chunks(x.numel(), [&](int64_t b, int64_t e) {
    const float* in0 = read_f32(offset_ptr(x.data_ptr(), dt, b), dt, e - b, 0);
    const float* in1 = read_f32(offset_ptr(z.data_ptr(), dt, b), dt, e - b, 1);
    float* o = write_f32(offset_ptr(out.data_ptr(), dt, b), dt, e - b, 2);
    body(in0, in1, o, e - b);
    write_back(o, dt, offset_ptr(out.data_ptr(), dt, b), e - b);
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
    void* yr = offset_ptr(y.data_ptr(), dt, r * h);
    float* Y = write_f32(yr, dt, h, 0);
    if (dt != DType::F32) widen_to_f32(yr, dt, Y, h);
    add_row(Y, B, h);
    write_back(Y, dt, yr, h);
  }
}

// dbias += column sums of dy. Threads own disjoint column blocks (no partial buffers, no races,
// and the sum order is fixed, so the result does not depend on the thread count or the blocking).
// The blocks are at most kCols wide and come in a multiple of the thread count, so that every
// thread sums as many columns: h = 384 in blocks of 256 left one of two threads a third idle.
void bias_backward(const Tensor& dy, Tensor& dbias) {
  const int64_t h = dbias.numel();
  if (h == 0) return;
  const int64_t rows = dy.numel() / h;
  const DType dt = dy.dtype();
  float* dB = dbias.data<float>();
  constexpr int64_t kCols = 256;
  const bool parallel = rows * h > 2 * kChunk;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int64_t wanted = ((h + kCols - 1) / kCols + threads - 1) / threads * threads;
  const int64_t cols = std::min(kCols, ((h + wanted - 1) / wanted + 15) / 16 * 16);
  const int64_t blocks = (h + cols - 1) / cols;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t blk = 0; blk < blocks; blk++) {
    const int64_t c0 = blk * cols, nc = std::min(h, c0 + cols) - c0;
    float acc[kCols] = {};
    for (int64_t r = 0; r < rows; r++)
      add_row(acc, read_f32(offset_ptr(dy.data_ptr(), dt, r * h + c0), dt, nc, 0), nc);
    add_row(dB + c0, acc, nc);
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  binary_chunks(a, b, out, [](const float* A, const float* B, float* O, int64_t n) { add_into(A, B, O, n); });
}

void add_(Tensor& a, const Tensor& b) {
  binary_chunks(a, b, a, [](const float* A, const float* B, float* O, int64_t n) { add_into(A, B, O, n); });
}

void scale_(Tensor& a, float alpha) {
  unary_chunks(a, a, [alpha](const float* A, float* O, int64_t n) {
    if (O != A) std::memcpy(O, A, static_cast<size_t>(n) * sizeof(float));
    scale_into(O, alpha, n);
  });
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
  unary_chunks(x, y, [](const float* X, float* Y, int64_t n) { gelu_fwd_chunk(X, Y, n); });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  binary_chunks(dy, x, dx,
                [](const float* D, const float* X, float* dX, int64_t n) { gelu_bwd_chunk(D, X, dX, n); });
}

void swiglu_forward(const Tensor& x, Tensor& y) {
  const int64_t f = y.size(-1), rows = f == 0 ? 0 : y.numel() / f;
  const DType dt = x.dtype();
#pragma omp parallel for schedule(static) if (rows * f > 2 * kChunk)
  for (int64_t r = 0; r < rows; r++) {
    const float* X = read_f32(offset_ptr(x.data_ptr(), dt, r * 2 * f), dt, 2 * f, 0);
    void* yr = offset_ptr(y.data_ptr(), dt, r * f);
    float* Y = write_f32(yr, dt, f, 1);
    swiglu_fwd_row(X, X + f, Y, f);
    write_back(Y, dt, yr, f);
  }
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t f = dy.size(-1), rows = f == 0 ? 0 : dy.numel() / f;
  const DType dt = x.dtype();
#pragma omp parallel for schedule(static) if (rows * f > 2 * kChunk)
  for (int64_t r = 0; r < rows; r++) {
    const float* D = read_f32(offset_ptr(dy.data_ptr(), dt, r * f), dt, f, 0);
    const float* X = read_f32(offset_ptr(x.data_ptr(), dt, r * 2 * f), dt, 2 * f, 1);
    void* dxr = offset_ptr(dx.data_ptr(), dt, r * 2 * f);
    float* dX = write_f32(dxr, dt, 2 * f, 2);
    swiglu_bwd_row(D, X, X + f, dX, dX + f, f);
    write_back(dX, dt, dxr, 2 * f);
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
  const DType dt = branch.dtype();
  const DropoutMask m(p, seed, offset);
  parallel_chunks(branch.numel(), [&](int64_t b, int64_t e) {
    const float* br = read_f32(offset_ptr(branch.data_ptr(), dt, b), dt, e - b, 0);
    const float* re = read_f32(offset_ptr(residual.data_ptr(), dt, b), dt, e - b, 1);
    float* o = write_f32(offset_ptr(out.data_ptr(), dt, b), dt, e - b, 2);
    dropout_add_chunk(m, br, re, o, e - b, m.first + b);
    write_back(o, dt, offset_ptr(out.data_ptr(), dt, b), e - b);
  });
}

}  // namespace parallel::cpu
