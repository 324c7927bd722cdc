// The distributed optimizer (ZeRO-1): state for this dp rank's shard of every bucket only.
#include "parallel/optimizer.hpp"

namespace parallel {

DistributedOptimizer::DistributedOptimizer(DataParallel& ddp, const OptimizerConfig& config,
                                           OptimizerGroups groups)
    : Optimizer(config, ddp.options().precision, groups, /*sharded=*/true), ddp_(ddp) {
  PARALLEL_CHECK(ddp.options().distributed_optimizer,
                 "DistributedOptimizer: the DDP must use the distributed optimizer's layout");
  PARALLEL_CHECK(groups.dp == nullptr || groups.dp->size() == ddp.dp().size(),
                 "DistributedOptimizer: dp group size {} differs from the DDP's {}", groups.dp->size(),
                 ddp.dp().size());
  ParamAndGradBuffer& buf = ddp.buffer();
  const bool low = buf.low_precision();
  int64_t total = 0;
  for (const Bucket& b : buf.buckets()) total += ddp.shard(b).count;
  // The shards are laid out in the state tensors bucket after bucket, padding included: at most
  // lcm(dp, 128) / dp elements per bucket.
  allocate_state(total, low, buf.grad_data().device());
  int64_t state_base = 0;
  for (const Bucket& b : buf.buckets()) {
    const BucketShard sh = ddp.shard(b);
    const int64_t lo = b.offset + sh.offset, hi = lo + sh.count;
    for (Parameter* p : b.params) {
      const int64_t p_lo = buf.offset_of(p), p_hi = p_lo + p->numel();
      const int64_t s_lo = std::max(lo, p_lo), s_hi = std::min(hi, p_hi);
      if (s_lo >= s_hi) continue;
      const int64_t n = s_hi - s_lo, state_off = state_base + (s_lo - lo);
      Tensor grad = buf.grad_data().narrow(0, s_lo, n);
      Tensor params = buf.param_data().narrow(0, s_lo, n);
      if (low) {
        Tensor main = main_.narrow(0, state_off, n);
        main.copy_(params);  // widened from the 16-bit values
        slots_.push_back(make_slot(p, grad, main, params, state_off));
      } else {
        slots_.push_back(make_slot(p, grad, params, Tensor(), state_off));
      }
      slots_.back().param_offset = s_lo - p_lo;
    }
    state_base += sh.count;
  }
}

void DistributedOptimizer::before_update() {
  // With overlap_param_gather a bucket whose parameters the forward never used may still be
  // gathering into the buffer that the update writes this rank's shard of.
  ddp_.finish_param_gather();
}

void DistributedOptimizer::after_update() {
  ddp_.start_param_gather(/*async=*/ddp_.options().overlap_param_gather);
}

}  // namespace parallel
