#pragma once
// The rotary embedding's frequencies: theta and an optional scaling of them for context extension,
// as Hugging Face's rope_scaling (model.rope_scaling* keys, docs/configuration.md):
//   none    inv_freq(i) = theta^(-2i/d)
//   linear  inv_freq(i) / factor (position interpolation: positions read as p / factor)
//   llama3  Llama 3.1's banded rule over wavelengths w = 2*pi / inv_freq, with
//           L = original_max_position_embeddings: w < L / high_freq_factor keeps inv_freq,
//           w > L / low_freq_factor divides it by factor, and in between it blends the two with
//           s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor):
//           (1 - s) * inv_freq / factor + s * inv_freq.
// Neither type scales the cos/sin values themselves (their attention_factor is 1).
//
// rope_inv_freq is the only place these formulas live: the CPU kernel (kernels/cpu/rope.cpp) and
// the CUDA kernel (kernels/cuda/rope.cu) both call it, in double. Plain C++ without fmt so that
// .cu files include it.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PARALLEL_ROPE_HD __host__ __device__
#else
#define PARALLEL_ROPE_HD
#endif

namespace parallel {

enum class RopeScalingType { None, Linear, Llama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  double factor = 1.0;                               // linear, llama3
  double low_freq_factor = 1.0;                      // llama3
  double high_freq_factor = 4.0;                     // llama3
  double original_max_position_embeddings = 8192.0;  // llama3: the context length trained before scaling
};

struct Rope {
  double theta = 10000.0;
  RopeScaling scaling{};
  // A plain theta converts: unscaled rope (every caller that only knows theta).
  constexpr Rope(double theta_ = 10000.0, RopeScaling scaling_ = {}) : theta(theta_), scaling(scaling_) {}
};

// The angular frequency of pair i (of d/2) in a head of dimension d.
PARALLEL_ROPE_HD inline double rope_inv_freq(const Rope& rope, int64_t i, int64_t d) {
  const double inv_freq = pow(rope.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  const RopeScaling& s = rope.scaling;
  switch (s.type) {
    case RopeScalingType::None:
      return inv_freq;
    case RopeScalingType::Linear:
      return inv_freq / s.factor;
    case RopeScalingType::Llama3: {
      const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
      const double low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
      const double high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
      if (wavelen < high_freq_wavelen) return inv_freq;
      if (wavelen > low_freq_wavelen) return inv_freq / s.factor;
      const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
    }
  }
  return inv_freq;
}

}  // namespace parallel

#undef PARALLEL_ROPE_HD
