// ReplicatedLinear: one GEMM each way, no communication (the gradient's tp reduction under
// sequence parallelism is the finalize step's, see the header).
#include "replicated_linear.hpp"

#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

Tensor as_rows(const Tensor& t) { return t.view({-1, t.size(-1)}); }

}  // namespace

ReplicatedLinear::ReplicatedLinear(const LayerEnv& env, const std::string& name, int64_t in, int64_t out) {
  weight.name = name + ".weight";
  weight.value = Tensor::zeros({out, in}, DType::F32, parameter_device());
  weight.grad = Tensor::zeros({out, in}, DType::F32, parameter_device());
  weight.global_shape = {out, in};
  weight.partition_dim = -1;
  weight.sequence_parallel_grad = env.sequence_parallel && env.tp->size() > 1;
}

Tensor ReplicatedLinear::forward(const Tensor& x_in, Context& ctx) {
  Tensor x = x_in.contiguous();
  PARALLEL_CHECK(x.size(-1) == weight.value.size(1), "ReplicatedLinear {}: input {} must end in {}",
                 weight.name, x.str(), weight.value.size(1));
  Shape y_shape = x.shape();
  y_shape.back() = weight.value.size(0);
  Tensor y = Tensor::empty(y_shape, x.dtype(), x.device());
  Tensor y2d = as_rows(y);
  ops::gemm(as_rows(x), false, weight.value, true, y2d);
  ctx.input = x;
  return y;
}

Tensor ReplicatedLinear::backward_input(const Tensor& dy_in, Context& ctx) {
  PARALLEL_CHECK(ctx.input.defined(), "ReplicatedLinear {}: backward without a saved input", weight.name);
  Tensor dy = dy_in.contiguous();
  Tensor dx = Tensor::empty(ctx.input.shape(), dy.dtype(), dy.device());
  Tensor dx2d = as_rows(dx);
  ops::gemm(as_rows(dy), false, weight.value, false, dx2d);
  ctx.grad_output = dy;
  return dx;
}

void ReplicatedLinear::backward_weight(Context& ctx) {
  PARALLEL_CHECK(ctx.grad_output.defined() && ctx.input.defined(),
                 "ReplicatedLinear {}: backward_weight before backward_input", weight.name);
  ops::gemm(as_rows(ctx.grad_output), true, as_rows(ctx.input), false, weight.grad, 1.0f, 1.0f);
  ctx = Context{};
}

Tensor ReplicatedLinear::backward(const Tensor& dy, Context& ctx) {
  Tensor dx = backward_input(dy, ctx);
  backward_weight(ctx);
  return dx;
}

}  // namespace parallel::model
