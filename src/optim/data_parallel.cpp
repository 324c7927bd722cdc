// DataParallel: bucketed, optionally overlapped gradient averaging over the dp group, and the
// distributed optimizer's parameter all-gather.
#include "parallel/data_parallel.hpp"

#include <algorithm>

#include "parallel/model_chunk.hpp"
#include "parallel/ops.hpp"
#include "parallel/precision.hpp"

namespace parallel {
namespace {

bool holds(DataParallelOptions::Params which, const Parameter& p) {
  using P = DataParallelOptions::Params;
  if (p.frozen) return false;  // no gradient to reduce, nothing to update or shard
  return which == P::All || (which == P::Experts) == p.expert;
}

std::vector<Parameter*> chunk_params(const std::vector<ModelChunk*>& chunks,
                                     DataParallelOptions::Params which) {
  std::vector<Parameter*> out;
  for (ModelChunk* c : chunks)
    for (Parameter* p : c->parameters())
      if (holds(which, *p)) out.push_back(p);
  return out;
}

}  // namespace

DataParallelOptions DataParallelOptions::from(const OptimizerConfig& o, Precision precision) {
  DataParallelOptions d;
  d.sharding = o.sharding;
  if (o.distributed && d.sharding == Sharding::None) d.sharding = Sharding::Optim;
  d.distributed_optimizer = d.sharding != Sharding::None;
  d.overlap_grad_reduce = o.overlap_grad_reduce;
  d.overlap_param_gather = o.overlap_param_gather && d.distributed_optimizer;
  d.bucket_size = o.bucket_size;
  d.precision = precision;
  d.sharding_group_size = o.sharding_group_size;
  d.reshard_after_forward = o.reshard_after_forward;
  d.prefetch_units = o.prefetch_units;
  return d;
}

DataParallelOptions DataParallelOptions::for_experts(int dense_ranks, int expert_ranks) const {
  DataParallelOptions e = *this;
  e.params = Params::Experts;
  e.average_over = dense_ranks;
  if (sharding_group_size > 0) {
    const int replicas = dense_ranks / sharding_group_size;
    PARALLEL_CHECK(replicas > 0 && dense_ranks % sharding_group_size == 0 && expert_ranks % replicas == 0,
                   "DataParallel: {} HSDP replicas ({} / sharding group {}) do not divide expert-dp {}",
                   replicas, dense_ranks, sharding_group_size, expert_ranks);
    e.sharding_group_size = expert_ranks / replicas;
  }
  return e;
}

namespace {

// Gradients that other groups must still sum (tied embeddings over the embedding group,
// sequence-parallel norms over tp: finalize_grads) are final only after finalize_grads, which the
// caller runs before finish_grad_sync.
bool reduced_after_finalize(const Parameter& p) {
  return p.sequence_parallel_grad || p.shared_across_pipeline;
}

// Sharding beyond the optimizer state needs the units; the options say it once.
DataParallelOptions checked(DataParallelOptions o) {
  if (o.sharding == Sharding::None && o.distributed_optimizer) o.sharding = Sharding::Optim;
  o.distributed_optimizer = o.sharding != Sharding::None;
  PARALLEL_CHECK(o.prefetch_units >= 0, "DataParallel: prefetch_units {} < 0", o.prefetch_units);
  return o;
}

// The buffer groups of sharded gradients: each unit's parameters, those reduced after finalize
// apart (their own buckets).
std::vector<std::vector<Parameter*>> unit_groups(const std::vector<ModelChunk*>& chunks,
                                                 DataParallelOptions::Params which) {
  std::vector<std::vector<Parameter*>> out;
  std::unordered_set<const Parameter*> seen;
  for (ModelChunk* c : chunks)
    for (const auto& unit : c->units()) {
      std::vector<Parameter*> now, later;
      for (Parameter* p : unit)
        if (holds(which, *p) && seen.insert(p).second)
          (reduced_after_finalize(*p) ? later : now).push_back(p);
      out.push_back(std::move(now));
      out.push_back(std::move(later));  // may be empty: an empty group holds no bucket
    }
  return out;
}

}  // namespace

DataParallel::DataParallel(const std::vector<ModelChunk*>& chunks, Communicator& dp,
                           DataParallelOptions options)
    : dp_(dp), options_(checked(options)) {
  chunks_ = chunks;
  shard_grads_ = options_.sharding == Sharding::OptimGrads || options_.sharding == Sharding::OptimGradsParams;
  shard_params_ = options_.sharding == Sharding::OptimGradsParams;
  std::vector<std::vector<Parameter*>> groups;
  if (shard_grads_) groups = unit_groups(chunks, options_.params);
  build(chunk_params(chunks, options_.params), std::move(groups));
  if (shard_grads_) set_up_units();
  // ZeRO-3 gathers unit by unit; ZeRO-1 and 2 all-gather after the step and may overlap that.
  gather_on_use_ = !shard_params_ && options_.overlap_param_gather && options_.distributed_optimizer;
  if (!options_.install_hooks) return;  // a SharedChunkHooks calls this replica
  for (ModelChunk* c : chunks_) c->set_grad_ready_hook([this](Parameter& p) { on_grad_ready(p); });
  if (shard_grads_)
    for (ModelChunk* c : chunks_)
      c->set_unit_hook([this](ModelChunk::UnitPhase phase, const std::vector<Parameter*>& params) {
        on_unit(phase, params);
      });
  if (gather_on_use_)
    for (ModelChunk* c : chunks_) c->set_param_use_hook([this](Parameter& p) { on_param_use(p); });
}

DataParallel::DataParallel(const std::vector<Parameter*>& params, Communicator& dp,
                           DataParallelOptions options)
    : dp_(dp), options_(checked(options)) {
  PARALLEL_CHECK(options_.sharding == Sharding::None || options_.sharding == Sharding::Optim,
                 "DataParallel: sharding gradients or parameters needs the model chunks (their unit hooks)");
  build(params, {});
}

void DataParallel::build(const std::vector<Parameter*>& params, std::vector<std::vector<Parameter*>> groups) {
  std::unordered_set<const Parameter*> seen;
  for (Parameter* p : params)
    if (seen.insert(p).second) params_.push_back(p);
  // HSDP: groups of k consecutive dp ranks share the shards; the ranks with the same index in each
  // group hold the same shard. Collective over dp (every dp rank builds its DDP).
  const int k = options_.sharding_group_size > 0 ? options_.sharding_group_size : dp_.size();
  PARALLEL_CHECK(dp_.size() % k == 0, "DataParallel: sharding group size {} does not divide dp size {}", k,
                 dp_.size());
  PARALLEL_CHECK(k == dp_.size() || options_.distributed_optimizer,
                 "DataParallel: sharding_group_size needs a sharding mode");
  if (k == dp_.size()) {
    shard_ = &dp_;
  } else {
    // Every rank knows both groups' members: split_group, which a meta rank can build too.
    const int r = dp_.rank(), n = dp_.size();
    std::vector<int> shard_members, replica_members;
    for (int i = 0; i < k; ++i) shard_members.push_back(r / k * k + i);
    for (int j = 0; j < n / k; ++j) replica_members.push_back(r % k + j * k);
    shard_owned_ = dp_.split_group(shard_members);
    replica_owned_ = dp_.split_group(replica_members);
    // Named for the planner's simulation, which reports time per parallel dimension (step_cost.hpp).
    shard_owned_->set_name("dp_shard");
    replica_owned_->set_name("dp_replica");
    shard_ = shard_owned_.get();
    replica_ = replica_owned_.get();
  }
  BufferOptions b;
  b.param_dtype = compute_dtype(options_.precision);
  b.bucket_size = options_.bucket_size;
  b.data_parallel_size = dp_.size();
  b.distributed_optimizer = options_.distributed_optimizer;
  b.shard_ranks = shard_->size();
  b.shard_rank = shard_->rank();
  b.shard_grads = shard_grads_;
  b.shard_params = shard_params_;
  b.groups = std::move(groups);
  buffer_ = std::make_unique<ParamAndGradBuffer>(params_, b);
  const std::size_t n = buffer_->buckets().size();
  ready_count_.assign(n, 0);
  reduce_work_.assign(n, nullptr);
  gather_work_.assign(n, nullptr);
  launched_.assign(n, 0);
  final_.assign(n, 0);
  reported_.assign(n, 0);
}

void DataParallel::set_up_units() {
  // Buffer groups come in pairs per unit (unit_groups): group g belongs to unit g / 2.
  int unit = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    for (const auto& params : chunks_[c]->units()) {
      for (Parameter* p : params) unit_of_.emplace(p, unit);
      unit_chunk_.push_back(static_cast<int>(c));
      ++unit;
    }
  unit_buckets_.assign(static_cast<std::size_t>(unit), {});
  for (const Bucket& b : buffer_->buckets())
    unit_buckets_[static_cast<std::size_t>(b.group / 2)].push_back(b.index);
  // Gathers run in forward order: the unit's buckets in the reverse of their layout order.
  for (auto& list : unit_buckets_) std::sort(list.rbegin(), list.rend());
}

DataParallel::~DataParallel() {
  if (options_.install_hooks)
    for (ModelChunk* c : chunks_) {
      c->set_grad_ready_hook(nullptr);
      c->set_param_use_hook(nullptr);
      c->set_unit_hook(nullptr);
    }
  // Nothing may still write into the buffers once they are gone.
  for (auto& w : reduce_work_)
    if (w) w->wait();
  for (auto& w : gather_work_)
    if (w) w->wait();
  for (auto& r : reducing_) r.work->wait();
}

void DataParallel::record(DdpEvent::Kind kind, int bucket, const Parameter* param, bool backward) {
  if (record_) events_.push_back({kind, bucket, param, backward, std::chrono::steady_clock::now()});
}

void DataParallel::zero_grad() {
  if (!gather_on_use_ && !shard_params_) finish_param_gather();
  while (!reducing_.empty()) complete_oldest_sharded_reduce();
  buffer_->zero_grads();
  ready_.clear();
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(final_.begin(), final_.end(), 0);
  std::fill(reported_.begin(), reported_.end(), 0);
}

void DataParallel::set_bucket_reduced_hook(BucketReducedHook hook, bool during_backward) {
  reduced_hook_ = std::move(hook);
  hook_during_backward_ = during_backward;
}

void DataParallel::report_reduced(int bucket) {
  final_[bucket] = 1;
  if (!reduced_hook_ || reported_[bucket] || !(hook_during_backward_ || finishing_)) return;
  reported_[bucket] = 1;
  record(DdpEvent::Kind::BucketReduced, bucket);
  reduced_hook_(bucket);
}

BucketShard DataParallel::shard(const Bucket& bucket) const {
  const Chunk c = chunk_of(bucket.numel, shard_->size(), shard_->rank());
  return {c.offset, c.count};
}

void DataParallel::launch_reduce(Bucket& bucket) {
  // Average, not sum: scaling before the reduction keeps bf16/fp16 reductions in range, as Megatron.
  const int average_over = options_.average_over > 0 ? options_.average_over : dp_.size();
  if (average_over > 1) ops::scale_(bucket.grads_view, 1.0f / static_cast<float>(average_over));
  if (shard_grads_) {
    // Into a fresh shard-sized tensor, added to the persistent shard once it lands; the full-size
    // gradient is released now (the reduction holds it until then).
    // A gradient added to a bucket after the optimizer updated it from the bucket's reduction
    // would be lost (the last micro-batch's backward was not the bucket's last).
    PARALLEL_CHECK(!reported_[bucket.index],
                   "DataParallel: bucket {} is reduced again after its final reduction was reported to the "
                   "optimizer; call set_is_last_microbatch(false) before every micro-batch but the last",
                   bucket.index);
    ShardedReduce r;
    r.bucket = bucket.index;
    r.last = is_last_microbatch_ || finishing_;
    r.full = buffer_->release_grads(bucket);
    if (shard_->size() == 1) {
      r.out = r.full;
      r.work = completed_work();
    } else {
      r.out = Tensor::empty({bucket.grad_shard.numel()}, DType::F32, r.full.device());
      r.work = shard_->reduce_scatter(r.full, r.out, ReduceOp::Sum, /*async=*/true);
    }
    reducing_.push_back(std::move(r));
    record(DdpEvent::Kind::ReduceLaunched, bucket.index);
    // Bounded: at most prefetch_units + 1 full-size gradients wait in flight.
    while (reducing_.size() > static_cast<std::size_t>(options_.prefetch_units) + 1)
      complete_oldest_sharded_reduce();
    return;
  }
  if (dp_.size() == 1) {
    reduce_work_[bucket.index] = completed_work();
  } else if (options_.distributed_optimizer) {
    Tensor mine = bucket.grad_shard;
    reduce_work_[bucket.index] =
        shard_->reduce_scatter(bucket.grads_view, mine, ReduceOp::Sum, /*async=*/true);
  } else {
    reduce_work_[bucket.index] = dp_.all_reduce(bucket.grads_view, ReduceOp::Sum, /*async=*/true);
  }
  launched_[bucket.index] = 1;
  pending_.push_back(bucket.index);
  record(DdpEvent::Kind::ReduceLaunched, bucket.index);
}

void DataParallel::complete_reduce(Bucket& bucket) {
  reduce_work_[bucket.index]->wait();
  reduce_work_[bucket.index] = nullptr;
  pending_.erase(std::find(pending_.begin(), pending_.end(), bucket.index));
  // HSDP: the group's reduce-scatter summed k ranks; the other groups hold the same shard's sums.
  if (replica_ != nullptr && replica_->size() > 1) replica_->all_reduce(bucket.grad_shard, ReduceOp::Sum);
  record(DdpEvent::Kind::ReduceDone, bucket.index);
}

void DataParallel::complete_oldest_sharded_reduce() {
  ShardedReduce r = std::move(reducing_.front());
  reducing_.erase(reducing_.begin());
  r.work->wait();
  if (replica_ != nullptr && replica_->size() > 1) replica_->all_reduce(r.out, ReduceOp::Sum);
  Bucket& bucket = buffer_->buckets()[static_cast<std::size_t>(r.bucket)];
  ops::add_(bucket.grad_shard, r.out);
  record(DdpEvent::Kind::ReduceDone, r.bucket);
  if (r.last) report_reduced(r.bucket);
}

void DataParallel::on_grad_ready(Parameter& param) {
  const Parameter* p = &param;
  if (shard_grads_) {
    // Every micro-batch: a bucket's gradients are final for this micro-batch once all its
    // parameters reported (each reports once per backward call of its chunk).
    if (!buffer_->contains(p) || reduced_after_finalize(param)) return;
    record(DdpEvent::Kind::GradReady, -1, p);
    const int b = buffer_->bucket_of(p);
    Bucket& bucket = buffer_->buckets()[static_cast<std::size_t>(b)];
    if (++ready_count_[b] == static_cast<int>(bucket.params.size())) {
      ready_count_[b] = 0;
      launch_reduce(bucket);
    }
    return;
  }
  if (!options_.overlap_grad_reduce || !is_last_microbatch_) return;
  if (!buffer_->contains(p)) return;  // not part of this replica (e.g. another DDP's chunk)
  if (reduced_after_finalize(param)) return;
  record(DdpEvent::Kind::GradReady, -1, p);
  const int b = buffer_->bucket_of(p);
  PARALLEL_CHECK(ready_.insert(p).second,
                 "DataParallel: {} received a gradient after its bucket's reduction could start; call "
                 "set_is_last_microbatch(false) before every micro-batch but the last",
                 param.name);
  Bucket& bucket = buffer_->buckets()[b];
  if (++ready_count_[b] != static_cast<int>(bucket.params.size())) return;
  launch_reduce(bucket);
  // The overlapped update: the reduction launched before this one has had a bucket's backward to
  // progress; complete it and let the optimizer update it while the backward goes on. Always the
  // previous one, never "whichever is done": the hook may issue collectives (the distributed
  // optimizer's all-gather), which every rank must issue in the same order.
  if (reduced_hook_ && hook_during_backward_)
    while (pending_.size() > 1) {
      const int done = pending_.front();
      complete_reduce(buffer_->buckets()[static_cast<std::size_t>(done)]);
      report_reduced(done);
    }
}

void DataParallel::finish_grad_sync() {
  finishing_ = true;
  if (shard_grads_) {
    // Buckets whose last reduction landed during the backward while the hook had to wait
    // (pipeline schedules): their updates run while the rest is reduced.
    for (const Bucket& b : buffer_->buckets())
      if (final_[b.index]) report_reduced(b.index);
    // What is still full-size: buckets reduced after finalize_grads (and any a hook never closed).
    for (Bucket& b : buffer_->buckets())
      if (b.grads_view.defined()) launch_reduce(b);
    while (!reducing_.empty()) complete_oldest_sharded_reduce();
  } else {
    for (Bucket& b : buffer_->buckets())
      if (!launched_[b.index]) launch_reduce(b);
    // In launch order, each reported as soon as it completes (before the later ones are waited for).
    while (!pending_.empty()) {
      const int done = pending_.front();
      complete_reduce(buffer_->buckets()[static_cast<std::size_t>(done)]);
      report_reduced(done);
    }
  }
  // Every gradient is final now (a bucket whose reductions all ran before the last micro-batch,
  // e.g. while the silent-data-corruption check held them back).
  for (const Bucket& b : buffer_->buckets()) report_reduced(b.index);
  finishing_ = false;
  ready_.clear();
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), 0);
}

