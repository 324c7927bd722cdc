#pragma once
// The norm layer (norm.cpp).
#include <string>
#include <vector>

#include "dropout.hpp"
#include "layer.hpp"
#include "layer_env.hpp"
#include "parallel/config.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// LayerNorm or RMSNorm over h; weight/bias replicated, partial gradients under sequence parallelism.
class Norm {
 public:
  Norm(const LayerEnv& env, const std::string& name, Normalization kind);
  Norm(const LayerEnv& env, const std::string& name);  // of the config's kind (the final norm)
  // A norm over `size` features (the last dimension), e.g. qk-norm's over each head (size head_dim).
  // partial_grad: each tp rank sees only part of the rows (its sequence shard, or its heads), so
  // its weight gradient is summed over tp before the optimizer step (sequence_parallel_grad).
  Norm(const LayerEnv& env, const std::string& name, Normalization kind, int64_t size, bool partial_grad);
  struct Context {
    Tensor x, mean, rstd;
  };
  Tensor forward(const Tensor& x, Context& ctx);
  Tensor backward(const Tensor& dy, Context& ctx);  // accumulates dweight/dbias; returns dx
  // The norm kernels produce dx and the weight gradients in one pass over the rows, so the input
  // step accumulates the weight gradients too (bit for bit backward()) and the weight step is empty:
  // nothing of the norm waits for W.
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);

  // The residual stream's fused steps (ops.hpp, "residual add fused with its neighbours"):
  // forward_residual writes sum = residual + dropout(branch) (sum may be branch itself, to reuse a
  // fresh tensor) and returns norm(sum), keeping sum as its saved input. backward_residual returns
  // d(sum) = the norm's dx + dresidual, and the branch's gradient (dropout's backward of d(sum); the
  // same tensor when dropout is off). Weight gradients accumulate in the pass, as in backward().
  Tensor forward_residual(const Tensor& residual, const Tensor& branch, const std::vector<DropoutRun>& drop,
                          Tensor& sum, Context& ctx);
  struct ResidualGrads {
    Tensor dsum, dbranch;
  };
  // drop: dropout_runs() of the branch's site; empty when no dropout sits on the branch.
  ResidualGrads backward_residual(const Tensor& dy, const Tensor& dresidual,
                                  const std::vector<DropoutRun>& drop, Context& ctx);
  std::vector<Parameter*> parameters();
  Parameter weight, bias;  // bias only for LayerNorm

 private:
  Normalization kind_;
  float eps_;
};
static_assert(Layer<Norm>);

}  // namespace parallel::model
