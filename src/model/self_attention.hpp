#pragma once
// The self-attention layer (attention.cpp).
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

namespace parallel::model {

// Self-attention: fused column-parallel q/k/v projection, optional per-head RMSNorm of the queries and
// keys (qk-norm, LayerSpec::qk_norm), rope, causal flash attention over this rank's heads,
// row-parallel output projection.
class SelfAttention {
 public:
  SelfAttention(const LayerEnv& env, const LayerSpec& spec);
  SelfAttention(const LayerEnv& env, int layer);  // layer_spec(*env.config, layer)
  struct Context {
    // The micro-batch's documents (model_chunk.hpp's PackedSequence): positions [b, s_local] on
    // the host, doc_start [b, S] on the device; undefined: plain positions, one document.
    Tensor positions, doc_start;
    std::shared_ptr<const cp::Layout> layout;  // the micro-batch's cp layout; null: the zigzag
    tp::LinearContext qkv_ctx, proj_ctx;
    Norm::Context q_norm_ctx, k_norm_ctx;  // qk-norm's inputs and statistics
    Tensor qkv;                            // projection output, kept instead of the core's state (selective)
    Tensor out;                            // the core's output (proj's input)
    cp::Attention::Saved core;             // the core's state for its backward (q, k, v after rope, ...)
  };
  // keep_core = false (selective recompute): keep only qkv and rebuild the rest in the backward.
  Tensor forward(const Tensor& x, Context& ctx, bool keep_core);  // [s(/tp), b, h] -> [s(/tp), b, h]
  Tensor backward(const Tensor& dy, Context& ctx);
  Tensor backward_input(const Tensor& dy, Context& ctx);  // keeps only the linears' contexts
  void backward_weight(Context& ctx);
  std::vector<Parameter*> parameters();

  tp::ColumnParallelLinear qkv;
  tp::RowParallelLinear proj;
  // qk-norm (Qwen3): one RMSNorm over head_dim for all query heads, one for all key heads. The
  // weights are replicated over tp; each rank normalises its own heads, so their gradients are
  // summed over tp (Parameter::sequence_parallel_grad).
  std::optional<Norm> q_norm, k_norm;

 private:
  // Whether the core reads q and k, and v, as views of the fused qkv output (attention.cpp).
  struct InPlace {
    bool qk = false, v = false;
  };
  InPlace in_place(Device dev) const;
  Tensor walk_backward(const Tensor& dy, Context& ctx, BackwardMode mode);
  void core_forward(const Tensor& qkv_out, Context& ctx);
  // The attention core's backward between the two linears: proj's dx -> qkv's dy.
  Tensor core_backward(const Tensor& dout, Context& ctx);
  void restore_core(Context& ctx);  // selective recompute
  const LayerEnv& env_;             // the chunk's, so set_training() reaches every layer
  int64_t heads_local_, groups_local_;
  int64_t window_;      // this layer's sliding window (LayerSpec::window); 0: none
  cp::Attention core_;  // exact over the whole sequence under context parallelism
};
static_assert(Layer<SelfAttention, bool>);  // forward(x, ctx, keep_core)

}  // namespace parallel::model
