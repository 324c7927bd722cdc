#pragma once
// Tensor-parallel building blocks (Megatron-Core's tensor_parallel package), each with its forward
// and backward side by side. A layer knows its tensor-parallel communicator and nothing else about
// the layout: pipeline schedules and data parallelism never reach in here.
//
// Activations are [s, b, h]. With sequence parallelism the tensors between layers are
// [s/tp, b, h]: a column-parallel layer all-gathers its input along s (and reduce-scatters the
// input gradient), a row-parallel layer reduce-scatters its output (and all-gathers the output
// gradient), replacing the all-reduces of plain tensor parallelism.
#include <string>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/parameter.hpp"

namespace parallel::tp {

// ---- communication mappings (forward; the backward is the named dual) ------------------------
Tensor all_reduce(Communicator& tp, const Tensor& x);       // dual: identity
Tensor gather_sequence(Communicator& tp, const Tensor& x);  // [s/tp,..] -> [s,..]; dual: reduce_scatter
Tensor reduce_scatter_sequence(Communicator& tp, const Tensor& x);  // [s,..] -> [s/tp,..]; dual: gather
Tensor split_sequence(Communicator& tp, const Tensor& x);           // [s,..] -> own [s/tp,..]; dual: gather
Tensor gather_last_dim(Communicator& tp, const Tensor& x);          // [..,n/tp] -> [..,n]; dual: split
Tensor split_last_dim(Communicator& tp, const Tensor& x);           // [..,n] -> own [..,n/tp]

// Dropout on a LoRA adapter's input (docs/lora.md), keyed like the model's other dropout sites: the
// mask of element (s, b, i) depends only on `seed` (the site and micro-batch) and the element's
// GLOBAL index (position * b + b_index) * in_global + i, so tp, sp and cp layouts draw the same
// mask. `runs` gives the global position of each run of rows of the input the GEMM sees (gathered
// along s under sequence parallelism); empty or p == 0: no dropout. Set by the caller before forward.
struct LoraDropout {
  float p = 0.0f;
  uint64_t seed = 0;
  struct Run {
    int64_t row = 0, rows = 0, position = 0;
  };
  std::vector<Run> runs;
};

// A LoRA adapter pair on a linear (or on one part of a fused linear): y += scale * x Aᵀ Bᵀ with
// A [rank, in] and B [out, rank] (PEFT's lora_A / lora_B). Named "<part>.lora_A.weight" and
// "<part>.lora_B.weight". On a column-parallel linear B is split by rows like the weight and A is
// replicated; on a row-parallel one A is split by columns like the weight and B is replicated. The
// replicated factor's gradient is a partial sum over tp (sequence_parallel_grad: finalize_grads sums
// it), which costs no communication in the forward or backward.
struct LoraOptions {
  int rank = 0;        // 0: no adapter
  float scale = 0.0f;  // alpha / rank
};

// What a linear layer keeps from its forward for its backward (per micro-batch).
struct LinearContext {
  Tensor input;  // the layer's input as the GEMM saw it (gathered along s under sequence parallelism)
  // Between a split backward's input step and its weight step: the output gradient the weight GEMM
  // reads, and the one the bias gradient sums (they differ only for a row-parallel layer under
  // sequence parallelism: the gathered gradient vs this rank's s-shard).
  Tensor grad_output, grad_bias;
  // LoRA: the dropout the caller asks for, the adapter input after it, the rank-space activation
  // x Aᵀ (all parts side by side; this rank's partial sum on a row-parallel layer) and, between a
  // split backward's two steps, its gradient.
  LoraDropout lora_dropout;
  Tensor lora_x, lora_h, lora_dh;
  // Set by whoever produced the output gradient and already added its column sums into the bias
  // gradient (ColumnParallelLinear::bias_grad_to_fuse): backward() then skips its own; cleared there.
  bool bias_grad_added = false;
};

// Split backward (zero-bubble pipeline schedules). Every layer with weights offers, besides its
// fused backward(), backward_input() (B: returns the input gradient; parameter gradients untouched;
// keeps in the context what the weight step needs) and backward_weight() (W: accumulates the
// parameter gradients, frees the context). B then W accumulates bit for bit what backward() does;
// other micro-batches' steps may run in between. The fused path is unchanged (it overlaps the tp
// reduction of dx with the weight GEMM, which the split cannot).

// y = x Wᵀ + b with W split by output rows over the tp group. Several global parameters may share
// one layer ("parts": query/key/value, gate/up): the local weight is the concatenation of each
// part's slice, so one GEMM serves them all, and the local output is [.., part0_r | part1_r | ..].
class ColumnParallelLinear {
 public:
  struct Part {
    std::string name;    // e.g. "layers.0.attention.query" (".weight"/".bias" are appended)
    int64_t out_global;  // global output features of this part; divisible by tp size
    bool lora = false;   // gets a LoRA adapter pair (Options::lora)
  };
  struct Options {
    bool bias = true;
    bool gather_output = false;      // all-gather the output over tp (full output on every rank)
    bool sequence_parallel = false;  // input is [s/tp, b, in]: all-gather it along s first
    LoraOptions lora;                // adapters on the parts marked lora
  };
  ColumnParallelLinear(std::vector<Part> parts, int64_t in_features, Options options, Communicator& tp);