void DataParallel::start_param_gather(bool async) {
  PARALLEL_CHECK(options_.distributed_optimizer,
                 "DataParallel: parameter all-gather needs the distributed optimizer");
  PARALLEL_CHECK(!shard_params_, "DataParallel: sharded parameters are gathered unit by unit");
  for (Bucket& b : buffer_->buckets()) start_param_gather(b, /*async=*/true);
  if (!async) finish_param_gather();
}

void DataParallel::start_param_gather(Bucket& b, bool async) {
  PARALLEL_CHECK(options_.distributed_optimizer && !shard_params_,
                 "DataParallel: a bucket's parameter all-gather needs the distributed optimizer with whole "
                 "parameters");
  if (gather_work_[b.index]) gather_work_[b.index]->wait();
  if (shard_->size() == 1) {
    gather_work_[b.index] = completed_work();
  } else {
    // The shard already sits in its slot of the bucket: an in-place all-gather.
    gather_work_[b.index] = shard_->all_gather(b.param_shard, b.params_view, /*async=*/true);
  }
  record(DdpEvent::Kind::GatherLaunched, b.index);
  if (!async) finish_gather(b);
}

void DataParallel::finish_param_gather(Bucket& bucket) { finish_gather(bucket); }

void DataParallel::finish_gather(Bucket& bucket) {
  if (!gather_work_[bucket.index]) return;
  gather_work_[bucket.index]->wait();
  gather_work_[bucket.index] = nullptr;
  record(DdpEvent::Kind::GatherDone, bucket.index);
}

