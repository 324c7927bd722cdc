#pragma once
// Rotary embedding of an attention layer's rows at their sequence positions (rotary.cpp): shared by
// the attention kinds, so packed documents and context-parallel chunks rotate the same way.
#include "layer_env.hpp"
#include "parallel/rope.hpp"
#include "parallel/tensor.hpp"

namespace parallel::model {

// x [s, b, heads, d] (contiguous): this rank's whole share of the sequence (its cp chunks, gathered
// over sp). positions [b, s] host int32 (the micro-batch's documents) or undefined (plain
// positions: each cp segment at its global offset, by `layout`, null: the zigzag). backward: the
// inverse rotation of a gradient.
void rotate(Tensor& x, const Tensor& positions, const cp::Layout* layout, const LayerEnv& env,
            const Rope& rope, bool backward);

}  // namespace parallel::model
