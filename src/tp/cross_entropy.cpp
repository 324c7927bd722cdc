// Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy): the logits stay split over
// the tp group; only per-row scalars (max, target logit, sum of exponentials) are reduced.
#include <cmath>

#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::tp {

Tensor vocab_parallel_cross_entropy(Communicator& tp, const Tensor& logits_in, const Tensor& targets,
                                    int64_t vocab_start, int64_t vocab_size, CrossEntropyContext& ctx) {
  Tensor logits = logits_in.contiguous();
  PARALLEL_CHECK(logits.dim() == 2, "vocab_parallel_cross_entropy: logits {} must be [n, v_local]",
                 logits.str());
  const int64_t n = logits.size(0);
  const Device dev = logits.device();
  Tensor row_max = Tensor::empty({n}, DType::F32, dev);
  // Target logit and sum of exponentials share one buffer so that one all-reduce sums both.
  Tensor stats = Tensor::empty({2, n}, DType::F32, dev);
  Tensor target_logit = stats.select(0), sum_exp = stats.select(1);
  if (tp.size() > 1) {
    ops::cross_entropy_local_stats(logits, targets, vocab_start, vocab_size, row_max, target_logit);
    tp.all_reduce(row_max, ReduceOp::Max);
    ops::cross_entropy_sum_exp(logits, row_max, vocab_start, vocab_size, sum_exp);
    tp.all_reduce(stats, ReduceOp::Sum);
  } else {
    // No reduction between the max and the sum: both in one pass over the logits.
    ops::cross_entropy_stats(logits, targets, vocab_start, vocab_size, row_max, target_logit, sum_exp);
  }

  // loss_i = log(sum_j exp(z_ij - max_i)) + max_i - z_i,target, on the logits' device: the host
  // reads nothing per micro-batch.
  Tensor loss = Tensor::empty({n}, DType::F32, dev);
  ops::cross_entropy_loss(row_max, sum_exp, target_logit, loss);
  ctx.logits = logits;
  ctx.targets = targets;
  ctx.row_max = row_max;
  ctx.sum_exp = sum_exp;
  ctx.vocab_start = vocab_start;
  ctx.vocab_size = vocab_size;
  return loss;
}

Tensor vocab_parallel_cross_entropy_backward(const Tensor& grad_loss, CrossEntropyContext& ctx) {
  PARALLEL_CHECK(ctx.logits.defined() && ctx.logits.numel() > 0,
                 "vocab_parallel_cross_entropy_backward: no saved state");
  Tensor dlogits = Tensor::empty(ctx.logits.shape(), ctx.logits.dtype(), ctx.logits.device());
  ops::cross_entropy_backward(ctx.logits, ctx.targets, ctx.row_max, ctx.sum_exp, grad_loss.contiguous(),
                              ctx.vocab_start, ctx.vocab_size, dlogits);
  ctx = CrossEntropyContext{};
  return dlogits;
}

}  // namespace parallel::tp
