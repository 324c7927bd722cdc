#pragma once
// Optimizers (Megatron-Core semantics):
//   AdamW                - PyTorch's torch.optim.AdamW over all parameters; every rank holds the
//                          full state. Over plain Parameters, or over a DataParallel replica.
//   DistributedOptimizer - ZeRO-1: dp rank r owns one contiguous shard of every DDP bucket (MoE: and
//                          expert-dp rank r of every expert bucket) and keeps
//                          fp32 main params (low precision only), exp_avg and exp_avg_sq for that
//                          shard alone. step(): (gradients already reduce-scattered by DDP) ->
//                          [fp16: unscale, skip on overflow] -> global norm -> clip -> update own
//                          shard -> write params back -> all-gather the params over dp.
//
// Both apply decoupled weight decay only to parameters with >= 2 dimensions (biases and norms
// are not decayed) and count each gradient element once in the global norm (grad_norm.hpp).
//
// optimizer.type muon (either class, any sharding): the parameters muon_parameter() selects get
// torch.optim.Muon's update instead of AdamW's (docs/optimizer.md#muon), with one fp32 momentum
// buffer as their state (sharded like AdamW's moments); the others keep AdamW. Newton-Schulz needs
// the whole matrix: each step, per Muon parameter, the ranks holding pieces of its update (the
// dp shards, then the tp slices) assemble it, every one of them orthogonalises the whole matrix
// in fp32, and each keeps its own piece.
//
// The overlapped update (docs/optimizer.md#the-overlapped-update): begin_overlapped_update(lr)
// before the step's forward and backward makes each DDP bucket's AdamW update run as soon as that
// bucket's reduction is final (DataParallel's bucket-reduced hook), during the rest of the backward
// (and, under the distributed optimizer, its all-gather starts then too); step(lr) then updates
// the buckets left. Only where that is bitwise the update step() would make: no clipping
// (clip_grad 0), no fp16 loss scaler, AdamW only (overlap_refusal() says why not otherwise).
//
// Precision: fp32 updates the parameters in place. bf16/fp16 keep fp32 main weights in the
// optimizer and write rounded values back to the model's 16-bit parameters (the DDP buffer's, or -
// without DDP - the Parameter values themselves), once per step.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/loss_scaler.hpp"
#include "parallel/ops.hpp"
#include "parallel/parameter.hpp"

