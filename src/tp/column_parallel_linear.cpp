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
  Tensor weight_grad = parameter_grad({out_local_, in_});
  Tensor bias, bias_grad;
  if (options_.bias) {
    bias = Tensor::zeros({out_local_}, DType::F32, parameter_device());
    bias_grad = parameter_grad({out_local_});
  }
  int64_t row = 0;
  for (const Part& part : parts) {
    const int64_t local = part.out_global / p;
    Parameter w;
    w.name = part.name + ".weight";
    w.value = weight.narrow(0, row, local);
    if (weight_grad.defined()) w.grad = weight_grad.narrow(0, row, local);
    w.global_shape = {part.out_global, in_};
    w.partition_dim = 0;
    w.partition_offset = r * local;
    weights.push_back(std::move(w));
    if (options_.bias) {
      Parameter b;
      b.name = part.name + ".bias";
      b.value = bias.narrow(0, row, local);
      if (bias_grad.defined()) b.grad = bias_grad.narrow(0, row, local);
      b.global_shape = {part.out_global};
      b.partition_dim = 0;
      b.partition_offset = r * local;
      biases.push_back(std::move(b));
    }
    row += local;
  }
  if (options_.lora.rank > 0) {
    // The A's of the adapted parts back to back in one storage: one GEMM gives every x Aᵀ.
    const int64_t rank = options_.lora.rank;
    int64_t pairs = 0;
    for (const Part& part : parts) pairs += part.lora ? 1 : 0;
    PARALLEL_CHECK(pairs > 0, "ColumnParallelLinear {}: Options::lora without a part marked lora",
                   parts.front().name);
    Tensor a_value = Tensor::zeros({pairs * rank, in_}, DType::F32, parameter_device());
    Tensor a_grad = Tensor::zeros({pairs * rank, in_}, DType::F32, parameter_device());
    int64_t part_row = 0, j = 0;
    for (const Part& part : parts) {
      const int64_t local = part.out_global / p;
      if (part.lora) {
        Parameter a;
        a.name = part.name + ".lora_A.weight";
        a.value = a_value.narrow(0, j * rank, rank);
        a.grad = a_grad.narrow(0, j * rank, rank);
        a.global_shape = {rank, in_};
        // Each rank's dA comes from its own output rows only: a partial sum over tp.
        a.sequence_parallel_grad = p > 1;
        lora_a.push_back(std::move(a));
        lora_b.push_back(lora::make_b(part.name, local, part.out_global, r * local, rank));
        lora_rows.push_back(part_row);
        ++j;
      }
      part_row += local;
    }
  }
}

std::vector<Parameter*> ColumnParallelLinear::parameters() {
  std::vector<Parameter*> out;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    out.push_back(&weights[i]);
    if (i < biases.size()) out.push_back(&biases[i]);
  }
  for (std::size_t i = 0; i < lora_a.size(); ++i) {
    out.push_back(&lora_a[i]);
    out.push_back(&lora_b[i]);
  }
  return out;
}

Tensor ColumnParallelLinear::lora_blocks() const {
  const int64_t rank = options_.lora.rank, pairs = static_cast<int64_t>(lora_b.size());
  const Tensor& first = lora_b.front().value;
  Tensor blocks = Tensor::zeros({out_local_, pairs * rank}, first.dtype(), first.device());
  for (int64_t j = 0; j < pairs; ++j) {
    const Tensor& b = lora_b[static_cast<std::size_t>(j)].value;
    Tensor slot =
        blocks.narrow(0, lora_rows[static_cast<std::size_t>(j)], b.size(0)).narrow(1, j * rank, rank);
    slot.copy_(b);
  }
  return blocks;
}

void ColumnParallelLinear::lora_forward(const Tensor& x_full, Tensor& y2d, LinearContext& ctx) {
  const int64_t rank = options_.lora.rank, pairs = static_cast<int64_t>(lora_a.size());
  const Tensor xd = lora::dropout_forward(x_full, ctx.lora_dropout, 0, in_);
  const Tensor x2d = as_rows(xd);
  Tensor h = Tensor::empty({x2d.size(0), pairs * rank}, xd.dtype(), xd.device());
  ops::gemm(x2d, false, fused(lora_a, &Parameter::value), true, h);
  ops::gemm(h, false, lora_blocks(), true, y2d, options_.lora.scale, 1.0f);
  ctx.lora_x = xd;
  ctx.lora_h = h;
}

