// Dropout sites of the GPT model. The mask of element (s, b, h) depends only on the run's seed, the
// site, the micro-batch and that element's GLOBAL position, so tp and sequence-parallel layouts, and
// recomputation in the backward, all draw the same mask.
#include "layers.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One generator key per (seed, layer, site, micro-batch); the counter is the global element index.
uint64_t site_seed(const LayerEnv& env, DropoutSite where, uint64_t micro_batch) {
  uint64_t k = splitmix64(env.seed ^ 0x64726F706F7574ull);  // "dropout"
  k = splitmix64(k ^ static_cast<uint64_t>(static_cast<int64_t>(where.layer) + 1));
  k = splitmix64(k ^ static_cast<uint64_t>(where.site));
  return splitmix64(k ^ micro_batch);
}

uint64_t site_offset(const LayerEnv& env, const Tensor& x) {
  const int64_t s_local = x.size(0);
  return static_cast<uint64_t>(env.sequence_offset(s_local) * (x.numel() / std::max<int64_t>(s_local, 1)));
}

}  // namespace

Tensor dropout_forward(const LayerEnv& env, const Tensor& x, DropoutSite where, uint64_t micro_batch) {
  const float p = env.training ? static_cast<float>(env.config->dropout) : 0.0f;
  if (p == 0.0f) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::dropout_forward(x, y, p, site_seed(env, where, micro_batch), site_offset(env, x));
  return y;
}

Tensor dropout_backward(const LayerEnv& env, const Tensor& dy, DropoutSite where, uint64_t micro_batch) {
  const float p = env.training ? static_cast<float>(env.config->dropout) : 0.0f;
  if (p == 0.0f) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  ops::dropout_backward(dy, dx, p, site_seed(env, where, micro_batch), site_offset(env, dy));
  return dx;
}

}  // namespace parallel::model
