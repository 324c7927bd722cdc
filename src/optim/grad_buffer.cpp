// ParamAndGradBuffer: layout (reverse registration order, fused units kept whole, buckets, the
// distributed optimizer's alignment and padding) and re-binding of the Parameters into it.
#include "parallel/grad_buffer.hpp"

#include <algorithm>
#include <numeric>
#include <unordered_set>

namespace parallel {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

int64_t default_bucket_size(int data_parallel_size) {
  return std::max<int64_t>(40'000'000, int64_t{1'000'000} * data_parallel_size);
}

BufferLayout layout_buffer(const std::vector<int64_t>& unit_numels, const BufferOptions& options) {
  const int64_t bucket_size =
      options.bucket_size > 0 ? options.bucket_size : default_bucket_size(options.data_parallel_size);
  const bool dist = options.distributed_optimizer;
  const int64_t bucket_multiple = dist ? std::lcm<int64_t>(options.data_parallel_size, 128) : 1;
  BufferLayout out;
  int64_t offset = 0, bucket_start = 0;
  bool open = false;
  auto close_bucket = [&] {
    const int64_t end = round_up(offset, bucket_multiple);
    out.bucket_numels.push_back(end - bucket_start);
    offset = bucket_start = end;
    open = false;
  };
  for (const int64_t n : unit_numels) {
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

  // Backward produces gradients roughly in reverse registration order: laying the buffer out that
  // way lets the first buckets complete (and start reducing) while the backward is still running.
  auto units = fused_units(params, "ParamAndGradBuffer");
  std::reverse(units.begin(), units.end());
  std::vector<int64_t> unit_numels;
  for (const auto& unit : units) {
    int64_t n = 0;
    for (Parameter* p : unit) n += p->numel();
    unit_numels.push_back(n);
  }
  const BufferLayout layout = layout_buffer(unit_numels, options_);
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
    for (Parameter* p : units[u]) {
      index_[p] = {offset, b};
      layout_.push_back(p);
      buckets_[b].params.push_back(p);
      offset += p->numel();
      numel_unpadded_ += p->numel();
    }
  }
  numel_ = layout.numel;
  params_ = Tensor::zeros({numel_}, options_.param_dtype, device);
  grads_ = Tensor::zeros({numel_}, DType::F32, device);
  for (Parameter* p : layout_) {
    const int64_t off = index_[p].offset, n = p->numel();
    Tensor value = params_.narrow(0, off, n);
    value.copy_(p->value.flatten());  // rounds fp32 values into a 16-bit buffer
    Tensor grad = grads_.narrow(0, off, n);
    grad.copy_(p->grad.flatten());
    const Shape shape = p->value.shape();
    p->value = value.view(shape);
    p->grad = grad.view(shape);
  }
  for (Bucket& b : buckets_) {
    b.params_view = params_.narrow(0, b.offset, b.numel);
    b.grads_view = grads_.narrow(0, b.offset, b.numel);
  }
}

}  // namespace parallel
