// The MLP of one layer: fc1 (GeLU) or fused gate|up (SwiGLU) column-parallel, so the activation is
// local to each rank's slice of f; fc2 row-parallel sums the slices.
#include "layers.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

std::vector<tp::ColumnParallelLinear::Part> fc1_parts(const LayerEnv& env, int layer) {
  if (env.config->activation == Activation::SwiGLU)
    return {{fmt::format("layers.{}.mlp.gate", layer), env.ffn},
            {fmt::format("layers.{}.mlp.up", layer), env.ffn}};
  return {{fmt::format("layers.{}.mlp.fc1", layer), env.ffn}};
}

}  // namespace

MLP::MLP(const LayerEnv& env, int layer)
    : fc1(fc1_parts(env, layer), env.hidden,
          {.bias = env.config->add_bias,
           .gather_output = false,
           .sequence_parallel = env.sequence_parallel,
           .operand_precision = env.activation_dtype},
          *env.tp),
      fc2(fmt::format("layers.{}.mlp.fc2", layer), env.ffn, env.hidden,
          {.bias = env.config->add_bias,
           .sequence_parallel = env.sequence_parallel,
           .operand_precision = env.activation_dtype},
          *env.tp),
      env_(env),
      activation_(env.config->activation) {}

std::vector<Parameter*> MLP::parameters() {
  std::vector<Parameter*> out = fc1.parameters();
  for (Parameter* p : fc2.parameters()) out.push_back(p);
  return out;
}

Tensor MLP::forward(const Tensor& x, Context& ctx) {
  Tensor pre = fc1.forward(x, ctx.fc1_ctx);  // [s, b, f_l] or [s, b, 2 f_l]
  to_activation_precision(env_, pre);        // the GEMM (+ bias) output is bf16 on the GPU
  Shape u_shape = pre.shape();
  if (activation_ == Activation::SwiGLU) u_shape.back() /= 2;
  Tensor u = Tensor::empty(u_shape, DType::F32, pre.device());
  if (activation_ == Activation::SwiGLU)
    ops::swiglu_forward(pre, u);
  else
    ops::gelu_forward(pre, u);
  to_activation_precision(env_, u);  // computed in fp32 from the bf16 input, emitted in bf16
  ctx.pre = pre;
  Tensor y = fc2.forward(u, ctx.fc2_ctx);
  to_activation_precision(env_, y);  // after the bias and the tp reduction
  return y;
}

Tensor MLP::backward(const Tensor& dy, Context& ctx) {
  Tensor du = fc2.backward(dy, ctx.fc2_ctx);
  to_activation_precision(env_, du);
  Tensor dpre = Tensor::empty(ctx.pre.shape(), DType::F32, ctx.pre.device());
  if (activation_ == Activation::SwiGLU)
    ops::swiglu_backward(du, ctx.pre, dpre);
  else
    ops::gelu_backward(du, ctx.pre, dpre);
  to_activation_precision(env_, dpre);
  ctx.pre = Tensor();
  Tensor dx = fc1.backward(dpre, ctx.fc1_ctx);
  to_activation_precision(env_, dx);  // after the tp reduction of the input gradient
  return dx;
}

}  // namespace parallel::model