void ColumnParallelLinear::lora_backward_input(const Tensor& dy2d, Tensor& dx_full, LinearContext& ctx) {
  const int64_t rank = options_.lora.rank, pairs = static_cast<int64_t>(lora_a.size());
  // dh = scale dy B (this rank's output rows only: partial over tp, as dx is).
  Tensor dh = Tensor::empty({dy2d.size(0), pairs * rank}, dy2d.dtype(), dy2d.device());
  ops::gemm(dy2d, false, lora_blocks(), false, dh, options_.lora.scale, 0.0f);
  Tensor dxd = Tensor::empty(dx_full.shape(), dx_full.dtype(), dx_full.device());
  Tensor dxd2d = as_rows(dxd);
  ops::gemm(dh, false, fused(lora_a, &Parameter::value), false, dxd2d);
  Tensor dx2d = as_rows(dx_full);
  ops::add_(dx2d, as_rows(lora::dropout_backward(dxd, ctx.lora_dropout, 0, in_)));
  ctx.lora_dh = dh;
}

void ColumnParallelLinear::lora_backward_weight(const Tensor& dy2d, LinearContext& ctx) {
  const int64_t rank = options_.lora.rank;
  // dA += dhᵀ xd (partial over tp: finalize_grads sums it); dB_j += scale dy_jᵀ h_j.
  Tensor a_grad = fused(lora_a, &Parameter::grad);
  ops::gemm(ctx.lora_dh, true, as_rows(ctx.lora_x), false, a_grad, 1.0f, 1.0f);
  Tensor db = Tensor::empty({out_local_, ctx.lora_h.size(1)}, DType::F32, dy2d.device());
  ops::gemm(dy2d, true, ctx.lora_h, false, db, options_.lora.scale, 0.0f);
  for (std::size_t j = 0; j < lora_b.size(); ++j) {
    Parameter& b = lora_b[j];
    const Tensor block = db.narrow(0, lora_rows[j], b.grad.size(0))
                             .narrow(1, static_cast<int64_t>(j) * rank, rank)
                             .contiguous();
    ops::add_(b.grad, block);
  }
  ctx.lora_x = ctx.lora_h = ctx.lora_dh = Tensor();
}

Tensor ColumnParallelLinear::fused(const std::vector<Parameter>& parts, Tensor Parameter::*member) const {
  return fused_rows(parts, member, "ColumnParallelLinear");
}

Tensor ColumnParallelLinear::bias_grad_to_fuse() const {
  if (!options_.bias || base_frozen() || options_.gather_output) return Tensor();
  return fused(biases, &Parameter::grad);
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
  if (!lora_a.empty()) lora_forward(x_full, y2d, ctx);
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
  if (!lora_a.empty()) lora_backward_input(dy2d, dx_full, ctx);
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
  if (!base_frozen()) {
    Tensor weight_grad = fused(weights, &Parameter::grad);
    ops::gemm(dy2d, true, x2d, false, weight_grad, 1.0f, 1.0f);
    if (options_.bias && !ctx.bias_grad_added) {
      Tensor bias_grad = fused(biases, &Parameter::grad);
      ops::bias_backward(dy2d, bias_grad);
    }
  }
  if (!lora_a.empty()) lora_backward_weight(dy2d, ctx);
  work->wait();
  ctx.input = Tensor();
  ctx.bias_grad_added = false;
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
  if (!lora_a.empty()) lora_backward_input(as_rows(dy), dx_full, ctx);
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
  if (!base_frozen()) {
    Tensor weight_grad = fused(weights, &Parameter::grad);
    ops::gemm(dy2d, true, as_rows(ctx.input), false, weight_grad, 1.0f, 1.0f);
    if (options_.bias) {
      Tensor bias_grad = fused(biases, &Parameter::grad);
      ops::bias_backward(as_rows(ctx.grad_bias), bias_grad);
    }
  }
  if (!lora_a.empty()) lora_backward_weight(dy2d, ctx);
  ctx = LinearContext{};
}

}  // namespace parallel::tp