// ---- sharded parameters (ZeRO-3) -------------------------------------------------------------------

void DataParallel::gather(Bucket& bucket) {
  if (bucket.params_view.defined()) return;  // gathered, or a gather in flight
  buffer_->materialize_params(bucket);
  if (shard_->size() == 1) {
    bucket.params_view.copy_(bucket.param_shard);
    gather_work_[bucket.index] = completed_work();
  } else {
    gather_work_[bucket.index] = shard_->all_gather(bucket.param_shard, bucket.params_view, /*async=*/true);
  }
  gathered_bytes_ += static_cast<int64_t>(bucket.params_view.nbytes());
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  record(DdpEvent::Kind::GatherLaunched, bucket.index);
}

void DataParallel::release(Bucket& bucket) {
  if (pinned_ || !bucket.params_view.defined()) return;
  finish_gather(bucket);
  gathered_bytes_ -= static_cast<int64_t>(bucket.params_view.nbytes());
  buffer_->release_params(bucket);
  record(DdpEvent::Kind::ParamsReleased, bucket.index);
}

void DataParallel::prefetch(int unit, int direction) {
  for (int k = 1; k <= options_.prefetch_units; ++k) {
    const int next = unit + direction * k;
    // Only inside the chunk: which chunk runs next is the pipeline schedule's business.
    if (next < 0 || next >= static_cast<int>(unit_buckets_.size()) ||
        unit_chunk_[static_cast<std::size_t>(next)] != unit_chunk_[static_cast<std::size_t>(unit)])
      break;
    for (int b : unit_buckets_[static_cast<std::size_t>(next)])
      gather(buffer_->buckets()[static_cast<std::size_t>(b)]);
  }
}

