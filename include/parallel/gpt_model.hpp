#pragma once
// A GPT model chunk: optionally the embedding (first chunk), a contiguous range of transformer
// layers, and optionally the final norm, output layer and loss (last chunk). A whole model on one
// pipeline stage is one chunk with both ends; the pipeline builds one chunk per (stage, virtual
// stage) and the model never learns which schedule runs it.
//
// It is a ModelChunk (model_chunk.hpp): data parallelism and the pipeline drive it through that
// interface. Forward and backward are explicit; everything a micro-batch needs for its backward
// lives in its own Activations object, so several micro-batches can be in flight at once.
#include <functional>
#include <memory>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/model_chunk.hpp"
#include "parallel/parameter.hpp"

namespace parallel {

// The padded vocabulary: the smallest multiple of 128 * tp that holds vocab_size.
int64_t padded_vocab_size(int64_t vocab_size, int tensor_parallel_size);

// Multi-token prediction's targets of a micro-batch (PackedSequence::mtp_targets, mtp_mask) from its
// whole targets [b, S] int32 on the host (t_{i+1} at position i): depth k's row holds t_{i+k+1} =
// targets[i + k] and mask 1 where i + k < S, else 0 and 0. On the meta device: shapes only.
struct MTPTargets {
  Tensor targets, mask;  // [depths, b, S] int32, fp32
};
MTPTargets mtp_targets(const Tensor& targets, int depths);

class GPTModel final : public ModelChunk {
 public:
  struct Options {
    bool sequence_parallel = false;
    Recompute recompute = Recompute::None;
    uint64_t seed = 1234;  // initialisation and dropout
    // BF16 / FP16: the activations and the gradients flowing between ops are rounded to that
    // precision at every op boundary, as a GPU mixed-precision run holds them (docs/optimizer.md);
    // GEMMs, norms, softmax and the loss still compute in fp32, parameter gradients stay fp32.
    Precision precision = Precision::FP32;
    // Where the parameters (and so every activation) live. They are initialised on the host, so
    // the values do not depend on the device, then moved. Inputs must be on this device too.
    Device device = Device::cpu();
    // Expert parallelism: the ranks that split each MoE layer's experts (docs/parallelism.md);
    // null: this rank holds every expert.
    Communicator* expert = nullptr;
    // Tensor parallelism inside experts: the ranks that split each expert's inner width (the
    // expert-tensor group); null: whole experts.
    Communicator* expert_tensor = nullptr;
    // Context parallelism (context_parallel.hpp): the cp group (null: none) and how attention
    // exchanges K/V over it. Inputs and targets are then this rank's two chunks of each sample
    // ([b, s / cp], cp::slice_sequence), and the loss sums only their tokens.
    Communicator* cp = nullptr;
    ContextComm context_comm = ContextComm::P2P;
  };
  // tp: the tensor-parallel communicator (size 1 without tensor parallelism).
  GPTModel(const ModelConfig& config, ChunkSpec spec, Options options, Communicator& tp);
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  bool pre_process() const override { return spec_.pre_process; }
  bool post_process() const override { return spec_.post_process; }

  struct Saved;  // what a micro-batch keeps for its backward: this chunk's Activations (opaque)
  ActivationsPtr new_activations() const override;

  // input: tokens [b, s] int32 on the first chunk (s: this rank's share under context parallelism), else
  // hidden [s(/tp), b, h] from the previous chunk. targets: [b, s] int32, used on the last chunk. Returns the
  // sum of the b*s token losses
  // ([1] fp32, the same on every tp rank) on the last chunk, else the hidden output.
  // `micro_batch` only keys the dropout masks: give every micro-batch of a run its own id (the
  // trainer uses its index among all micro-batches of all global batches), else masks repeat.
  Tensor forward(const Tensor& input, const Tensor& targets, Activations& act,
                 uint64_t micro_batch = 0) override;
  // A packed micro-batch (model_chunk.hpp): positions for RoPE / learned positions, documents
  // for every layer's attention, and the loss mask: the loss sum is then over the tokens whose
  // mask is 1 (the others' losses are multiplied by 0, and so are their gradients).
  Tensor forward(const Tensor& input, const Tensor& targets, Activations& act, uint64_t micro_batch,
                 const PackedSequence& packed) override;
  // grad: on the last chunk a [1] tensor holding d(objective)/d(loss sum) (e.g. 1 / tokens in the
  // global batch), else the gradient of this chunk's output. Accumulates parameter gradients and
  // returns the gradient of the input hidden (an undefined Tensor on the first chunk). Frees the
  // micro-batch's saved activations.
  Tensor backward(const Tensor& grad, Activations& act) override;
  // backward() in two steps, for zero-bubble pipeline schedules. backward_input (B) takes the same
  // `grad`, returns the input gradient and leaves every parameter gradient untouched; what the
  // weight gradients need stays in `act`. backward_weight (W) accumulates this micro-batch's
  // parameter gradients, calls the grad-ready hook as backward() does, and frees `act`'s saved
  // tensors. B then W accumulates bit for bit what backward() does; other micro-batches' forwards,
  // B and W steps may run in between (gradients then accumulate in the order the W steps run).
  // Until W, `act` holds the linear layers' inputs and output gradients (the logits' gradient on
  // the last chunk): more than backward() keeps, less than the forward did.
  Tensor backward_input(const Tensor& grad, Activations& act) override;
  void backward_weight(Activations& act) override;

