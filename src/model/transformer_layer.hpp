#pragma once
// One transformer layer (transformer_layer.cpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "attention_part.hpp"
#include "feed_forward.hpp"
#include "layer.hpp"
#include "layer_env.hpp"
#include "layer_spec.hpp"
#include "moe_layer.hpp"
#include "norm.hpp"
#include "parallel/config.hpp"

namespace parallel::model {

// Pre-norm transformer layer with its recompute policy, made of the parts its LayerSpec names.
class TransformerLayer {
 public:
  TransformerLayer(const LayerEnv& env, const LayerSpec& spec, Recompute recompute);
  // layer_spec(*env.config, layer).
  TransformerLayer(const LayerEnv& env, int layer, Recompute recompute);
  struct Context {
    uint64_t micro_batch = 0;
    Tensor positions, doc_start;  // the micro-batch's documents (AttentionPart::Context)
    std::shared_ptr<const cp::Layout> layout;
    Tensor x;  // the layer input (all that full recompute keeps)
    Norm::Context norm1, norm2;
    AttentionPart::Context attn;
    FeedForward::Context ffn;
  };
  Tensor forward(const Tensor& x, Context& ctx, uint64_t micro_batch);
  Tensor backward(const Tensor& dy, Context& ctx);        // frees ctx
  Tensor backward_input(const Tensor& dy, Context& ctx);  // keeps the linears' state
  void backward_weight(Context& ctx);                     // frees ctx
  std::vector<Parameter*> parameters();
  MoELayer* moe() { return ffn_.moe(); }  // null for a dense layer

 private:
  // backward() and backward_input(): one walk over the parts.
  Tensor walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode);
  Tensor forward_impl(const Tensor& x, Context& ctx, bool keep_core, bool record_stats);
  const LayerEnv& env_;  // the chunk's, so set_training() reaches every layer
  int layer_;
  Recompute recompute_;
  Norm norm1_;
  AttentionPart attention_;  // self or latent attention (LayerSpec::attention)
  Norm norm2_;
  FeedForward ffn_;  // dense MLP or MoE (LayerSpec::ffn)
};
static_assert(Layer<TransformerLayer, uint64_t>);  // forward(x, ctx, micro_batch)

}  // namespace parallel::model
