#pragma once
// The gradient reductions a model-parallel layout owes before the optimizer step, after the last
// micro-batch's backward (Megatron's finalize_model_grads, minus data parallelism, which the
// DDP wrapper owns):
//   - tied word embeddings: the copies on the first and last pipeline stage each hold the gradient
//     of their own use; both need the sum (all-reduce over the embedding group, when pp > 1; summed
//     on the rank when one rank holds both stages, as rank 0 of the V placement does);
//   - sequence parallelism: tp::reduce_sequence_parallel_grads over the tensor-parallel group.
#include <vector>

#include "parallel/parallel_state.hpp"
#include "parallel/parameter.hpp"

namespace parallel {

// params: every parameter this rank holds (all of its pipeline chunks). Collective over the
// embedding group (first and last pipeline rank) for the copies whose twin lives on the other one,
// and over the tensor-parallel group.
void finalize_grads(const std::vector<Parameter*>& params, ParallelState& state);

}  // namespace parallel
