// ParamAndGradBuffer: layout (reverse registration order, fused units kept whole, buckets, the
// distributed optimizer's alignment and padding) and re-binding of the Parameters into it.
#include "parallel/grad_buffer.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_set>
#include <utility>

#include "parallel/communicator.hpp"

namespace parallel {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

int64_t default_bucket_size(int data_parallel_size) {
  return std::max<int64_t>(40'000'000, int64_t{1'000'000} * data_parallel_size);
}

BufferLayout layout_buffer(const std::vector<int64_t>& unit_numels, const BufferOptions& options,
                           const std::vector<int>& unit_groups) {
  const int64_t bucket_size =
      options.bucket_size > 0 ? options.bucket_size : default_bucket_size(options.data_parallel_size);
  const bool dist = options.distributed_optimizer;
  const int shard_ranks = options.shard_ranks > 0 ? options.shard_ranks : options.data_parallel_size;
  const int64_t bucket_multiple = dist ? std::lcm<int64_t>(shard_ranks, 128) : 1;
  BufferLayout out;
  int64_t offset = 0, bucket_start = 0;
  bool open = false;
  auto close_bucket = [&] {
    const int64_t end = round_up(offset, bucket_multiple);
    out.bucket_numels.push_back(end - bucket_start);
    offset = bucket_start = end;
    open = false;
  };
  for (std::size_t u = 0; u < unit_numels.size(); ++u) {
    const int64_t n = unit_numels[u];
    // A bucket never spans two groups.
    if (open && !unit_groups.empty() && unit_groups[u] != unit_groups[u - 1]) close_bucket();
    // Alignment keeps every shard boundary-friendly for vectorised kernels (Megatron: 64 elements).
    if (dist) offset = round_up(offset, 64);
    out.unit_offsets.push_back(offset);
    offset += n;
    open = true;
    // Units are never split: a bucket closes once it has reached the size.
    if (offset - bucket_start >= bucket_size) close_bucket();
  }
  if (open) close_bucket();
  out.numel = offset;
  return out;
}

ParamAndGradBuffer::ParamAndGradBuffer(const std::vector<Parameter*>& params_in, BufferOptions options)
    : options_(options) {
  PARALLEL_CHECK(options_.data_parallel_size >= 1, "ParamAndGradBuffer: dp size {} < 1",
                 options_.data_parallel_size);
  PARALLEL_CHECK(options_.param_dtype == DType::F32 || options_.param_dtype == DType::BF16 ||
                     options_.param_dtype == DType::F16,
                 "ParamAndGradBuffer: parameter dtype {} is not fp32, bf16 or fp16",
                 dtype_name(options_.param_dtype));
  if (options_.bucket_size <= 0) options_.bucket_size = default_bucket_size(options_.data_parallel_size);

  std::vector<Parameter*> params;
  std::unordered_set<const Parameter*> seen;
  for (Parameter* p : params_in)
    if (seen.insert(p).second) params.push_back(p);
  PARALLEL_CHECK(!params.empty(), "ParamAndGradBuffer: no parameters");
  const Device device = params.front()->value.device();
  for (Parameter* p : params)
    PARALLEL_CHECK((p->value.dtype() == DType::F32 || p->value.dtype() == options_.param_dtype) &&
                       p->grad.dtype() == DType::F32 && p->value.is_contiguous() && p->grad.is_contiguous() &&
                       p->value.device() == device,
                   "ParamAndGradBuffer: {} must be contiguous on {} with an fp32 gradient and an fp32 or {} "
                   "value (got {})",
                   p->name, device.str(), dtype_name(options_.param_dtype), dtype_name(p->value.dtype()));

  const bool dist = options_.distributed_optimizer;
  if (options_.shard_ranks <= 0) options_.shard_ranks = options_.data_parallel_size;
  PARALLEL_CHECK(!options_.shard_grads || dist,
                 "ParamAndGradBuffer: sharded gradients need the distributed optimizer's layout");
  PARALLEL_CHECK(!options_.shard_params || options_.shard_grads,
                 "ParamAndGradBuffer: sharded parameters need sharded gradients");
  PARALLEL_CHECK(options_.shard_rank >= 0 && options_.shard_rank < options_.shard_ranks,
                 "ParamAndGradBuffer: shard rank {} of {}", options_.shard_rank, options_.shard_ranks);
  device_ = device;

  // Backward produces gradients roughly in reverse registration order: laying the buffer out that
  // way lets the first buckets complete (and start reducing) while the backward is still running.
  // With groups, each group's units stay together (reverse group order, reverse registration order
  // inside a group) and buckets are cut at group boundaries.
  auto units = fused_units(params, "ParamAndGradBuffer");
  std::reverse(units.begin(), units.end());
  std::vector<int> unit_groups;
  if (!options_.groups.empty()) {
    std::unordered_map<const Parameter*, int> group_of;
    for (std::size_t g = 0; g < options_.groups.size(); ++g)
      for (Parameter* p : options_.groups[g]) group_of.emplace(p, static_cast<int>(g));
    std::vector<int> groups_in(units.size());
    for (std::size_t u = 0; u < units.size(); ++u) {
      for (Parameter* p : units[u])
        PARALLEL_CHECK(group_of.count(p) && group_of.at(p) == group_of.at(units[u].front()),
                       "ParamAndGradBuffer: {} is in no group, or fused parts are in two", p->name);
      groups_in[u] = group_of.at(units[u].front());
    }
    std::vector<std::size_t> order(units.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return groups_in[a] > groups_in[b]; });
    std::vector<std::vector<Parameter*>> sorted;
    for (std::size_t i : order) {
      sorted.push_back(std::move(units[i]));
      unit_groups.push_back(groups_in[i]);
    }
    units = std::move(sorted);
  }
  std::vector<int64_t> unit_numels;
  for (const auto& unit : units) {
    int64_t n = 0;
    for (Parameter* p : unit) n += p->numel();
    unit_numels.push_back(n);
  }
  const BufferLayout layout = layout_buffer(unit_numels, options_, unit_groups);
  int64_t bucket_start = 0;
  for (std::size_t b = 0; b < layout.bucket_numels.size(); ++b) {
    Bucket bucket;
    bucket.index = static_cast<int>(b);
    bucket.offset = bucket_start;
    bucket.numel = layout.bucket_numels[b];
    buckets_.push_back(std::move(bucket));
    bucket_start += layout.bucket_numels[b];
  }
  int b = 0;  // the unit's bucket: the last one starting at or before it (offsets only grow)
  for (std::size_t u = 0; u < units.size(); ++u) {
    int64_t offset = layout.unit_offsets[u];
    while (b + 1 < static_cast<int>(buckets_.size()) && buckets_[b + 1].offset <= offset) ++b;
    if (!unit_groups.empty()) buckets_[b].group = unit_groups[u];
    for (Parameter* p : units[u]) {
      index_[p] = {offset, b, p->numel(), p->value.shape()};
      layout_.push_back(p);
      buckets_[b].params.push_back(p);
      offset += p->numel();
      numel_unpadded_ += p->numel();
    }
  }
  numel_ = layout.numel;
  const int k = options_.shard_ranks;
  auto shard_of = [&](const Tensor& full, const Bucket& b) {
    const Chunk c = chunk_of(b.numel, k, options_.shard_rank);
    return full.narrow(0, c.offset, c.count);
  };
  // Sharded storage: bucket b's shard sits at b.offset / k (every bucket is a multiple of k).
  auto shard_storage = [&](const Tensor& storage, const Bucket& b) {
    return storage.narrow(0, b.offset / k, b.numel / k);
  };
  if (options_.shard_params) {
    param_shards_ = Tensor::zeros({numel_ / k}, options_.param_dtype, device);
    for (Bucket& b : buckets_) {
      // The own shard of the full bucket, one bucket at a time: never the whole model at once.
      Tensor full = Tensor::zeros({b.numel}, options_.param_dtype, device);
      for (Parameter* p : b.params)
        full.narrow(0, index_[p].offset - b.offset, p->numel()).copy_(p->value.flatten());
      b.param_shard = shard_storage(param_shards_, b);
      b.param_shard.copy_(shard_of(full, b));
      for (Parameter* p : b.params) p->value = Tensor();
    }
  } else {
    params_ = Tensor::zeros({numel_}, options_.param_dtype, device);
    for (Parameter* p : layout_) {
      const Location& at = index_[p];
      Tensor value = params_.narrow(0, at.offset, at.numel);
      value.copy_(p->value.flatten());  // rounds fp32 values into a 16-bit buffer
      p->value = value.view(at.shape);
    }
    for (Bucket& b : buckets_) {
      b.params_view = params_.narrow(0, b.offset, b.numel);
      if (dist) b.param_shard = shard_of(b.params_view, b);
    }
  }
  if (options_.shard_grads) {
    // A step starts from zero gradients: whatever the Parameters held is dropped.
    grad_shards_ = Tensor::zeros({numel_ / k}, DType::F32, device);
    for (Bucket& b : buckets_) b.grad_shard = shard_storage(grad_shards_, b);
    for (Parameter* p : layout_) p->grad = Tensor();
  } else {
    grads_ = Tensor::zeros({numel_}, DType::F32, device);
    for (Parameter* p : layout_) {
      const Location& at = index_[p];
      Tensor grad = grads_.narrow(0, at.offset, at.numel);
      grad.copy_(p->grad.flatten());
      p->grad = grad.view(at.shape);
    }
    for (Bucket& b : buckets_) {
      b.grads_view = grads_.narrow(0, b.offset, b.numel);
      if (dist) b.grad_shard = shard_of(b.grads_view, b);
    }
  }
}

