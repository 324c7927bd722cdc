// LayerNorm / RMSNorm over the hidden dimension. The parameters are replicated over tp; under
// sequence parallelism each rank normalises only its s-shard, so its gradient is partial and is
// all-reduced over tp before the optimizer step (sequence_parallel_grad).
#include "norm.hpp"

#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

Parameter replicated(const std::string& name, int64_t n, float value, bool sp_grad) {
  Parameter p;
  p.name = name;
  p.value = Tensor::full({n}, value, DType::F32, parameter_device());
  p.grad = parameter_grad({n});
  p.global_shape = {n};
  p.partition_dim = -1;
  p.sequence_parallel_grad = sp_grad;
  return p;
}

}  // namespace

Norm::Norm(const LayerEnv& env, const std::string& name) : Norm(env, name, env.config->normalization) {}

Norm::Norm(const LayerEnv& env, const std::string& name, Normalization kind)
    : Norm(env, name, kind, env.hidden, env.sequence_parallel && env.tp->size() > 1) {}

Norm::Norm(const LayerEnv& env, const std::string& name, Normalization kind, int64_t size, bool partial_grad)
    : kind_(kind), eps_(static_cast<float>(env.config->norm_epsilon)) {
  weight = replicated(name + ".weight", size, 1.0f, partial_grad);
  if (kind_ == Normalization::LayerNorm) bias = replicated(name + ".bias", size, 0.0f, partial_grad);
}

std::vector<Parameter*> Norm::parameters() {
  if (kind_ == Normalization::LayerNorm) return {&weight, &bias};
  return {&weight};
}

Tensor Norm::forward(const Tensor& x_in, Context& ctx) {
  Tensor x = x_in.contiguous();
  const int64_t h = x.size(-1), rows = x.numel() / h;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor x2d = x.view({rows, h}), y2d = y.view({rows, h});
  ctx.rstd = Tensor::empty({rows}, DType::F32, x.device());
  if (kind_ == Normalization::LayerNorm) {
    ctx.mean = Tensor::empty({rows}, DType::F32, x.device());
    ops::layernorm_forward(x2d, weight.value, bias.value, y2d, ctx.mean, ctx.rstd, eps_);
  } else {
    ops::rmsnorm_forward(x2d, weight.value, y2d, ctx.rstd, eps_);
  }
  // Statistics in fp32 (mean, rstd stay fp32, as the fused GPU kernels keep them); output in bf16.
  ctx.x = x;
  return y;
}

namespace {

// A frozen norm's kernels still write weight gradients: they go to a scratch tensor of h elements.
Tensor grad_or_scratch(const Parameter& p) {
  if (!p.frozen) return p.grad;
  return Tensor::zeros(p.value.shape(), DType::F32, p.value.device());
}

}  // namespace

Tensor Norm::backward(const Tensor& dy_in, Context& ctx) {
  Tensor dy = dy_in.contiguous();
  const int64_t h = ctx.x.size(-1), rows = ctx.x.numel() / h;
  Tensor dx = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), ctx.x.device());
  Tensor dy2d = dy.view({rows, h}), x2d = ctx.x.view({rows, h}), dx2d = dx.view({rows, h});
  Tensor dweight = grad_or_scratch(weight);
  if (kind_ == Normalization::LayerNorm) {
    Tensor dbias = grad_or_scratch(bias);
    ops::layernorm_backward(dy2d, x2d, weight.value, ctx.mean, ctx.rstd, dx2d, dweight, dbias);
  } else {
    ops::rmsnorm_backward(dy2d, x2d, weight.value, ctx.rstd, dx2d, dweight);
  }
  ctx = Context{};
  return dx;
}