  Tensor forward(const Tensor& x, LinearContext& ctx);          // x: [s(/tp), b, in] -> [s, b, out_local]
  Tensor backward(const Tensor& dy, LinearContext& ctx);        // accumulates weight/bias grads; returns dx
  Tensor backward_input(const Tensor& dy, LinearContext& ctx);  // B: dx only
  void backward_weight(LinearContext& ctx);                     // W: weight/bias grads

  int64_t out_local() const { return out_local_; }
  std::vector<Parameter*> parameters();
  // The bias gradient (fused [out_local] view) for a caller that sums the output gradient's columns
  // into it itself, in the pass that produces that gradient (the MLP: ops::gelu_backward_bias), and
  // then sets LinearContext::bias_grad_added for backward(). Undefined where backward() would not
  // add them in the same way: no bias, frozen base weights, or a gathered output (dy is split first).
  Tensor bias_grad_to_fuse() const;
  // One per part. The parts' tensors sit back to back in one storage, so a single view spans them
  // all and one GEMM serves every part. The Parameters are the source of truth: whoever re-binds
  // them (ParamAndGradBuffer) must keep each tensor kind's parts adjacent and in this order.
  std::vector<Parameter> weights, biases;
  // LoRA, one pair per adapted part, in part order: the A's back to back in one storage (one GEMM
  // gives every part's x Aᵀ), the B's each on its own. lora_rows[i]: the first local output row of
  // the part lora_b[i] adapts. Empty without adapters.
  std::vector<Parameter> lora_a, lora_b;
  std::vector<int64_t> lora_rows;

 private:
  // The fused [out_local(, in)] view over the parts' `member` tensors (value or grad).
  Tensor fused(const std::vector<Parameter>& parts, Tensor Parameter::*member) const;
  bool base_frozen() const { return weights.front().frozen; }
  // LoRA's steps beside the base GEMMs: y += scale h Bᵀ; dx += scale dy B A (before dx's tp
  // reduction, which sums the partial products); then the adapters' gradients.
  Tensor lora_blocks() const;  // the B's as one block-diagonal [out_local, pairs * rank]
  void lora_forward(const Tensor& x_full, Tensor& y2d, LinearContext& ctx);
  void lora_backward_input(const Tensor& dy2d, Tensor& dx_full, LinearContext& ctx);
  void lora_backward_weight(const Tensor& dy2d, LinearContext& ctx);
  Options options_;
  Communicator& tp_;
  int64_t in_ = 0, out_local_ = 0;
};

// y = x Wᵀ + b with W split by input columns: x holds this rank's slice of the input features;
// partial products are all-reduced (or reduce-scattered along s under sequence parallelism), and
// the bias is added once, after the reduction.
class RowParallelLinear {
 public:
  struct Options {
    bool bias = true;
    bool sequence_parallel = false;  // output is [s/tp, b, out]
    LoraOptions lora;                // an adapter pair when lora.rank > 0
  };
  RowParallelLinear(std::string name, int64_t in_global, int64_t out_features, Options options,
                    Communicator& tp);

