// LayerNorm and RMSNorm over the last dimension, forward and backward side by side.
// Row reductions use `omp simd reduction` so they vectorise (16 partial sums) without -ffast-math.
// Statistics are fp32 with two passes per row (mean, then the mean of squared deviations): the row
// is in L1 for the second pass, and it avoids E[x^2] - E[x]^2's cancellation for rows with a large
// mean. Parameter gradients are per-thread partial sums over rows, added to dweight/dbias in thread
// order at the end (accumulate, as ops.hpp requires). Weights are widened once per call. bf16 rows
// that feed a row reduction (the statistics, the backward's sums) are widened once into per-thread
// fp32 scratch (widen.hpp; an L1-resident row), so that the reductions run exactly the fp32 loops;
// everything else of a bf16 row, the residual sum, the outputs, the residual gradient read and the
// dropout of the branch gradient, is read and written as bf16 inside the loops (bf16_io.hpp), with
// no separate narrowing pass. fp16 rows go through fp32 scratch both ways.
// Built with -ffp-contract=off (CMakeLists.txt): GCC's multiply-add contraction differs between the
// instantiations' loops (and between a clone's main loop and its remainder), which breaks the bf16
// rows' bitwise contract under AVX-512.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/bf16_io.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/dropout_mask.hpp"
#include "cpu/widen.hpp"

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel::cpu {
namespace {

int64_t rows_of(const Tensor& x, int64_t h) { return h == 0 ? 0 : x.numel() / h; }

// Threads only pay off when there is real work; tiny norms (tests, small models) stay serial.
bool worth_threads(int64_t rows, int64_t h) { return rows * h > (1 << 15); }

PARALLEL_CLONES float row_sum(const float* x, int64_t h) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < h; i++) s += x[i];
  return s;
}
PARALLEL_CLONES float row_sq_dev(const float* x, float m, int64_t h) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < h; i++) s += (x[i] - m) * (x[i] - m);
  return s;
}
PARALLEL_CLONES float row_dot(const float* a, const float* b, int64_t h) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < h; i++) s += a[i] * b[i];
  return s;
}

using bf16_t = uint16_t;  // bf16 storage (bf16_io.hpp)

// ---- layernorm ----
// The row loops are always-inline templates over the storage type of the outputs (and of the
// residual gradient read), with one cloned function per combination used below.

template <class O>
[[gnu::always_inline]] inline void ln_fwd_row_t(const float* x, const float* w, const float* b, O* y, float m,
                                                float rs, int64_t h) {
  for (int64_t i = 0; i < h; i++) store_elem(y, i, (x[i] - m) * rs * w[i] + b[i]);
}
PARALLEL_CLONES void ln_fwd_row(const float* x, const float* w, const float* b, float* y, float m, float rs,
                                int64_t h) {
  ln_fwd_row_t(x, w, b, y, m, rs, h);
}
PARALLEL_CLONES void ln_fwd_row(const float* x, const float* w, const float* b, bf16_t* y, float m, float rs,
                                int64_t h) {
  ln_fwd_row_t(x, w, b, y, m, rs, h);
}

// With xhat = (x - m) rs and g = w dy: dx = rs (g - mean(g) - xhat mean(g xhat)) (+ res, the
// residual path's gradient, when given; res may alias dx).
template <class R, class O>
[[gnu::always_inline]] inline void ln_bwd_row_t(const float* dy, const float* x, const float* w, float m,
                                                float rs, O* dx, float* dw, float* db, int64_t h,
                                                const R* res) {
  float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t i = 0; i < h; i++) {
    const float g = w[i] * dy[i];
    sum_g += g;
    sum_gx += g * (x[i] - m) * rs;
  }
  const float mean_g = sum_g / static_cast<float>(h), mean_gx = sum_gx / static_cast<float>(h);
  // dx, dw, db and the inputs never overlap across elements (res and dx may be the same element);
  // saying so lets GCC vectorise without runtime alias checks (six pointers are more than it is
  // willing to version the loop for).
  if (res == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < h; i++) {
      const float xhat = (x[i] - m) * rs;
      store_elem(dx, i, rs * (w[i] * dy[i] - mean_g - xhat * mean_gx));
      dw[i] += dy[i] * xhat;
      db[i] += dy[i];
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < h; i++) {
    const float xhat = (x[i] - m) * rs;
    store_elem(dx, i, rs * (w[i] * dy[i] - mean_g - xhat * mean_gx) + load_elem(res, i));
    dw[i] += dy[i] * xhat;
    db[i] += dy[i];
  }
}
PARALLEL_CLONES void ln_bwd_row(const float* dy, const float* x, const float* w, float m, float rs, float* dx,
                                float* dw, float* db, int64_t h, const float* res) {
  ln_bwd_row_t(dy, x, w, m, rs, dx, dw, db, h, res);
}
PARALLEL_CLONES void ln_bwd_row(const float* dy, const float* x, const float* w, float m, float rs,
                                bf16_t* dx, float* dw, float* db, int64_t h, const bf16_t* res) {
  ln_bwd_row_t(dy, x, w, m, rs, dx, dw, db, h, res);
}
PARALLEL_CLONES void ln_bwd_row(const float* dy, const float* x, const float* w, float m, float rs, float* dx,
                                float* dw, float* db, int64_t h, const bf16_t* res) {
  ln_bwd_row_t(dy, x, w, m, rs, dx, dw, db, h, res);
}