void ParamAndGradBuffer::zero_grads() {
  if (!options_.shard_grads) {
    grads_.zero_();
    return;
  }
  grad_shards_.zero_();
  for (Bucket& b : buckets_)
    if (b.grads_view.defined()) b.grads_view.zero_();
}

void ParamAndGradBuffer::materialize_params(Bucket& b) {
  PARALLEL_CHECK(options_.shard_params, "ParamAndGradBuffer: parameters are not sharded");
  if (b.params_view.defined()) return;
  b.params_view = Tensor::empty({b.numel}, options_.param_dtype, device_);
  for (Parameter* p : b.params) {
    const Location& at = index_.at(p);
    p->value = b.params_view.narrow(0, at.offset - b.offset, at.numel).view(at.shape);
  }
}

Tensor ParamAndGradBuffer::release_params(Bucket& b) {
  PARALLEL_CHECK(options_.shard_params, "ParamAndGradBuffer: parameters are not sharded");
  for (Parameter* p : b.params) p->value = Tensor();
  return std::exchange(b.params_view, Tensor());
}

void ParamAndGradBuffer::materialize_grads(Bucket& b) {
  PARALLEL_CHECK(options_.shard_grads, "ParamAndGradBuffer: gradients are not sharded");
  if (b.grads_view.defined()) return;
  b.grads_view = Tensor::zeros({b.numel}, DType::F32, device_);
  for (Parameter* p : b.params) {
    const Location& at = index_.at(p);
    p->grad = b.grads_view.narrow(0, at.offset - b.offset, at.numel).view(at.shape);
  }
}

Tensor ParamAndGradBuffer::release_grads(Bucket& b) {
  PARALLEL_CHECK(options_.shard_grads, "ParamAndGradBuffer: gradients are not sharded");
  for (Parameter* p : b.params) p->grad = Tensor();
  return std::exchange(b.grads_view, Tensor());
}

}  // namespace parallel
