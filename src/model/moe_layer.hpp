#pragma once
// The mixture-of-experts layer (moe.cpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "layer.hpp"
#include "layer_env.hpp"
#include "mlp.hpp"
#include "parallel/tensor_parallel.hpp"
#include "router.hpp"

namespace parallel::model {

// What the MoE layers of a chunk saw since the last reset (for metrics.jsonl): the aux and z loss
// terms as added to the objective (coefficients applied, one per layer and micro-batch) and the
// assignments each expert received (before capacity drops), over this rank's tokens.
struct MoEStats {
  double aux_loss = 0.0, z_loss = 0.0, seq_aux_loss = 0.0;
  int64_t calls = 0;    // layer forwards counted
  int64_t dropped = 0;  // assignments beyond the capacity
  std::vector<int64_t> tokens_per_expert;
};

// Mixture of experts in place of the MLP (docs/model.md, "Mixture of experts"): a router (fp32
// logits; the scores, top-k choices, combine weights and the balance and z losses are router.hpp's
// Router's), token dispatch to the experts' owners over env.ep (alltoall or allgather), the local
// experts as one grouped GEMM over their contiguous rows, and the combine. Experts are GeLU or SwiGLU MLPs
// without biases, named "layers.<l>.mlp.experts.<global index>.{fc1 | gate, up}.weight" and "...fc2.weight";
// a rank holds num_experts / ep of them (global indices ep_rank * local ..). Under tensor parallelism inside
// experts (env.etp, Megatron-Core's expert-tensor group) each rank holds 1/etp of the inner width of its
// experts (fc1 / gate / up by rows, fc2 by columns, as the dense MLP under tp): after the ep dispatch the
// rows are all-gathered over etp, every etp rank computes its slice for all of them, and the partial outputs
// are reduce-scattered back before the return dispatch; the backward mirrors it. An optional shared expert is
// a tensor-parallel MLP. Runs on the CPU and on CUDA: routing is host code on the router's logits read back,
// the row passes are ops (moe.cpp).
class MoELayer {
 public:
  MoELayer(const LayerEnv& env, int layer);
  struct Context {
    int64_t tokens = 0;                // rows of this rank's input
    Tensor x;                          // [T, h] input rows (router and weight steps)
    Router::Routing routing;           // host code (router.hpp)
    std::vector<float> routing_stats;  // Router::statistics, over the tp group under sp and cp
    std::vector<int64_t> perm;         // permuted row -> assignment t * k + j (kept ones, by expert)
    std::vector<int64_t> token_rows;   // [T, k] each token's kept permuted rows, ascending; -1 pads
    std::vector<int64_t> counts;       // [E] kept assignments per expert (this rank's tokens)
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
    // LoRA on the experts: the rank-space activations x A1ᵀ [N_local, pairs * r] and act A2ᵀ
    // [N_local, r] (this etp rank's partial sum), and their gradients between the backward's steps.
    Tensor lora_h1, lora_h2, lora_dh1, lora_dh2;
    MLP::Context shared;
  };
  Tensor forward(const Tensor& x, Context& ctx, bool record_stats);  // [s(/tp), b, h] -> same
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();
  MoEStats& stats() { return stats_; }

  Parameter router;  // [E, h], replicated (dense)
  Router gate;       // routing from the router's logits (router.hpp), with the expert bias
  // Local experts, this etp rank's slice of each (F_l = F / etp, rows or columns from etp_rank F_l):
  // fc1[e] holds the parts {fc1} (gelu) or {gate, up} (swiglu), each [F_l, h], back to back in
  // one storage so one GEMM serves both (fused_rows); fc2[e] is [h, F_l].
  std::vector<std::vector<Parameter>> fc1;
  std::vector<Parameter> fc2;
  std::unique_ptr<MLP> shared;  // shared expert, or null
  // LoRA on the local experts (model.lora targets gate / up / fc1 and fc2; docs/lora.md, "Experts"),
  // sharded over etp as the base weights: per expert, the adapted fc1 parts' A's [r, h] back to back
  // in one storage (one GEMM gives every part's x Aᵀ) and replicated over etp, their B's [F_l, r]
  // split by rows like the parts; fc2's A [r, F_l] split by columns like fc2 and its B [h, r]
  // replicated. The replicated factors' gradients are partial sums over etp, summed in
  // backward_weight (one all-reduce per layer). Empty without adapters.
  std::vector<std::vector<Parameter>> lora_a1, lora_b1;
  std::vector<Parameter> lora_a2, lora_b2;

 private:
  // Rows of the permuted tokens [N, h] to the local experts' rows [N_local, h] (forward) or back.
  Tensor dispatch(const Tensor& rows, Context& ctx, const std::vector<int64_t>& send_counts, bool back);
  // Tensor parallelism inside experts: this rank's rows (grouped by local expert) to every etp
  // rank's rows of each local expert, and partial results over those back to this rank's rows,
  // summed over etp. Identities at etp 1.
  Tensor gather_over_etp(const Tensor& rows, const Context& ctx) const;
  Tensor reduce_scatter_over_etp(const Tensor& rows, const Context& ctx) const;
  // LoRA: expert e's B's as one block-diagonal [fc1 rows, pairs * r] matrix (zeros off the adapted
  // parts' blocks), and the adapters' weight step.
  Tensor lora_blocks(std::size_t e) const;
  void lora_backward_weight(Context& ctx);
  int64_t lora_rank_ = 0;
  float lora_scale_ = 0.0f;
  std::vector<int64_t> lora_rows_;  // first fc1 row (local) of each adapted part, in part order
  bool lora_fc2_ = false;
  const LayerEnv& env_;
  int64_t experts_, local_, topk_, ffn_, ffn_local_;
  MoEStats stats_;
};
static_assert(Layer<MoELayer, bool>);  // forward(x, ctx, record_stats)

}  // namespace parallel::model