// ---- rmsnorm ----

template <class O>
[[gnu::always_inline]] inline void rms_fwd_row_t(const float* x, const float* w, O* y, float rs, int64_t h) {
  for (int64_t i = 0; i < h; i++) store_elem(y, i, x[i] * rs * w[i]);
}
PARALLEL_CLONES void rms_fwd_row(const float* x, const float* w, float* y, float rs, int64_t h) {
  rms_fwd_row_t(x, w, y, rs, h);
}
PARALLEL_CLONES void rms_fwd_row(const float* x, const float* w, bf16_t* y, float rs, int64_t h) {
  rms_fwd_row_t(x, w, y, rs, h);
}

// y = w x rs with rs = (mean(x^2) + eps)^-1/2, d rs / dx_i = -rs^3 x_i / h:
// dx = rs (w dy - x rs^2 mean(w dy x)).
template <class R, class O>
[[gnu::always_inline]] inline void rms_bwd_row_t(const float* dy, const float* x, const float* w, float rs,
                                                 O* dx, float* dw, int64_t h, const R* res) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < h; i++) sum += w[i] * dy[i] * x[i];
  const float c = rs * rs * sum / static_cast<float>(h);
  if (res == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < h; i++) {
      store_elem(dx, i, rs * (w[i] * dy[i] - x[i] * c));
      dw[i] += dy[i] * x[i] * rs;
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < h; i++) {
    store_elem(dx, i, rs * (w[i] * dy[i] - x[i] * c) + load_elem(res, i));
    dw[i] += dy[i] * x[i] * rs;
  }
}
PARALLEL_CLONES void rms_bwd_row(const float* dy, const float* x, const float* w, float rs, float* dx,
                                 float* dw, int64_t h, const float* res) {
  rms_bwd_row_t(dy, x, w, rs, dx, dw, h, res);
}
PARALLEL_CLONES void rms_bwd_row(const float* dy, const float* x, const float* w, float rs, bf16_t* dx,
                                 float* dw, int64_t h, const bf16_t* res) {
  rms_bwd_row_t(dy, x, w, rs, dx, dw, h, res);
}
PARALLEL_CLONES void rms_bwd_row(const float* dy, const float* x, const float* w, float rs, float* dx,
                                 float* dw, int64_t h, const bf16_t* res) {
  rms_bwd_row_t(dy, x, w, rs, dx, dw, h, res);
}

// ---- the residual stream's fused steps ----

PARALLEL_DROPOUT_CLONES void residual_row(const DropoutMask& m, const float* branch, const float* residual,
                                          float* sum, int64_t h, uint64_t first) {
  dropout_add_row(m, branch, residual, sum, h, first);
}
PARALLEL_DROPOUT_CLONES void residual_row(const DropoutMask& m, const bf16_t* branch, const bf16_t* residual,
                                          bf16_t* sum, int64_t h, uint64_t first) {
  dropout_add_row(m, branch, residual, sum, h, first);
}
PARALLEL_DROPOUT_CLONES void dropout_grad_row(const DropoutMask& m, const float* dx, float* dbranch,
                                              int64_t h, uint64_t first) {
  dropout_row(m, dx, dbranch, h, first);
}
// The bf16 input gradient and its dropout for the branch from the fp32 gradient row, in one pass:
// dx = bf16(dx32), dbranch = bf16(dropout(dx32)), as narrowing after dropout_grad_row would give
// (the keep decisions block by block first: dropout_mask.hpp).
PARALLEL_DROPOUT_CLONES void narrow_dropout_grad_row(const DropoutMask& m, const float* dx32, bf16_t* dx,
                                                     bf16_t* dbranch, int64_t h, uint64_t first) {
  const float scale = m.scale;
  uint32_t mask[kMaskBlock];
  for (int64_t b = 0; b < h; b += kMaskBlock) {
    const int64_t len = std::min(kMaskBlock, h - b);
    keep_mask(mask, m.key, m.p, first + static_cast<uint64_t>(b), len);
#pragma omp simd
    for (int64_t i = 0; i < len; i++) {
      const float d = dx32[b + i];
      store_elem(dx, b + i, d);
      store_elem(dbranch, b + i, masked(d * scale, mask[i]));
    }
  }
}

