#pragma once
// Data parallelism (Megatron-Core's DistributedDataParallel): the model replica's parameters and
// gradients live in a ParamAndGradBuffer; gradients are averaged over the dp group bucket by bucket,
// by all-reduce (plain optimizer) or reduce-scatter (distributed optimizer: each rank keeps only its
// shard of every bucket's reduced gradient).
//
// With overlap_grad_reduce a bucket's reduction starts as soon as its gradients are final: the model
// calls the grad-ready hook after each parameter's last contribution of a backward pass, and only the
// last micro-batch of a step counts (set_is_last_microbatch(false) before the earlier micro-batches'
// backward, true before the last one's). finish_grad_sync() launches what has not been launched and
// waits for everything. Without overlap every reduction happens in finish_grad_sync(). Parameters
// whose gradients other groups still sum (sequence_parallel_grad, shared_across_pipeline) never
// start their bucket early: finalize_grads must run first, and the distributed optimizer's shards of
// a tied embedding differ between the first and last stage, so reducing before finalising is wrong.
//
// A training step:
//   ddp.zero_grad();
//   for each micro-batch m: ddp.set_is_last_microbatch(m == last); forward; backward;
//   finalize_grads(params, state);   // tied embeddings over the embedding group, SP norms over tp
//   ddp.finish_grad_sync();
//   optimizer.step(lr);                                // all-gathers params (distributed optimizer)
//
// With overlap_param_gather the all-gathers launched by step() are left in flight: the chunk
// constructor installs a parameter-use hook, so the next forward waits for a bucket's gather only
// right before the first layer that uses one of its parameters, and the later buckets' gathers
// overlap the earlier layers' compute. Built from a parameter list (no hook), zero_grad() waits
// for all of them instead. Anything else that reads or writes the parameters in between
// (optimizer step, checkpoint save/load) calls finish_param_gather() first.
//
// Sharding beyond the optimizer state (optimizer.sharding, docs/optimizer.md) needs model chunks:
// buckets then follow the chunks' units (ModelChunk::units(); parameters whose gradients other
// groups still sum form their own buckets) and the unit hook drives everything:
//   optim_grads (ZeRO-2): before a unit's backward its buckets get zeroed full-size gradients; once
//     a bucket's gradients are final for the micro-batch it is reduce-scattered (async) and the
//     full-size gradient released; the result is added to this rank's persistent gradient shard.
//     So with accumulation every micro-batch reduces (the full gradient never exists for the whole
//     model); is_last_microbatch and overlap_grad_reduce do not apply.
//   optim_grads_params (ZeRO-3 / FSDP): parameters too are stored as shards. Before a unit's
//     forward (backward) its buckets are all-gathered (waiting for a prefetched gather if one is in
//     flight) and the gathers of the next `prefetch_units` units of the same chunk (previous, in
//     backward) are started; after its forward (with reshard_after_forward) and after its backward
//     the gathered parameters are freed. Parameter values are undefined Tensors outside a unit's
//     compute: call unshard() before reading them (checkpoints), reshard() after.
// HSDP (sharding_group_size k < dp): shards are 1/k of a bucket; gradients are reduce-scattered in
// the group of k consecutive dp ranks and the shard all-reduced across the dp / k groups;
// parameters are gathered inside the group.
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/grad_buffer.hpp"
#include "parallel/model_chunk.hpp"

namespace parallel {

struct DataParallelOptions {
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;  // distributed optimizer only
  bool distributed_optimizer = false;
  int64_t bucket_size = 0;                // elements; 0: max(40M, 1M * dp)
  Precision precision = Precision::FP32;  // dtype of the parameter buffer; grads are always fp32
  // Optim: the distributed optimizer (same as distributed_optimizer). OptimGrads, OptimGradsParams:
  // see above. from() keeps distributed_optimizer == (sharding != None).
  Sharding sharding = Sharding::None;
  int sharding_group_size = 0;  // 0: all of dp
  bool reshard_after_forward = true;
  int prefetch_units = 1;
  // Which of the chunks' parameters this replica holds (MoE: experts are reduced, and sharded, over
  // the expert-dp group, dense parameters over dp x cp, each by its own DataParallel).
  enum class Params { All, Dense, Experts } params = Params::All;
  // Built from model chunks: whether the constructor installs its hooks on them. A chunk has one
  // slot per hook, so replicas that share chunks (MoE's dense and expert replicas) are built with
  // false and served by one SharedChunkHooks, which calls each replica in turn.
  bool install_hooks = true;
  // Gradients are divided by this many ranks before the sum over the group (0: the group's size).
  // Expert gradients summed over expert-dp are averaged over the dense dp x cp size, since each
  // expert already received the tokens of the ep ranks (Megatron's expert_gradient_scaling_factor).
  int average_over = 0;

