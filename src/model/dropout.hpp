#pragma once
// Dropout sites of the GPT model (dropout.cpp).
#include <cstdint>
#include <vector>

#include "layer_env.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {

// Dropout keyed by (seed, layer, site, micro-batch) and each element's global position. p == 0 is
// the identity and costs nothing (x is returned as is).
struct DropoutSite {
  int layer = 0;  // global layer index; -1 for the embedding
  int site = 0;   // 0 embedding, 1 attention output, 2 MLP output
};
// layout: the micro-batch's cp layout (PackedSequence::layout; null: the zigzag).
Tensor dropout_forward(const LayerEnv& env, const Tensor& x, DropoutSite where, uint64_t micro_batch,
                       const cp::Layout* layout = nullptr);
Tensor dropout_backward(const LayerEnv& env, const Tensor& dy, DropoutSite where, uint64_t micro_batch,
                        const cp::Layout* layout = nullptr);
// The dropout of LoRA adapters' input at `where` (sites 3..6: qkv, proj, fc1, fc2) for the linears
// of a layer whose activations are [s_local, b, ..] (gathered along s under sequence parallelism
// before the GEMMs): tensor_parallel.hpp's LoraDropout. p = 0 without model.lora.dropout.
tp::LoraDropout lora_dropout(const LayerEnv& env, DropoutSite where, uint64_t micro_batch, int64_t s_local,
                             const cp::Layout* layout = nullptr);
// The same site's dropout as arguments for the fused ops (ops::DropoutSpec), one per run of rows
// [row, row + rows) of a [s_local, ...] tensor like x whose global positions are consecutive: one
// run, or two under context parallelism; a single run over every row, p = 0, when dropout is off.
struct DropoutRun {
  int64_t row = 0, rows = 0;
  ops::DropoutSpec spec;
};
std::vector<DropoutRun> dropout_runs(const LayerEnv& env, const Tensor& x, DropoutSite where,
                                     uint64_t micro_batch, const cp::Layout* layout = nullptr);
// out = residual + dropout(branch) at `where` (ops::dropout_add, run by run); out may be branch.
void dropout_add(const LayerEnv& env, const Tensor& branch, const Tensor& residual, Tensor& out,
                 DropoutSite where, uint64_t micro_batch, const cp::Layout* layout = nullptr);

}  // namespace parallel::model