PARALLEL_CLONES void add_into(float* dst, const float* src, int64_t h) {
  for (int64_t i = 0; i < h; i++) dst[i] += src[i];
}

}  // namespace

// The plain norms are the fused kernels below with the residual parts absent: one row walk each
// way, so the two forms cannot drift apart (the op table checks both against the reference).
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                       Tensor& rstd, float eps) {
  Tensor none;
  residual_norm_forward(x, Tensor{}, 0.0f, 0, 0, weight, bias, none, y, mean, rstd, eps);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  Tensor none;
  norm_backward_residual(dy, Tensor{}, x, weight, mean, rstd, dx, dweight, dbias, 0.0f, 0, 0, none);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps) {
  Tensor none, no_mean;
  residual_norm_forward(x, Tensor{}, 0.0f, 0, 0, weight, Tensor{}, none, y, no_mean, rstd, eps);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight) {
  Tensor none, no_dbias;
  norm_backward_residual(dy, Tensor{}, x, weight, Tensor{}, rstd, dx, dweight, no_dbias, 0.0f, 0, 0, none);
}

// The stored sum (rounded to the activation dtype) is what gets normalised: for 16-bit tensors the
// fp32 sum is narrowed into `sum` and widened back before the statistics. Without a branch (the
// plain norm) `residual` is the norm's input and `sum` is not written.
void residual_norm_forward(const Tensor& residual, const Tensor& branch, float p, uint64_t seed,
                           uint64_t offset, const Tensor& weight, const Tensor& bias, Tensor& sum, Tensor& y,
                           Tensor& mean, Tensor& rstd, float eps) {
  const int64_t h = weight.numel(), rows = rows_of(residual, h);
  const DType dt = residual.dtype();
  const bool layernorm = bias.defined();
  const bool fused = branch.defined();
  const DropoutMask drop(p, seed, offset);
  const float* W = read_f32(weight.data_ptr(), weight.dtype(), h, 6);
  const float* B = layernorm ? read_f32(bias.data_ptr(), bias.dtype(), h, 7) : nullptr;
  float* M = layernorm ? mean.data<float>() : nullptr;
  float* R = rstd.data<float>();
#pragma omp parallel for schedule(static) if (worth_threads(rows, h))
  for (int64_t r = 0; r < rows; r++) {
    const float* S = nullptr;
    const uint64_t first = drop.first + static_cast<uint64_t>(r * h);
    if (fused && dt == DType::BF16) {
      // The rounded sum goes straight into `sum`, then is widened (in L1) for the statistics.
      bf16_t* sr = static_cast<bf16_t*>(sum.data_ptr()) + r * h;
      residual_row(drop, static_cast<const bf16_t*>(branch.data_ptr()) + r * h,
                   static_cast<const bf16_t*>(residual.data_ptr()) + r * h, sr, h, first);
      S = read_f32(sr, dt, h, 0);
    } else if (fused) {
      const float* res = read_f32(offset_ptr(residual.data_ptr(), dt, r * h), dt, h, 0);
      const float* br = read_f32(offset_ptr(branch.data_ptr(), dt, r * h), dt, h, 1);
      void* sr = offset_ptr(sum.data_ptr(), dt, r * h);
      float* sum_row = write_f32(sr, dt, h, 2);
      residual_row(drop, br, res, sum_row, h, first);
      if (dt != DType::F32) {
        narrow_from_f32(sum_row, dt, sr, h);
        widen_to_f32(sr, dt, sum_row, h);
      }
      S = sum_row;
    } else {
      S = read_f32(offset_ptr(residual.data_ptr(), dt, r * h), dt, h, 0);
    }
    // The statistics on the fp32 row, then the output row written in its own type.
    auto normalise = [&](auto* Y) {
      if (layernorm) {
        const float m = row_sum(S, h) / static_cast<float>(h);
        const float rs = 1.0f / std::sqrt(row_sq_dev(S, m, h) / static_cast<float>(h) + eps);
        ln_fwd_row(S, W, B, Y, m, rs, h);
        M[r] = m;
        R[r] = rs;
      } else {
        const float rs = 1.0f / std::sqrt(row_dot(S, S, h) / static_cast<float>(h) + eps);
        rms_fwd_row(S, W, Y, rs, h);
        R[r] = rs;
      }
    };
    if (dt == DType::BF16) {
      normalise(static_cast<bf16_t*>(y.data_ptr()) + r * h);
    } else {
      void* yr = offset_ptr(y.data_ptr(), dt, r * h);
      float* Y = write_f32(yr, dt, h, 3);
      normalise(Y);
      write_back(Y, dt, yr, h);
    }
  }
}

