#pragma once
// The GPT model's internal building blocks (not part of the public API): norm, self-attention,
// MLP, one transformer layer and the output layer, each with its forward and backward side by side
// and a Context holding what its backward needs. Names, shapes and init follow docs/model.md.
//
// Every layer with parameters also splits its backward (tensor_parallel.hpp): backward_input (B)
// returns the input gradient and keeps what backward_weight (W) needs in the Context; W
// accumulates the parameter gradients and frees the Context. B then W is bit for bit backward().
// The norms are the exception: their weight gradients come out of B's kernel pass (see Norm).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// What every layer of one model chunk shares.
struct LayerEnv {
  const ModelConfig* config = nullptr;
  Communicator* tp = nullptr;
  bool sequence_parallel = false;  // only meaningful when tp->size() > 1
  // Context parallelism (context_parallel.hpp): null or size 1 without it. This rank's activations
  // hold chunks cp.rank() and 2 cp - 1 - cp.rank() of every sample.
  Communicator* cp = nullptr;
  ContextComm context_comm = ContextComm::P2P;
  uint64_t seed = 0;
  int64_t hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
  bool training = true;  // false: dropout is the identity (evaluation)
  // The precision policy's compute dtype (precision.hpp): the model's parameter copy and so every
  // activation and activation gradient. Layers follow their inputs' dtype; this is for the odd
  // tensor a layer creates from nothing.
  DType activation_dtype = DType::F32;
  // Expert parallelism: the ranks that split a MoE layer's experts (null: this rank holds all),
  // and the ranks that split each expert's inner width (tensor parallelism inside experts; null:
  // whole experts).
  Communicator* ep = nullptr;
  Communicator* etp = nullptr;
  // d(objective) / d(sum of this rank's MoE aux and z losses over the step's micro-batches): the
  // trainer sets it to loss scale / micro-batches per rank, as Megatron's MoEAuxLossAutoScaler does.
  double moe_loss_scale = 1.0;
  int cp_rank() const { return cp != nullptr ? cp->rank() : 0; }
  int cp_size() const { return cp != nullptr ? cp->size() : 1; }
  // The sizes of the communicators this chunk was given, as check_layout (layout_rules.hpp) reads
  // them; dp is not known here (data 0).
  ParallelConfig layout() const {
    ParallelConfig p;
    p.tensor = tp->size();
    p.sequence_parallel = sequence_parallel && tp->size() > 1;
    p.context = cp_size();
    p.context_comm = context_comm;
    p.expert = ep != nullptr ? ep->size() : 1;
    p.expert_tensor = etp != nullptr ? etp->size() : 1;
    p.data = 0;
    return p;
  }
  // Global sequence positions of the rows of this rank's activations [s_local, b, h]: its s-shard
  // under sequence parallelism of its cp chunks. Dropout masks and learned positions are keyed by
  // them, so they do not depend on tp or cp.
  std::vector<cp::Segment> positions(int64_t s_local) const {
    const bool sharded = sequence_parallel && tp->size() > 1;
    const int64_t local_seq = sharded ? s_local * tp->size() : s_local;
    return cp::segments(local_seq, cp_rank(), cp_size(), sharded ? tp->rank() * s_local : 0, s_local);
  }
};

// Dropout keyed by (seed, layer, site, micro-batch) and each element's global position. p == 0 is
// the identity and costs nothing (x is returned as is).
struct DropoutSite {
  int layer = 0;  // global layer index; -1 for the embedding
  int site = 0;   // 0 embedding, 1 attention output, 2 MLP output
};
Tensor dropout_forward(const LayerEnv& env, const Tensor& x, DropoutSite where, uint64_t micro_batch);
Tensor dropout_backward(const LayerEnv& env, const Tensor& dy, DropoutSite where, uint64_t micro_batch);
// The same site's dropout as arguments for the fused ops (ops::DropoutSpec), one per run of rows
// [row, row + rows) of a [s_local, ...] tensor like x whose global positions are consecutive: one
// run, or two under context parallelism; a single run over every row, p = 0, when dropout is off.
struct DropoutRun {
  int64_t row = 0, rows = 0;
  ops::DropoutSpec spec;
};
std::vector<DropoutRun> dropout_runs(const LayerEnv& env, const Tensor& x, DropoutSite where,
                                     uint64_t micro_batch);
