// ColumnParallelLinear: W split by output rows. Forward: [gather x along s] -> x Wᵀ + b -> [gather
// the output's last dim]. Backward: dW, db from the local dy; dx = dy W is a partial sum over the
// ranks' output slices, so it is all-reduced (or reduce-scattered along s under sequence
// parallelism), overlapped with the weight-gradient GEMM.
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::tp {
namespace {

// [d0, .., dk, n] -> [d0 * .. * dk, n]: the GEMMs see activations as 2-D.
Tensor as_rows(const Tensor& t) { return t.view({-1, t.size(-1)}); }

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(std::vector<Part> parts, int64_t in_features, Options options,
                                           Communicator& tp)
    : options_(options), tp_(tp), in_(in_features) {
  const int p = tp.size(), r = tp.rank();
  for (const Part& part : parts) {
    PARALLEL_CHECK(part.out_global % p == 0,
                   "ColumnParallelLinear {}: {} output features not divisible by tp = {}", part.name,
                   part.out_global, p);
    out_local_ += part.out_global / p;
  }
  // One fused buffer per tensor so a single GEMM serves every part; the parts' Parameters are row
  // views into it (rows of a row-major matrix are contiguous, so the views are too). Only the views
  // are kept: fused() rebuilds the spanning view on use, so re-bound Parameters stay in effect.
  Tensor weight = Tensor::zeros({out_local_, in_}, DType::F32, parameter_device());
  Tensor weight_grad = Tensor::zeros({out_local_, in_}, DType::F32, parameter_device());
  Tensor bias, bias_grad;
  if (options_.bias) {
    bias = Tensor::zeros({out_local_}, DType::F32, parameter_device());
    bias_grad = Tensor::zeros({out_local_}, DType::F32, parameter_device());
  }
  int64_t row = 0;
  for (const Part& part : parts) {
    const int64_t local = part.out_global / p;
    Parameter w;
    w.name = part.name + ".weight";
    w.value = weight.narrow(0, row, local);
    w.grad = weight_grad.narrow(0, row, local);
    w.global_shape = {part.out_global, in_};
    w.partition_dim = 0;
    w.partition_offset = r * local;
    weights.push_back(std::move(w));
    if (options_.bias) {
      Parameter b;
      b.name = part.name + ".bias";
      b.value = bias.narrow(0, row, local);
      b.grad = bias_grad.narrow(0, row, local);
      b.global_shape = {part.out_global};
      b.partition_dim = 0;
      b.partition_offset = r * local;
      biases.push_back(std::move(b));
    }
    row += local;
  }
}

std::vector<Parameter*> ColumnParallelLinear::parameters() {
  std::vector<Parameter*> out;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    out.push_back(&weights[i]);
    if (i < biases.size()) out.push_back(&biases[i]);
  }
  return out;
}

Tensor ColumnParallelLinear::fused(const std::vector<Parameter>& parts, Tensor Parameter::*member) const {
  return fused_rows(parts, member, "ColumnParallelLinear");
}

Tensor ColumnParallelLinear::forward(const Tensor& x, LinearContext& ctx) {
  PARALLEL_CHECK(x.size(-1) == in_, "ColumnParallelLinear: input {} must end in {}", x.str(), in_);
  Tensor x_full = options_.sequence_parallel ? gather_sequence(tp_, x) : x.contiguous();
  Shape y_shape = x_full.shape();
  y_shape.back() = out_local_;
  Tensor y = Tensor::empty(y_shape, x_full.dtype(), x.device());
  Tensor y2d = as_rows(y);
  if (options_.bias)
    ops::gemm_bias(as_rows(x_full), false, fused(weights, &Parameter::value), true,
                   fused(biases, &Parameter::value), y2d);
  else
    ops::gemm(as_rows(x_full), false, fused(weights, &Parameter::value), true, y2d);
  ctx.input = x_full;
  return options_.gather_output ? gather_last_dim(tp_, y) : y;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy_in, LinearContext& ctx) {
  Tensor x_full = ctx.input;
  PARALLEL_CHECK(x_full.defined() && x_full.numel() > 0,
                 "ColumnParallelLinear::backward without a saved input");
  Tensor dy = options_.gather_output ? split_last_dim(tp_, dy_in) : dy_in.contiguous();
  const Tensor x2d = as_rows(x_full), dy2d = as_rows(dy);

  Tensor dx_full = Tensor::empty(x_full.shape(), dy.dtype(), x_full.device());
  Tensor dx_full2d = as_rows(dx_full);
  ops::gemm(dy2d, false, fused(weights, &Parameter::value), false, dx_full2d);
  // Each rank's dx covers only its output slice: sum over the group. Start the reduction now and
  // compute the parameter gradients while it runs.
  Tensor dx = dx_full;
  WorkHandle work = completed_work();
  if (tp_.size() > 1) {
    if (options_.sequence_parallel) {
      Shape shard = x_full.shape();
      PARALLEL_CHECK(shard[0] % tp_.size() == 0, "ColumnParallelLinear: sequence {} not divisible by tp = {}",
                     shard[0], tp_.size());
      shard[0] /= tp_.size();
      dx = Tensor::empty(shard, dx_full.dtype(), x_full.device());
      work = tp_.reduce_scatter(dx_full, dx, ReduceOp::Sum, /*async=*/true);
    } else {
      work = tp_.all_reduce(dx_full, ReduceOp::Sum, /*async=*/true);
    }
  }
  Tensor weight_grad = fused(weights, &Parameter::grad);
  ops::gemm(dy2d, true, x2d, false, weight_grad, 1.0f, 1.0f);
  if (options_.bias) {
    Tensor bias_grad = fused(biases, &Parameter::grad);
    ops::bias_backward(dy2d, bias_grad);
  }
  work->wait();
  ctx.input = Tensor();
  return dx;
}

Tensor ColumnParallelLinear::backward_input(const Tensor& dy_in, LinearContext& ctx) {
  const Tensor& x_full = ctx.input;
  PARALLEL_CHECK(x_full.defined() && x_full.numel() > 0,
                 "ColumnParallelLinear::backward_input without a saved input");
  Tensor dy = options_.gather_output ? split_last_dim(tp_, dy_in) : dy_in.contiguous();
  Tensor dx_full = Tensor::empty(x_full.shape(), dy.dtype(), x_full.device());
  Tensor dx_full2d = as_rows(dx_full);
  ops::gemm(as_rows(dy), false, fused(weights, &Parameter::value), false, dx_full2d);
  ctx.grad_output = dy;
  ctx.grad_bias = dy;
  if (tp_.size() == 1) return dx_full;
  // The reduction has nothing to overlap with here: the weight GEMM is the later W step.
  if (!options_.sequence_parallel) {
    tp_.all_reduce(dx_full, ReduceOp::Sum);
    return dx_full;
  }
  Shape shard = x_full.shape();
  PARALLEL_CHECK(shard[0] % tp_.size() == 0, "ColumnParallelLinear: sequence {} not divisible by tp = {}",
                 shard[0], tp_.size());
  shard[0] /= tp_.size();
  Tensor dx = Tensor::empty(shard, dx_full.dtype(), x_full.device());
  tp_.reduce_scatter(dx_full, dx, ReduceOp::Sum);
  return dx;
}

void ColumnParallelLinear::backward_weight(LinearContext& ctx) {
  PARALLEL_CHECK(ctx.grad_output.defined() && ctx.input.defined(),
                 "ColumnParallelLinear::backward_weight before backward_input");
  const Tensor dy2d = as_rows(ctx.grad_output);
  Tensor weight_grad = fused(weights, &Parameter::grad);
  ops::gemm(dy2d, true, as_rows(ctx.input), false, weight_grad, 1.0f, 1.0f);
  if (options_.bias) {
    Tensor bias_grad = fused(biases, &Parameter::grad);
    ops::bias_backward(as_rows(ctx.grad_bias), bias_grad);
  }
  ctx = LinearContext{};
}

}  // namespace parallel::tp
