#pragma once
// A trainable parameter: this rank's slice of a global tensor, its gradient, and where the slice
// sits in the global tensor (for checkpoints that reshard, for the gradient norm, and for the
// gradient reductions that tensor or sequence parallelism need).
#include <string>
#include <vector>

#include "parallel/tensor.hpp"

namespace parallel {

struct Parameter {
  std::string name;              // global name, e.g. "layers.3.attention.query.weight" (docs/model.md)
  Tensor value;                  // this rank's slice; may be a view into a larger buffer
  Tensor grad;                   // same shape as value; layers accumulate into it (+=)
  Shape global_shape;            // shape of the whole parameter across the tensor-parallel group
  int partition_dim = -1;        // dimension split over tensor parallel ranks; -1: replicated
  int64_t partition_offset = 0;  // start of this slice along partition_dim
  // Replicated over the tensor-parallel group, but each rank sees only its sequence shard's
  // gradient (norms and row-parallel biases under sequence parallelism) or its heads' (qk-norm
  // weights under any tp): the tp group must all-reduce its gradient before the optimizer step.
  bool sequence_parallel_grad = false;
  // The same parameter lives on several pipeline stages (tied word embeddings on the first and
  // last stage): its gradients are all-reduced over the embedding group, and it is counted once in
  // the gradient norm.
  bool shared_across_pipeline = false;
  // The output layer's copy of a shared_across_pipeline parameter (the tied embedding on the last
  // stage): not counted in the gradient norm, not written to checkpoints. The V placement puts it
  // on the same rank as the embedding's copy, so the first pipeline rank alone cannot tell them apart.
  bool pipeline_copy = false;
  // Rows of the global tensor that hold real data, or -1 for all. The vocabulary is padded to a
  // multiple of 128 * tp, so the padded row count depends on the layout; checkpoints store only
  // these rows, which is what lets a checkpoint load at any tensor-parallel size.
  int64_t unpadded_rows = -1;
  // An expert of a MoE layer (its name carries the global expert index). Dense parameters are
  // replicated over the data-parallel ranks (dp x cp); an expert lives on one expert-parallel rank
  // and is replicated over the expert-data-parallel group only, so its gradient is reduced there,
  // counted once per expert in the norm, and written by expert-dp rank 0 (docs/parallelism.md).
  bool expert = false;
  // Not trained (LoRA's base weights, docs/lora.md): `grad` is undefined and no layer accumulates
  // into it; data parallelism, the optimizer and ZeRO leave it out (no gradient buffer, no fp32
  // main copy, no optimizer state, never sharded). Checkpoints still save and load its value.
  bool frozen = false;

  bool is_replicated_over_tp() const { return partition_dim < 0; }
  int64_t numel() const { return value.numel(); }
};

// Parameters that share one value storage (a fused layer's parts), grouped in order of first
// appearance and sorted by where they sit in it. They must be back to back, since the layer's fused
// operand is one view spanning them; `who` names the caller in the error otherwise.
std::vector<std::vector<Parameter*>> fused_units(const std::vector<Parameter*>& params, const char* who);

// The [rows, ...] view spanning `parts`' `member` tensors (value or grad), which must sit back to
// back in one storage (a fused layer's parts: gate|up, q|k|v), so one GEMM serves them all. The
// view borrows the storage, which the parts' own tensors keep alive. `who` names the caller in the
// error when the parts are not adjacent (a re-binding that broke them apart).
Tensor fused_rows(const std::vector<Parameter>& parts, Tensor Parameter::*member, const char* who);

// Moves every parameter's value and gradient to `device`. Tensors that shared one storage back to
// back (a fused layer's parts: gate|up, q|k|v, a MoE expert's gate|up) share one new storage in the
// same order, so fused_rows still spans them; tied parameters (listed twice) move once. No-op for
// tensors already there.
void move_parameters(const std::vector<Parameter*>& params, Device device);

// The device that layers create new parameters (value and gradient) on: the CPU unless a
// ParameterDeviceScope is live. GPTModel opens one for Device::meta(), so a meta model's parameters
// are born on the meta allocator - no host memory, no values - and a model far bigger than the host
// can be planned. Real devices keep creating on the host, where the layout-independent init
// (init.hpp) fills them before they move (bitwise the same weights on every layout).
// Per thread and nesting, like MetaOpRecorder (a model is built on one thread).
Device parameter_device();
class ParameterDeviceScope {
 public:
  explicit ParameterDeviceScope(Device device);
  ~ParameterDeviceScope();
  ParameterDeviceScope(const ParameterDeviceScope&) = delete;
  ParameterDeviceScope& operator=(const ParameterDeviceScope&) = delete;

 private:
  Device outer_;
};

// The gradient tensor a layer gives a parameter it creates: fp32 zeros on parameter_device(), or
// an undefined Tensor while a FrozenParameterScope is live. GPTModel opens one around a LoRA
// model's layers, so the frozen base weights are born without a gradient (no transient fp32 copy of
// the whole model at construction); adapters allocate theirs directly.
Tensor parameter_grad(const Shape& shape);
class FrozenParameterScope {
 public:
  explicit FrozenParameterScope(bool frozen);
  ~FrozenParameterScope();
  FrozenParameterScope(const FrozenParameterScope&) = delete;
  FrozenParameterScope& operator=(const FrozenParameterScope&) = delete;

 private:
  bool outer_;
};

// Zeroes every gradient (start of an optimizer step's accumulation).
void zero_grads(const std::vector<Parameter*>& params);

}  // namespace parallel
