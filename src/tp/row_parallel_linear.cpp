// RowParallelLinear: W split by input columns. Each rank's x Wᵀ is a partial sum of the output, so
// the forward reduces it (all-reduce, or reduce-scatter along s under sequence parallelism) and
// adds the replicated bias once afterwards. The backward needs the full dy on every rank.
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::tp {
namespace {

Tensor as_rows(const Tensor& t) { return t.view({-1, t.size(-1)}); }

}  // namespace

RowParallelLinear::RowParallelLinear(std::string name, int64_t in_global, int64_t out_features,
                                     Options options, Communicator& tp)
    : options_(options), tp_(tp) {
  const int p = tp.size();
  PARALLEL_CHECK(in_global % p == 0, "RowParallelLinear {}: {} input features not divisible by tp = {}", name,
                 in_global, p);
  const int64_t in_local = in_global / p;
  weight.name = name + ".weight";
  weight.value = Tensor::zeros({out_features, in_local}, DType::F32, parameter_device());
  weight.grad = parameter_grad({out_features, in_local});
  weight.global_shape = {out_features, in_global};
  weight.partition_dim = 1;
  weight.partition_offset = tp.rank() * in_local;
  if (options_.bias) {
    bias.name = name + ".bias";
    bias.value = Tensor::zeros({out_features}, DType::F32, parameter_device());
    bias.grad = parameter_grad({out_features});
    bias.global_shape = {out_features};
    bias.partition_dim = -1;
    // Under sequence parallelism each rank's dy is only its s-shard: its bias gradient is partial.
    bias.sequence_parallel_grad = options_.sequence_parallel && p > 1;
  }
  if (has_lora()) {
    const int64_t rank = options_.lora.rank;
    lora_a = lora::make_a(name, rank, in_local, in_global, tp.rank() * in_local);
    lora_b = lora::make_b(name, out_features, out_features, 0, rank);
    // Each rank's dB comes from its own input columns only: a partial sum over tp.
    lora_b.sequence_parallel_grad = p > 1;
  }
}

std::vector<Parameter*> RowParallelLinear::parameters() {
  std::vector<Parameter*> out{&weight};
  if (options_.bias) out.push_back(&bias);
  if (has_lora()) {
    out.push_back(&lora_a);
    out.push_back(&lora_b);
  }
  return out;
}

// dh = scale dy B is the same on every rank (dy is whole, B replicated); dx's slice gets
// dropout'(dh A), and dA (this rank's columns) is exact. dB = scale dyᵀ h sums the ranks' partial
// h: finalize_grads adds it up over tp.
void RowParallelLinear::lora_backward_input(const Tensor& dy_full2d, Tensor& dx, LinearContext& ctx) {
  const int64_t in_global = weight.global_shape[1];
  Tensor dh = Tensor::empty({dy_full2d.size(0), options_.lora.rank}, dy_full2d.dtype(), dy_full2d.device());
  ops::gemm(dy_full2d, false, lora_b.value, false, dh, options_.lora.scale, 0.0f);
  Tensor dxd = Tensor::empty(dx.shape(), dx.dtype(), dx.device());
  Tensor dxd2d = as_rows(dxd);
  ops::gemm(dh, false, lora_a.value, false, dxd2d);
  Tensor dx2d = as_rows(dx);
  ops::add_(dx2d, as_rows(lora::dropout_backward(dxd, ctx.lora_dropout, weight.partition_offset, in_global)));
  ctx.lora_dh = dh;
}

void RowParallelLinear::lora_backward_weight(const Tensor& dy_full2d, LinearContext& ctx) {
  ops::gemm(ctx.lora_dh, true, as_rows(ctx.lora_x), false, lora_a.grad, 1.0f, 1.0f);
  ops::gemm(dy_full2d, true, ctx.lora_h, false, lora_b.grad, options_.lora.scale, 1.0f);
  ctx.lora_x = ctx.lora_h = ctx.lora_dh = Tensor();
}

Tensor RowParallelLinear::forward(const Tensor& x_in, LinearContext& ctx) {
  Tensor x = x_in.contiguous();
  const int64_t out = weight.value.size(0);
  PARALLEL_CHECK(x.size(-1) == weight.value.size(1), "RowParallelLinear {}: input {} must end in {}",
                 weight.name, x.str(), weight.value.size(1));
  Shape y_shape = x.shape();
  y_shape.back() = out;
  Tensor partial = Tensor::empty(y_shape, x.dtype(), x.device());
  Tensor partial2d = as_rows(partial);
  // The bias is added once, after the reduction; on one rank there is none, so the GEMM adds it.
  const bool fuse_bias = options_.bias && tp_.size() == 1;
  if (fuse_bias)
    ops::gemm_bias(as_rows(x), false, weight.value, true, bias.value, partial2d);
  else
    ops::gemm(as_rows(x), false, weight.value, true, partial2d);
  if (has_lora()) {
    // partial += scale (xd Aᵀ) Bᵀ before the reduction: with B replicated, the sum over the ranks'
    // column slices is the whole adapter's output, with no communication of its own.
    const Tensor xd =
        lora::dropout_forward(x, ctx.lora_dropout, weight.partition_offset, weight.global_shape[1]);
    Tensor h = Tensor::empty({partial2d.size(0), options_.lora.rank}, x.dtype(), x.device());
    ops::gemm(as_rows(xd), false, lora_a.value, true, h);
    ops::gemm(h, false, lora_b.value, true, partial2d, options_.lora.scale, 1.0f);
    ctx.lora_x = xd;
    ctx.lora_h = h;
  }
  Tensor y = partial;
  if (tp_.size() > 1) {
    if (options_.sequence_parallel) {
      y = reduce_scatter_sequence(tp_, partial);
    } else {
      tp_.all_reduce(partial, ReduceOp::Sum);
    }
  }
  if (options_.bias && !fuse_bias) {
    Tensor y2d = as_rows(y);
    ops::add_bias(y2d, bias.value);
  }
  ctx.input = x;
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy_in, LinearContext& ctx) {
  Tensor x = ctx.input;
  PARALLEL_CHECK(x.defined() && x.numel() > 0, "RowParallelLinear::backward without a saved input");
  Tensor dy = dy_in.contiguous();
  // Start the gather of the s-shards, and reduce the bias gradient (local shard only) meanwhile.
  Tensor dy_full = dy;
  WorkHandle work = completed_work();
  if (options_.sequence_parallel && tp_.size() > 1) {
    Shape full = dy.shape();
    full[0] *= tp_.size();
    dy_full = Tensor::empty(full, dy.dtype(), dy.device());
    work = tp_.all_gather(dy, dy_full, /*async=*/true);
  }
  if (options_.bias && !weight.frozen) ops::bias_backward(as_rows(dy), bias.grad);
  work->wait();
  const Tensor dy2d = as_rows(dy_full), x2d = as_rows(x);
  if (!weight.frozen) ops::gemm(dy2d, true, x2d, false, weight.grad, 1.0f, 1.0f);
  Tensor dx = Tensor::empty(x.shape(), dy.dtype(), x.device());
  Tensor dx2d = as_rows(dx);
  ops::gemm(dy2d, false, weight.value, false, dx2d);
  if (has_lora()) {
    lora_backward_input(dy2d, dx, ctx);
    lora_backward_weight(dy2d, ctx);
  }
  ctx.input = Tensor();
  return dx;
}

Tensor RowParallelLinear::backward_input(const Tensor& dy_in, LinearContext& ctx) {
  const Tensor& x = ctx.input;
  PARALLEL_CHECK(x.defined() && x.numel() > 0, "RowParallelLinear::backward_input without a saved input");
  Tensor dy = dy_in.contiguous();
  Tensor dy_full = dy;
  if (options_.sequence_parallel && tp_.size() > 1) {
    Shape full = dy.shape();
    full[0] *= tp_.size();
    dy_full = Tensor::empty(full, dy.dtype(), dy.device());
    tp_.all_gather(dy, dy_full);
  }
  Tensor dx = Tensor::empty(x.shape(), dy.dtype(), x.device());
  Tensor dx2d = as_rows(dx);
  ops::gemm(as_rows(dy_full), false, weight.value, false, dx2d);
  if (has_lora()) lora_backward_input(as_rows(dy_full), dx, ctx);
  ctx.grad_output = dy_full;
  ctx.grad_bias = dy;  // this rank's s-shard: the bias gradient is partial under sequence parallelism
  return dx;
}

void RowParallelLinear::backward_weight(LinearContext& ctx) {
  PARALLEL_CHECK(ctx.grad_output.defined() && ctx.input.defined(),
                 "RowParallelLinear::backward_weight before backward_input");
  if (!weight.frozen) {
    if (options_.bias) ops::bias_backward(as_rows(ctx.grad_bias), bias.grad);
    ops::gemm(as_rows(ctx.grad_output), true, as_rows(ctx.input), false, weight.grad, 1.0f, 1.0f);
  }
  if (has_lora()) lora_backward_weight(as_rows(ctx.grad_output), ctx);
  ctx = LinearContext{};
}

}  // namespace parallel::tp
