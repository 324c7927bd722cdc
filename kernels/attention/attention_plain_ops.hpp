#pragma once
// Tensor-level launchers of the plain attention path (attention_plain.hpp), called by
// cuda::attention_forward / attention_backward (kernels/cuda/cuda_ops.hpp) when
// kernels::attention_path() is Plain. Same contract as those (ops.hpp): tensors contiguous on one
// GPU, validated by src/ops/ops.cpp.
//
// Inputs of a 16-bit dtype (real bf16 / fp16 activations) go to cuBLAS as they are; fp32 tensors go as
// fp32, unless operand_precision (the older mixed-precision emulation's argument: fp32 tensors holding
// 16-bit values; leave it F32 otherwise) is BF16 / F16: then they are converted (exactly) to that
// type first and the outputs (out, dq, dk, dv) are rounded to it at the end, as the 16-bit flash
// kernels' are. Outputs of a dtype other than fp32 are
// computed into fp32 scratch and converted. Header-only host C++ (includes tensor.hpp, so not for
// .cu files). UNVERIFIED ON A GPU (2026-11).
#include <cstdint>

#include "../cuda/convert.hpp"
#include "../cuda/cuda_check.hpp"
#include "../cuda/kernels.hpp"
#include "attention_plain.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cuda::plain_detail {

inline cudaStream_t raw(Stream stream) { return static_cast<cudaStream_t>(stream.handle); }

// The input as cuBLAS will read it: itself when already of `type` (or of a 16-bit dtype), else a
// converted copy from the caching allocator, ordered on `stream`.
inline Tensor as_type(const Tensor& x, DType type, Stream stream) {
  if (x.dtype() == type || x.dtype() != DType::F32) return x;
  Tensor out = Tensor::empty(x.shape(), type, x.device(), stream);
  PARALLEL_CUDA_CHECK(
      kernels::convert(out.data_ptr(), type, x.data_ptr(), x.dtype(), x.numel(), raw(stream)));
  return out;
}

// An fp32 tensor to write an output into: dst itself when fp32, else scratch (see finish()).
inline Tensor fp32_target(const Tensor& dst, Stream stream) {
  return dst.dtype() == DType::F32 ? dst : Tensor::empty(dst.shape(), DType::F32, dst.device(), stream);
}

// Rounds an fp32 result to `precision` (16-bit emulation) or converts it into a 16-bit dst.
inline void finish(Tensor& dst, Tensor& result, DType precision, Stream stream) {
  if (dst.numel() == 0) return;
  if (dst.dtype() != DType::F32) {
    PARALLEL_CUDA_CHECK(kernels::convert(dst.data_ptr(), dst.dtype(), result.data_ptr(), DType::F32,
                                         dst.numel(), raw(stream)));
  } else if (precision != DType::F32) {
    kernels::round_to_precision(static_cast<float*>(dst.data_ptr()), dst.numel(), precision, stream.handle);
  }
}

// The type cuBLAS multiplies in: the tensors' own 16-bit dtype, else operand_precision.
inline DType gemm_type(const Tensor& q, DType operand_precision) {
  const DType t = q.dtype() != DType::F32 ? q.dtype() : operand_precision;
  PARALLEL_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16,
                 "plain attention: operand precision must be fp32, bf16 or fp16, got {}", dtype_name(t));
  return t;
}

inline kernels::AttentionShape shape_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}

}  // namespace parallel::cuda::plain_detail

namespace parallel::cuda {

inline void attention_plain_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                    Tensor& lse, const AttentionBounds& mask, float softmax_scale,
                                    Stream stream, DType operand_precision = DType::F32) {
  using namespace plain_detail;
  DeviceGuard guard(q.device().index);
  const DType t = gemm_type(q, operand_precision);
  const Tensor qt = as_type(q, t, stream), kt = as_type(k, t, stream), vt = as_type(v, t, stream);
  Tensor o32 = fp32_target(out, stream);
  kernels::attention_plain_forward(qt.data_ptr(), kt.data_ptr(), vt.data_ptr(), t,
                                   static_cast<float*>(o32.data_ptr()), static_cast<float*>(lse.data_ptr()),
                                   shape_of(q, k, v), mask, softmax_scale, stream.handle);
  finish(out, o32, operand_precision, stream);
}

// P is recomputed from q, k and the saved lse (the whole row's statistic under ring attention).
inline void attention_plain_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                                     const AttentionBounds& mask, float softmax_scale, Stream stream,
                                     DType operand_precision = DType::F32) {
  using namespace plain_detail;
  DeviceGuard guard(q.device().index);
  const DType t = gemm_type(q, operand_precision);
  const Tensor dot = as_type(dout, t, stream), qt = as_type(q, t, stream), kt = as_type(k, t, stream);
  const Tensor vt = as_type(v, t, stream), ot = as_type(out, t, stream);
  Tensor dq32 = fp32_target(dq, stream), dk32 = fp32_target(dk, stream), dv32 = fp32_target(dv, stream);
  kernels::attention_plain_backward(
      dot.data_ptr(), qt.data_ptr(), kt.data_ptr(), vt.data_ptr(), ot.data_ptr(),
      static_cast<const float*>(lse.data_ptr()), t, static_cast<float*>(dq32.data_ptr()),
      static_cast<float*>(dk32.data_ptr()), static_cast<float*>(dv32.data_ptr()), shape_of(q, k, v), mask,
      softmax_scale, stream.handle);
  finish(dq, dq32, operand_precision, stream);
  finish(dk, dk32, operand_precision, stream);
  finish(dv, dv32, operand_precision, stream);
}

}  // namespace parallel::cuda