// Per dropout run (two under context parallelism, whose rows sit at two position ranges), on the
// rows of the [s, b, h] tensors viewed as [s b, h].
Tensor Norm::forward_residual(const Tensor& residual_in, const Tensor& branch_in,
                              const std::vector<DropoutRun>& drop, Tensor& sum, Context& ctx) {
  Tensor residual = residual_in.contiguous(), branch = branch_in.contiguous();
  if (!sum.defined()) sum = Tensor::empty(residual.shape(), residual.dtype(), residual.device());
  const int64_t h = residual.size(-1), rows = residual.numel() / h, per_s = rows / residual.size(0);
  Tensor y = Tensor::empty(residual.shape(), residual.dtype(), residual.device());
  Tensor r2d = residual.view({rows, h}), b2d = branch.view({rows, h}), s2d = sum.view({rows, h}),
         y2d = y.view({rows, h});
  ctx.rstd = Tensor::empty({rows}, DType::F32, residual.device());
  if (kind_ == Normalization::LayerNorm) ctx.mean = Tensor::empty({rows}, DType::F32, residual.device());
  for (const DropoutRun& run : drop) {
    const int64_t r0 = run.row * per_s, n = run.rows * per_s;
    Tensor s_run = s2d.narrow(0, r0, n), y_run = y2d.narrow(0, r0, n), rstd = ctx.rstd.narrow(0, r0, n);
    Tensor mean = ctx.mean.defined() ? ctx.mean.narrow(0, r0, n) : Tensor();
    ops::residual_norm_forward(r2d.narrow(0, r0, n), b2d.narrow(0, r0, n), run.spec, weight.value, bias.value,
                               s_run, y_run, mean, rstd, eps_);
  }
  ctx.x = sum;
  return y;
}

Norm::ResidualGrads Norm::backward_residual(const Tensor& dy_in, const Tensor& dresidual_in,
                                            const std::vector<DropoutRun>& drop, Context& ctx) {
  Tensor dy = dy_in.contiguous(), dresidual = dresidual_in.contiguous();
  const int64_t h = ctx.x.size(-1), rows = ctx.x.numel() / h, per_s = rows / ctx.x.size(0);
  ResidualGrads g;
  g.dsum = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), ctx.x.device());
  const bool dropping = !drop.empty() && drop.front().spec.p > 0.0f;
  if (dropping) g.dbranch = Tensor::empty(ctx.x.shape(), ctx.x.dtype(), ctx.x.device());
  Tensor dy2d = dy.view({rows, h}), dr2d = dresidual.view({rows, h}), x2d = ctx.x.view({rows, h}),
         ds2d = g.dsum.view({rows, h});
  Tensor dweight = grad_or_scratch(weight);
  Tensor dbias = kind_ == Normalization::LayerNorm ? grad_or_scratch(bias) : Tensor();  // RMSNorm: none
  const std::vector<DropoutRun> whole = {DropoutRun{0, ctx.x.size(0), {}}};
  for (const DropoutRun& run : dropping ? drop : whole) {
    const int64_t r0 = run.row * per_s, n = run.rows * per_s;
    Tensor ds_run = ds2d.narrow(0, r0, n);
    Tensor db_run = dropping ? g.dbranch.view({rows, h}).narrow(0, r0, n) : Tensor();
    Tensor mean = ctx.mean.defined() ? ctx.mean.narrow(0, r0, n) : Tensor();
    ops::norm_backward_residual(dy2d.narrow(0, r0, n), dr2d.narrow(0, r0, n), x2d.narrow(0, r0, n),
                                weight.value, mean, ctx.rstd.narrow(0, r0, n), ds_run, dweight, dbias,
                                run.spec, db_run);
  }
  if (!dropping) g.dbranch = g.dsum;
  ctx = Context{};
  return g;
}

// The kernel produces dx and the weight gradients in one pass over the rows: the input step runs it
// whole (as backward() does, so the gradients are bit for bit the fused ones, accumulated in the
// order the input steps run: micro-batch order), and the weight step has nothing left to do.
// Splitting would cost a second pass and keep x and dy until W, for a gradient of h elements.
Tensor Norm::backward_input(const Tensor& dy, Context& ctx) { return backward(dy, ctx); }

void Norm::backward_weight(Context&) {}

}  // namespace parallel::model
