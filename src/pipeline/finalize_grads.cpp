// Gradient reductions owed by pipeline and tensor parallelism before the optimizer step.
#include "parallel/finalize_grads.hpp"

#include <algorithm>

#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel {

void finalize_grads(const std::vector<Parameter*>& params, ParallelState& state) {
  // Both ends must reduce the same tensors in the same order; sorting by name makes that hold
  // whatever order the chunks list their parameters in.
  std::vector<Parameter*> shared;
  for (Parameter* p : params)
    if (p->shared_across_pipeline && !p->frozen) shared.push_back(p);
  std::stable_sort(shared.begin(), shared.end(),
                   [](const Parameter* a, const Parameter* b) { return a->name < b->name; });
  // A rank that holds both copies (rank 0 of the V placement: the embedding and the output layer)
  // sums them itself; its copies then need nothing from the embedding group, where the other
  // member (rank p - 1) holds none.
  std::vector<Parameter*> remote;
  for (std::size_t i = 0; i < shared.size(); ++i) {
    if (i + 1 < shared.size() && shared[i + 1]->name == shared[i]->name) {
      Parameter& first = *shared[i];
      Parameter& copy = *shared[i + 1];
      ops::add_(first.grad, copy.grad);
      copy.grad.copy_(first.grad);
      ++i;
    } else {
      remote.push_back(shared[i]);
    }
  }
  Communicator* embedding = state.embedding();
  if (state.grid().sizes().pipeline > 1 && embedding != nullptr && embedding->size() > 1) {
    std::vector<WorkHandle> pending;
    for (Parameter* p : remote)
      pending.push_back(embedding->all_reduce(p->grad, ReduceOp::Sum, /*async=*/true));
    for (WorkHandle& w : pending) w->wait();
  }
  tp::reduce_sequence_parallel_grads(params, state.tp());
}

}  // namespace parallel