namespace parallel {

class ParallelState;

// Where the gradient norm and the overflow check are reduced. Null communicators: this rank alone.
struct OptimizerGroups {
  Communicator* model = nullptr;  // tp x pp (ParallelState::model())
  Communicator* dp = nullptr;     // dp x cp (ParallelState::dp_cp()): the replicas of a dense parameter
  // MoE: expert gradients are summed over the ranks holding different experts (etp x ep x pp,
  // ParallelState::expert_model()), every expert element once, then added to the dense sum.
  Communicator* expert_model = nullptr;
  // MoE with a sharded optimizer: the ranks whose expert shards differ (ParallelState::edp(); the
  // DistributedOptimizer replaces it by the expert replica's sharding group, as it does dp).
  Communicator* expert_dp = nullptr;
  // MoE model: every rank joins the experts' norm reduction over expert_model, also one whose
  // pipeline stage holds no MoE layer (and so no expert parameter) while other stages do.
  bool model_has_experts = false;
  int tp_rank = 0;
  bool first_pipeline_stage = true;
  // Muon: the ranks holding the tensor-parallel slices of a dense (tp) or expert (etp) matrix,
  // gathered before the orthogonalisation. Null: the parameters are whole on this rank.
  Communicator* tp = nullptr;
  Communicator* expert_tp = nullptr;
  static OptimizerGroups from(ParallelState& state);
};

struct StepResult {
  bool skipped = false;    // nothing was updated: an fp16 overflow, or skip_update said so
  bool overflow = false;   // fp16: the gradients overflowed (skipped, and the loss scale lowered)
  double grad_norm = 0.0;  // global, after unscaling, before clipping (0 on an fp16 overflow)
  double clip_coef = 1.0;
  double loss_scale = 1.0;  // the scale this step's gradients carried
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr`. `skip_update` (when given) sees the global gradient norm
  // once it is known (not on an fp16 overflow, which skips by itself) and returning true skips the
  // update: nothing changes but the loss scaler's count of clean steps (the trainer's guard,
  // training_guard.hpp). It must answer alike on every rank, as the norm is alike.
  StepResult step(double lr, const std::function<bool(double grad_norm)>& skip_update = {});
  // Updates applied so far (skipped steps do not count): PyTorch's `step` state.
  int64_t updates() const { return updates_; }
  // fp16 only (null otherwise): multiply the loss gradient by loss_scaler()->scale().
  DynamicLossScaler* loss_scaler() { return scaler_.get(); }
  // Bytes of optimizer state this object allocated: fp32 main params (low precision only),
  // exp_avg and exp_avg_sq (AdamW's parameters), momentum (Muon's).
  std::size_t state_bytes() const;
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const Tensor& momentum() const { return momentum_; }  // undefined without Muon parameters
  const Tensor& main_params() const { return main_; }   // undefined for fp32 (params updated in place)

  // ---- checkpointing (train_state.hpp) ----
  // One contiguous piece of a parameter's state: elements [param_offset, param_offset + n) of the
  // flattened parameter. The tensors are views into the optimizer's state (writable); `main` is
  // the parameter itself for fp32. An AdamW parameter has exp_avg and exp_avg_sq, a Muon one
  // momentum (the others undefined).
  struct StateSlice {
    Parameter* param = nullptr;
    int64_t param_offset = 0;
    Tensor main, exp_avg, exp_avg_sq, momentum;
    int64_t numel() const { return main.numel(); }
  };
  std::vector<StateSlice> state_slices() const;
  // The DDPs whose buffers this optimizer updates: the dense replica, then the MoE experts' when
  // there is one; empty for AdamW over plain Parameters.
  virtual std::vector<DataParallel*> data_parallels() { return {}; }
  // Whether state_slices() may hold Muon momentum: optimizer.type is muon (alike on every rank,
  // so checkpoint collectives agree even where a rank's shards hold no Muon element).
  bool uses_muon() const { return config_.type == OptimizerType::Muon; }
  // A resumed run continues the bias correction where it stopped.
  void set_updates(int64_t updates) { updates_ = updates; }
  // Low precision: re-reads the fp32 main params from the low-precision parameters (after new
  // weights were loaded into them), so the next step starts from those weights. No-op for fp32.
  void reset_main_from_params();

  // ---- the overlapped update ----
  // Why this optimizer cannot update bucket by bucket before step() with bitwise the result of
  // step()'s own update; empty when it can. Clipping needs the global norm of every gradient and
  // the fp16 scaler's overflow check every gradient, before any update; Muon orthogonalises whole
  // matrices with collectives of its own; over plain Parameters there are no buckets.
  std::string overlap_refusal() const;
  // Arms the next step (throws what overlap_refusal() says): every bucket of the data_parallels()
  // is updated with `lr` as soon as its reduction is final, during the backward when
  // `during_backward` (else from finish_grad_sync(): pipeline schedules). The next step(lr) must
  // have the same lr; it computes the norm from the same, untouched gradients and updates what is
  // left. A `skip_update` that then answers true cannot undo the buckets already updated: the step
  // reports skipped, the rest is not updated and the caller must stop (the trainer's guard only
  // stops in this mode, train_step.cpp).
  void begin_overlapped_update(double lr, bool during_backward);
  bool overlapped_update_armed() const { return overlap_.armed; }

 protected:
  // One contiguous range the update touches: a whole parameter (AdamW) or the part of one that
  // lies in this rank's shard (DistributedOptimizer).
  struct Slot {
    Parameter* param = nullptr;
    Tensor grad;                 // fp32 [n]
    Tensor main;                 // fp32 [n], updated in place (the parameters themselves for fp32)
    Tensor target;               // [n] low-precision parameters to write back to; undefined: none
    Tensor exp_avg, exp_avg_sq;  // AdamW
    Tensor momentum;             // Muon
    bool muon = false;
    float weight_decay = 0.0f;
    int64_t param_offset = 0;  // where the range starts in the flattened parameter
    int replica = -1;          // index into data_parallels(); -1: no DDP
    int bucket = -1;           // the DDP bucket holding the range
  };
  // A Muon matrix of this optimizer's replicas, whether or not this rank holds a piece of it: the
  // ranks that do assemble it together, so every rank of `shard` and `tp` takes part.
  struct MuonMatrix {
    Parameter* param = nullptr;
    int64_t local_numel = 0;        // this tp rank's slice, all of it
    Communicator* shard = nullptr;  // dp ranks holding the slice's pieces; null: one holds it all
    Communicator* tp = nullptr;     // tp ranks holding the slices; null: the slice is the matrix
    int slot = -1;                  // this rank's piece (slots_), or -1
    Device device;
  };
  Optimizer(const OptimizerConfig& config, Precision precision, OptimizerGroups groups, bool sharded);
  // Allocates the fp32 main params (if needed) of `numel` elements on the parameters' device.
  void allocate_state(int64_t numel, bool need_main, Device device);
  // A slot without its moments; bind_state() gives them once every slot exists.
  Slot make_slot(Parameter* p, Tensor grad, Tensor main, Tensor target);
  // Allocates exp_avg and exp_avg_sq for the AdamW slots and momentum for the Muon ones (one flat
  // tensor each, slot after slot) and points the slots at their ranges.
  void bind_state(Device device);
  // Muon: lists the Muon matrices of `params` (in that order, which must be alike on the ranks
  // of `shard` and of the tp groups) and links them to this rank's slots.
  void add_muon_matrices(const std::vector<Parameter*>& params,
                         const std::function<int64_t(Parameter*)>& numel, Communicator* shard, Device device);
  // Muon's update of every Muon matrix (muon.cpp); collective over each matrix's shard and tp.
  void muon_update(double lr, float grad_scale);
  // Before anything reads the gradients or writes the parameters (e.g. finish an all-gather still
  // filling the parameter buffer).
  virtual void before_update() {}
  // After the slots are updated and written back (e.g. widen, all-gather).
  virtual void after_update() {}
  // The overlapped update: before and after one bucket's slots are updated during the backward
  // (the distributed optimizer finishes a gather still filling the bucket, then starts its gather).
  virtual void before_bucket_update(int /*replica*/, int /*bucket*/) {}
  virtual void after_bucket_update(int /*replica*/, int /*bucket*/) {}
  // Whether the overlapped update already updated the bucket this step.
  bool updated_early(int replica, int bucket) const {
    return overlap_.armed &&
           overlap_.done[static_cast<std::size_t>(replica)][static_cast<std::size_t>(bucket)];
  }

  OptimizerConfig config_;
  Precision precision_;
  OptimizerGroups groups_;
  bool sharded_;  // gradients are dp shards: the norm and overflow check also sum over dp
  // MoE: the experts' squares are summed apart (grad_norm.hpp); every rank takes part in that
  // reduction, also one whose shards hold no expert element.
  bool has_experts_ = false;
  std::vector<Slot> slots_;
  std::vector<MuonMatrix> muon_;
  Tensor main_, exp_avg_, exp_avg_sq_, momentum_;
  std::unique_ptr<DynamicLossScaler> scaler_;
  int64_t updates_ = 0;

 private:
  // One slot's arguments of the multi-tensor update (ops::adamw_update_multi_): the main weights,
  // and at low precision the model's 16-bit copy written from them in the same pass.
  static ops::AdamWTensors adamw_tensors(const Slot& s);
  void update_bucket(int replica, int bucket);  // the bucket-reduced hook's target
  void disarm();
  struct Overlap {
    bool armed = false;
    double lr = 0.0;
    ops::AdamWStep h;
    std::vector<std::vector<std::vector<int>>> slots;  // [replica][bucket]: slot indices
    std::vector<std::vector<char>> done;               // [replica][bucket]
  } overlap_;
};

// Whether optimizer.type muon updates `p` with Muon: a 2-D hidden weight (attention query, key,
// value and proj, MLP fc1 / gate / up / fc2, router, each expert's matrices), i.e. 2-D and neither
// an embedding ("embedding.*"), the output layer ("output.*") nor vocabulary-padded. Everything
// else (embeddings, output layer, norms, biases) gets AdamW, as in Moonlight and torch.optim.Muon,
// and so do LoRA adapters ("*.lora_A.weight", "*.lora_B.weight"; docs/lora.md).
bool muon_parameter(const Parameter& p);

class AdamW : public Optimizer {
 public:
  // Over the Parameters as they are (no DDP). bf16/fp16: the values must already be the policy's
  // 16-bit copy (GPTModel casts them; precision.hpp); fp32 main copies live here and the values
  // are written from them after every update.
  AdamW(const std::vector<Parameter*>& params, const OptimizerConfig& config, Precision precision,
        OptimizerGroups groups = {});
  // Over a DDP replica with all-reduced gradients (DataParallelOptions::distributed_optimizer off),
  // and the MoE expert replica (reduced over expert-dp) when there is one.
  AdamW(DataParallel& ddp, const OptimizerConfig& config, OptimizerGroups groups,
        DataParallel* experts = nullptr);
  std::vector<DataParallel*> data_parallels() override;

 private:
  DataParallel* ddp_ = nullptr;
  DataParallel* experts_ = nullptr;
};

class DistributedOptimizer : public Optimizer {
 public:
  // `ddp` must use the distributed optimizer layout (reduce-scattered gradients), and so must the
  // MoE expert replica (sharded over expert-dp) when there is one: state for this rank's shard of
  // every bucket of both.
  DistributedOptimizer(DataParallel& ddp, const OptimizerConfig& config, OptimizerGroups groups,
                       DataParallel* experts = nullptr);
  std::vector<DataParallel*> data_parallels() override;

 private:
  void before_update() override;
  void after_update() override;
  void before_bucket_update(int replica, int bucket) override;
  void after_bucket_update(int replica, int bucket) override;
  DataParallel& ddp_;
  DataParallel* experts_ = nullptr;
};

// The optimizer `ddp`'s layout takes: DistributedOptimizer when its gradients are reduce-scattered
// (DataParallelOptions::distributed_optimizer, i.e. optimizer.sharding other than none), else
// AdamW; each refuses the other's layout, so the choice is the layout's, not the caller's.
std::unique_ptr<Optimizer> make_optimizer(DataParallel& ddp, const OptimizerConfig& config,
                                          OptimizerGroups groups, DataParallel* experts = nullptr);

}  // namespace parallel
