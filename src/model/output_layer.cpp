// The output projection: logits = x Woutᵀ with Wout [Vp, h] split by vocabulary rows, a
// column-parallel linear without bias. It is its own class (not ColumnParallelLinear) because with
// tied embeddings the weight belongs to the word embedding: this layer only borrows the Parameter
// and accumulates into its gradient.
#include "output_layer.hpp"

#include "parallel/ops.hpp"

namespace parallel::model {

OutputLayer::OutputLayer(const LayerEnv& env, Parameter* weight) : env_(env), weight_(weight) {}

Tensor OutputLayer::forward(const Tensor& x, tp::LinearContext& ctx) {
  Communicator& tp = *env_.tp;
  Tensor x_full = env_.sequence_parallel ? tp::gather_sequence(tp, x) : x.contiguous();
  const int64_t s = x_full.size(0), b = x_full.size(1), h = x_full.size(2);
  const int64_t v_local = weight_->value.size(0);
  Tensor logits = Tensor::empty({s, b, v_local}, x_full.dtype(), x.device());
  Tensor logits2d = logits.view({s * b, v_local});
  ops::gemm(x_full.view({s * b, h}), false, weight_->value, true, logits2d);
  ctx.input = x_full;
  return logits;
}

Tensor OutputLayer::backward(const Tensor& dlogits_in, tp::LinearContext& ctx) {
  Communicator& tp = *env_.tp;
  Tensor x_full = ctx.input;
  Tensor dlogits = dlogits_in.contiguous();
  const int64_t s = x_full.size(0), b = x_full.size(1), h = x_full.size(2);
  const Tensor dl2d = dlogits.view({s * b, dlogits.size(-1)}), x2d = x_full.view({s * b, h});
  Tensor dx_full = Tensor::empty(x_full.shape(), dlogits.dtype(), x_full.device());
  Tensor dx_full2d = dx_full.view({s * b, h});
  ops::gemm(dl2d, false, weight_->value, false, dx_full2d);
  // dx is partial over the vocabulary slices: reduce it while the weight gradient is computed.
  Tensor dx = dx_full;
  WorkHandle work = completed_work();
  if (tp.size() > 1) {
    if (env_.sequence_parallel) {
      dx = Tensor::empty({s / tp.size(), b, h}, dx_full.dtype(), x_full.device());
      work = tp.reduce_scatter(dx_full, dx, ReduceOp::Sum, /*async=*/true);
    } else {
      work = tp.all_reduce(dx_full, ReduceOp::Sum, /*async=*/true);
    }
  }
  if (!weight_->frozen) ops::gemm(dl2d, true, x2d, false, weight_->grad, 1.0f, 1.0f);
  work->wait();
  ctx.input = Tensor();
  return dx;
}

Tensor OutputLayer::backward_input(const Tensor& dlogits_in, tp::LinearContext& ctx) {
  Communicator& tp = *env_.tp;
  const Tensor& x_full = ctx.input;
  Tensor dlogits = dlogits_in.contiguous();
  const int64_t s = x_full.size(0), b = x_full.size(1), h = x_full.size(2);
  Tensor dx_full = Tensor::empty(x_full.shape(), dlogits.dtype(), x_full.device());
  Tensor dx_full2d = dx_full.view({s * b, h});
  ops::gemm(dlogits.view({s * b, dlogits.size(-1)}), false, weight_->value, false, dx_full2d);
  // W's input: the logits' gradient [s, b, v_local], the largest tensor a split backward keeps.
  ctx.grad_output = dlogits;
  if (tp.size() == 1) return dx_full;
  if (!env_.sequence_parallel) {
    tp.all_reduce(dx_full, ReduceOp::Sum);
    return dx_full;
  }
  Tensor dx = Tensor::empty({s / tp.size(), b, h}, dx_full.dtype(), x_full.device());
  tp.reduce_scatter(dx_full, dx, ReduceOp::Sum);
  return dx;
}

void OutputLayer::backward_weight(tp::LinearContext& ctx) {
  PARALLEL_CHECK(ctx.grad_output.defined() && ctx.input.defined(),
                 "OutputLayer::backward_weight before backward_input");
  const Tensor& x_full = ctx.input;
  const int64_t s = x_full.size(0), b = x_full.size(1), h = x_full.size(2);
  const Tensor dl2d = ctx.grad_output.view({s * b, ctx.grad_output.size(-1)});
  if (!weight_->frozen) ops::gemm(dl2d, true, x_full.view({s * b, h}), false, weight_->grad, 1.0f, 1.0f);
  ctx = tp::LinearContext{};
}

}  // namespace parallel::model