void DataParallel::on_unit(ModelChunk::UnitPhase phase, const std::vector<Parameter*>& params) {
  using Phase = ModelChunk::UnitPhase;
  if (!shard_grads_) return;
  // The unit's parameters in this buffer (a MoE layer's unit holds dense and expert parameters,
  // which two replicas shard; a unit of another DDP's chunk holds none of ours).
  const Parameter* first = nullptr;
  for (const Parameter* p : params)
    if (buffer_->contains(p)) {
      first = p;
      break;
    }
  if (first == nullptr) return;
  const int unit = unit_of_.at(first);
  const bool backward = phase == Phase::BeforeBackward || phase == Phase::AfterBackward;
  // The buckets this unit reads (a tied output weight lives in the embedding's buckets).
  std::vector<int> buckets;
  for (Parameter* p : params) {
    if (!buffer_->contains(p)) continue;
    const int b = buffer_->bucket_of(p);
    if (std::find(buckets.begin(), buckets.end(), b) == buckets.end()) buckets.push_back(b);
  }
  auto bucket = [&](int b) -> Bucket& { return buffer_->buckets()[static_cast<std::size_t>(b)]; };
  switch (phase) {
    case Phase::BeforeForward:
    case Phase::BeforeBackward:
      if (shard_params_) {
        for (int b : buckets) gather(bucket(b));
        // The next units' gathers run while this one computes.
        prefetch(unit, backward ? -1 : +1);
        for (int b : buckets) finish_gather(bucket(b));
      }
      if (backward)
        for (int b : buckets) buffer_->materialize_grads(bucket(b));
      record(DdpEvent::Kind::UnitBegin, unit, nullptr, backward);
      break;
    case Phase::AfterForward:
    case Phase::AfterBackward:
      record(DdpEvent::Kind::UnitEnd, unit, nullptr, backward);
      if (shard_params_ && (backward || options_.reshard_after_forward))
        for (int b : buckets) release(bucket(b));
      break;
  }
}

