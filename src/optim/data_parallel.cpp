// DataParallel: bucketed, optionally overlapped gradient averaging over the dp group, and the
// distributed optimizer's parameter all-gather.
#include "parallel/data_parallel.hpp"

#include "parallel/gpt_model.hpp"
#include "parallel/ops.hpp"
#include "parallel/precision.hpp"

namespace parallel {
namespace {

std::vector<Parameter*> chunk_params(const std::vector<GPTModel*>& chunks) {
  std::vector<Parameter*> out;
  for (GPTModel* c : chunks)
    for (Parameter* p : c->parameters()) out.push_back(p);
  return out;
}

}  // namespace

DataParallelOptions DataParallelOptions::from(const OptimizerConfig& o, Precision precision) {
  DataParallelOptions d;
  d.overlap_grad_reduce = o.overlap_grad_reduce;
  d.overlap_param_gather = o.overlap_param_gather && o.distributed;
  d.distributed_optimizer = o.distributed;
  d.bucket_size = o.bucket_size;
  d.precision = precision;
  return d;
}

DataParallel::DataParallel(const std::vector<GPTModel*>& chunks, Communicator& dp,
                           DataParallelOptions options)
    : DataParallel(chunk_params(chunks), dp, options) {
  chunks_ = chunks;
  for (GPTModel* c : chunks_) c->set_grad_ready_hook([this](Parameter& p) { on_grad_ready(p); });
  if (options_.overlap_param_gather && options_.distributed_optimizer) {
    gather_on_use_ = true;
    for (GPTModel* c : chunks_) c->set_param_use_hook([this](Parameter& p) { on_param_use(p); });
  }
}

DataParallel::DataParallel(const std::vector<Parameter*>& params, Communicator& dp,
                           DataParallelOptions options)
    : dp_(dp), options_(options) {
  std::unordered_set<const Parameter*> seen;
  for (Parameter* p : params)
    if (seen.insert(p).second) params_.push_back(p);
  BufferOptions b;
  b.param_dtype = compute_dtype(options_.precision);
  b.bucket_size = options_.bucket_size;
  b.data_parallel_size = dp.size();
  b.distributed_optimizer = options_.distributed_optimizer;
  buffer_ = std::make_unique<ParamAndGradBuffer>(params_, b);
  const std::size_t n = buffer_->buckets().size();
  ready_count_.assign(n, 0);
  reduce_work_.assign(n, nullptr);
  gather_work_.assign(n, nullptr);
}

DataParallel::~DataParallel() {
  for (GPTModel* c : chunks_) {
    c->set_grad_ready_hook(nullptr);
    c->set_param_use_hook(nullptr);
  }
  // Nothing may still write into the buffers once they are gone.
  for (auto& w : reduce_work_)
    if (w) w->wait();
  for (auto& w : gather_work_)
    if (w) w->wait();
}

void DataParallel::record(DdpEvent::Kind kind, int bucket, const Parameter* param) {
  if (record_) events_.push_back({kind, bucket, param, std::chrono::steady_clock::now()});
}

void DataParallel::zero_grad() {
  if (!gather_on_use_) finish_param_gather();
  buffer_->zero_grads();
  ready_.clear();
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
}

BucketShard DataParallel::shard(const Bucket& bucket) const {
  const Chunk c = chunk_of(bucket.numel, dp_.size(), dp_.rank());
  return {c.offset, c.count};
}

void DataParallel::launch_reduce(Bucket& bucket) {
  // Average, not sum: scaling before the reduction keeps bf16/fp16 reductions in range, as Megatron.
  if (dp_.size() > 1) ops::scale_(bucket.grads_view, 1.0f / static_cast<float>(dp_.size()));
  if (dp_.size() == 1) {
    reduce_work_[bucket.index] = completed_work();
  } else if (options_.distributed_optimizer) {
    const BucketShard s = shard(bucket);
    Tensor mine = bucket.grads_view.narrow(0, s.offset, s.count);
    reduce_work_[bucket.index] = dp_.reduce_scatter(bucket.grads_view, mine, ReduceOp::Sum, /*async=*/true);
  } else {
    reduce_work_[bucket.index] = dp_.all_reduce(bucket.grads_view, ReduceOp::Sum, /*async=*/true);
  }
  record(DdpEvent::Kind::ReduceLaunched, bucket.index);
}

void DataParallel::on_grad_ready(Parameter& param) {
  if (!options_.overlap_grad_reduce || !is_last_microbatch_) return;
  const Parameter* p = &param;
  if (!buffer_->contains(p)) return;  // not part of this replica (e.g. another DDP's chunk)
  // Gradients that other groups must still sum (tied embeddings over the embedding group,
  // sequence-parallel norms over tp: finalize_grads) are not final yet; their buckets are reduced
  // in finish_grad_sync, which the caller runs after finalize_grads.
  if (param.sequence_parallel_grad || param.shared_across_pipeline) return;
  record(DdpEvent::Kind::GradReady, -1, p);
  const int b = buffer_->bucket_of(p);
  PARALLEL_CHECK(ready_.insert(p).second,
                 "DataParallel: {} received a gradient after its bucket's reduction could start; call "
                 "set_is_last_microbatch(false) before every micro-batch but the last",
                 param.name);
  Bucket& bucket = buffer_->buckets()[b];
  if (++ready_count_[b] == static_cast<int>(bucket.params.size())) launch_reduce(bucket);
}

void DataParallel::finish_grad_sync() {
  for (Bucket& b : buffer_->buckets())
    if (!reduce_work_[b.index]) launch_reduce(b);
  for (Bucket& b : buffer_->buckets()) {
    reduce_work_[b.index]->wait();
    reduce_work_[b.index] = nullptr;
    record(DdpEvent::Kind::ReduceDone, b.index);
  }
  ready_.clear();
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
}

void DataParallel::start_param_gather(bool async) {
  PARALLEL_CHECK(options_.distributed_optimizer,
                 "DataParallel: parameter all-gather needs the distributed optimizer");
  for (Bucket& b : buffer_->buckets()) {
    if (gather_work_[b.index]) gather_work_[b.index]->wait();
    if (dp_.size() == 1) {
      gather_work_[b.index] = completed_work();
    } else {
      // The shard already sits in its slot of the bucket: an in-place all-gather.
      const BucketShard s = shard(b);
      const Tensor mine = b.params_view.narrow(0, s.offset, s.count);
      gather_work_[b.index] = dp_.all_gather(mine, b.params_view, async);
    }
    record(DdpEvent::Kind::GatherLaunched, b.index);
  }
  if (!async) finish_param_gather();
}

void DataParallel::finish_gather(Bucket& bucket) {
  if (!gather_work_[bucket.index]) return;
  gather_work_[bucket.index]->wait();
  gather_work_[bucket.index] = nullptr;
  record(DdpEvent::Kind::GatherDone, bucket.index);
}

void DataParallel::finish_param_gather() {
  for (Bucket& b : buffer_->buckets()) finish_gather(b);
}

void DataParallel::on_param_use(Parameter& param) {
  const Parameter* p = &param;
  if (!buffer_->contains(p)) return;  // not part of this replica
  Bucket& bucket = buffer_->buckets()[buffer_->bucket_of(p)];
  finish_gather(bucket);
  record(DdpEvent::Kind::ParamUse, bucket.index, p);
}

}  // namespace parallel
