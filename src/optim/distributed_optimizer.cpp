// The distributed optimizer (ZeRO-1, and the update of ZeRO-2/3): state for this rank's shard of
// every bucket only.
#include "parallel/optimizer.hpp"

namespace parallel {

DistributedOptimizer::DistributedOptimizer(DataParallel& ddp, const OptimizerConfig& config,
                                           OptimizerGroups groups, DataParallel* experts)
    : Optimizer(config, ddp.options().precision, groups, /*sharded=*/true), ddp_(ddp), experts_(experts) {
  for (DataParallel* d : data_parallels())
    PARALLEL_CHECK(d->options().distributed_optimizer,
                   "DistributedOptimizer: the DDP must use the distributed optimizer's layout");
  PARALLEL_CHECK(groups.dp == nullptr || groups.dp->size() == ddp.dp().size(),
                 "DistributedOptimizer: dp group size {} differs from the DDP's {}", groups.dp->size(),
                 ddp.dp().size());
  // The shards differ only inside the sharding group (HSDP: the other groups hold the same ones),
  // so the norm sums over it; the experts' over their replica's.
  if (groups_.dp != nullptr) groups_.dp = &ddp.shard_group();
  if (experts != nullptr) {
    PARALLEL_CHECK(experts->options().precision == ddp.options().precision,
                   "DistributedOptimizer: the expert replica's precision differs from the dense one's");
    groups_.expert_dp = &experts->shard_group();
    has_experts_ = true;
  }
  const bool low = ddp.buffer().low_precision();
  int64_t total = 0;
  for (DataParallel* d : data_parallels())
    for (const Bucket& b : d->buffer().buckets()) total += d->shard(b).count;
  // The main params are laid out bucket after bucket (the dense replica's, then the experts'),
  // padding included: at most lcm(shard ranks, 128) / shard ranks elements per bucket; the moments
  // hold the parameters' elements only (bind_state).
  allocate_state(total, low, ddp.buffer().device());
  int64_t state_base = 0;
  const std::vector<DataParallel*> replicas = data_parallels();
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    DataParallel* d = replicas[r];
    ParamAndGradBuffer& buf = d->buffer();
    for (const Bucket& b : buf.buckets()) {
      const BucketShard sh = d->shard(b);
      const int64_t lo = b.offset + sh.offset, hi = lo + sh.count;
      for (Parameter* p : b.params) {
        const int64_t p_lo = buf.offset_of(p), p_hi = p_lo + buf.numel_of(p);
        const int64_t s_lo = std::max(lo, p_lo), s_hi = std::min(hi, p_hi);
        if (s_lo >= s_hi) continue;
        const int64_t n = s_hi - s_lo, state_off = state_base + (s_lo - lo);
        // Views of the bucket's shard: the full buffers, or the sharded storage (ZeRO-2/3).
        Tensor grad = b.grad_shard.narrow(0, s_lo - lo, n);
        Tensor params = b.param_shard.narrow(0, s_lo - lo, n);
        if (low) {
          Tensor main = main_.narrow(0, state_off, n);
          main.copy_(params);  // widened from the 16-bit values
          slots_.push_back(make_slot(p, grad, main, params));
        } else {
          slots_.push_back(make_slot(p, grad, params, Tensor()));
        }
        slots_.back().param_offset = s_lo - p_lo;
        slots_.back().replica = static_cast<int>(r);
        slots_.back().bucket = b.index;
      }
      state_base += sh.count;
    }
  }
  bind_state(ddp.buffer().device());
  // A matrix's pieces lie in the shards of its sharding group (HSDP: the other groups hold the same).
  for (DataParallel* d : data_parallels())
    add_muon_matrices(
        d->buffer().params(), [d](Parameter* p) { return d->buffer().numel_of(p); }, &d->shard_group(),
        ddp.buffer().device());
}

std::vector<DataParallel*> DistributedOptimizer::data_parallels() {
  std::vector<DataParallel*> out{&ddp_};
  if (experts_ != nullptr) out.push_back(experts_);
  return out;
}

void DistributedOptimizer::before_update() {
  // With overlap_param_gather a bucket whose parameters the forward never used may still be
  // gathering into the buffer that the update writes this rank's shard of (ZeRO-3: a gather may
  // still be reading the shard). Buckets the overlapped update already updated are gathering this
  // step's values: left in flight.
  const std::vector<DataParallel*> replicas = data_parallels();
  for (std::size_t r = 0; r < replicas.size(); ++r)
    for (Bucket& b : replicas[r]->buffer().buckets())
      if (!updated_early(static_cast<int>(r), b.index)) replicas[r]->finish_param_gather(b);
}

void DistributedOptimizer::after_update() {
  // ZeRO-3: whatever is still gathered (an evaluation's units kept by reshard_after_forward false)
  // holds the old values; the next forward gathers the updated shards. Otherwise every bucket's
  // gather was started, by the overlapped update or now, in bucket order on every rank.
  const std::vector<DataParallel*> replicas = data_parallels();
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    DataParallel* d = replicas[r];
    if (d->buffer().params_sharded()) {
      d->reshard();
      continue;
    }
    for (Bucket& b : d->buffer().buckets())
      if (!updated_early(static_cast<int>(r), b.index)) d->start_param_gather(b, /*async=*/true);
    if (!d->options().overlap_param_gather) d->finish_param_gather();
  }
}

void DistributedOptimizer::before_bucket_update(int replica, int bucket) {
  DataParallel* d = data_parallels()[static_cast<std::size_t>(replica)];
  d->finish_param_gather(d->buffer().buckets()[static_cast<std::size_t>(bucket)]);
}

void DistributedOptimizer::after_bucket_update(int replica, int bucket) {
  // The bucket's updated shards go out now, while the backward (or the reductions) go on; ZeRO-3
  // gathers unit by unit in the next forward instead.
  DataParallel* d = data_parallels()[static_cast<std::size_t>(replica)];
  if (!d->buffer().params_sharded())
    d->start_param_gather(d->buffer().buckets()[static_cast<std::size_t>(bucket)], /*async=*/true);
}

}  // namespace parallel
