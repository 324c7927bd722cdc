// Gradient reductions owed by pipeline and tensor parallelism before the optimizer step.
#include "parallel/finalize_grads.hpp"

#include <algorithm>

#include "parallel/tensor_parallel.hpp"

namespace parallel {

void finalize_grads(const std::vector<Parameter*>& params, ParallelState& state) {
  Communicator* embedding = state.embedding();
  if (state.grid().sizes().pipeline > 1 && embedding != nullptr && embedding->size() > 1) {
    // Both ends must reduce the same tensors in the same order; sorting by name makes that hold
    // whatever order the chunks list their parameters in.
    std::vector<Parameter*> shared;
    for (Parameter* p : params)
      if (p->shared_across_pipeline) shared.push_back(p);
    std::sort(shared.begin(), shared.end(),
              [](const Parameter* a, const Parameter* b) { return a->name < b->name; });
    std::vector<WorkHandle> pending;
    for (Parameter* p : shared)
      pending.push_back(embedding->all_reduce(p->grad, ReduceOp::Sum, /*async=*/true));
    for (WorkHandle& w : pending) w->wait();
  }
  tp::reduce_sequence_parallel_grads(params, state.tp());
}

}  // namespace parallel
