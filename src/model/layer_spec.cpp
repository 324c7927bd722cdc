// Every per-layer choice of the model, from the config's rules (config.hpp). A rule that makes
// layers differ (dense first k layers, another attention on some layers) is a line here.
#include "layer_spec.hpp"

namespace parallel::model {

LayerSpec layer_spec(const ModelConfig& config, int layer) {
  LayerSpec spec;
  spec.layer = layer;
  spec.attention = config.is_mla() ? AttentionKind::Latent : AttentionKind::Self;
  spec.window = config.layer_window(layer);
  spec.qk_norm = config.qk_norm;
  spec.ffn = config.is_moe_layer(layer) ? FFNKind::MoE : FFNKind::Dense;
  spec.norm = config.normalization;
  return spec;
}

}  // namespace parallel::model
