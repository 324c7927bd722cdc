#pragma once
// The feed-forward part of a transformer layer, of the kind its LayerSpec names: a dense MLP or a
// mixture of experts. The part holds exactly one of them and each call visits it once; Context
// holds the chosen kind's context (set by the forward).
#include <variant>
#include <vector>

#include "layer.hpp"
#include "layer_env.hpp"
#include "layer_spec.hpp"
#include "mlp.hpp"
#include "moe_layer.hpp"

namespace parallel::model {

class FeedForward {
 public:
  FeedForward(const LayerEnv& env, const LayerSpec& spec);
  using Context = std::variant<MLP::Context, MoELayer::Context>;
  // record_stats: count this forward in the MoE statistics (false when full recompute reruns it);
  // a dense part ignores it.
  Tensor forward(const Tensor& x, Context& ctx, bool record_stats);
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();
  MoELayer* moe() { return std::get_if<MoELayer>(&layer_); }  // null for a dense part

 private:
  std::variant<MLP, MoELayer> layer_;
};
static_assert(Layer<FeedForward, bool>);  // forward(x, ctx, record_stats)

}  // namespace parallel::model
