// Self-attention of one layer on this rank's heads: rank r holds query heads [r·hq/tp, (r+1)·hq/tp)
// and exactly the kv heads they use, so attention itself needs no communication; only the two
// linears talk to the other ranks.
#include <cmath>

#include "layers.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {

SelfAttention::SelfAttention(const LayerEnv& env, int layer)
    : qkv({{fmt::format("layers.{}.attention.query", layer), env.heads * env.head_dim},
           {fmt::format("layers.{}.attention.key", layer), env.groups * env.head_dim},
           {fmt::format("layers.{}.attention.value", layer), env.groups * env.head_dim}},
          env.hidden,
          {.bias = env.config->add_bias || env.config->add_qkv_bias,
           .gather_output = false,
           .sequence_parallel = env.sequence_parallel},
          *env.tp),
      proj(fmt::format("layers.{}.attention.proj", layer), env.heads * env.head_dim, env.hidden,
           {.bias = env.config->add_bias, .sequence_parallel = env.sequence_parallel}, *env.tp),
      env_(env),
      heads_local_(env.heads / env.tp->size()),
      groups_local_(env.groups / env.tp->size()) {}

std::vector<Parameter*> SelfAttention::parameters() {
  std::vector<Parameter*> out = qkv.parameters();
  for (Parameter* p : proj.parameters()) out.push_back(p);
  return out;
}

// qkv_out [s, b, (hq_l + 2 hkv_l) d] -> q, k, v (contiguous, rotated), out, lse.
void SelfAttention::core_forward(const Tensor& qkv_out, Context& ctx) {
  const int64_t s = qkv_out.size(0), b = qkv_out.size(1), d = env_.head_dim;
  const int64_t nq = heads_local_ * d, nkv = groups_local_ * d;
  const Device dev = qkv_out.device();
  const DType dt = qkv_out.dtype();
  ctx.q = Tensor::empty({s, b, heads_local_, d}, dt, dev);
  ctx.k = Tensor::empty({s, b, groups_local_, d}, dt, dev);
  ctx.v = Tensor::empty({s, b, groups_local_, d}, dt, dev);
  ctx.q.view({s, b, nq}).copy_(qkv_out.narrow(2, 0, nq));
  ctx.k.view({s, b, nkv}).copy_(qkv_out.narrow(2, nq, nkv));
  ctx.v.view({s, b, nkv}).copy_(qkv_out.narrow(2, nq + nkv, nkv));
  if (env_.config->position_embedding == PositionEmbedding::Rope) {
    // Attention always sees the whole sequence (the qkv linear gathered it), so positions start at 0.
    const float theta = static_cast<float>(env_.config->rope_theta);
    ops::rope_forward(ctx.q, 0, theta);
    ops::rope_forward(ctx.k, 0, theta);
    // The rotated q and k are bf16 tensors on the GPU (the attention kernel's inputs).
  }
  ctx.out = Tensor::empty({s, b, heads_local_, d}, dt, dev);
  ctx.lse = Tensor::empty({b, heads_local_, s}, DType::F32, dev);
  ops::attention_forward(ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, /*causal=*/true,
                         1.0f / std::sqrt(static_cast<float>(d)));
}

Tensor SelfAttention::forward(const Tensor& x, Context& ctx, bool keep_core) {
  Tensor qkv_out = qkv.forward(x, ctx.qkv_ctx);
  core_forward(qkv_out, ctx);
  const int64_t s = qkv_out.size(0), b = qkv_out.size(1);
  Tensor y = proj.forward(ctx.out.view({s, b, heads_local_ * env_.head_dim}), ctx.proj_ctx);
  if (keep_core) return y;
  // Selective recompute: the core's state (q, k, v, out, lse, and proj's saved input, which is
  // `out`) is rebuilt from qkv in the backward; qkv is the only activation kept.
  ctx.qkv = qkv_out;
  ctx.q = ctx.k = ctx.v = ctx.out = ctx.lse = Tensor();
  ctx.proj_ctx.input = Tensor();
  return y;
}

void SelfAttention::restore_core(Context& ctx) {
  if (ctx.out.defined() && ctx.out.numel() > 0) return;
  core_forward(ctx.qkv, ctx);
  ctx.qkv = Tensor();
  const int64_t s = ctx.out.size(0), b = ctx.out.size(1);
  ctx.proj_ctx.input = ctx.out.view({s, b, heads_local_ * env_.head_dim});
}

Tensor SelfAttention::core_backward(const Tensor& dout_flat, Context& ctx) {
  const int64_t s = ctx.out.size(0), b = ctx.out.size(1), d = env_.head_dim;
  const int64_t nq = heads_local_ * d, nkv = groups_local_ * d;
  Tensor dout = dout_flat.view({s, b, heads_local_, d});
  const Device dev = dout.device();
  const DType dt = dout.dtype();
  Tensor dq = Tensor::empty(ctx.q.shape(), dt, dev);
  Tensor dk = Tensor::empty(ctx.k.shape(), dt, dev);
  Tensor dv = Tensor::empty(ctx.v.shape(), dt, dev);
  ops::attention_backward(dout, ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, dq, dk, dv, /*causal=*/true,
                          1.0f / std::sqrt(static_cast<float>(d)));
  ctx.q = ctx.k = ctx.v = ctx.out = ctx.lse = Tensor();
  // dq, dk, dv leave the attention kernel in bf16, and again after the rope's backward rotation.
  if (env_.config->position_embedding == PositionEmbedding::Rope) {
    const float theta = static_cast<float>(env_.config->rope_theta);
    ops::rope_backward(dq, 0, theta);
    ops::rope_backward(dk, 0, theta);
  }
  // Back into the fused layout [.., q_r | k_r | v_r] the qkv GEMM produced.
  Tensor dqkv = Tensor::empty({s, b, nq + 2 * nkv}, dt, dev);
  dqkv.narrow(2, 0, nq).copy_(dq.view({s, b, nq}));
  dqkv.narrow(2, nq, nkv).copy_(dk.view({s, b, nkv}));
  dqkv.narrow(2, nq + nkv, nkv).copy_(dv.view({s, b, nkv}));
  return dqkv;
}

Tensor SelfAttention::backward(const Tensor& dy, Context& ctx) {
  restore_core(ctx);
  Tensor dqkv = core_backward(proj.backward(dy, ctx.proj_ctx), ctx);
  return qkv.backward(dqkv, ctx.qkv_ctx);
}

Tensor SelfAttention::backward_input(const Tensor& dy, Context& ctx) {
  restore_core(ctx);
  Tensor dqkv = core_backward(proj.backward_input(dy, ctx.proj_ctx), ctx);
  return qkv.backward_input(dqkv, ctx.qkv_ctx);
}

void SelfAttention::backward_weight(Context& ctx) {
  proj.backward_weight(ctx.proj_ctx);
  qkv.backward_weight(ctx.qkv_ctx);
}

}  // namespace parallel::model