  Tensor forward(const Tensor& x, LinearContext& ctx);          // x: [s, b, in/tp] -> [s(/tp), b, out]
  Tensor backward(const Tensor& dy, LinearContext& ctx);        // returns dx [s, b, in/tp]
  Tensor backward_input(const Tensor& dy, LinearContext& ctx);  // B: dx only
  void backward_weight(LinearContext& ctx);                     // W: weight/bias grads

  std::vector<Parameter*> parameters();
  Parameter weight, bias;
  Parameter lora_a, lora_b;  // defined only with Options::lora

 private:
  bool has_lora() const { return options_.lora.rank > 0; }
  void lora_backward_input(const Tensor& dy_full2d, Tensor& dx, LinearContext& ctx);
  void lora_backward_weight(const Tensor& dy_full2d, LinearContext& ctx);
  Options options_;
  Communicator& tp_;
};

// The LoRA pieces both linears share (src/tp/lora.cpp).
namespace lora {
// x after the adapter dropout (x itself when there is none); in_offset / in_global place x's last
// dimension in the global input (a row-parallel layer's column slice).
Tensor dropout_forward(const Tensor& x, const LoraDropout& drop, int64_t in_offset, int64_t in_global);
Tensor dropout_backward(const Tensor& dx, const LoraDropout& drop, int64_t in_offset, int64_t in_global);
// A [rank, in] Parameter named `name` (replicated, or split along dim 1 when in_local < in_global),
// B [out_local, rank] (split along dim 0 when out_local < out_global). Values zero: GPTModel
// initialises them (init.hpp: A kaiming-uniform, B zero, as PEFT).
Parameter make_a(const std::string& name, int64_t rank, int64_t in_local, int64_t in_global,
                 int64_t in_offset);
Parameter make_b(const std::string& name, int64_t out_local, int64_t out_global, int64_t out_offset,
                 int64_t rank);
}  // namespace lora

// Word embedding with the (padded) vocabulary split in contiguous ranges over the tp group: each
// rank looks up the ids it owns (zeros elsewhere), and the partial results are all-reduced (or
// reduce-scattered along s under sequence parallelism).
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(std::string name, int64_t vocab_padded, int64_t hidden, bool sequence_parallel,
                         Communicator& tp);
  struct Context {
    Tensor tokens;
  };
  Tensor forward(const Tensor& tokens, Context& ctx);  // tokens [b, s] int32 -> [s(/tp), b, h]
  // Accumulates into weight.grad. There is no input gradient: the whole backward is a weight step.
  void backward(const Tensor& dy, Context& ctx);

  int64_t vocab_start() const { return weight.partition_offset; }
  std::vector<Parameter*> parameters() { return {&weight}; }
  Parameter weight;

 private:
  bool sequence_parallel_;
  Communicator& tp_;
};

// Cross-entropy over vocab-parallel logits [n, v_local] without gathering them: the row max, the
// target logit and the sum of exponentials are reduced over tp. Columns with a global id >=
// vocab_size (padding) never take part. Returns the per-token loss [n], the same on every tp rank.
struct CrossEntropyContext {
  Tensor logits, targets, row_max, sum_exp;
  int64_t vocab_start = 0, vocab_size = 0;
};
Tensor vocab_parallel_cross_entropy(Communicator& tp, const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, int64_t vocab_size, CrossEntropyContext& ctx);
// grad_loss: [n], d(objective)/d(loss_i). Returns dlogits [n, v_local].
Tensor vocab_parallel_cross_entropy_backward(const Tensor& grad_loss, CrossEntropyContext& ctx);

// The gradient reductions tensor parallelism owes before an optimizer step: sums the gradients of
// sequence_parallel_grad parameters over the tp group.
void reduce_sequence_parallel_grads(const std::vector<Parameter*>& params, Communicator& tp);

}  // namespace parallel::tp
