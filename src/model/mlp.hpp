#pragma once
// The dense MLP layer (mlp.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "layer.hpp"
#include "layer_env.hpp"
#include "parallel/config.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// MLP: column-parallel fc1 (or fused gate|up for SwiGLU), activation, row-parallel fc2.
class MLP {
 public:
  MLP(const LayerEnv& env, int layer);                               // "layers.<layer>.mlp", env.ffn wide
  MLP(const LayerEnv& env, const std::string& prefix, int64_t ffn);  // e.g. a MoE layer's shared expert
  struct Context {
    tp::LinearContext fc1_ctx, fc2_ctx;
    Tensor pre;  // fc1 output, the activation's input
  };
  Tensor forward(const Tensor& x, Context& ctx);
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);  // keeps only the linears' contexts
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();

  tp::ColumnParallelLinear fc1;
  tp::RowParallelLinear fc2;

 private:
  Tensor walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode);
  Activation activation_;
};
static_assert(Layer<MLP>);

}  // namespace parallel::model
