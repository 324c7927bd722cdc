// VocabParallelEmbedding: each rank owns a contiguous range of the padded vocabulary's rows; a
// lookup gives the owner's row on one rank and zeros on the others, so a sum over the group
// (all-reduce, or reduce-scatter along s under sequence parallelism) assembles the embedding.
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::tp {

VocabParallelEmbedding::VocabParallelEmbedding(std::string name, int64_t vocab_padded, int64_t hidden,
                                               bool sequence_parallel, Communicator& tp)
    : sequence_parallel_(sequence_parallel), tp_(tp) {
  PARALLEL_CHECK(vocab_padded % tp.size() == 0,
                 "VocabParallelEmbedding {}: vocabulary {} not divisible by tp = {}", name, vocab_padded,
                 tp.size());
  const int64_t rows = vocab_padded / tp.size();
  weight.name = name;
  weight.value = Tensor::zeros({rows, hidden}, DType::F32, parameter_device());
  weight.grad = parameter_grad({rows, hidden});
  weight.global_shape = {vocab_padded, hidden};
  weight.partition_dim = 0;
  weight.partition_offset = tp.rank() * rows;
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens, Context& ctx) {
  PARALLEL_CHECK(tokens.dim() == 2, "VocabParallelEmbedding: tokens {} must be [b, s]", tokens.str());
  const int64_t b = tokens.size(0), s = tokens.size(1), h = weight.value.size(1);
  // The lookup output has the weight's dtype: the model's 16-bit copy under mixed precision.
  Tensor out = Tensor::empty({s, b, h}, weight.value.dtype(), weight.value.device());
  ops::embedding_forward(tokens, weight.value, vocab_start(), out);
  ctx.tokens = tokens;
  if (tp_.size() == 1) return out;
  if (sequence_parallel_) return reduce_scatter_sequence(tp_, out);
  tp_.all_reduce(out, ReduceOp::Sum);
  return out;
}

void VocabParallelEmbedding::backward(const Tensor& dy, Context& ctx) {
  PARALLEL_CHECK(ctx.tokens.defined() && ctx.tokens.numel() > 0,
                 "VocabParallelEmbedding::backward without tokens");
  // Every rank needs the gradient of every token position: the ids it owns may be anywhere in s.
  Tensor dy_full = sequence_parallel_ ? gather_sequence(tp_, dy) : dy.contiguous();
  ops::embedding_backward(ctx.tokens, dy_full, vocab_start(), weight.grad);
  ctx.tokens = Tensor();
}

}  // namespace parallel::tp
