#pragma once
// Multi-head latent attention, DeepSeek-V2/V3's MLA (latent_attention.cpp; docs/model.md,
// "Multi-head latent attention").
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "layer.hpp"
#include "layer_env.hpp"
#include "layer_spec.hpp"
#include "norm.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/tensor_parallel.hpp"
#include "replicated_linear.hpp"

namespace parallel::model {

// With n = qk_nope_head_dim, r = qk_rope_head_dim, dv = v_head_dim, H heads:
//   q          = q_up(q_latent_norm(q_down(x)))          (or query(x) when q_lora_rank is 0)  [.., H (n + r)]
//   [c | k_pe] = kv_down(x)                        [.., kv_lora_rank + r]
//   kv         = kv_up(kv_norm(c))                 [.., H (n + dv)]
//   q_h = [q_nope_h, rope(q_pe_h)], k_h = [k_nope_h, rope(k_pe)] (one k_pe for every head), v_h
//   y = proj(attention(q, k, v; scale 1/sqrt(n + r) times DeepSeek's yarn correction))
// Under tensor parallelism the heads split (q_up / query and kv_up column-parallel, proj
// row-parallel); the down projections and their norms are replicated and run on this rank's rows
// (its s-shard under sequence parallelism, then gathered by the up projections, as Megatron-Core's
// MLA does). k_pe is gathered along s the same way, and its gradient, which every rank's heads add
// to, is reduced over tp.
class LatentAttention {
 public:
  LatentAttention(const LayerEnv& env, const LayerSpec& spec);
  struct Context {
    Tensor positions, doc_start;               // the micro-batch's documents (AttentionPart::Context)
    std::shared_ptr<const cp::Layout> layout;  // this rank's positions under cp (null: the zigzag)
    tp::LinearContext q_down_ctx, q_up_ctx, kv_down_ctx, kv_up_ctx, proj_ctx;
    Norm::Context q_latent_norm_ctx, kv_norm_ctx;
    // Selective recompute keeps the up projections' outputs and k_pe (gathered, not rotated).
    Tensor q, kv, k_pe;
    Tensor out;                 // the core's output (proj's input)
    cp::Attention::Saved core;  // the core's state (q, k, v after rope, ...)
  };
  // keep_core = false (selective recompute): keep q, kv and k_pe; rebuild the rest in the backward.
  Tensor forward(const Tensor& x, Context& ctx, bool keep_core);  // [s(/tp), b, h] -> [s(/tp), b, h]
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();

  std::optional<ReplicatedLinear> q_down;  // q_lora_rank > 0
  std::optional<Norm> q_latent_norm;       // q_lora_rank > 0
  tp::ColumnParallelLinear q_up;           // "q_up", or "query" when q_lora_rank is 0
  ReplicatedLinear kv_down;
  Norm kv_norm;
  tp::ColumnParallelLinear kv_up;
  tp::RowParallelLinear proj;

 private:
  Tensor walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode);
  void core_forward(const Tensor& q_in, const Tensor& kv_in, const Tensor& k_pe_in, Context& ctx);
  struct CoreGrads {
    Tensor dq, dkv, dk_pe;  // shaped as q, kv, k_pe; dk_pe is this rank's heads' part only
  };
  CoreGrads core_backward(const Tensor& dout, Context& ctx);
  void restore_core(Context& ctx);  // selective recompute
  const LayerEnv& env_;
  int64_t heads_local_, nope_, rope_, v_dim_, kv_rank_;
  int64_t window_;  // this layer's sliding window (LayerSpec::window); 0: none
  cp::Attention core_;
};
static_assert(Layer<LatentAttention, bool>);  // forward(x, ctx, keep_core)

}  // namespace parallel::model