// out = residual + dropout(branch) at `where` (ops::dropout_add, run by run); out may be branch.
void dropout_add(const LayerEnv& env, const Tensor& branch, const Tensor& residual, Tensor& out,
                 DropoutSite where, uint64_t micro_batch);

// LayerNorm or RMSNorm over h; weight/bias replicated, partial gradients under sequence parallelism.
class Norm {
 public:
  Norm(const LayerEnv& env, const std::string& name);
  struct Context {
    Tensor x, mean, rstd;
  };
  Tensor forward(const Tensor& x, Context& ctx);
  Tensor backward(const Tensor& dy, Context& ctx);  // accumulates dweight/dbias; returns dx
  // The norm kernels produce dx and the weight gradients in one pass over the rows, so the input
  // step accumulates the weight gradients too (bit for bit backward()) and the weight step is empty:
  // nothing of the norm waits for W.
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);

  // The residual stream's fused steps (ops.hpp, "residual add fused with its neighbours"):
  // forward_residual writes sum = residual + dropout(branch) (sum may be branch itself, to reuse a
  // fresh tensor) and returns norm(sum), keeping sum as its saved input. backward_residual returns
  // d(sum) = the norm's dx + dresidual, and the branch's gradient (dropout's backward of d(sum); the
  // same tensor when dropout is off). Weight gradients accumulate in the pass, as in backward().
  Tensor forward_residual(const Tensor& residual, const Tensor& branch, const std::vector<DropoutRun>& drop,
                          Tensor& sum, Context& ctx);
  struct ResidualGrads {
    Tensor dsum, dbranch;
  };
  // drop: dropout_runs() of the branch's site; empty when no dropout sits on the branch.
  ResidualGrads backward_residual(const Tensor& dy, const Tensor& dresidual,
                                  const std::vector<DropoutRun>& drop, Context& ctx);
  std::vector<Parameter*> parameters();
  Parameter weight, bias;  // bias only for LayerNorm

 private:
  Normalization kind_;
  float eps_;
};

// Self-attention: fused column-parallel q/k/v projection, rope, causal flash attention over this
// rank's heads, row-parallel output projection.
class SelfAttention {
 public:
  SelfAttention(const LayerEnv& env, int layer);
  struct Context {
    // The micro-batch's documents (model_chunk.hpp's PackedSequence): positions [b, s_local] on
    // the host, doc_start [b, S] on the device; undefined: plain positions, one document.
    Tensor positions, doc_start;
    tp::LinearContext qkv_ctx, proj_ctx;
    Tensor qkv;                 // projection output, kept instead of the core's state (selective)
    Tensor out;                 // the core's output (proj's input)
    cp::Attention::Saved core;  // the core's state for its backward (q, k, v after rope, ...)
  };
  // keep_core = false (selective recompute): keep only qkv and rebuild the rest in the backward.
  Tensor forward(const Tensor& x, Context& ctx, bool keep_core);  // [s(/tp), b, h] -> [s(/tp), b, h]
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);  // keeps only the linears' contexts
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();

  tp::ColumnParallelLinear qkv;
  tp::RowParallelLinear proj;

 private:
  void core_forward(const Tensor& qkv_out, Context& ctx);
  // The attention core's backward between the two linears: proj's dx -> qkv's dy.
  Tensor core_backward(const Tensor& dout, Context& ctx);
  void restore_core(Context& ctx);  // selective recompute
  const LayerEnv& env_;             // the chunk's, so set_training() reaches every layer
  int64_t heads_local_, groups_local_;
  int64_t window_;      // this layer's sliding window (ModelConfig::layer_window); 0: none
  cp::Attention core_;  // exact over the whole sequence under context parallelism
};

