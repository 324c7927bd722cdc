#pragma once
// The output layer (output_layer.cpp).
#include "layer.hpp"
#include "layer_env.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// Output projection to vocab-parallel logits: a column-parallel linear without bias whose weight
// may be borrowed (tied embeddings use the word embedding's Parameter).
class OutputLayer {
 public:
  OutputLayer(const LayerEnv& env, Parameter* weight);
  using Context = tp::LinearContext;
  Tensor forward(const Tensor& x, tp::LinearContext& ctx);  // [s(/tp), b, h] -> [s, b, Vp/tp]
  Tensor backward(const Tensor& dlogits, tp::LinearContext& ctx);
  Tensor backward_input(const Tensor& dlogits, tp::LinearContext& ctx);  // keeps dlogits for W
  void backward_weight(tp::LinearContext& ctx);
  std::vector<Parameter*> parameters() { return {weight_}; }  // possibly borrowed (tied)

 private:
  const LayerEnv& env_;  // the chunk's, so set_training() reaches every layer
  Parameter* weight_;
};
static_assert(Layer<OutputLayer>);

}  // namespace parallel::model
