#pragma once
// A linear layer whose weight every tp rank holds whole (replicated_linear.cpp): MLA's down
// projections, which are small and feed column-parallel up projections.
#include <cstdint>
#include <string>
#include <vector>

#include "layer.hpp"
#include "layer_env.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// y = x Wᵀ on this rank's rows. Under sequence parallelism a rank sees only its s-shard, so its
// weight gradient is partial and is all-reduced over tp before the optimizer step
// (sequence_parallel_grad, as the norms); without it every rank sees every row and the same
// output gradient (the column-parallel layer after it all-reduces its input gradient), so the
// gradients agree without communication.
class ReplicatedLinear {
 public:
  ReplicatedLinear(const LayerEnv& env, const std::string& name, int64_t in, int64_t out);
  using Context = tp::LinearContext;
  Tensor forward(const Tensor& x, Context& ctx);  // [.., in] -> [.., out]
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters() { return {&weight}; }
  Parameter weight;  // [out, in]
};
static_assert(Layer<ReplicatedLinear>);

}  // namespace parallel::model
