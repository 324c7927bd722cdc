// Multi-head latent attention on this rank's heads (latent_attention.hpp). The rope part of the
// query and key heads is in rotate-half order, as every rope here; DeepSeek-V3's interleaved
// checkpoints (rope_interleave) are that order after a permutation of the weights' rope rows.
#include "latent_attention.hpp"

#include <cmath>

#include "parallel/error.hpp"
#include "parallel/ops.hpp"
#include "parallel/rope.hpp"
#include "rotary.hpp"

namespace parallel::model {
namespace {

std::string name_of(const LayerSpec& spec, const char* part) {
  return fmt::format("layers.{}.attention.{}", spec.layer, part);
}

float softmax_scale(const ModelConfig& m) {
  // DeepSeek's yarn_apply_mscale: 1/sqrt(n + r), times mscale(factor, mscale_all_dim)^2 under yarn.
  const double d = m.qk_nope_head_dim + m.qk_rope_head_dim;
  return static_cast<float>(yarn_softmax_scale_factor(m.rope_scaling) / std::sqrt(d));
}

}  // namespace

LatentAttention::LatentAttention(const LayerEnv& env, const LayerSpec& spec)
    : q_up({{name_of(spec, env.config->q_lora_rank > 0 ? "q_up" : "query"),
             env.heads * (env.config->qk_nope_head_dim + env.config->qk_rope_head_dim)}},
           env.config->q_lora_rank > 0 ? env.config->q_lora_rank : env.hidden,
           {.bias = false, .gather_output = false, .sequence_parallel = env.sequence_parallel, .lora = {}},
           *env.tp),
      kv_down(env, name_of(spec, "kv_down"), env.hidden,
              env.config->kv_lora_rank + env.config->qk_rope_head_dim),
      kv_norm(env, name_of(spec, "kv_norm"), Normalization::RMSNorm, env.config->kv_lora_rank,
              env.sequence_parallel),
      kv_up({{name_of(spec, "kv_up"), env.heads * (env.config->qk_nope_head_dim + env.config->v_head_dim)}},
            env.config->kv_lora_rank,
            {.bias = false, .gather_output = false, .sequence_parallel = env.sequence_parallel, .lora = {}},
            *env.tp),
      proj(name_of(spec, "proj"), env.heads * env.config->v_head_dim, env.hidden,
           {.bias = false, .sequence_parallel = env.sequence_parallel, .lora = {}}, *env.tp),
      env_(env),
      heads_local_(env.heads / env.tp->size()),
      nope_(env.config->qk_nope_head_dim),
      rope_(env.config->qk_rope_head_dim),
      v_dim_(env.config->v_head_dim),
      kv_rank_(env.config->kv_lora_rank),
      window_(spec.window),
      core_(env.cp, env.context_comm, softmax_scale(*env.config)) {
  PARALLEL_CHECK(env.config->is_mla(), "LatentAttention: model.attention is not mla");
  if (env.config->q_lora_rank > 0) {
    q_down.emplace(env, name_of(spec, "q_down"), env.hidden, env.config->q_lora_rank);
    q_latent_norm.emplace(env, name_of(spec, "q_latent_norm"), Normalization::RMSNorm,
                          env.config->q_lora_rank, env.sequence_parallel);
  }
}

std::vector<Parameter*> LatentAttention::parameters() {
  std::vector<Parameter*> out;
  auto add = [&out](std::vector<Parameter*> ps) { out.insert(out.end(), ps.begin(), ps.end()); };
  if (q_down) {
    add(q_down->parameters());
    add(q_latent_norm->parameters());
  }
  add(q_up.parameters());
  add(kv_down.parameters());
  add(kv_norm.parameters());
  add(kv_up.parameters());
  add(proj.parameters());
  return out;
}

// q [s, b, H_l (n + r)], kv [s, b, H_l (n + dv)], k_pe [s, b, r] over this rank's whole share of
// the sequence -> the core's output and state.
void LatentAttention::core_forward(const Tensor& q_in, const Tensor& kv_in, const Tensor& k_pe_in,
                                   Context& ctx) {
  const int64_t s = q_in.size(0), b = q_in.size(1), hl = heads_local_, dqk = nope_ + rope_;
  const Device dev = q_in.device();
  const DType dt = q_in.dtype();
  const Rope rope(env_.config->rope_theta, env_.config->rope_scaling);
  Tensor q = q_in.contiguous().view({s, b, hl, dqk}).clone();
  Tensor q_pe = Tensor::empty({s, b, hl, rope_}, dt, dev);
  q_pe.copy_(q.narrow(3, nope_, rope_));
  rotate(q_pe, ctx.positions, ctx.layout.get(), env_, rope, false);
  q.narrow(3, nope_, rope_).copy_(q_pe);

  Tensor k_pe = k_pe_in.contiguous().view({s, b, 1, rope_}).clone();
  rotate(k_pe, ctx.positions, ctx.layout.get(), env_, rope, false);
  const Tensor kv = kv_in.contiguous().view({s, b, hl, nope_ + v_dim_});
  Tensor k = Tensor::empty({s, b, hl, dqk}, dt, dev);
  Tensor v = Tensor::empty({s, b, hl, v_dim_}, dt, dev);
  k.narrow(3, 0, nope_).copy_(kv.narrow(3, 0, nope_));
  for (int64_t h = 0; h < hl; ++h) k.narrow(2, h, 1).narrow(3, nope_, rope_).copy_(k_pe);
  v.copy_(kv.narrow(3, nope_, v_dim_));
  ops::AttentionMask mask;
  mask.window = window_;
  mask.doc_start = ctx.doc_start;
  ctx.out = core_.forward(q, k, v, ctx.core, mask, ctx.layout);
}

Tensor LatentAttention::forward(const Tensor& x, Context& ctx, bool keep_core) {
  const int64_t s_local = x.size(0), b = x.size(1);
  Tensor q =
      q_down ? q_up.forward(q_latent_norm->forward(q_down->forward(x, ctx.q_down_ctx), ctx.q_latent_norm_ctx),
                            ctx.q_up_ctx)
             : q_up.forward(x, ctx.q_up_ctx);
  Tensor ckv = kv_down.forward(x, ctx.kv_down_ctx);  // [s(/tp), b, kv_lora_rank + r]
  Tensor c = Tensor::empty({s_local, b, kv_rank_}, ckv.dtype(), ckv.device());
  Tensor k_pe = Tensor::empty({s_local, b, rope_}, ckv.dtype(), ckv.device());
  c.copy_(ckv.narrow(2, 0, kv_rank_));
  k_pe.copy_(ckv.narrow(2, kv_rank_, rope_));
  // kv_up gathers its input along s under sequence parallelism; k_pe, which has no linear after
  // it, is gathered here.
  if (env_.sequence_parallel) k_pe = tp::gather_sequence(*env_.tp, k_pe);
  Tensor kv = kv_up.forward(kv_norm.forward(c, ctx.kv_norm_ctx), ctx.kv_up_ctx);
  core_forward(q, kv, k_pe, ctx);
  const int64_t s = q.size(0);
  Tensor y = proj.forward(ctx.out.view({s, b, heads_local_ * v_dim_}), ctx.proj_ctx);
  if (keep_core) return y;
  ctx.q = q;
  ctx.kv = kv;
  ctx.k_pe = k_pe;
  ctx.out = Tensor();
  ctx.core = {};
  ctx.proj_ctx.input = Tensor();
  return y;
}

void LatentAttention::restore_core(Context& ctx) {
  if (ctx.core.defined()) return;
  core_forward(ctx.q, ctx.kv, ctx.k_pe, ctx);
  const int64_t s = ctx.q.size(0), b = ctx.q.size(1);
  ctx.q = ctx.kv = ctx.k_pe = Tensor();
  ctx.proj_ctx.input = ctx.out.view({s, b, heads_local_ * v_dim_});
}

LatentAttention::CoreGrads LatentAttention::core_backward(const Tensor& dout_flat, Context& ctx) {
  const int64_t s = ctx.out.size(0), b = ctx.out.size(1), hl = heads_local_, dqk = nope_ + rope_;
  Tensor dout = dout_flat.contiguous().view({s, b, hl, v_dim_});
  const Device dev = dout.device();
  const DType dt = dout.dtype();
  const Rope rope(env_.config->rope_theta, env_.config->rope_scaling);
  Tensor dq = Tensor::empty({s, b, hl, dqk}, dt, dev);
  Tensor dk = Tensor::empty({s, b, hl, dqk}, dt, dev);
  Tensor dv = Tensor::empty({s, b, hl, v_dim_}, dt, dev);
  core_.backward(dout, ctx.core, dq, dk, dv);
  ctx.out = Tensor();

  Tensor dq_pe = Tensor::empty({s, b, hl, rope_}, dt, dev);
  dq_pe.copy_(dq.narrow(3, nope_, rope_));
  rotate(dq_pe, ctx.positions, ctx.layout.get(), env_, rope, true);
  dq.narrow(3, nope_, rope_).copy_(dq_pe);
  // Every head's key used the one k_pe: its gradient is their sum (in head order).
  Tensor dk_pe = Tensor::empty({s, b, 1, rope_}, dt, dev);
  Tensor head = Tensor::empty({s, b, 1, rope_}, dt, dev);
  dk_pe.copy_(dk.narrow(2, 0, 1).narrow(3, nope_, rope_));
  for (int64_t h = 1; h < hl; ++h) {
    head.copy_(dk.narrow(2, h, 1).narrow(3, nope_, rope_));
    ops::add_(dk_pe, head);
  }
  rotate(dk_pe, ctx.positions, ctx.layout.get(), env_, rope, true);
  Tensor dkv = Tensor::empty({s, b, hl, nope_ + v_dim_}, dt, dev);
  dkv.narrow(3, 0, nope_).copy_(dk.narrow(3, 0, nope_));
  dkv.narrow(3, nope_, v_dim_).copy_(dv);
  return {dq.view({s, b, hl * dqk}), dkv.view({s, b, hl * (nope_ + v_dim_)}), dk_pe.view({s, b, rope_})};
}

Tensor LatentAttention::walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode) {
  restore_core(ctx);
  CoreGrads g = core_backward(backward_step(proj, dy, ctx.proj_ctx, mode), ctx);
  // Key-value path. The other tp ranks' heads add to d(k_pe): reduce-scattered back to this
  // rank's s-shard under sequence parallelism (gather_sequence's dual), all-reduced without.
  Tensor dc = backward_step(kv_norm, backward_step(kv_up, g.dkv, ctx.kv_up_ctx, mode), ctx.kv_norm_ctx, mode);
  Tensor dk_pe = env_.sequence_parallel ? tp::reduce_scatter_sequence(*env_.tp, g.dk_pe)
                                        : tp::all_reduce(*env_.tp, g.dk_pe);
  const int64_t s_local = dc.size(0), b = dc.size(1);
  Tensor dckv = Tensor::empty({s_local, b, kv_rank_ + rope_}, dc.dtype(), dc.device());
  dckv.narrow(2, 0, kv_rank_).copy_(dc);
  dckv.narrow(2, kv_rank_, rope_).copy_(dk_pe);
  Tensor dx = backward_step(kv_down, dckv, ctx.kv_down_ctx, mode);
  // Query path.
  Tensor dq = backward_step(q_up, g.dq, ctx.q_up_ctx, mode);
  if (q_down)
    dq = backward_step(*q_down, backward_step(*q_latent_norm, dq, ctx.q_latent_norm_ctx, mode),
                       ctx.q_down_ctx, mode);
  ops::add_(dx, dq);
  return dx;
}

Tensor LatentAttention::backward(const Tensor& dy, Context& ctx) {
  Tensor dx = walk_backward(dy, ctx, BackwardMode::Fused);
  ctx = Context{};
  return dx;
}

Tensor LatentAttention::backward_input(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::InputOnly);
}

void LatentAttention::backward_weight(Context& ctx) {
  proj.backward_weight(ctx.proj_ctx);
  kv_up.backward_weight(ctx.kv_up_ctx);
  kv_norm.backward_weight(ctx.kv_norm_ctx);
  kv_down.backward_weight(ctx.kv_down_ctx);
  q_up.backward_weight(ctx.q_up_ctx);
  if (q_down) {
    q_latent_norm->backward_weight(ctx.q_latent_norm_ctx);
    q_down->backward_weight(ctx.q_down_ctx);
  }
  ctx = Context{};
}

}  // namespace parallel::model
