// One depth of multi-token prediction: the embedding of the tokens k ahead and the previous depth's
// hidden state, each normalised, concatenated (embedding first, as DeepSeek-V3 and Megatron-Core
// order them) and projected from 2h to h, then one transformer layer.
#include "mtp_layer.hpp"

#include <fmt/format.h>

#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

LayerSpec mtp_spec(const ModelConfig& config, int depth) {
  // The make-up of the model's last layer (its attention kind, window and FFN, dense or MoE), under
  // this depth's own index for its names, init and dropout keys.
  LayerSpec spec = layer_spec(config, config.num_layers - 1);
  spec.layer = MTPLayer::layer_index(config, depth);
  return spec;
}

std::string prefix(const ModelConfig& config, int depth) {
  return fmt::format("layers.{}.", MTPLayer::layer_index(config, depth));
}

}  // namespace

MTPLayer::MTPLayer(const LayerEnv& env, int depth, Parameter* embedding, Recompute recompute)
    : norm(env, prefix(*env.config, depth) + "final_norm"),
      env_(env),
      embedding_(embedding),
      enorm_(env, prefix(*env.config, depth) + "enorm"),
      hnorm_(env, prefix(*env.config, depth) + "hnorm"),
      eh_proj_(env, prefix(*env.config, depth) + "eh_proj", 2 * env.hidden, env.hidden),
      layer_(env, mtp_spec(*env.config, depth), recompute) {}

std::vector<Parameter*> MTPLayer::parameters() {
  std::vector<Parameter*> out;
  for (Parameter* p : enorm_.parameters()) out.push_back(p);
  for (Parameter* p : hnorm_.parameters()) out.push_back(p);
  out.push_back(&eh_proj_.weight);
  for (Parameter* p : layer_.parameters()) out.push_back(p);
  for (Parameter* p : norm.parameters()) out.push_back(p);
  return out;
}

Tensor MTPLayer::forward(const Tensor& h, Context& ctx, const Tensor& tokens, uint64_t micro_batch) {
  PARALLEL_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I32,
                 "MTPLayer: tokens {} must be [b, s] int32", tokens.str());
  // The vocab-parallel lookup (tp::VocabParallelEmbedding's) on the borrowed weight.
  Communicator& tp = *env_.tp;
  const Tensor& w = embedding_->value;
  const int64_t b = tokens.size(0), s = tokens.size(1), hidden = w.size(1);
  Tensor e = Tensor::empty({s, b, hidden}, w.dtype(), w.device());
  ops::embedding_forward(tokens, w, embedding_->partition_offset, e);
  if (tp.size() > 1) {
    if (env_.sequence_parallel)
      e = tp::reduce_scatter_sequence(tp, e);
    else
      tp.all_reduce(e, ReduceOp::Sum);
  }
  ctx.tokens = tokens;
  const Tensor en = enorm_.forward(e, ctx.enorm);
  const Tensor hn = hnorm_.forward(h, ctx.hnorm);
  const int64_t rows = en.numel() / hidden;
  Tensor cat = Tensor::empty({en.size(0), en.size(1), 2 * hidden}, en.dtype(), en.device());
  Tensor cat2d = cat.view({rows, 2 * hidden});
  cat2d.narrow(1, 0, hidden).copy_(en.contiguous().view({rows, hidden}));
  cat2d.narrow(1, hidden, hidden).copy_(hn.contiguous().view({rows, hidden}));
  const Tensor x = eh_proj_.forward(cat, ctx.eh_proj);
  ctx.layer.micro_batch = micro_batch;
  return layer_.forward(x, ctx.layer, micro_batch);
}

void MTPLayer::embedding_backward(const Tensor& de, Context& ctx) {
  if (!embedding_->frozen) {
    // Every rank needs the gradient of every position: the ids it owns may be anywhere in s.
    const Tensor full = env_.sequence_parallel ? tp::gather_sequence(*env_.tp, de) : de.contiguous();
    ops::embedding_backward(ctx.tokens, full, embedding_->partition_offset, embedding_->grad);
  }
  ctx.tokens = Tensor();
}

// Fused: every part's B and W, the embedding's weight step last. InputOnly: every part's B; the
// embedding's output gradient waits in ctx for backward_weight().
Tensor MTPLayer::walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode) {
  const Tensor dx = backward_step(layer_, dy, ctx.layer, mode);
  const Tensor dcat = backward_step(eh_proj_, dx, ctx.eh_proj, mode).contiguous();
  const int64_t hidden = env_.hidden, rows = dcat.numel() / (2 * hidden);
  Shape half = dcat.shape();
  half.back() = hidden;
  Tensor den = Tensor::empty(half, dcat.dtype(), dcat.device());
  Tensor dhn = Tensor::empty(half, dcat.dtype(), dcat.device());
  const Tensor dcat2d = dcat.view({rows, 2 * hidden});
  den.view({rows, hidden}).copy_(dcat2d.narrow(1, 0, hidden));
  dhn.view({rows, hidden}).copy_(dcat2d.narrow(1, hidden, hidden));
  const Tensor dh = backward_step(hnorm_, dhn, ctx.hnorm, mode);
  const Tensor de = backward_step(enorm_, den, ctx.enorm, mode);
  if (mode == BackwardMode::Fused)
    embedding_backward(de, ctx);
  else
    ctx.embedding_grad = de;
  return dh;
}

Tensor MTPLayer::backward(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::Fused);
}

Tensor MTPLayer::backward_input(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::InputOnly);
}

void MTPLayer::backward_weight(Context& ctx) {
  layer_.backward_weight(ctx.layer);
  eh_proj_.backward_weight(ctx.eh_proj);
  hnorm_.backward_weight(ctx.hnorm);
  enorm_.backward_weight(ctx.enorm);
  const Tensor de = std::move(ctx.embedding_grad);
  embedding_backward(de, ctx);
}

}  // namespace parallel::model