  std::vector<Parameter*> parameters() override;
  // Evaluation mode (false) turns dropout off; training is the default.
  void set_training(bool training) override;
  // Called during backward() right after a parameter's last gradient contribution of that call
  // (its gradient is final for this micro-batch), in backward order. Lets a caller such as data
  // parallelism start reducing gradients while the rest of the backward runs. Empty: no calls.
  void set_grad_ready_hook(std::function<void(Parameter&)> hook) override;
  // Called during forward() right before a parameter's first use in that call, in forward order
  // (a layer's parameters together, before the layer runs). Lets a caller such as data parallelism
  // wait for a parameter's all-gather only when it is needed. Empty: no calls.
  void set_param_use_hook(std::function<void(Parameter&)> hook) override;
  // The chunk's units, in forward order: the embedding (first chunk), each transformer layer, the
  // final norm with the output layer (last chunk). Every parameter is in exactly one unit; a weight
  // tied to this chunk's embedding is in the embedding's.
  std::vector<std::vector<Parameter*>> units() override;
  // Called right before and right after each unit's forward and backward with the parameters the
  // unit reads (the output unit also lists a weight tied to this chunk's embedding). Lets a caller
  // such as fully sharded data parallelism gather a unit's parameters just before it computes and
  // free them after, without the model knowing. Empty: no calls.
  void set_unit_hook(std::function<void(UnitPhase, const std::vector<Parameter*>&)> hook) override;
  // d(objective) / d(sum of this chunk's MoE aux and z losses over the step's micro-batches on this
  // rank): the trainer sets loss scale / micro-batches, so the losses average over micro-batches
  // like the language-model loss (then over dp by the gradient averaging). Default 1.
  void set_moe_loss_scale(double scale);
  // The MoE layers' statistics since the last reset (summed over this chunk's MoE layers; empty
  // tokens_per_expert for a dense chunk), and the reset.
  struct MoEStatistics {
    // As added to the objective, summed over layers and calls; aux_loss holds the Switch and the
    // sequence-wise balance losses.
    double aux_loss = 0.0, z_loss = 0.0;
    int64_t calls = 0, dropped = 0;
    std::vector<int64_t> tokens_per_expert;  // summed over layers
  };
  MoEStatistics moe_statistics() const;
  void reset_moe_statistics();
  // Aux-loss-free balancing (model.moe_router_expert_bias; docs/model.md, "Routing"): the MoE
  // layers' expert biases, state that is checkpointed but not trained (no gradient; empty when the
  // bias is off), and their update after an optimizer step from the loads the step's forwards
  // counted. Collective over `world`: every rank calls it once with all its chunks; each layer's
  // loads are summed over every rank that routed its tokens, so every rank holding the layer moves
  // its bias alike. The counts restart after it, and at reset_router_load() (a skipped update).
  std::vector<Parameter*> router_buffers();
  // Multi-token prediction (model.mtp_num_layers = D): the sums of each depth's token losses (over
  // the positions whose target is inside the sequence) of this chunk's training forwards since the
  // last reset, [D] fp32 on the model's device; undefined on a chunk without the MTP layers. The
  // objective adds mtp_loss_scaling_factor / D times each depth's mean: the chunk seeds depth k's
  // backward with grad * factor / D * S / (S - k), S the whole sequence, so that the mean is over
  // the B (S - k) targets of a global batch of B samples. Evaluation forwards skip the MTP layers.
  const Tensor& mtp_loss_sums() const;
  void reset_mtp_loss_sums();
  static void update_router_bias(const std::vector<GPTModel*>& chunks, Communicator& world);
  // Forgets the loads counted since the last update (a step whose update was skipped).
  void reset_router_load();
  const ModelConfig& config() const { return config_; }
  const ChunkSpec& spec() const { return spec_; }
  Device device() const override;  // where the parameters and activations live (Options::device)
  int64_t vocab_padded() const { return vocab_padded_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ModelConfig config_;
  ChunkSpec spec_;
  int64_t vocab_padded_ = 0;
};

}  // namespace parallel
