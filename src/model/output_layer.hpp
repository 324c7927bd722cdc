#pragma once
// The output layer (output_layer.cpp).
#include "layer_env.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// Output projection to vocab-parallel logits: a column-parallel linear without bias whose weight
// may be borrowed (tied embeddings use the word embedding's Parameter).
class OutputLayer {
 public:
  OutputLayer(const LayerEnv& env, Parameter* weight);
  Tensor forward(const Tensor& x, tp::LinearContext& ctx);  // [s(/tp), b, h] -> [s, b, Vp/tp]
  Tensor backward(const Tensor& dlogits, tp::LinearContext& ctx);
  Tensor backward_input(const Tensor& dlogits, tp::LinearContext& ctx);  // keeps dlogits for W
  void backward_weight(tp::LinearContext& ctx);

 private:
  const LayerEnv& env_;  // the chunk's, so set_training() reaches every layer
  Parameter* weight_;
};

}  // namespace parallel::model
