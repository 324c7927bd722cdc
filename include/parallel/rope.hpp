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
//   yarn    YaRN (transformers' _compute_yarn_parameters, followed step by step): with
//           L = original_max_position_embeddings and the correction dims
//             c(beta) = d ln(L / (2 pi beta)) / (2 ln theta),
//           low = max(floor(c(beta_fast)), 0), high = min(ceil(c(beta_slow)), d - 1) (no floor/ceil
//           without truncate; high += 0.001 where they meet), the ramp r(i) = clamp((i - low) /
//           (high - low), 0, 1) over the pairs blends inv_freq / factor (r = 1) with inv_freq (r = 0).
//           The cos/sin values are multiplied by attention_factor (rope_attention_factor): the given
//           one, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set,
//           else mscale(factor, 1), where mscale(f, m) = 0.1 m ln f + 1 (1 for f <= 1). Rotating q
//           and k both, this scales the scores by attention_factor^2: Llama's and Qwen2's whole
//           YaRN correction. DeepSeek-V2/V3 also multiply the softmax scale by
//           mscale(factor, mscale_all_dim)^2 (yarn_softmax_scale_factor; the attention's business:
//           ops::attention_* take the scale from the caller).
// The other types do not scale the cos/sin values (their attention_factor is 1).
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

enum class RopeScalingType { None, Linear, Llama3, Yarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  double factor = 1.0;            // linear, llama3, yarn
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double original_max_position_embeddings =
      8192.0;                     // llama3, yarn: the context length trained before scaling
  double beta_fast = 32.0;        // yarn: rotations where extrapolation ends
  double beta_slow = 1.0;         // yarn: rotations where interpolation begins
  double mscale = 0.0;            // yarn (0: unset)
  double mscale_all_dim = 0.0;    // yarn (0: unset)
  double attention_factor = 0.0;  // yarn: the cos/sin factor (0: derived, see above)
  bool truncate = true;           // yarn: floor / ceil the correction range
};

struct Rope {
  double theta = 10000.0;
  RopeScaling scaling{};
  // A plain theta converts: unscaled rope (every caller that only knows theta).
  constexpr Rope(double theta_ = 10000.0, RopeScaling scaling_ = {}) : theta(theta_), scaling(scaling_) {}
};

// YaRN's magnitude scale: 0.1 m ln(f) + 1, and 1 for f <= 1 (transformers' get_mscale and
// DeepSeek's yarn_get_mscale).
PARALLEL_ROPE_HD inline double yarn_get_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

// The factor on the cos/sin values (1 except for yarn).
PARALLEL_ROPE_HD inline double rope_attention_factor(const Rope& rope) {
  const RopeScaling& s = rope.scaling;
  if (s.type != RopeScalingType::Yarn) return 1.0;
  if (s.attention_factor > 0.0) return s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    return yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim);
  return yarn_get_mscale(s.factor, 1.0);
}

// DeepSeek-V2/V3's correction of the softmax scale under yarn (their yarn_apply_mscale):
// mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set, else 1. Llama and Qwen2 do not apply
// it (their correction is the cos/sin factor alone).
inline double yarn_softmax_scale_factor(const RopeScaling& s) {
  if (s.type != RopeScalingType::Yarn || s.mscale_all_dim == 0.0) return 1.0;
  const double m = yarn_get_mscale(s.factor, s.mscale_all_dim);
  return m * m;
}

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
    case RopeScalingType::Yarn: {
      const double two_pi = 2.0 * 3.14159265358979323846, dim = static_cast<double>(d);
      const double L = s.original_max_position_embeddings, log_theta = log(rope.theta);
      double low = dim * log(L / (s.beta_fast * two_pi)) / (2.0 * log_theta);
      double high = dim * log(L / (s.beta_slow * two_pi)) / (2.0 * log_theta);
      if (s.truncate) {
        low = floor(low);
        high = ceil(high);
      }
      low = low > 0.0 ? low : 0.0;
      high = high < dim - 1.0 ? high : dim - 1.0;
      if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
      double ramp = (static_cast<double>(i) - low) / (high - low);
      ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
      // ramp 1: interpolated (inv_freq / factor); ramp 0: extrapolated (inv_freq as it is).
      return inv_freq / s.factor * ramp + inv_freq * (1.0 - ramp);
    }
  }
  return inv_freq;
}

}  // namespace parallel

#undef PARALLEL_ROPE_HD
