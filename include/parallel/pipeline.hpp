#pragma once
// Pipeline parallelism: which layers a rank holds, and the executor that runs a schedule
// (pipeline_schedule.hpp) on this rank with real point-to-point messages over the pipeline group.
//
// Three orthogonal pieces:
//   stage_layout()     pure arithmetic: (layers, p, v, explicit first/last counts, rank) -> chunks
//   PipelineExecutor   walks a Schedule, moves activations and gradients, records timings; knows
//                      nothing about GPT
//   PipelineModel      what the executor drives: forward/backward of (chunk, micro-batch);
//                      ChunkPipelineModel adapts this rank's ModelChunks (GPTModel or any other,
//                      model_chunk.hpp), which never learn the schedule
// docs/pipeline.md ("The executor") explains the message-order argument and the bubble figures.
#include <concepts>
#include <cstddef>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/model_chunk.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace parallel {
struct Config;  // config.hpp; only LayoutParams::of reads one
}  // namespace parallel

namespace parallel::pipeline {

// ---- layer assignment ---------------------------------------------------------------------------

struct LayoutParams {
  int num_layers = 1;
  int pipeline_size = 1;                  // p
  int virtual_stages = 1;                 // v
  int first_stage_layers = 0;             // 0: split evenly (parallel.first_stage_layers)
  int last_stage_layers = 0;              // 0: split evenly (parallel.last_stage_layers)
  Placement placement = Placement::Loop;  // which stages a rank holds (placement_of the schedule)

  // What a config asks for (model.num_layers and the parallel.* pipeline keys): the one place that
  // maps a config to a layout, so the trainer and the memory plan cannot disagree.
  static LayoutParams of(const Config& config);
};

// Layers of every global stage g = 0..p*v-1, in stage order (they are contiguous and in order).
// Even split: num_layers / (p*v) each, which must divide. Explicit counts (v == 1 only): the first
// and/or last stage get theirs, the other stages share the rest evenly. Every stage holds >= 1 layer.
// Throws parallel::Error with one line naming the rule.
std::vector<int> layers_per_stage(const LayoutParams& params);

// This rank's chunks: chunk c is global stage global_stage(p, rank, c, placement) (c*p + rank in
// the loop placement; r and 2p - 1 - r in the V one). pre_process on global stage 0, post_process on
// global stage p*v - 1: in the V placement both on rank 0, in its chunks 0 and 1.
std::vector<ChunkSpec> stage_layout(const LayoutParams& params, int rank);

// ---- what the executor drives -------------------------------------------------------------------

class PipelineModel {
 public:
  virtual ~PipelineModel() = default;
  // input: undefined on global stage 0 (the model reads its own data), else the activation received
  // from the previous stage. Returns the activation for the next stage (ignored on the last stage).
  virtual Tensor forward(int chunk, int micro_batch, const Tensor& input) = 0;
  // grad: undefined on the last global stage (the model knows its loss scale), else the gradient of
  // this chunk's output. Returns the gradient of its input (ignored on global stage 0).
  virtual Tensor backward(int chunk, int micro_batch, const Tensor& grad) = 0;
  // Split backward, for schedules with BackwardInput / BackwardWeight steps: backward() in two
  // steps, the input gradient (same arguments and result) and later the weight gradients. The
  // defaults refuse: a model that cannot split runs only fused schedules.
  virtual Tensor backward_input(int chunk, int micro_batch, const Tensor& grad);
  virtual void backward_weight(int chunk, int micro_batch);
};

// ---- executor -----------------------------------------------------------------------------------

struct ExecutorOptions {
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v
  // Every message between stages: [s (/tp under sequence parallelism), b, h].
  Shape activation_shape;
  DType dtype = DType::F32;
  Device device = Device::cpu();
  // Which schedule to run; given (p, r, m, v) of any rank, so the executor can also derive the order
  // in which its neighbours send.
  std::function<Schedule(const ScheduleParams&)> schedule = make_schedule;
  // Passed to `schedule` (make_schedule reads it); also says the placement (placement_of), so a
  // custom `schedule` of a V placement must come with kind ZeroBubbleV or DualPipeV.
  PipelineSchedule kind = PipelineSchedule::Auto;
};

// One rank's record of one step.
struct StepStats {
  double busy_seconds = 0;          // inside PipelineModel::forward / backward
  double idle_seconds = 0;          // blocked in receives
  double drain_seconds = 0;         // waiting for the last sends to complete at the end of the step
  double total_seconds = 0;         // wall time of the whole step
  int forwards = 0, backwards = 0;  // backwards: fused or input steps
  int weight_steps = 0;             // split backward's weight steps
  int messages_sent = 0, messages_received = 0;
  int received_early = 0;  // messages that arrived (in the sender's order) before their action came
  int batches = 0;         // sends and receives posted together (one batch_p2p, waited as one)
  int peak_in_flight = 0;  // (chunk, micro-batch) pairs whose forward is done and backward is not
  // ... whose forward is done and weight step is not (split backward keeps some activations until
  // W); equals peak_in_flight for fused schedules.
  int peak_until_weight = 0;
  std::size_t start_allocated_bytes = 0;  // allocator's live bytes when the step began
  std::size_t peak_allocated_bytes = 0;   // allocator's high-water mark during the step
};

class PipelineExecutor {
 public:
  // pp: the pipeline group; its rank is the pipeline stage. Throws if the schedule does not fit.
  PipelineExecutor(Communicator& pp, ExecutorOptions options);

