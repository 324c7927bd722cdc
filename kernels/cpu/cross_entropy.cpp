// The local pieces of vocab-parallel cross-entropy (see ops.hpp). Row i's loss is
//   log(sum_j exp(l_ij - max_i)) + max_i - l_i,target
// with max and sum all-reduced over ranks by the caller between the pieces. Subtracting the
// global max keeps every exp in (0, 1], so the sums cannot overflow whatever the logits' scale.
// Columns with global id >= vocab_size are padding (vocab rounded up to a multiple of the TP size)
// and are skipped everywhere. bf16 logits are read, and bf16 dlogits written, inside the loops
// (bf16_io.hpp: the same fp32 operations, no fp32 copy of the row); fp16 logits are widened a row
// at a time. dlogits are written in the logits' dtype. Built with -ffp-contract=off (CMakeLists.txt),
// as the element-wise kernels are: the bf16 loops round exactly as the fp32 ones.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/bf16_io.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/widen.hpp"

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel::cpu {
namespace {

// Local columns [0, valid) are real vocabulary entries.
int64_t valid_columns(int64_t v_local, int64_t vocab_start, int64_t vocab_size) {
  return std::clamp<int64_t>(vocab_size - vocab_start, 0, v_local);
}

bool worth_threads(int64_t n, int64_t v) { return n * v > (1 << 15); }

using bf16_t = uint16_t;  // bf16 storage (bf16_io.hpp)

// max is exact, and lane_max's lanes are fixed by the column index: any storage type gives the same.
PARALLEL_CLONES float row_max_of(const float* l, int64_t n) {
  return lane_max(n, [&](int64_t j) { return l[j]; });
}
PARALLEL_CLONES float row_max_of(const bf16_t* l, int64_t n) {
  return lane_max(n, [&](int64_t j) { return load_elem(l, j); });
}

// The exp argument's clamp runs in a loop of its own (vec_math.hpp): inside the exp loop GCC turns
// it into a branch and the AVX2 clone stays scalar. Same operations as fast_exp, so the same values.
constexpr int64_t kExpBlock = 256;  // exp arguments staged on the stack, 1 KiB

// The sum is taken in 8 lanes, lane k holding columns = k mod 8, lanes added pairwise at the end:
// the same order on every ISA and storage type (an `omp simd` reduction would follow the vector
// width).
template <class T>
[[gnu::always_inline]] inline float row_sum_exp_t(const T* l, float m, int64_t n) {
  constexpr int kLanes = 8;
  float arg[kExpBlock];
  float lane[kLanes] = {};
  for (int64_t b = 0; b < n; b += kExpBlock) {
    const int64_t len = std::min(kExpBlock, n - b);
    for (int64_t j = 0; j < len; j++) arg[j] = clamp_exp_arg(load_elem(l, b + j) - m);
    for (int64_t j = 0; j < len; j++) arg[j] = exp_clamped(arg[j]);
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes)
      for (int k = 0; k < kLanes; k++) lane[k] += arg[j + k];
    for (; j < len; j++) lane[0] += arg[j];  // only the row's last block can be ragged
  }
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}
PARALLEL_CLONES float row_sum_exp(const float* l, float m, int64_t n) { return row_sum_exp_t(l, m, n); }
PARALLEL_CLONES float row_sum_exp(const bf16_t* l, float m, int64_t n) { return row_sum_exp_t(l, m, n); }

PARALLEL_CLONES void row_softmax_grad(const float* l, float m, float g_over_sum, float* d, int64_t n) {
  for (int64_t j = 0; j < n; j++) d[j] = clamp_exp_arg(l[j] - m);
  for (int64_t j = 0; j < n; j++) d[j] = g_over_sum * exp_clamped(d[j]);
}

// The bf16 row of dlogits in one pass, block by block on the stack: the fp32 softmax gradient,
// minus g at the target column t (when local), rounded into d; padding columns [valid, v) are 0.
PARALLEL_CLONES void row_softmax_grad(const bf16_t* l, float m, float g_over_sum, float g, int64_t t,
                                      bf16_t* d, int64_t valid, int64_t v) {
  float arg[kExpBlock];
  for (int64_t b = 0; b < valid; b += kExpBlock) {
    const int64_t len = std::min(kExpBlock, valid - b);
    for (int64_t j = 0; j < len; j++) arg[j] = clamp_exp_arg(load_elem(l, b + j) - m);
    for (int64_t j = 0; j < len; j++) arg[j] = g_over_sum * exp_clamped(arg[j]);
    if (t >= b && t < b + len) arg[t - b] -= g;
    for (int64_t j = 0; j < len; j++) store_elem(d, b + j, arg[j]);
  }
  for (int64_t j = valid; j < v; j++) d[j] = 0;
}

// Row l's max (-inf when this rank holds only padding) and the target's logit (0 when the target
// lies in another rank's slice of the vocabulary).
template <class T>
void max_and_target(const T* l, int64_t t, int64_t valid, float& m, float& tl) {
  m = row_max_of(l, valid);
  tl = t >= 0 && t < valid ? load_elem(l, t) : 0.0f;
}

// The sum of exp(l - m) over the row; 0 for a row of padding only (m = -inf).
template <class T>
float sum_exp_of(const T* l, float m, int64_t valid) {
  return std::isinf(m) && m < 0 ? 0.0f : row_sum_exp(l, m, valid);
}

}  // namespace

