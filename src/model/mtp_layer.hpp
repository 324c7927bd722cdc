#pragma once
// One depth of multi-token prediction (mtp_layer.cpp; docs/model.md, "Multi-token prediction").
#include <cstdint>
#include <vector>

#include "layer.hpp"
#include "layer_env.hpp"
#include "norm.hpp"
#include "parallel/config.hpp"
#include "replicated_linear.hpp"
#include "transformer_layer.hpp"

namespace parallel::model {

// DeepSeek-V3's MTP module of depth k (1 <= k <= D = model.mtp_num_layers):
//   h'_i = eh_proj([enorm(Emb(t_{i+k})) ; hnorm(h^{k-1}_i)])      eh_proj: [h, 2h], replicated over tp
//   h^k  = TRM_k(h')                                              the last layer's make-up
// and its own final norm (`norm`), which the chunk applies to h^k before the shared output layer.
// The word embedding is borrowed (the chunk's, or its copy on a last pipeline stage without it);
// its gradient accumulates into that Parameter in the weight step. Parameters are named
// layers.{L + k - 1}.{enorm, hnorm, eh_proj, final_norm, <the transformer layer's>}: the MTP layers
// continue the layer numbering, as DeepSeek-V3's checkpoints do.
class MTPLayer {
 public:
  MTPLayer(const LayerEnv& env, int depth, Parameter* embedding, Recompute recompute);
  // The global index of this depth's layer: num_layers + depth - 1.
  static int layer_index(const ModelConfig& config, int depth) { return config.num_layers + depth - 1; }
  struct Context {
    Tensor tokens;          // [b, s_local] int32: the tokens k ahead, for the embedding's weight step
    Tensor embedding_grad;  // split backward: d(embedding output), waiting for the weight step
    Norm::Context enorm, hnorm;
    ReplicatedLinear::Context eh_proj;
    TransformerLayer::Context layer;  // the chunk fills its positions, doc_start and layout
  };
  // h: the previous depth's hidden state [s(/tp), b, h] (the main model's last layer output, before
  // its final norm, at depth 1); tokens: [b, s_local] int32, t_{i+k} for this rank's positions i.
  // Returns h^k [s(/tp), b, h].
  Tensor forward(const Tensor& h, Context& ctx, const Tensor& tokens, uint64_t micro_batch);
  Tensor backward(const Tensor& dy, Context& ctx);  // returns d(h^{k-1}); frees ctx
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  // Its own parameters, `norm`'s included (not the borrowed embedding).
  std::vector<Parameter*> parameters();
  MoELayer* moe() { return layer_.moe(); }
  Norm norm;  // the depth's final norm (DeepSeek-V3's shared_head.norm), run by the chunk

 private:
  Tensor walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode);
  void embedding_backward(const Tensor& de, Context& ctx);
  const LayerEnv& env_;
  Parameter* embedding_;
  Norm enorm_, hnorm_;
  ReplicatedLinear eh_proj_;
  TransformerLayer layer_;
};
static_assert(Layer<MTPLayer, const Tensor&, uint64_t>);  // forward(h, ctx, tokens, micro_batch)

}  // namespace parallel::model
