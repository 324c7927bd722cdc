// Rotary position embedding (GPT-NeoX / Llama layout): in each head of x = [s, b, heads, d], the
// pair (x[i], x[i + d/2]) is rotated by angle (position_offset + s_index) * inv_freq(i), the
// frequencies of include/parallel/rope.hpp, and scaled by its attention factor (yarn; 1 otherwise).
// The backward rotates the gradient by the negative angle (the rotation is orthogonal), scaled alike.
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

namespace parallel::cpu {
namespace {

// direction +1 forward, -1 backward. Angles are computed in double: at positions ~1e5, a float
// product position * inv_freq would already be off by ~1e-2 rad.
void rope(Tensor& x, int64_t position_offset, const Rope& rope, float direction) {
  const int64_t s = x.size(0), per_pos = x.size(1) * x.size(2), d = x.size(3), half = d / 2;
  const DType dt = x.dtype();
  // Table [s, half] of cos and sin: s * d/2 trig calls instead of s * b * heads * d/2.
  std::vector<float> cos_t(static_cast<size_t>(s * half)), sin_t(static_cast<size_t>(s * half));
  // yarn's attention factor scales cos and sin (1 otherwise); the backward, the transpose of the
  // scaled rotation, is the rotation by the negative angle scaled alike.
  const double factor = rope_attention_factor(rope);
  for (int64_t i = 0; i < half; i++) {
    const double inv_freq = rope_inv_freq(rope, i, d);
    for (int64_t p = 0; p < s; p++) {
      const double angle = static_cast<double>(position_offset + p) * inv_freq;
      cos_t[p * half + i] = static_cast<float>(factor * std::cos(angle));
      sin_t[p * half + i] = direction * static_cast<float>(factor * std::sin(angle));
    }
  }
#pragma omp parallel for collapse(2) schedule(static) if (x.numel() > (1 << 15))
  for (int64_t p = 0; p < s; p++) {
    for (int64_t v = 0; v < per_pos; v++) {
      // One head at a time: widened in place for bf16/fp16 (a 16-bit head is d values).
      void* stored = offset_ptr(x.data_ptr(), dt, (p * per_pos + v) * d);
      float* head = write_f32(stored, dt, d, 0);
      if (dt != DType::F32) widen_to_f32(stored, dt, head, d);
      const float* c = cos_t.data() + p * half;
      const float* sn = sin_t.data() + p * half;
#pragma omp simd
      for (int64_t i = 0; i < half; i++) {
        const float x1 = head[i], x2 = head[i + half];
        head[i] = x1 * c[i] - x2 * sn[i];
        head[i + half] = x2 * c[i] + x1 * sn[i];
      }
      write_back(head, dt, stored, d);
    }
  }
}

}  // namespace

void rope_forward(Tensor& x, int64_t position_offset, const Rope& r) { rope(x, position_offset, r, 1.0f); }
void rope_backward(Tensor& dx, int64_t position_offset, const Rope& r) {
  rope(dx, position_offset, r, -1.0f);
}

}  // namespace parallel::cpu
