// The attention part: the layer the spec chose, visited once per call.
#include "attention_part.hpp"

#include <type_traits>

#include "parallel/error.hpp"

namespace parallel::model {
namespace {

using Part = std::variant<SelfAttention, LatentAttention>;

Part make_part(const LayerEnv& env, const LayerSpec& spec) {
  switch (spec.attention) {
    case AttentionKind::Latent:
      return Part(std::in_place_type<LatentAttention>, env, spec);
    case AttentionKind::Self:
      break;
  }
  return Part(std::in_place_type<SelfAttention>, env, spec);
}

// The context of `layer`'s kind, which its forward put in ctx.
template <typename L>
typename L::Context& context_of(const L&, AttentionPart::Context& ctx) {
  auto* own = std::get_if<typename L::Context>(&ctx.kind);
  PARALLEL_CHECK(own != nullptr, "AttentionPart: backward with a context its forward did not make");
  return *own;
}

}  // namespace

AttentionPart::AttentionPart(const LayerEnv& env, const LayerSpec& spec) : layer_(make_part(env, spec)) {}

Tensor AttentionPart::forward(const Tensor& x, Context& ctx, bool keep_core) {
  return std::visit(
      [&](auto& layer) {
        using L = std::decay_t<decltype(layer)>;
        auto& own = ctx.kind.emplace<typename L::Context>();
        own.positions = ctx.positions;
        own.doc_start = ctx.doc_start;
        own.layout = ctx.layout;
        if constexpr (std::is_same_v<L, SelfAttention>) {
          own.qkv_ctx.lora_dropout = ctx.qkv_lora_dropout;
          own.proj_ctx.lora_dropout = ctx.proj_lora_dropout;
        }
        return layer.forward(x, own, keep_core);
      },
      layer_);
}

Tensor AttentionPart::backward(const Tensor& dy, Context& ctx) {
  return std::visit([&](auto& layer) { return layer.backward(dy, context_of(layer, ctx)); }, layer_);
}

Tensor AttentionPart::backward_input(const Tensor& dy, Context& ctx) {
  return std::visit([&](auto& layer) { return layer.backward_input(dy, context_of(layer, ctx)); }, layer_);
}

void AttentionPart::backward_weight(Context& ctx) {
  std::visit([&](auto& layer) { layer.backward_weight(context_of(layer, ctx)); }, layer_);
}

std::vector<Parameter*> AttentionPart::parameters() {
  return std::visit([](auto& layer) { return layer.parameters(); }, layer_);
}

}  // namespace parallel::model
