// The defaults of ModelChunk (model_chunk.hpp): a chunk that does not split its backward.
#include "parallel/model_chunk.hpp"

#include "parallel/error.hpp"

namespace parallel {

Tensor ModelChunk::forward(const Tensor& input, const Tensor& targets, Activations& act, uint64_t micro_batch,
                           const PackedSequence& packed) {
  PARALLEL_CHECK(
      packed.empty(),
      "this model chunk cannot mask documents (data.reset_position_ids, data.reset_attention_mask, "
      "data.eod_mask_loss)");
  return forward(input, targets, act, micro_batch);
}

Tensor ModelChunk::backward_input(const Tensor&, Activations&) {
  PARALLEL_FAIL("this model chunk cannot split its backward: use a schedule without weight steps");
}

void ModelChunk::backward_weight(Activations&) {
  PARALLEL_FAIL("this model chunk cannot split its backward: use a schedule without weight steps");
}

}  // namespace parallel