void DataParallel::unshard() {
  if (!shard_params_) {
    finish_param_gather();
    return;
  }
  for (Bucket& b : buffer_->buckets()) gather(b);
  finish_param_gather();
  pinned_ = true;
}

void DataParallel::reshard(bool write_shards) {
  if (!shard_params_) return;
  finish_param_gather();
  pinned_ = false;
  for (Bucket& b : buffer_->buckets()) {
    if (!b.params_view.defined()) continue;
    if (write_shards) {
      const BucketShard s = shard(b);
      b.param_shard.copy_(b.params_view.narrow(0, s.offset, s.count));
    }
    release(b);
  }
}

void DataParallel::finish_param_gather() {
  for (Bucket& b : buffer_->buckets()) finish_gather(b);
}

void DataParallel::on_param_use(Parameter& param) {
  const Parameter* p = &param;
  if (!gather_on_use_ || !buffer_->contains(p)) return;  // not waited for here, or another replica's
  Bucket& bucket = buffer_->buckets()[buffer_->bucket_of(p)];
  finish_gather(bucket);
  record(DdpEvent::Kind::ParamUse, bucket.index, p);
}

// ---- replicas sharing chunks ------------------------------------------------------------------

SharedChunkHooks::SharedChunkHooks(const std::vector<ModelChunk*>& chunks,
                                   std::vector<DataParallel*> replicas)
    : chunks_(chunks), replicas_(std::move(replicas)) {
  for (DataParallel* d : replicas_)
    PARALLEL_CHECK(!d->options().install_hooks,
                   "SharedChunkHooks: a replica that installed its own hooks would lose them");
  for (ModelChunk* c : chunks_) {
    c->set_grad_ready_hook([this](Parameter& p) {
      for (DataParallel* d : replicas_) d->on_grad_ready(p);
    });
    c->set_param_use_hook([this](Parameter& p) {
      for (DataParallel* d : replicas_) d->on_param_use(p);
    });
    c->set_unit_hook([this](ModelChunk::UnitPhase phase, const std::vector<Parameter*>& params) {
      for (DataParallel* d : replicas_) d->on_unit(phase, params);
    });
  }
}

SharedChunkHooks::~SharedChunkHooks() {
  for (ModelChunk* c : chunks_) {
    c->set_grad_ready_hook(nullptr);
    c->set_param_use_hook(nullptr);
    c->set_unit_hook(nullptr);
  }
}

}  // namespace parallel
