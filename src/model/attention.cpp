// Self-attention of one layer on this rank's heads: rank r holds query heads [r·hq/tp, (r+1)·hq/tp)
// and exactly the kv heads they use, so attention itself needs no communication; only the two
// linears talk to the other ranks.
#include <cmath>

#include "parallel/error.hpp"
#include "parallel/ops.hpp"
#include "rotary.hpp"
#include "self_attention.hpp"

namespace parallel::model {
namespace {

// LoRA on a linear when model.lora targets `module` (docs/lora.md).
tp::LoraOptions lora_on(const ModelConfig& m, const char* module) {
  if (!m.lora_targets(module)) return {};
  return {m.lora.rank, static_cast<float>(m.lora.scale())};
}

tp::LoraOptions lora_on_any(const ModelConfig& m, std::initializer_list<const char*> modules) {
  for (const char* module : modules)
    if (m.lora_targets(module)) return lora_on(m, module);
  return {};
}

}  // namespace

SelfAttention::SelfAttention(const LayerEnv& env, int layer)
    : SelfAttention(env, layer_spec(*env.config, layer)) {}

SelfAttention::SelfAttention(const LayerEnv& env, const LayerSpec& spec)
    : qkv({{fmt::format("layers.{}.attention.query", spec.layer), env.heads * env.head_dim,
            env.config->lora_targets("q")},
           {fmt::format("layers.{}.attention.key", spec.layer), env.groups * env.head_dim,
            env.config->lora_targets("k")},
           {fmt::format("layers.{}.attention.value", spec.layer), env.groups * env.head_dim,
            env.config->lora_targets("v")}},
          env.hidden,
          {.bias = env.config->add_bias || env.config->add_qkv_bias,
           .gather_output = false,
           .sequence_parallel = env.sequence_parallel,
           .lora = lora_on_any(*env.config, {"q", "k", "v"})},
          *env.tp),
      proj(fmt::format("layers.{}.attention.proj", spec.layer), env.heads * env.head_dim, env.hidden,
           {.bias = env.config->add_bias,
            .sequence_parallel = env.sequence_parallel,
            .lora = lora_on(*env.config, "o")},
           *env.tp),
      env_(env),
      heads_local_(env.heads / env.tp->size()),
      groups_local_(env.groups / env.tp->size()),
      window_(spec.window),
      core_(env.cp, env.context_comm, 1.0f / std::sqrt(static_cast<float>(env.head_dim))) {
  if (spec.qk_norm) {
    const bool partial = env.tp->size() > 1;
    q_norm.emplace(env, fmt::format("layers.{}.attention.q_norm", spec.layer), Normalization::RMSNorm,
                   env.head_dim, partial);
    k_norm.emplace(env, fmt::format("layers.{}.attention.k_norm", spec.layer), Normalization::RMSNorm,
                   env.head_dim, partial);
  }
}

std::vector<Parameter*> SelfAttention::parameters() {
  std::vector<Parameter*> out = qkv.parameters();
  if (q_norm) {
    out.push_back(&q_norm->weight);
    out.push_back(&k_norm->weight);
  }
  for (Parameter* p : proj.parameters()) out.push_back(p);
  return out;
}

// Which of q, k and v the attention core reads straight out of the fused qkv output (and whose
// gradients it writes straight into the fused dqkv): the CPU kernels take each position's heads at
// any row stride (ops.hpp), so a head block of the fused tensor needs no copy. Copied instead, as
// contiguous tensors: on CUDA (its kernels take contiguous tensors), under context parallelism
// (ring and all-to-all attention pack and move whole tensors), and q and k when rope or qk-norm
// changes them (in place, on the copy: the fused output is kept for selective recompute). The meta
// device takes the CPU's path, so a meta run allocates what a CPU run does.
SelfAttention::InPlace SelfAttention::in_place(Device dev) const {
  const bool views = !dev.is_cuda() && env_.cp_size() == 1;
  const bool qk_changed = q_norm.has_value() || env_.config->position_embedding == PositionEmbedding::Rope;
  return {.qk = views && !qk_changed, .v = views};
}

// qkv_out [s, b, (hq_l + 2 hkv_l) d] -> q, k, v (views of it, or contiguous copies; rotated) -> the
// core's output and state. s is this rank's whole share of the sequence (the qkv linear gathered it
// under sp): all of it, or its two chunks under context parallelism.
void SelfAttention::core_forward(const Tensor& qkv_out, Context& ctx) {
  const int64_t s = qkv_out.size(0), b = qkv_out.size(1), d = env_.head_dim;
  const int64_t nq = heads_local_ * d, nkv = groups_local_ * d;
  const InPlace views = in_place(qkv_out.device());
  auto part = [&](int64_t start, int64_t heads, bool view) {
    const Tensor rows = qkv_out.narrow(2, start, heads * d);
    if (view) return rows.view({s, b, heads, d});
    Tensor t = Tensor::empty({s, b, heads, d}, qkv_out.dtype(), qkv_out.device());
    t.view({s, b, heads * d}).copy_(rows);
    return t;
  };
  Tensor q = part(0, heads_local_, views.qk);
  Tensor k = part(nq, groups_local_, views.qk);
  Tensor v = part(nq + nkv, groups_local_, views.v);
  if (q_norm) {  // per head, before rope (each row of [s b heads, d])
    q = q_norm->forward(q, ctx.q_norm_ctx);
    k = k_norm->forward(k, ctx.k_norm_ctx);
  }
  if (env_.config->position_embedding == PositionEmbedding::Rope) {
    const Rope rope(env_.config->rope_theta, env_.config->rope_scaling);
    rotate(q, ctx.positions, ctx.layout.get(), env_, rope, false);
    rotate(k, ctx.positions, ctx.layout.get(), env_, rope, false);
    // The rotated q and k are bf16 tensors on the GPU (the attention kernel's inputs).
  }
  ops::AttentionMask mask;
  mask.window = window_;
  mask.doc_start = ctx.doc_start;
  ctx.out = core_.forward(q, k, v, ctx.core, mask, ctx.layout);
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
  ctx.out = Tensor();
  ctx.core = {};
  ctx.q_norm_ctx = {};
  ctx.k_norm_ctx = {};
  ctx.proj_ctx.input = Tensor();
  return y;
}

void SelfAttention::restore_core(Context& ctx) {
  if (ctx.core.defined()) return;
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
  // The fused layout [.., q_r | k_r | v_r] the qkv GEMM produced: the kernel writes the gradients
  // of the parts it read in place straight into it, the others are copied in below.
  Tensor dqkv = Tensor::empty({s, b, nq + 2 * nkv}, dt, dev);
  const InPlace views = in_place(dev);
  auto part = [&](int64_t start, int64_t heads, bool view) {
    if (view) return dqkv.narrow(2, start, heads * d).view({s, b, heads, d});
    return Tensor::empty({s, b, heads, d}, dt, dev);
  };
  Tensor dq = part(0, heads_local_, views.qk);
  Tensor dk = part(nq, groups_local_, views.qk);
  Tensor dv = part(nq + nkv, groups_local_, views.v);
  core_.backward(dout, ctx.core, dq, dk, dv);
  ctx.out = Tensor();
  // dq, dk, dv leave the attention kernel in bf16, and again after the rope's backward rotation.
  if (env_.config->position_embedding == PositionEmbedding::Rope) {
    const Rope rope(env_.config->rope_theta, env_.config->rope_scaling);
    rotate(dq, ctx.positions, ctx.layout.get(), env_, rope, true);
    rotate(dk, ctx.positions, ctx.layout.get(), env_, rope, true);
  }
  if (q_norm) {  // the norms' weight gradients accumulate here, in the input step too (Norm)
    dq = q_norm->backward(dq, ctx.q_norm_ctx);
    dk = k_norm->backward(dk, ctx.k_norm_ctx);
  }
  if (!views.qk) {
    dqkv.narrow(2, 0, nq).copy_(dq.view({s, b, nq}));
    dqkv.narrow(2, nq, nkv).copy_(dk.view({s, b, nkv}));
  }
  if (!views.v) dqkv.narrow(2, nq + nkv, nkv).copy_(dv.view({s, b, nkv}));
  return dqkv;
}

Tensor SelfAttention::walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode) {
  restore_core(ctx);
  Tensor dqkv = core_backward(backward_step(proj, dy, ctx.proj_ctx, mode), ctx);
  return backward_step(qkv, dqkv, ctx.qkv_ctx, mode);
}

Tensor SelfAttention::backward(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::Fused);
}

Tensor SelfAttention::backward_input(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::InputOnly);
}

void SelfAttention::backward_weight(Context& ctx) {
  proj.backward_weight(ctx.proj_ctx);
  qkv.backward_weight(ctx.qkv_ctx);
}

}  // namespace parallel::model
