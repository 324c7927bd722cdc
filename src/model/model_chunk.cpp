// The defaults of ModelChunk (model_chunk.hpp): a chunk that does not split its backward.
#include "parallel/model_chunk.hpp"

#include "parallel/error.hpp"

namespace parallel {

Tensor ModelChunk::backward_input(const Tensor&, Activations&) {
  PARALLEL_FAIL("this model chunk cannot split its backward: use a schedule without weight steps");
}

void ModelChunk::backward_weight(Activations&) {
  PARALLEL_FAIL("this model chunk cannot split its backward: use a schedule without weight steps");
}

}  // namespace parallel
