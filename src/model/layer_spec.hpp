#pragma once
// The make-up of one transformer layer, decided in one place (layer_spec()) from the model config
// and the layer's global index: which attention, which feed-forward part, which norm, and the
// per-layer options. TransformerLayer builds the parts the spec names; nothing else in the layer
// reads the per-layer rules of ModelConfig. A new kind of part is a new enumerator here, a layer
// file, and one case where the composite builds its parts (docs/model.md, "A new layer or model
// family").
#include <cstdint>

#include "parallel/config.hpp"

namespace parallel::model {

enum class AttentionKind {
  Self,    // multi-head / grouped-query self-attention with rope or learned positions (SelfAttention)
  Latent,  // multi-head latent attention, DeepSeek-V2/V3's MLA (LatentAttention; model.attention: mla)
};

enum class FFNKind {
  Dense,  // MLP, env.ffn wide
  MoE,    // MoELayer (ModelConfig::is_moe_layer)
};

struct LayerSpec {
  int layer = 0;  // global index: parameter names ("layers.<layer>. ..."), init and dropout keys
  AttentionKind attention = AttentionKind::Self;
  int64_t window = 0;    // sliding-window attention (ModelConfig::layer_window); 0: full causal
  bool qk_norm = false;  // RMSNorm over each query and key head before rope (model.qk_norm, Qwen3)
  FFNKind ffn = FFNKind::Dense;
  Normalization norm = Normalization::LayerNorm;  // input and post-attention norms
};

LayerSpec layer_spec(const ModelConfig& config, int layer);

}  // namespace parallel::model
