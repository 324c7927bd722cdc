// The MLP of one layer: fc1 (GeLU) or fused gate|up (SwiGLU) column-parallel, so the activation is
// local to each rank's slice of f; fc2 row-parallel sums the slices.
#include "mlp.hpp"

#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

std::vector<tp::ColumnParallelLinear::Part> fc1_parts(const LayerEnv& env, const std::string& prefix,
                                                      int64_t ffn) {
  const ModelConfig& m = *env.config;
  if (m.activation == Activation::SwiGLU)
    return {{prefix + ".gate", ffn, m.lora_targets("gate")}, {prefix + ".up", ffn, m.lora_targets("up")}};
  return {{prefix + ".fc1", ffn, m.lora_targets("fc1")}};
}

// LoRA on a linear when model.lora targets one of `modules` (docs/lora.md).
tp::LoraOptions lora_on(const ModelConfig& m, std::initializer_list<const char*> modules) {
  for (const char* module : modules)
    if (m.lora_targets(module)) return {m.lora.rank, static_cast<float>(m.lora.scale())};
  return {};
}

}  // namespace

MLP::MLP(const LayerEnv& env, int layer) : MLP(env, fmt::format("layers.{}.mlp", layer), env.ffn) {}

MLP::MLP(const LayerEnv& env, const std::string& prefix, int64_t ffn)
    : fc1(fc1_parts(env, prefix, ffn), env.hidden,
          {.bias = env.config->add_bias,
           .gather_output = false,
           .sequence_parallel = env.sequence_parallel,
           .lora = lora_on(*env.config, {"fc1", "gate", "up"})},
          *env.tp),
      fc2(prefix + ".fc2", ffn, env.hidden,
          {.bias = env.config->add_bias,
           .sequence_parallel = env.sequence_parallel,
           .lora = lora_on(*env.config, {"fc2"})},
          *env.tp),
      activation_(env.config->activation) {}

std::vector<Parameter*> MLP::parameters() {
  std::vector<Parameter*> out = fc1.parameters();
  for (Parameter* p : fc2.parameters()) out.push_back(p);
  return out;
}

Tensor MLP::forward(const Tensor& x, Context& ctx) {
  Tensor pre = fc1.forward(x, ctx.fc1_ctx);  // [s, b, f_l] or [s, b, 2 f_l]
  Shape u_shape = pre.shape();
  if (activation_ == Activation::SwiGLU) u_shape.back() /= 2;
  Tensor u = Tensor::empty(u_shape, pre.dtype(), pre.device());
  if (activation_ == Activation::SwiGLU)
    ops::swiglu_forward(pre, u);
  else
    ops::gelu_forward(pre, u);
  ctx.pre = pre;
  Tensor y = fc2.forward(u, ctx.fc2_ctx);
  return y;
}

namespace {

// fc2's dx -> fc1's dy through the activation. With fc1_bias_grad defined (gelu only) fc1's bias
// gradient is summed in the same pass (ops::gelu_backward_bias), and fc1's backward told so.
Tensor activation_backward(Activation activation, const Tensor& du, MLP::Context& ctx, Tensor fc1_bias_grad) {
  Tensor dpre = Tensor::empty(ctx.pre.shape(), ctx.pre.dtype(), ctx.pre.device());
  if (activation == Activation::SwiGLU) {
    ops::swiglu_backward(du, ctx.pre, dpre);
  } else if (fc1_bias_grad.defined()) {
    ops::gelu_backward_bias(du, ctx.pre, dpre, fc1_bias_grad);
    ctx.fc1_ctx.bias_grad_added = true;
  } else {
    ops::gelu_backward(du, ctx.pre, dpre);
  }
  ctx.pre = Tensor();
  return dpre;
}

}  // namespace

Tensor MLP::walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode) {
  Tensor du = backward_step(fc2, dy, ctx.fc2_ctx, mode);
  // Only in the fused backward: a split one adds the bias gradient in its weight step.
  Tensor dpre = activation_backward(
      activation_, du, ctx,
      mode == BackwardMode::Fused && activation_ != Activation::SwiGLU ? fc1.bias_grad_to_fuse() : Tensor());
  return backward_step(fc1, dpre, ctx.fc1_ctx, mode);
}

Tensor MLP::backward(const Tensor& dy, Context& ctx) { return walk_backward(dy, ctx, BackwardMode::Fused); }

Tensor MLP::backward_input(const Tensor& dy, Context& ctx) {
  return walk_backward(dy, ctx, BackwardMode::InputOnly);
}

void MLP::backward_weight(Context& ctx) {
  fc2.backward_weight(ctx.fc2_ctx);
  fc1.backward_weight(ctx.fc1_ctx);
}

}  // namespace parallel::model