// MLP: column-parallel fc1 (or fused gate|up for SwiGLU), activation, row-parallel fc2.
class MLP {
 public:
  MLP(const LayerEnv& env, int layer);                               // "layers.<layer>.mlp", env.ffn wide
  MLP(const LayerEnv& env, const std::string& prefix, int64_t ffn);  // e.g. a MoE layer's shared expert
  struct Context {
    tp::LinearContext fc1_ctx, fc2_ctx;
    Tensor pre;  // fc1 output, the activation's input
  };
  Tensor forward(const Tensor& x, Context& ctx);
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);  // keeps only the linears' contexts
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();

  tp::ColumnParallelLinear fc1;
  tp::RowParallelLinear fc2;

 private:
  Activation activation_;
};

// What the MoE layers of a chunk saw since the last reset (for metrics.jsonl): the aux and z loss
// terms as added to the objective (coefficients applied, one per layer and micro-batch) and the
// assignments each expert received (before capacity drops), over this rank's tokens.
struct MoEStats {
  double aux_loss = 0.0, z_loss = 0.0;
  int64_t calls = 0;    // layer forwards counted
  int64_t dropped = 0;  // assignments beyond the capacity
  std::vector<int64_t> tokens_per_expert;
};

// Mixture of experts in place of the MLP (docs/model.md, "Mixture of experts"): a router (fp32
// logits, softmax over all experts, top-k with ties to the lower expert index; the combine weights
// are the chosen probabilities, not renormalised), the load-balancing and z losses, token dispatch
// to the experts' owners over env.ep (alltoall or allgather), the local experts as one grouped
// GEMM over their contiguous rows, and the combine. Experts are GeLU or SwiGLU MLPs without biases,
// named "layers.<l>.mlp.experts.<global index>.{fc1 | gate, up}.weight" and "...fc2.weight"; a rank
// holds num_experts / ep of them (global indices ep_rank * local ..). Under tensor parallelism
// inside experts (env.etp, Megatron-Core's expert-tensor group) each rank holds 1/etp of the inner
// width of its experts (fc1 / gate / up by rows, fc2 by columns, as the dense MLP under tp): after
// the ep dispatch the rows are all-gathered over etp, every etp rank computes its slice for all of
// them, and the partial outputs are reduce-scattered back before the return dispatch; the
// backward mirrors it. An optional shared expert is a tensor-parallel MLP. Runs on the CPU and
// on CUDA: routing is host code on the router's logits read back, the row passes are ops (moe.cpp).
class MoELayer {
 public:
  MoELayer(const LayerEnv& env, int layer);
  struct Context {
    int64_t tokens = 0;  // rows of this rank's input
    Tensor x;            // [T, h] input rows (router and weight steps)
    Tensor probs;        // [T, E] fp32 router softmax, on the host (routing is host code)
    std::vector<float> lse;
    std::vector<int32_t> choice;      // [T * k] chosen experts
    std::vector<int64_t> perm;        // permuted row -> assignment t * k + j (kept ones, by expert)
    std::vector<int64_t> token_rows;  // [T, k] each token's kept permuted rows, ascending; -1 pads
    std::vector<int64_t> counts;      // [E] kept assignments per expert (this rank's tokens)
    std::vector<double> aux_counts;   // [E] assignments before drops, over the tp group under sp
    double aux_tokens = 0;            // tokens the aux and z losses average over
    // Dispatch: rows received from each ep rank per local expert [ep][L].
    std::vector<int64_t> recv_counts;
    std::vector<int64_t> all_counts;  // allgather: [ep][E] every rank's counts per expert
    // Tensor parallelism inside experts: the rows each etp rank brought per local expert [etp][L],
    // and where the gathered row of each sits in the all-gather's padded [etp][width] layout.
    std::vector<int64_t> etp_counts, etp_index;
    int64_t etp_width = 0;
    // Offsets of the local experts' rows in what the experts compute on (gathered over etp).
    std::vector<int64_t> local_offsets;
    // [N_local, h], [N_local, F_l | 2 F_l], [N_local, F_l] with F_l = F / etp.
    Tensor expert_in, pre, act;
    Tensor out_perm;  // [N, h] expert outputs back in permuted order
    // Between backward_input and backward_weight.
    Tensor d_expert_out, d_pre, d_logits;
    MLP::Context shared;
  };
  Tensor forward(const Tensor& x, Context& ctx, bool record_stats);  // [s(/tp), b, h] -> same
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();
  MoEStats& stats() { return stats_; }

