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
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/grad_buffer.hpp"

namespace parallel {

class GPTModel;

struct DataParallelOptions {
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;  // distributed optimizer only
  bool distributed_optimizer = false;
  int64_t bucket_size = 0;                // elements; 0: max(40M, 1M * dp)
  Precision precision = Precision::FP32;  // dtype of the parameter buffer; grads are always fp32

  static DataParallelOptions from(const OptimizerConfig& optimizer, Precision precision);
};

// What DDP did and when: the overlap test and benchmark read this log.
struct DdpEvent {
  enum class Kind { GradReady, ReduceLaunched, ReduceDone, GatherLaunched, GatherDone, ParamUse };
  Kind kind;
  int bucket = -1;                   // -1 for GradReady
  const Parameter* param = nullptr;  // GradReady and ParamUse only
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
  // Lays out every chunk's parameters (chunks in order, each in its registration order) and hooks
  // the chunks' backward (and, with overlap_param_gather, their forward). The chunks must outlive
  // this object; the destructor removes the hooks.
  DataParallel(const std::vector<GPTModel*>& chunks, Communicator& dp, DataParallelOptions options);
  // Without a model: no grad-ready hooks (call on_grad_ready yourself, or do not overlap).
  DataParallel(const std::vector<Parameter*>& params, Communicator& dp, DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Zeroes the gradient buffer. Waits for any parameter all-gather still in flight, unless the
  // parameter-use hook is installed (overlap_param_gather with model chunks): the forward waits.
  void zero_grad();
  void set_is_last_microbatch(bool last) { is_last_microbatch_ = last; }
  // The grad-ready hook's target.
  void on_grad_ready(Parameter& param);
  // The parameter-use hook's target: waits for the all-gather of the parameter's bucket if one is
  // in flight (once per bucket) and records ParamUse.
  void on_param_use(Parameter& param);
  // Launches every bucket not yet launched and waits for all of them: gradients are then averaged
  // over dp (all of them, or this rank's shards with the distributed optimizer).
  void finish_grad_sync();

  // Distributed optimizer: all-gathers every bucket's parameters from the ranks' shards, and widens
  // the low-precision parameters into the fp32 working copy. async: returns after launching.
  void start_param_gather(bool async);
  void finish_param_gather();  // idempotent

  BucketShard shard(const Bucket& bucket) const;
  ParamAndGradBuffer& buffer() { return *buffer_; }
  Communicator& dp() { return dp_; }
  const DataParallelOptions& options() const { return options_; }
  // Every parameter of the replica, in registration order.
  const std::vector<Parameter*>& params() const { return params_; }

  std::vector<DdpEvent>& events() { return events_; }
  void set_record_events(bool on) { record_ = on; }

 private:
  void launch_reduce(Bucket& bucket);
  void finish_gather(Bucket& bucket);  // waits for the bucket's in-flight gather, if any
  void record(DdpEvent::Kind kind, int bucket, const Parameter* param = nullptr);

  Communicator& dp_;
  DataParallelOptions options_;
  std::vector<GPTModel*> chunks_;
  std::vector<Parameter*> params_;
  std::unique_ptr<ParamAndGradBuffer> buffer_;
  bool is_last_microbatch_ = true;
  bool gather_on_use_ = false;  // the parameter-use hook waits for the gathers
  std::unordered_set<const Parameter*> ready_;
  std::vector<int> ready_count_;
  std::vector<WorkHandle> reduce_work_;  // per bucket; null: not launched this step
  std::vector<WorkHandle> gather_work_;  // per bucket; null: nothing in flight
  bool record_ = false;
  std::vector<DdpEvent> events_;
};

}  // namespace parallel
