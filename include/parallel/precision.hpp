#pragma once
// The mixed-precision policy, in one place (Megatron-Core's bf16/fp16 training with fp32 main
// weights):
//
//   what                                       fp32    bf16 / fp16
//   activations and activation gradients        fp32    16-bit (half the bytes of fp32)
//   the model's parameter values (GEMM inputs)  fp32    16-bit copy, written once per step
//   parameter gradients                         fp32    fp32 (accumulated, Megatron's fusion)
//   optimizer main weights, exp_avg, exp_avg_sq fp32    fp32
//
// Nothing else decides dtypes: the model casts its parameters here once after init, every layer
// writes its outputs in its inputs' dtype, the embedding's output takes the weight's dtype, and
// the ops check the combinations they accept (ops.hpp, "Precision").
#include <vector>

#include "parallel/dtype.hpp"
#include "parallel/parameter.hpp"

namespace parallel {

// The dtype of activations and of the model's parameter copy under `p`.
DType compute_dtype(Precision p);

// Rebinds every parameter's value to a new tensor of `dtype` holding its values (rounded to
// nearest even). Parameters that shared one storage (a fused layer's parts) share one new storage,
// in the same order and back to back, so fused views still span them; tied parameters (the same
// Parameter object listed twice) are cast once. Gradients are left as they are (fp32). No-op for
// parameters already of `dtype`.
void cast_parameters(const std::vector<Parameter*>& params, DType dtype);

}  // namespace parallel
