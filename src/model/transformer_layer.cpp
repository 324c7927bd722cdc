// One pre-norm transformer layer:
//   x2  = x + dropout(attention(norm1(x)))
//   out = x2 + dropout(mlp(norm2(x2)))
// and its recompute policies: selective drops the core attention's state (rebuilt from the saved
// qkv projection), full keeps only x and reruns the whole forward at the start of the backward.
#include "transformer_layer.hpp"

#include "parallel/ops.hpp"

namespace parallel::model {

TransformerLayer::TransformerLayer(const LayerEnv& env, const LayerSpec& spec, Recompute recompute)
    : env_(env),
      layer_(spec.layer),
      recompute_(recompute),
      norm1_(env, fmt::format("layers.{}.input_norm", spec.layer), spec.norm),
      attention_(env, spec),
      norm2_(env, fmt::format("layers.{}.post_attention_norm", spec.layer), spec.norm),
      ffn_(env, spec) {}

TransformerLayer::TransformerLayer(const LayerEnv& env, int layer, Recompute recompute)
    : TransformerLayer(env, layer_spec(*env.config, layer), recompute) {}

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> out;
  for (Parameter* p : norm1_.parameters()) out.push_back(p);
  for (Parameter* p : attention_.parameters()) out.push_back(p);
  for (Parameter* p : norm2_.parameters()) out.push_back(p);
  for (Parameter* p : ffn_.parameters()) out.push_back(p);
  return out;
}

// The residual stream goes through two fused ops (ops.hpp): norm2's forward_residual forms
// x2 = x + dropout(o) and norm2(x2) in one pass, dropout_add forms the output.
// record_stats: false when full recompute reruns the forward (the MoE statistics count once).
Tensor TransformerLayer::forward_impl(const Tensor& x, Context& ctx, bool keep_core, bool record_stats) {
  const uint64_t mb = ctx.micro_batch;
  ctx.attn.positions = ctx.positions;
  ctx.attn.doc_start = ctx.doc_start;
  ctx.attn.layout = ctx.layout;
  const cp::Layout* layout = ctx.layout.get();
  if (env_.config->lora.enabled()) {
    const int64_t s = x.size(0);
    ctx.attn.qkv_lora_dropout = lora_dropout(env_, {layer_, 3}, mb, s, layout);
    ctx.attn.proj_lora_dropout = lora_dropout(env_, {layer_, 4}, mb, s, layout);
    if (auto* mlp = std::get_if<MLP::Context>(&ctx.ffn)) {  // MoE layers take no adapters (config rule)
      mlp->fc1_ctx.lora_dropout = lora_dropout(env_, {layer_, 5}, mb, s, layout);
      mlp->fc2_ctx.lora_dropout = lora_dropout(env_, {layer_, 6}, mb, s, layout);
    }
  }
  Tensor a = norm1_.forward(x, ctx.norm1);
  // o and y below are fresh tensors (the row-parallel outputs), so the sums reuse their storage.
  Tensor o = attention_.forward(a, ctx.attn, keep_core);
  Tensor x2 = o;
  Tensor m = norm2_.forward_residual(x, o, dropout_runs(env_, o, {layer_, 1}, mb, layout), x2, ctx.norm2);
  Tensor y = ffn_.forward(m, ctx.ffn, record_stats);
  dropout_add(env_, y, x2, y, {layer_, 2}, mb, layout);
  return y;
}

Tensor TransformerLayer::forward(const Tensor& x, Context& ctx, uint64_t micro_batch) {
  ctx.micro_batch = micro_batch;
  if (recompute_ != Recompute::Full)
    return forward_impl(x, ctx, /*keep_core=*/recompute_ == Recompute::None, true);
  // Full recompute: run the layer for its output and forget everything but the input.
  Context scratch;
  scratch.micro_batch = micro_batch;
  scratch.positions = ctx.positions;
  scratch.doc_start = ctx.doc_start;
  scratch.layout = ctx.layout;
  Tensor y = forward_impl(x, scratch, /*keep_core=*/true, true);
  ctx.x = x;
  return y;
}

// Fused: each part's whole backward, then ctx is freed. InputOnly: each part's input step; their
// contexts keep what backward_weight() needs. The norms' residual steps are the same in both modes
// (their weight gradients come out of the one kernel pass, see Norm).
Tensor TransformerLayer::walk_backward(const Tensor& dy_in, Context& ctx, BackwardMode mode) {
  if (recompute_ == Recompute::Full) {
    // Same inputs, same seeds, same kernels: the recomputed state is bitwise the original's.
    Tensor x = ctx.x;
    ctx.x = Tensor();
    (void)forward_impl(x, ctx, /*keep_core=*/true, false);
  }
  const uint64_t mb = ctx.micro_batch;
  const cp::Layout* layout = ctx.layout.get();
  Tensor dy = dy_in.contiguous();
  // out = x2 + dropout(mlp(norm2(x2))): dy flows to x2 directly and through the MLP branch.
  Tensor dm = backward_step(ffn_, dropout_backward(env_, dy, {layer_, 2}, mb, layout), ctx.ffn, mode);
  // x2 = x + dropout(o): norm2's backward adds dy and hands o its gradient through the dropout.
  Norm::ResidualGrads g2 =
      norm2_.backward_residual(dm, dy, dropout_runs(env_, dy, {layer_, 1}, mb, layout), ctx.norm2);
  Tensor da = backward_step(attention_, g2.dbranch, ctx.attn, mode);
  Tensor dx = norm1_.backward_residual(da, g2.dsum, {}, ctx.norm1).dsum;
  if (mode == BackwardMode::Fused) ctx = Context{};
  return dx;
}

Tensor TransformerLayer::backward(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::Fused);
}

Tensor TransformerLayer::backward_input(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::InputOnly);
}

void TransformerLayer::backward_weight(Context& ctx) {
  ffn_.backward_weight(ctx.ffn);
  norm2_.backward_weight(ctx.norm2);
  attention_.backward_weight(ctx.attn);
  norm1_.backward_weight(ctx.norm1);
  ctx = Context{};
}

}  // namespace parallel::model