  // Runs this rank's schedule once (one optimizer step's forward and backward passes). Collective
  // over the pipeline group. Resets the allocator's peak (to measure this step's).
  StepStats run(PipelineModel& model);

  const Schedule& schedule() const { return schedule_; }

 private:
  // A message as its receiver (rank) names it.
  struct Key {
    bool gradient;
    int chunk, micro_batch;
    int rank;
    auto operator<=>(const Key&) const = default;
  };
  Tensor receive(const Key& key, int source, StepStats& stats);
  // Where the message that `send` (an action of rank `source`) posts goes.
  Key destination(int source, const Action& send) const;
  // The message a receive action of this rank waits for, and the rank that sends it.
  std::pair<Key, int> receive_key(const Action& recv) const;

  Communicator& pp_;
  ExecutorOptions options_;
  int p_, rank_, last_stage_;
  Placement placement_;
  Schedule schedule_;
  // Per source rank: the messages it sends to this rank, in its posting order.
  std::map<int, std::vector<Key>> incoming_;
  // The runs of communication actions whose messages with one neighbour go as one batch_p2p, by
  // their first action.
  struct Batch {
    std::size_t end = 0;     // the run's end (exclusive)
    std::vector<int> peers;  // the neighbours whose messages in the run are batched
  };
  std::map<std::size_t, Batch> batched_runs_;
  // Per source rank, during a step: how far into incoming_ we have received, and what arrived
  // before it was needed.
  std::map<int, std::size_t> cursor_;
  std::map<Key, Tensor> early_;
};

// ---- the model chunks' adapter -------------------------------------------------------------------

struct MicroBatch {
  Tensor tokens;   // the first chunk's input (GPT: token ids [b, s] int32)
  Tensor targets;  // read by the last chunk (GPT: [b, s] int32)
  // Documents (model_chunk.hpp): given to every chunk; empty for a plain micro-batch. When the
  // data has them, every pipeline stage reads its micro-batches (not only the first and last).
  PackedSequence packed = {};  // (a default initialiser: MicroBatch{tokens, targets} stays warning-free)
};
using MicroBatchFn = std::function<MicroBatch(int micro_batch)>;

// This rank's model chunks behind the executor's PipelineModel: owns one Activations object per
// (chunk, micro-batch) in flight, feeds the first chunk its data and seeds the last one's backward
// with the loss scale. Knows nothing of GPT.
class ChunkPipelineModel final : public PipelineModel {
 public:
  // chunks[c] is this rank's chunk c (stage_layout order); not owned.
  explicit ChunkPipelineModel(std::vector<ModelChunk*> chunks);
  template <std::derived_from<ModelChunk> Chunk>
  explicit ChunkPipelineModel(const std::vector<Chunk*>& chunks)
      : ChunkPipelineModel(std::vector<ModelChunk*>(chunks.begin(), chunks.end())) {}

  // Before each executor run: where micro-batch data comes from, and d(objective)/d(loss sum) for
  // the last chunk's backward ([1] fp32, e.g. 1 / tokens in the global batch). Resets loss_sum().
  // Micro-batch i of the step reaches the model as id `first_micro_batch_id + i`, which keys its
  // dropout masks: ids must not repeat over a run.
  void start_step(MicroBatchFn data, Tensor loss_scale, uint64_t first_micro_batch_id = 0);
  // Before an executor run of a forward-only schedule (evaluation): dropout off, nothing kept for a
  // backward; loss_sum() accumulates as in training.
  void start_forward_only(MicroBatchFn data);

  Tensor forward(int chunk, int micro_batch, const Tensor& input) override;
  Tensor backward(int chunk, int micro_batch, const Tensor& grad) override;
  Tensor backward_input(int chunk, int micro_batch, const Tensor& grad) override;
  void backward_weight(int chunk, int micro_batch) override;

  // Sum of the token losses of this step's micro-batches: [1] fp32 on the model's device, summed
  // there in the order the last stage's forwards run (0 unless this rank holds the last stage). Reading it is
  // the caller's one host read per step.
  const Tensor& loss_sum() const { return loss_sum_; }
  // Whether a chunk of this rank computes the loss (holds the last global stage: the last pipeline
  // rank in the loop placement, rank 0 in the V one).
  bool computes_loss() const;
  int live_activations() const { return static_cast<int>(activations_.size()); }
  int peak_live_activations() const { return peak_live_; }  // since start_step
  std::vector<Parameter*> parameters();                     // of every chunk

 private:
  using Saved = std::map<std::pair<int, int>, ModelChunk::ActivationsPtr>;  // (chunk, micro-batch)
  std::vector<ModelChunk*> chunks_;
  MicroBatchFn data_;
  Tensor loss_scale_;
  uint64_t first_id_ = 0;
  bool forward_only_ = false;
  Tensor loss_sum_;
  int peak_live_ = 0;
  Saved activations_;
  // The saved activations of (chunk, micro_batch) for a backward, checked, and the gradient that
  // seeds it (the loss scale on the last chunk, else `grad`).
  Saved::iterator saved_for_backward(int chunk, int micro_batch, const Tensor& grad, Tensor& seed);
};

}  // namespace parallel::pipeline