  Parameter router;  // [E, h], replicated (dense)
  // Local experts, this etp rank's slice of each (F_l = F / etp, rows or columns from etp_rank F_l):
  // fc1[e] holds the parts {fc1} (gelu) or {gate, up} (swiglu), each [F_l, h], back to back in
  // one storage so one GEMM serves both (fused_rows); fc2[e] is [h, F_l].
  std::vector<std::vector<Parameter>> fc1;
  std::vector<Parameter> fc2;
  std::unique_ptr<MLP> shared;  // shared expert, or null

 private:
  // Rows of the permuted tokens [N, h] to the local experts' rows [N_local, h] (forward) or back.
  Tensor dispatch(const Tensor& rows, Context& ctx, const std::vector<int64_t>& send_counts, bool back);
  // Tensor parallelism inside experts: this rank's rows (grouped by local expert) to every etp
  // rank's rows of each local expert, and partial results over those back to this rank's rows,
  // summed over etp. Identities at etp 1.
  Tensor gather_over_etp(const Tensor& rows, const Context& ctx) const;
  Tensor reduce_scatter_over_etp(const Tensor& rows, const Context& ctx) const;
  const LayerEnv& env_;
  int64_t experts_, local_, topk_, ffn_, ffn_local_;
  MoEStats stats_;
};

// Pre-norm transformer layer with its recompute policy.
class TransformerLayer {
 public:
  TransformerLayer(const LayerEnv& env, int layer, Recompute recompute);
  struct Context {
    uint64_t micro_batch = 0;
    Tensor positions, doc_start;  // the micro-batch's documents (SelfAttention::Context)
    Tensor x;                     // the layer input (all that full recompute keeps)
    Norm::Context norm1, norm2;
    SelfAttention::Context attn;
    MLP::Context mlp;
    MoELayer::Context moe;
  };
  Tensor forward(const Tensor& x, Context& ctx, uint64_t micro_batch);
  Tensor backward(const Tensor& dy, Context& ctx);        // frees ctx
  Tensor backward_input(const Tensor& dy, Context& ctx);  // keeps the linears' state
  void backward_weight(Context& ctx);                     // frees ctx
  std::vector<Parameter*> parameters();
  MoELayer* moe() { return moe_.get(); }  // null for a dense layer

 private:
  Tensor forward_impl(const Tensor& x, Context& ctx, bool keep_core, bool record_stats);
  Tensor ffn_forward(const Tensor& x, Context& ctx, bool record_stats);
  Tensor ffn_backward(const Tensor& dy, Context& ctx);
  Tensor ffn_backward_input(const Tensor& dy, Context& ctx);
  void ffn_backward_weight(Context& ctx);
  const LayerEnv& env_;  // the chunk's, so set_training() reaches every layer
  int layer_;
  Recompute recompute_;
  Norm norm1_;
  SelfAttention attention_;
  Norm norm2_;
  std::unique_ptr<MLP> mlp_;       // dense layers
  std::unique_ptr<MoELayer> moe_;  // MoE layers (ModelConfig::is_moe_layer)
};

// Output projection to vocab-parallel logits: a column-parallel linear without bias whose weight
// may be borrowed (tied embeddings use the word embedding's Parameter).
class OutputLayer {
 public:
  OutputLayer(const LayerEnv& env, Parameter* weight);
  Tensor forward(const Tensor& x, tp::LinearContext& ctx);  // [s(/tp), b, h] -> [s, b, Vp/tp]
  Tensor backward(const Tensor& dlogits, tp::LinearContext& ctx);
  Tensor backward_input(const Tensor& dlogits, tp::LinearContext& ctx);  // keeps dlogits for W
  void backward_weight(tp::LinearContext& ctx);

 private:
  const LayerEnv& env_;  // the chunk's, so set_training() reaches every layer
  Parameter* weight_;
};

}  // namespace parallel::model
