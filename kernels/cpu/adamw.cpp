// AdamW over flat fp32 buffers (contract in include/parallel/ops.hpp). The scalars come from
// adamw_scalars.hpp, shared with kernels/cuda/adamw.cu: both devices do the same float operations.
//
// One pass per element: the loop reads the fp32 gradient, m, v and the fp32 (main) weight once and
// writes m, v, the weight and, for a bf16 model copy, the rounded 16-bit weight in the same
// iteration. The loop is cloned for AVX-512 / AVX2 / baseline (chosen at load time); the clones
// perform exactly the scalar code's operations in the same order (IEEE sqrt and division are
// correctly rounded in every width, and no multiply-add is contracted: see the build flags below), so
// every clone is bitwise equal to the scalar reference (test_adamw_fused). fp16 model copies are
// narrowed with F16C from the L1-resident block just written (widen.hpp): no pass over memory.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "adamw_scalars.hpp"
#include "cpu/bf16_io.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

// Built with -ffp-contract=off -fno-math-errno (CMakeLists.txt): bitwise equality with the unfused
// scalar update needs separate roundings of each product and sum (GCC contracts C++ by default, and
// the avx512f clone has FMA), and the square root must not call libm for errno or it stays scalar.

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel::cpu {

namespace {

// The element update, shared by every loop below. `kClip`: the gradient is multiplied by k.clip
// (the clip coefficient); without it the gradient is used as is (a multiply by 1 would be exact
// too, but this keeps the arithmetic literally the reference's).
template <bool kClip>
inline float update_one(const kernels::AdamWScalars& k, float g, float& p, float& m, float& v) {
  const float gi = kClip ? g * k.clip : g;
  float pi = p * k.decay;
  const float mi = m * k.b1 + gi * k.a1;
  const float vi = v * k.b2 + gi * gi * k.a2;
  const float denom = std::sqrt(vi) / k.bc2s + k.eps;
  pi += -k.step_size * (mi / denom);
  p = pi;
  m = mi;
  v = vi;
  return pi;
}

template <bool kClip>
inline void update_loop(const kernels::AdamWScalars& k, const float* g, float* p, float* m, float* v,
                        int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) update_one<kClip>(k, g[i], p[i], m[i], v[i]);
}

template <bool kClip>
inline void update_loop_bf16(const kernels::AdamWScalars& k, const float* g, float* p, float* m, float* v,
                             uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(update_one<kClip>(k, g[i], p[i], m[i], v[i]));
}

PARALLEL_CLONES void update_block(kernels::AdamWScalars k, const float* g, float* p, float* m, float* v,
                                  int64_t n) {
  if (k.clip == 1.0f)
    update_loop<false>(k, g, p, m, v, n);
  else
    update_loop<true>(k, g, p, m, v, n);
}

PARALLEL_CLONES void update_block_bf16(kernels::AdamWScalars k, const float* g, float* p, float* m, float* v,
                                       uint16_t* out, int64_t n) {
  if (k.clip == 1.0f)
    update_loop_bf16<false>(k, g, p, m, v, out, n);
  else
    update_loop_bf16<true>(k, g, p, m, v, out, n);
}

}  // namespace

namespace {

// Blocks small enough that the fresh fp32 values are still in L1 when an fp16 model copy is
// narrowed from them; bf16 copies are written inside the update loop itself.
constexpr int64_t kBlock = 4096;
// Below this many elements (in all) the update runs on the calling thread.
constexpr int64_t kParallelAbove = 1 << 16;

// One tensor's pointers and scalars.
struct Job {
  kernels::AdamWScalars k;
  const float* g;
  float* p;
  float* m;
  float* v;
  void* copy;  // the 16-bit model copy, or null
  DType copy_dt;
};

// (Tensor is a handle: data() of a const one is the storage it points to.)
Job job_of(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
           const ops::AdamWStep& h, double weight_decay, const Tensor* model_copy) {
  Job j;
  j.k = kernels::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, weight_decay, h.step, h.grad_scale);
  j.g = grad.data<float>();
  j.p = param.data<float>();
  j.m = exp_avg.data<float>();
  j.v = exp_avg_sq.data<float>();
  j.copy = model_copy != nullptr ? model_copy->data_ptr() : nullptr;
  j.copy_dt = model_copy != nullptr ? model_copy->dtype() : DType::F32;
  return j;
}

void update_range(const Job& j, int64_t lo, int64_t hi) {
  if (j.copy != nullptr && j.copy_dt == DType::BF16) {
    update_block_bf16(j.k, j.g + lo, j.p + lo, j.m + lo, j.v + lo, static_cast<uint16_t*>(j.copy) + lo,
                      hi - lo);
  } else {
    update_block(j.k, j.g + lo, j.p + lo, j.m + lo, j.v + lo, hi - lo);
    if (j.copy != nullptr)
      convert_block_from_f32(j.p + lo, j.copy_dt, offset_ptr(j.copy, j.copy_dt, lo), hi - lo);
  }
}

}  // namespace

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                   const ops::AdamWStep& h, Tensor* model_copy) {
  const Job j = job_of(param, grad, exp_avg, exp_avg_sq, h, h.weight_decay, model_copy);
  const int64_t n = param.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelAbove)
  for (int64_t b = 0; b < blocks; ++b) update_range(j, b * kBlock, std::min(n, (b + 1) * kBlock));
}

// Every tensor's blocks in one list, split evenly over one team (the per-element update does not
// depend on which thread runs it or on the block boundaries: bitwise the per-tensor calls).
void adamw_update_multi_(const std::vector<ops::AdamWTensors>& tensors, const ops::AdamWStep& h) {
  struct Block {
    int32_t job;
    int64_t lo, hi;
  };
  std::vector<Job> jobs;
  std::vector<Block> blocks;
  jobs.reserve(tensors.size());
  int64_t total = 0;
  for (const ops::AdamWTensors& t : tensors) {
    const Tensor* copy = t.model_copy.defined() ? &t.model_copy : nullptr;
    jobs.push_back(job_of(t.param, t.grad, t.exp_avg, t.exp_avg_sq, h, t.weight_decay, copy));
    const int64_t n = t.param.numel();
    for (int64_t lo = 0; lo < n; lo += kBlock)
      blocks.push_back({static_cast<int32_t>(jobs.size() - 1), lo, std::min(n, lo + kBlock)});
    total += n;
  }
  const auto count = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (total > kParallelAbove)
  for (int64_t b = 0; b < count; ++b) {
    const Block& blk = blocks[static_cast<size_t>(b)];
    update_range(jobs[static_cast<size_t>(blk.job)], blk.lo, blk.hi);
  }
}

}  // namespace parallel::cpu