void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               int64_t vocab_size, Tensor& row_max, Tensor& target_logit) {
  const int64_t n = logits.size(0), v = logits.size(1), valid = valid_columns(v, vocab_start, vocab_size);
  const DType dt = logits.dtype();
  const int32_t* T = targets.data<int32_t>();
  float *M = row_max.data<float>(), *TL = target_logit.data<float>();
#pragma omp parallel for schedule(static) if (worth_threads(n, v))
  for (int64_t i = 0; i < n; i++) {
    const int64_t t = static_cast<int64_t>(T[i]) - vocab_start;
    if (dt == DType::BF16)
      max_and_target(static_cast<const bf16_t*>(logits.data_ptr()) + i * v, t, valid, M[i], TL[i]);
    else
      max_and_target(read_f32(offset_ptr(logits.data_ptr(), dt, i * v), dt, valid, 0), t, valid, M[i], TL[i]);
  }
}

void cross_entropy_sum_exp(const Tensor& logits, const Tensor& row_max, int64_t vocab_start,
                           int64_t vocab_size, Tensor& sum_exp) {
  const int64_t n = logits.size(0), v = logits.size(1), valid = valid_columns(v, vocab_start, vocab_size);
  const DType dt = logits.dtype();
  const float* M = row_max.data<float>();
  float* S = sum_exp.data<float>();
#pragma omp parallel for schedule(static) if (worth_threads(n, v))
  for (int64_t i = 0; i < n; i++)
    S[i] = dt == DType::BF16
               ? sum_exp_of(static_cast<const bf16_t*>(logits.data_ptr()) + i * v, M[i], valid)
               : sum_exp_of(read_f32(offset_ptr(logits.data_ptr(), dt, i * v), dt, valid, 0), M[i], valid);
}

// Row by row: the max, then the sum against it while the row (32 KiB of fp32 at v = 8192) is still
// in L1/L2. The same row functions as the two ops above on the same values: bitwise their results.
// (An online softmax, rescaling a running sum at each new max, would read the row once from cache
// instead of twice but round differently; from memory it is read once either way.)
void cross_entropy_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                         Tensor& row_max, Tensor& target_logit, Tensor& sum_exp) {
  const int64_t n = logits.size(0), v = logits.size(1), valid = valid_columns(v, vocab_start, vocab_size);
  const DType dt = logits.dtype();
  const int32_t* T = targets.data<int32_t>();
  float *M = row_max.data<float>(), *TL = target_logit.data<float>(), *S = sum_exp.data<float>();
#pragma omp parallel for schedule(static) if (worth_threads(n, v))
  for (int64_t i = 0; i < n; i++) {
    const int64_t t = static_cast<int64_t>(T[i]) - vocab_start;
    if (dt == DType::BF16) {
      const bf16_t* l = static_cast<const bf16_t*>(logits.data_ptr()) + i * v;
      max_and_target(l, t, valid, M[i], TL[i]);
      S[i] = sum_exp_of(l, M[i], valid);
    } else {
      const float* l = read_f32(offset_ptr(logits.data_ptr(), dt, i * v), dt, valid, 0);
      max_and_target(l, t, valid, M[i], TL[i]);
      S[i] = sum_exp_of(l, M[i], valid);
    }
  }
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            const Tensor& sum_exp, const Tensor& grad_scale, int64_t vocab_start,
                            int64_t vocab_size, Tensor& dlogits) {
  const int64_t n = logits.size(0), v = logits.size(1), valid = valid_columns(v, vocab_start, vocab_size);
  const DType dt = logits.dtype();
  const float *M = row_max.data<float>(), *S = sum_exp.data<float>();
  const float* G = grad_scale.data<float>();
  const int32_t* T = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (worth_threads(n, v))
  for (int64_t i = 0; i < n; i++) {
    if (dt == DType::BF16) {
      row_softmax_grad(static_cast<const bf16_t*>(logits.data_ptr()) + i * v, M[i], G[i] / S[i], G[i],
                       static_cast<int64_t>(T[i]) - vocab_start,
                       static_cast<bf16_t*>(dlogits.data_ptr()) + i * v, valid, v);
      continue;
    }
    const float* l = read_f32(offset_ptr(logits.data_ptr(), dt, i * v), dt, valid, 0);
    void* stored = offset_ptr(dlogits.data_ptr(), dt, i * v);
    float* d = write_f32(stored, dt, v, 1);
    row_softmax_grad(l, M[i], G[i] / S[i], d, valid);
    std::fill(d + valid, d + v, 0.0f);  // padding columns: not part of the softmax
    const int64_t t = static_cast<int64_t>(T[i]) - vocab_start;
    if (t >= 0 && t < valid) d[t] -= G[i];
    write_back(d, dt, stored, v);
  }
}

void cross_entropy_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        Tensor& loss) {
  const int64_t n = loss.numel();
  const float *M = row_max.data<float>(), *S = sum_exp.data<float>(), *T = target_logit.data<float>();
  float* L = loss.data<float>();
  for (int64_t i = 0; i < n; i++) L[i] = std::log(S[i]) + M[i] - T[i];
}

}  // namespace parallel::cpu