  static DataParallelOptions from(const OptimizerConfig& optimizer, Precision precision);
  // MoE: the expert replica's options from the dense replica's (dense_ranks = dp x cp, expert_ranks
  // = expert-dp): experts only, sharded in the same mode, gradients averaged over dense_ranks, and
  // under HSDP the dense replica count kept (dense_ranks / sharding_group_size replicas, so the
  // experts shard over expert_ranks / that many; config.cpp checks it divides), as Megatron's
  // distributed optimizer instances do.
  DataParallelOptions for_experts(int dense_ranks, int expert_ranks) const;
};

// What DDP did and when: the overlap test and benchmark read this log.
struct DdpEvent {
  // UnitBegin / UnitEnd: a unit's forward or backward compute (sharded parameters only).
  enum class Kind {
    GradReady,
    ReduceLaunched,
    ReduceDone,
    GatherLaunched,
    GatherDone,
    ParamUse,
    UnitBegin,
    UnitEnd,
    ParamsReleased,
    BucketReduced  // the bucket-reduced hook ran (the optimizer's overlapped update)
  };
  Kind kind;
  int bucket = -1;                   // -1 for GradReady; the unit for UnitBegin / UnitEnd
  const Parameter* param = nullptr;  // GradReady and ParamUse only
  bool backward = false;             // UnitBegin / UnitEnd
  std::chrono::steady_clock::time_point time;
};

// This rank's part of a bucket under the distributed optimizer: [offset, offset + count) relative
// to the bucket start.
struct BucketShard {
  int64_t offset = 0;
  int64_t count = 0;
};

class DataParallel {
 public:
  // Lays out every chunk's parameters (chunks in order, each in its parameters() order) and hooks
  // the chunks' backward (and, with overlap_param_gather, their forward). The chunks must outlive
  // this object; the destructor removes the hooks.
  DataParallel(const std::vector<ModelChunk*>& chunks, Communicator& dp, DataParallelOptions options);
  template <std::derived_from<ModelChunk> Chunk>
  DataParallel(const std::vector<Chunk*>& chunks, Communicator& dp, DataParallelOptions options)
      : DataParallel(std::vector<ModelChunk*>(chunks.begin(), chunks.end()), dp, options) {}
  // Without a model: no grad-ready hooks (call on_grad_ready yourself, or do not overlap).
  DataParallel(const std::vector<Parameter*>& params, Communicator& dp, DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Zeroes the gradient buffer. Waits for any parameter all-gather still in flight, unless the
  // parameter-use hook is installed (overlap_param_gather with model chunks): the forward waits.
  void zero_grad();
  void set_is_last_microbatch(bool last) { is_last_microbatch_ = last; }
  // The hooks' targets. Each ignores parameters outside this replica's buffer, and what this
  // replica's mode does not use (the unit hook without sharded gradients, the parameter-use hook
  // unless the forward waits for overlapped gathers), so a shared hook may call every replica.
  // The grad-ready hook's target.
  void on_grad_ready(Parameter& param);
  // The parameter-use hook's target: waits for the all-gather of the parameter's bucket if one is
  // in flight (once per bucket) and records ParamUse.
  void on_param_use(Parameter& param);
  // Launches every bucket not yet launched and waits for all of them: gradients are then averaged
  // over dp (all of them, or this rank's shards with the distributed optimizer).
  void finish_grad_sync();

  // The overlapped optimizer update's hook (optimizer.hpp, docs/optimizer.md#the-overlapped-update):
  // called once per bucket and step with the bucket's index, as soon as its reduction is complete
  // and its gradients (this rank's shard under the distributed optimizer) are final for the step.
  // Reductions complete in the order they were launched, alike on every rank, so whatever the hook
  // issues (the distributed optimizer's all-gather) is issued in one order everywhere:
  //   - during_backward: when a bucket's reduction is launched in the backward (only the last
  //     micro-batch's, overlap_grad_reduce), the one launched before it is completed and reported;
  //     ZeRO-2/3 report a bucket when its last micro-batch's reduction lands.
  //   - otherwise (pipeline schedules) nothing is reported before finish_grad_sync().
  // finish_grad_sync() then reports every bucket not yet reported, each right after its
  // reduction completes, before the later ones are waited for. A gradient for a reported bucket
  // throws. An empty hook turns it off.
  using BucketReducedHook = std::function<void(int bucket)>;
  void set_bucket_reduced_hook(BucketReducedHook hook, bool during_backward);

  // Distributed optimizer: all-gathers every bucket's parameters from the ranks' shards, and widens
  // the low-precision parameters into the fp32 working copy. async: returns after launching.
  void start_param_gather(bool async);
  void finish_param_gather();  // idempotent
  // The same for one bucket (the overlapped update gathers each bucket once it is updated).
  void start_param_gather(Bucket& bucket, bool async);
  void finish_param_gather(Bucket& bucket);  // idempotent

  // Sharded parameters: gathers every bucket and keeps them until reshard() (checkpoints read and
  // write the values). Otherwise finish_param_gather().
  void unshard();
  // Sharded parameters: frees every gathered bucket; write_shards first copies this rank's part of
  // the full values into its shard (after new values were loaded into them). Otherwise nothing.
  void reshard(bool write_shards = false);
  // The unit hook's target (ModelChunk::set_unit_hook): acts on the unit's parameters in this buffer.
  void on_unit(ModelChunk::UnitPhase phase, const std::vector<Parameter*>& params);
  // Bytes of gathered (full) parameter buckets now and at most since construction (sharded
  // parameters only; the shards themselves are not counted).
  int64_t gathered_param_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_param_bytes() const { return peak_gathered_bytes_; }
  // The buckets holding each unit's parameters (all chunks, in order; sharded gradients only).
  const std::vector<std::vector<int>>& unit_buckets() const { return unit_buckets_; }

  BucketShard shard(const Bucket& bucket) const;
  ParamAndGradBuffer& buffer() { return *buffer_; }
  Communicator& dp() { return dp_; }
  // The ranks that share shards (HSDP: this rank's group of sharding_group_size; else dp) and the
  // ranks holding the same shard (null without HSDP).
  Communicator& shard_group() { return *shard_; }
  Communicator* replica_group() { return replica_; }
  const DataParallelOptions& options() const { return options_; }
  // Every parameter of the replica, in registration order.
  const std::vector<Parameter*>& params() const { return params_; }

  std::vector<DdpEvent>& events() { return events_; }
  void set_record_events(bool on) { record_ = on; }

 private:
  void launch_reduce(Bucket& bucket);
  void complete_reduce(Bucket& bucket);  // waits; HSDP: all-reduces the shard across groups
  void complete_oldest_sharded_reduce();
  void report_reduced(int bucket);     // the bucket's gradients are final: the hook, if allowed now
  void finish_gather(Bucket& bucket);  // waits for the bucket's in-flight gather, if any
  void gather(Bucket& bucket);         // sharded parameters: starts the bucket's gather if released
  void release(Bucket& bucket);        // sharded parameters: frees the gathered bucket
  void prefetch(int unit, int direction);
  void record(DdpEvent::Kind kind, int bucket, const Parameter* param = nullptr, bool backward = false);
  void set_up_units();
  void build(const std::vector<Parameter*>& params, std::vector<std::vector<Parameter*>> groups);

  Communicator& dp_;
  DataParallelOptions options_;
  std::unique_ptr<Communicator> shard_owned_, replica_owned_;
  Communicator* shard_ = nullptr;
  Communicator* replica_ = nullptr;
  bool shard_grads_ = false, shard_params_ = false;
  // Sharded gradients: reductions in flight (the full gradient and the reduced shard they fill).
  struct ShardedReduce {
    int bucket;
    WorkHandle work;
    Tensor full, out;
    bool last = false;  // launched in the last micro-batch's backward: the bucket's final reduction
  };
  std::vector<ShardedReduce> reducing_;
  std::vector<std::vector<int>> unit_buckets_;  // per unit
  std::vector<int> unit_chunk_;                 // per unit
  std::unordered_map<const Parameter*, int> unit_of_;
  bool pinned_ = false;  // unshard(): nothing is released until reshard()
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
  std::vector<ModelChunk*> chunks_;
  std::vector<Parameter*> params_;
  std::unique_ptr<ParamAndGradBuffer> buffer_;
  bool is_last_microbatch_ = true;
  bool gather_on_use_ = false;  // the parameter-use hook waits for the gathers
  std::unordered_set<const Parameter*> ready_;
  std::vector<int> ready_count_;
  std::vector<WorkHandle> reduce_work_;  // per bucket; null: not in flight
  std::vector<char> launched_;           // per bucket: reduction launched this step (unsharded)
  std::vector<int> pending_;             // launched, not yet completed, in launch order (unsharded)
  BucketReducedHook reduced_hook_;
  bool hook_during_backward_ = false;
  bool finishing_ = false;               // inside finish_grad_sync()
  std::vector<char> final_;              // per bucket: gradients final this step
  std::vector<char> reported_;           // per bucket: the hook saw it this step
  std::vector<WorkHandle> gather_work_;  // per bucket; null: nothing in flight
  bool record_ = false;
  std::vector<DdpEvent> events_;
};

// One hook per chunk slot (grad-ready, parameter-use, unit) that calls every replica in order,
// for DataParallels built from the same chunks with install_hooks = false (MoE: the dense replica
// over dp x cp and the expert replica over expert-dp). The chunks and replicas must outlive it;
// the destructor removes the hooks.
class SharedChunkHooks {
 public:
  SharedChunkHooks(const std::vector<ModelChunk*>& chunks, std::vector<DataParallel*> replicas);
  template <std::derived_from<ModelChunk> Chunk>
  SharedChunkHooks(const std::vector<Chunk*>& chunks, std::vector<DataParallel*> replicas)
      : SharedChunkHooks(std::vector<ModelChunk*>(chunks.begin(), chunks.end()), std::move(replicas)) {}
  ~SharedChunkHooks();
  SharedChunkHooks(const SharedChunkHooks&) = delete;
  SharedChunkHooks& operator=(const SharedChunkHooks&) = delete;

 private:
  std::vector<ModelChunk*> chunks_;
  std::vector<DataParallel*> replicas_;
};

}  // namespace parallel