// Without dresidual (the plain norm backward) dx is the norm's gradient alone.
void norm_backward_residual(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                            Tensor& dbias, float p, uint64_t seed, uint64_t offset, Tensor& dbranch) {
  const int64_t h = weight.numel(), rows = rows_of(x, h);
  const DType dt = x.dtype();
  const bool layernorm = mean.defined();
  const bool has_residual = dresidual.defined();
  const bool want_branch = dbranch.defined();
  const DropoutMask drop(p, seed, offset);
  const float* W = read_f32(weight.data_ptr(), weight.dtype(), h, 7);
  const float* M = layernorm ? mean.data<float>() : nullptr;
  const float* R = rstd.data<float>();
  const int64_t per_thread = layernorm ? 2 * h : h;  // [dweight partial | dbias partial]
  const int threads = worth_threads(rows, h) ? omp_get_max_threads() : 1;
  std::vector<float> partial(static_cast<size_t>(threads) * per_thread, 0.0f);
#pragma omp parallel num_threads(threads)
  {
    float* pw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      const float* D = read_f32(offset_ptr(dy.data_ptr(), dt, r * h), dt, h, 0);
      const float* X = read_f32(offset_ptr(x.data_ptr(), dt, r * h), dt, h, 1);
      const uint64_t first = drop.first + static_cast<uint64_t>(r * h);
      // The row's input gradient into dX (any storage type), with the residual gradient Res added.
      auto backward = [&](auto* dX, const auto* Res) {
        if (layernorm)
          ln_bwd_row(D, X, W, M[r], R[r], dX, pw, pw + h, h, Res);
        else
          rms_bwd_row(D, X, W, R[r], dX, pw, h, Res);
      };
      if (dt == DType::BF16) {
        const bf16_t* Res = has_residual ? static_cast<const bf16_t*>(dresidual.data_ptr()) + r * h : nullptr;
        bf16_t* dxr = static_cast<bf16_t*>(dx.data_ptr()) + r * h;
        if (!want_branch) {
          backward(dxr, Res);
        } else {
          // The branch's dropout reads the fp32 gradient, before rounding: one fp32 row in L1.
          float* dX = scratch_f32(2, h);
          backward(dX, Res);
          narrow_dropout_grad_row(drop, dX, dxr, static_cast<bf16_t*>(dbranch.data_ptr()) + r * h, h, first);
        }
        continue;
      }
      const float* Res =
          has_residual ? read_f32(offset_ptr(dresidual.data_ptr(), dt, r * h), dt, h, 3) : nullptr;
      void* dxr = offset_ptr(dx.data_ptr(), dt, r * h);
      float* dX = write_f32(dxr, dt, h, 2);
      backward(dX, Res);
      if (want_branch) {
        void* dbr = offset_ptr(dbranch.data_ptr(), dt, r * h);
        float* dB = write_f32(dbr, dt, h, 4);
        dropout_grad_row(drop, dX, dB, h, first);
        write_back(dB, dt, dbr, h);
      }
      write_back(dX, dt, dxr, h);
    }
  }
  for (int t = 0; t < threads; t++) {
    add_into(dweight.data<float>(), partial.data() + static_cast<size_t>(t) * per_thread, h);
    if (layernorm) add_into(dbias.data<float>(), partial.data() + static_cast<size_t>(t) * per_thread + h, h);
  }
}

}  // namespace parallel::cpu
