// The feed-forward part: the layer the spec chose, visited once per call.
#include "feed_forward.hpp"

#include <type_traits>

#include "parallel/error.hpp"

namespace parallel::model {
namespace {

using Part = std::variant<MLP, MoELayer>;

Part make_part(const LayerEnv& env, const LayerSpec& spec) {
  switch (spec.ffn) {
    case FFNKind::MoE:
      return Part(std::in_place_type<MoELayer>, env, spec.layer);
    case FFNKind::Dense:
      break;
  }
  return Part(std::in_place_type<MLP>, env, spec.layer);
}

// The context of `layer`'s kind, which its forward put in ctx.
template <typename L>
typename L::Context& context_of(const L&, FeedForward::Context& ctx) {
  auto* own = std::get_if<typename L::Context>(&ctx);
  PARALLEL_CHECK(own != nullptr, "FeedForward: backward with a context its forward did not make");
  return *own;
}

}  // namespace

FeedForward::FeedForward(const LayerEnv& env, const LayerSpec& spec) : layer_(make_part(env, spec)) {}

Tensor FeedForward::forward(const Tensor& x, Context& ctx, bool record_stats) {
  return std::visit(
      [&](auto& layer) {
        using L = std::decay_t<decltype(layer)>;
        // A context of the right kind is kept: the caller may have prepared it (the LoRA dropout
        // keys of the MLP's linears, TransformerLayer::forward_impl).
        auto* kept = std::get_if<typename L::Context>(&ctx);
        auto& own = kept != nullptr ? *kept : ctx.emplace<typename L::Context>();
        if constexpr (std::is_same_v<L, MoELayer>)
          return layer.forward(x, own, record_stats);
        else
          return layer.forward(x, own);
      },
      layer_);
}

Tensor FeedForward::backward(const Tensor& dy, Context& ctx) {
  return std::visit([&](auto& layer) { return layer.backward(dy, context_of(layer, ctx)); }, layer_);
}

Tensor FeedForward::backward_input(const Tensor& dy, Context& ctx) {
  return std::visit([&](auto& layer) { return layer.backward_input(dy, context_of(layer, ctx)); }, layer_);
}

void FeedForward::backward_weight(Context& ctx) {
  std::visit([&](auto& layer) { layer.backward_weight(context_of(layer, ctx)); }, layer_);
}

std::vector<Parameter*> FeedForward::parameters() {
  return std::visit([](auto& layer) { return layer.parameters(); }, layer_);
}

}  // namespace parallel::model
