#pragma once
// The attention part of a transformer layer, of the kind its LayerSpec names: self-attention
// (multi-head / grouped-query) or multi-head latent attention. The part holds exactly one of them
// and each call visits it once, as FeedForward does for the feed-forward kinds.
#include <memory>
#include <variant>
#include <vector>

#include "latent_attention.hpp"
#include "layer.hpp"
#include "layer_env.hpp"
#include "layer_spec.hpp"
#include "self_attention.hpp"

namespace parallel::model {

class AttentionPart {
 public:
  AttentionPart(const LayerEnv& env, const LayerSpec& spec);
  struct Context {
    Tensor positions, doc_start;               // the micro-batch's documents, handed to the chosen kind
    std::shared_ptr<const cp::Layout> layout;  // this rank's positions under cp (null: the zigzag)
    // LoRA's dropout on the self-attention's linears (TransformerLayer; MLA takes no adapters).
    tp::LoraDropout qkv_lora_dropout, proj_lora_dropout;
    std::variant<SelfAttention::Context, LatentAttention::Context> kind;  // set by the forward
  };
  // keep_core = false: selective recompute (the kind keeps its projections, rebuilds the core).
  Tensor forward(const Tensor& x, Context& ctx, bool keep_core);
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();

 private:
  std::variant<SelfAttention, LatentAttention> layer_;
};
static_assert(Layer<AttentionPart, bool>);  // forward(x, ctx, keep_core)

}  // namespace parallel::model
