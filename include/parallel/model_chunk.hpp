#pragma once
// A model chunk as data parallelism (DataParallel) and the pipeline (ChunkPipelineModel, the
// executor) see it: its parameters grouped into units, three hooks through which a caller follows
// the forward and backward, and forward / backward on opaque per-micro-batch activations. GPTModel
// is one; anything that implements this trains through every DataParallel mode (sharded or not)
// and every pipeline schedule unchanged, so a new layer is a new layer of a chunk, not a new code
// path through them (test_model_chunk trains a two-layer toy chunk that way).
//
// A chunk holds a contiguous piece of the model. The first chunk (pre_process) reads the
// micro-batch's input (GPT: token ids [b, s] int32); the others read the previous chunk's output.
// The last chunk (post_process) also reads the micro-batch's targets and returns the sum of its
// per-token losses ([1] fp32); the others return their output activation for the next chunk. A
// chunk never learns which schedule runs it or whether its parameters are sharded.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "parallel/device.hpp"
#include "parallel/parameter.hpp"
#include "parallel/tensor.hpp"

namespace parallel {

namespace cp {
class Layout;  // context_parallel.hpp
}

// How a micro-batch's sequences are packed from documents (data.reset_position_ids,
// data.reset_attention_mask, data.eod_mask_loss; docs/data.md). Every chunk needs it (each layer's
// attention), not only the first. Undefined tensors mean the plain case: positions are the
// tokens' places in the sequence, one document, every token's loss counts.
struct PackedSequence {
  // int32 [b, s_local] on the host: the position of each token this rank holds (its cp chunks),
  // for RoPE and learned position embeddings.
  Tensor positions;
  // int32 [b, S] on the model's device, S the whole sequence (not sliced by cp): the position
  // where the document of the token at position p starts (attention_mask.hpp).
  Tensor doc_start;
  // fp32 [b, s_local] on the model's device: each token's loss weight (0 or 1).
  Tensor loss_mask;
  // Which positions each context-parallel rank holds (parallel.context_layout), the same on every
  // cp rank; null: the zigzag. The tokens, targets, positions and loss mask are sliced by it.
  std::shared_ptr<const cp::Layout> layout;
  // Multi-token prediction of depth D (GPT's model.mtp_num_layers; mtp_targets() in gpt_model.hpp):
  // int32 [D, b, s_local] on the model's device, depth k's targets t_{i+k+1} (row k - 1), and fp32
  // [D, b, s_local], 1 where that target lies inside the sequence. Cut from the whole sequence, then
  // sliced like the targets, so that context parallelism sees the tokens of other ranks' chunks.
  // Undefined: the last chunk derives them from its targets (one rank of cp only).
  Tensor mtp_targets, mtp_mask;
  bool empty() const {
    return !positions.defined() && !doc_start.defined() && !loss_mask.defined() && layout == nullptr &&
           !mtp_targets.defined();
  }
};

// Which part of the model one chunk holds: a contiguous range of layers, and whether it holds the
// input end (pre_process: the embedding, reads the micro-batch's input) and the output end
// (post_process: the head and the loss). The pipeline's stage_layout (pipeline.hpp) hands these out
// for any model; a model builds its chunk from one (GPTModel, examples/custom_model's EncoderChunk).
struct ChunkSpec {
  int first_layer = 0;  // global index of this chunk's first layer
  int num_layers = 0;
  bool pre_process = true;   // holds the input end (GPT: the embedding); input is the micro-batch's
  bool post_process = true;  // holds the output end (GPT: final norm, output layer, loss)
};

class ModelChunk {
 public:
  virtual ~ModelChunk() = default;

  virtual bool pre_process() const = 0;   // reads the micro-batch's input
  virtual bool post_process() const = 0;  // reads the targets, returns the loss sum

  // Everything a micro-batch keeps for its backward, owned by the caller, so several micro-batches
  // can be in flight at once. Each chunk type has its own; a chunk is only given its own.
  struct Activations {
    virtual ~Activations() = default;
  };
  using ActivationsPtr = std::unique_ptr<Activations>;
  virtual ActivationsPtr new_activations() const = 0;

  // input: the micro-batch's input on the first chunk, else the previous chunk's output. targets:
  // read by the last chunk. Returns the loss sum ([1] fp32) on the last chunk, else the output.
  // `micro_batch` keys anything random (dropout): every micro-batch of a run gets its own id.
  virtual Tensor forward(const Tensor& input, const Tensor& targets, Activations& act,
                         uint64_t micro_batch) = 0;
  // The same for a packed micro-batch. The default refuses a non-empty `packed`: a chunk that
  // cannot mask documents must not silently train across them.
  virtual Tensor forward(const Tensor& input, const Tensor& targets, Activations& act, uint64_t micro_batch,
                         const PackedSequence& packed);
  // grad: on the last chunk a [1] tensor d(objective)/d(loss sum), else the gradient of the
  // output. Accumulates (+=) the parameter gradients, calls the grad-ready hook for each parameter
  // once its contribution is final, and returns the gradient of the input (an undefined Tensor on
  // the first chunk). Frees what `act` saved.
  virtual Tensor backward(const Tensor& grad, Activations& act) = 0;
  // backward() in two steps, for zero-bubble pipeline schedules: backward_input (B) returns the
  // input gradient and leaves the parameter gradients untouched; backward_weight (W) accumulates
  // them (grad-ready hooks as in backward()) and frees `act`. B then W must accumulate exactly what
  // backward() does. The defaults refuse: a chunk that cannot split runs only fused schedules.
  virtual Tensor backward_input(const Tensor& grad, Activations& act);
  virtual void backward_weight(Activations& act);

  // Every parameter of the chunk, in a fixed order (DataParallel lays its buffer out in it).
  virtual std::vector<Parameter*> parameters() = 0;
  // The parameters grouped by what computes together, in forward order; every parameter is in
  // exactly one unit. Sharded data parallelism gathers and frees parameters unit by unit.
  virtual std::vector<std::vector<Parameter*>> units() = 0;

  // Hooks: one slot each, an empty function removes it.
  // Called during a backward right after a parameter's last gradient contribution of that call,
  // so a caller such as data parallelism can start reducing while the rest of the backward runs.
  virtual void set_grad_ready_hook(std::function<void(Parameter&)> hook) = 0;
  // Called during forward() right before a parameter's first use in that call, so a caller can
  // wait for the parameter's all-gather only when it is needed.
  virtual void set_param_use_hook(std::function<void(Parameter&)> hook) = 0;
  enum class UnitPhase { BeforeForward, AfterForward, BeforeBackward, AfterBackward };
  // Called right before and after each unit's forward and backward (and weight step) with the
  // parameters the unit reads, which may include a weight of another unit it shares (GPT's tied
  // output weight). Lets fully sharded data parallelism gather a unit's parameters just before it
  // computes and free them after.
  virtual void set_unit_hook(std::function<void(UnitPhase, const std::vector<Parameter*>&)> hook) = 0;

  // false: evaluation (no dropout); true is the default.
  virtual void set_training(bool training) = 0;
  // Where the parameters and activations live; inputs must be there too.
  virtual Device device() const = 0;
};

}  // namespace parallel
