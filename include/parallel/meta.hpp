#pragma once
// The meta device: tensors with a shape, a dtype and Device::meta() but no values.
//
// Contract:
//   - Storage: Tensor::empty / zeros / full on Device::meta() allocate from the meta allocator
//     (allocator_for(Device::meta())), which counts bytes exactly as the CPU allocator counts its
//     `allocated` (the requested bytes, no rounding), so memory_stats(Device::meta()).peak_allocated
//     is the peak a real rank would reach, and reset_peak() works as on any device. No memory is
//     touched: a meta tensor's data_ptr() is nullptr.
//   - Per thread: the meta allocator's statistics, the live MetaOpRecorder and MetaTimeline and the
//     parameter device scope are the calling thread's. memory_stats(Device::meta()) on a thread
//     counts the meta tensors that thread allocated (one freed on another thread still leaves the
//     account of the thread that made it), so two threads each running a meta rank (the layout
//     search's parallel candidates) get the peaks they get alone.
//   - Ops (ops.hpp) accept meta tensors and run the very checks they run for real ones (defined,
//     contiguous, one device, dtypes, shapes: ops.cpp has one check path for every device); then,
//     instead of a kernel, they record an OpEvent into the innermost live MetaOpRecorder (nothing is
//     recorded when none is live). Views (view, narrow, select, flatten) work as on the CPU; copy_
//     and fill_ into a meta tensor record "copy_" / "fill_" events; copying a CPU tensor to meta
//     (to(Device::meta())) is allowed and is how synthetic data enters a meta run.
//   - Values: reading one is an error with a message naming the tensor - data<T>(),
//     to_float_vector(), copy_ from meta into a CPU or CUDA tensor, ops::sum_of_squares (a host
//     value). Code whose control flow depends on values must state an assumption for meta instead
//     (reduce_grad_norm: the norm is taken as 0, i.e. finite - no fp16 overflow, no clipping).
//   - Mixing meta with CPU or CUDA tensors in one op is the usual "on different devices" error.
//
// Workspace: the kernels' own transient allocations are those of this build's CPU kernels
// (ops.cpp: attention's tiles and scratch, ops::attention_workspace_bytes; a 16-bit GEMM without a
// oneDNN kernel widens tile by tile into the kernels' thread-local scratch, kernels/cpu/widen.hpp,
// which no tensor allocator sees); a CUDA target's workspaces are not modelled yet.
//
// FLOPs are model FLOPs of the op as written (a GEMM 2 m n k; causal attention half of the full
// score and value products; element-wise ops a small per-element count given in ops.cpp): a cost
// model's input, not a measurement. Bytes read and written are the operands' and results' nbytes
// (an in-place operand counts on both sides).
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "parallel/tensor.hpp"

namespace parallel {

struct OpEvent {
  std::string op;             // the ops:: name ("gemm", "attention_backward") or "copy_" / "fill_"
  std::vector<Shape> shapes;  // operands read, then results written
  std::vector<DType> dtypes;  // parallel to shapes
  double flops = 0;
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  // The transient memory the kernel itself takes (its workspace): allocated from the meta allocator
  // and freed again inside the op, so it counts toward the peak as the real kernel's does.
  int64_t workspace_bytes = 0;
};

// Records the ops run on meta tensors while it lives. Scopes nest: the innermost live recorder of
// the thread receives the thread's events (per thread, like the meta allocator's statistics).
class MetaOpRecorder {
 public:
  MetaOpRecorder();
  ~MetaOpRecorder();
  MetaOpRecorder(const MetaOpRecorder&) = delete;
  MetaOpRecorder& operator=(const MetaOpRecorder&) = delete;

  const std::vector<OpEvent>& events() const { return events_; }
  double total_flops() const;
  void add(OpEvent event) { events_.push_back(std::move(event)); }

 private:
  std::vector<OpEvent> events_;
  MetaOpRecorder* outer_ = nullptr;
};

namespace meta {

// For ops.cpp and tensor.cpp, after their checks: records the op into the live recorder, if any.
// `workspace` is the kernel's transient allocation in bytes (OpEvent::workspace_bytes).
void record_op(const char* op, double flops, std::initializer_list<const Tensor*> reads,
               std::initializer_list<const Tensor*> writes, int64_t workspace = 0);
// dst.copy_(src) with dst or src on meta: records the copy when dst is meta (src may be anything:
// values are dropped); throws when dst is not (that would read src's values).
void copy(const Tensor& dst, const Tensor& src);
// Throws parallel::Error: "<what> of <tensor>: a meta tensor has no values ...".
[[noreturn]] void refuse_read(const Tensor& t, const char* what);

}  // namespace meta
}  // namespace parallel
