#pragma once
// The layer protocol of the model wing: what every layer in src/model is, so a composite layer
// (TransformerLayer, the chunk in gpt_model.cpp) can walk its parts the same way whatever they are.
//
// A layer L has
//   - L::Context: what one micro-batch's forward keeps for its backward. Several micro-batches are
//     in flight under pipeline parallelism, so the layer itself holds no per-micro-batch state.
//   - forward(x, ctx, args...) -> y. The extra arguments are the layer's own (a recompute choice,
//     the micro-batch id); the concept below names them per layer.
//   - backward(dy, ctx) -> dx (fused): accumulates the parameter gradients and frees ctx.
//   - backward_input(dy, ctx) -> dx (B): leaves the parameter gradients alone and keeps in ctx what
//     W needs.
//   - backward_weight(ctx) (W): accumulates the parameter gradients and frees ctx.
//     B then W accumulates bit for bit what backward() does (test_split_backward). The norms are
//     the exception: their weight gradients come out of B's kernel pass (see Norm).
//   - parameters(): the Parameters it reads, in a fixed order.
//
// A composite layer writes its backward once, as a walk over its parts in a BackwardMode: Fused is
// backward() (each part's B and W), InputOnly is backward_input() (each part's B); the W steps then
// run in backward_weight(), which walks the same parts in the same order.
#include <concepts>
#include <vector>

#include "parallel/parameter.hpp"
#include "parallel/tensor.hpp"

namespace parallel::model {

template <typename L, typename... ForwardArgs>
concept Layer = std::default_initializable<typename L::Context> &&
    requires(L& layer, const Tensor& x, typename L::Context& ctx, ForwardArgs... args) {
  { layer.forward(x, ctx, args...) } -> std::same_as<Tensor>;
  { layer.backward(x, ctx) } -> std::same_as<Tensor>;
  { layer.backward_input(x, ctx) } -> std::same_as<Tensor>;
  { layer.backward_weight(ctx) } -> std::same_as<void>;
  { layer.parameters() } -> std::same_as<std::vector<Parameter*>>;
};

enum class BackwardMode {
  Fused,      // backward(): every part's B and W
  InputOnly,  // backward_input(): every part's B; their W steps wait for backward_weight()
};

// One part's step of a composite's backward walk (a layer, or a tp linear with its LinearContext).
template <typename Part, typename PartContext>
Tensor backward_step(Part& part, const Tensor& dy, PartContext& ctx, BackwardMode mode) {
  return mode == BackwardMode::Fused ? part.backward(dy, ctx) : part.backward_input(dy, ctx);
}

}  // namespace parallel::model
