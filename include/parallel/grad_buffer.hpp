#pragma once
// ParamAndGradBuffer (Megatron-Core's param_and_grad_buffer): every parameter of a model replica
// (all chunks on this rank) lives in one contiguous parameter buffer and one contiguous fp32
// gradient buffer, laid out in reverse registration order (the order backward produces gradients)
// and cut into buckets that data parallelism reduces one at a time.
//
// After construction each Parameter's value and grad are views into the buffers (existing values are
// copied in). Parameters that already share one storage (a ColumnParallelLinear's fused q/k/v or
// gate/up parts) form one unit: they are placed back to back in their original order so that the
// layer's single fused GEMM operand still spans them (docs/optimizer.md).
//
// Precision: the parameter buffer holds `param_dtype` (fp32, bf16 or fp16) and the Parameters'
// values are views into it: under bf16/fp16 the model computes on exactly these 16-bit values
// (precision.hpp), which the optimizer writes from its fp32 main weights once per step and the
// distributed optimizer all-gathers in 16 bits. Gradients are always fp32.
//
// Sharded storage (optimizer.sharding, docs/optimizer.md): with shard_grads the buffer holds only
// this rank's shard of every bucket's gradients; a bucket's full-size gradient exists only between
// materialize_grads() and release_grads() (one micro-batch's backward of its unit). With
// shard_params it holds only this rank's shard of the parameters too; a bucket's full parameters
// exist between materialize_params() and release_params(), and the Parameters' values (grads) are
// undefined Tensors while their bucket's full parameters (gradients) are released. Buckets then
// follow `groups` (a bucket never spans two), so that a model unit's parameters can be gathered
// and reduced on their own.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "parallel/parameter.hpp"

namespace parallel {

// Megatron's default bucket size in elements: max(40M, 1M * dp).
int64_t default_bucket_size(int data_parallel_size);

struct BufferOptions {
  DType param_dtype = DType::F32;  // F32, BF16 or F16
  int64_t bucket_size = 0;         // elements; <= 0: default_bucket_size(data_parallel_size)
  int data_parallel_size = 1;
  // The distributed optimizer's layout: every unit starts on a 64-element boundary and every
  // bucket is padded to a multiple of lcm(dp, 128), so each dp rank owns an equal contiguous shard.
  bool distributed_optimizer = false;
  // Ranks sharing the shards and this rank's index among them (HSDP: the sharding group; else dp).
  // 0 for shard_ranks: data_parallel_size.
  int shard_ranks = 0;
  int shard_rank = 0;
  bool shard_grads = false;   // ZeRO-2 and 3 (needs distributed_optimizer)
  bool shard_params = false;  // ZeRO-3 (needs shard_grads)
  // Non-empty: every parameter in exactly one group, groups in registration order; buckets are cut
  // at group boundaries, laid out in reverse group order (and reverse registration order inside).
  std::vector<std::vector<Parameter*>> groups;
};

// Where each unit (a parameter, or the parameters of one fused storage) lands in the buffers: the
// layout rule alone, without tensors, so that the memory plan (memory_plan.hpp) sizes the buffers
// exactly as the constructor below lays them out. `unit_numels` in layout order.
struct BufferLayout {
  std::vector<int64_t> unit_offsets;   // first element of each unit
  std::vector<int64_t> bucket_numels;  // padded sizes, in order
  int64_t numel = 0;                   // padded total
};
// `unit_groups` (empty, or one group id per unit): a bucket also closes where the group changes.
BufferLayout layout_buffer(const std::vector<int64_t>& unit_numels, const BufferOptions& options,
                           const std::vector<int>& unit_groups = {});

struct Bucket {
  int index = 0;
  int64_t offset = 0;              // first element in the buffers
  int64_t numel = 0;               // padded size (a multiple of lcm(dp, 128) with the distributed optimizer)
  std::vector<Parameter*> params;  // in layout order
  Tensor params_view;              // [numel] view of the parameter buffer (param_dtype)
  Tensor grads_view;               // [numel] view of the fp32 gradient buffer
  int group = -1;                  // index into BufferOptions::groups; -1 without groups
  // This rank's shard [numel / shard_ranks] (distributed optimizer only): views of the full
  // buffers, or of the sharded storage with shard_grads / shard_params.
  Tensor param_shard, grad_shard;
};

class ParamAndGradBuffer {
 public:
  // `params` in registration order (duplicates are ignored). Values fp32 or param_dtype (copied in,
  // rounded), gradients fp32, all on one device.
  ParamAndGradBuffer(const std::vector<Parameter*>& params, BufferOptions options);
  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  const BufferOptions& options() const { return options_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::vector<Bucket>& buckets() { return buckets_; }
  // Parameters in layout order (reverse registration order, fused units kept in order).
  const std::vector<Parameter*>& params() const { return layout_; }
  bool contains(const Parameter* p) const { return index_.count(p) > 0; }
  int64_t offset_of(const Parameter* p) const { return index_.at(p).offset; }
  int bucket_of(const Parameter* p) const { return index_.at(p).bucket; }
  int64_t numel_of(const Parameter* p) const { return index_.at(p).numel; }

  bool grads_sharded() const { return options_.shard_grads; }
  bool params_sharded() const { return options_.shard_params; }
  // Sharded storage: allocates the bucket's full parameters (uninitialised) or gradients (zeroed)
  // and points its Parameters' values or grads into them.
  void materialize_params(Bucket& bucket);
  void materialize_grads(Bucket& bucket);
  // The reverse: the Parameters' values or grads become undefined; returns the full tensor (which
  // a caller may keep alive, e.g. for a reduction still in flight).
  Tensor release_params(Bucket& bucket);
  Tensor release_grads(Bucket& bucket);

  int64_t numel() const { return numel_; }                    // padded
  int64_t numel_unpadded() const { return numel_unpadded_; }  // sum of parameter sizes
  // The full buffers; undefined with shard_params / shard_grads (see the buckets' views).
  Tensor& param_data() { return params_; }  // [numel] param_dtype
  Tensor& grad_data() { return grads_; }    // [numel] fp32
  Device device() const { return device_; }
  // bf16/fp16 parameters: the optimizer keeps fp32 main weights apart from this buffer.
  bool low_precision() const { return options_.param_dtype != DType::F32; }
  void zero_grads();  // the full gradients, or the shards and any materialised full ones

 private:
  struct Location {
    int64_t offset = 0;
    int bucket = 0;
    int64_t numel = 0;
    Shape shape;
  };
  BufferOptions options_;
  std::vector<Parameter*> layout_;
  std::unordered_map<const Parameter*, Location> index_;
  std::vector<Bucket> buckets_;
  int64_t numel_ = 0, numel_unpadded_ = 0;
  Tensor params_, grads_;
  Tensor param_shards_, grad_shards_;  // sharded storage: every bucket's shard, bucket after bucket
  Device device_ = Device::cpu();
};

}  // namespace parallel
