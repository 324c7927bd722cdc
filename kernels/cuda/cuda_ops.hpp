#pragma once
// The CUDA kernels behind parallel::ops (include/parallel/ops.hpp): one function per op, the same
// signature as the op. src/ops/ops.cpp validates arguments (defined, contiguous, one device, fp32
// (int32 ids), shapes) before calling these; they make the tensors' GPU current, pass raw pointers
// to the launchers of kernels.hpp (the .cu files) and order the work on `stream`.
//
// Header-only host C++: the .cu files cannot include fmt (nor therefore tensor.hpp), so the Tensor
// layer lives here and is compiled by the host compiler in the files that include it.
//
// Numerics follow kernels/cpu/ (same formulas, same dropout masks); tolerances are in
// tests/cuda/test_cuda_ops.cpp. Every op is deterministic run to run: no float atomics anywhere
// (bias / norm / embedding parameter gradients use ordered partial sums or a stable sort,
// attention's dq has its own pass).
#include <algorithm>
#include <cstdint>

// Relative includes: usable from tests and benchmarks, which do not see the private include dirs.
#include "../../src/cuda/cuda_check.hpp"
#include "../attention/attention_plain_ops.hpp"
#include "../attention/flash_attention_mma.hpp"
#include "../gemm/gemm.hpp"
#include "convert.hpp"
#include "kernels.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cuda {

namespace ops_detail {
inline const float* cf(const Tensor& t) { return static_cast<const float*>(t.data_ptr()); }
inline float* f(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }
inline const int32_t* ids(const Tensor& t) { return static_cast<const int32_t*>(t.data_ptr()); }
inline int64_t rows_of(const Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }
inline int64_t valid_columns(int64_t v_local, int64_t vocab_start, int64_t vocab_size) {
  return std::clamp<int64_t>(vocab_size - vocab_start, 0, v_local);
}
}  // namespace ops_detail

// ---- dense algebra ----------------------------------------------------------------------------
// fp32 cuBLASLt with CUBLAS_COMPUTE_32F: true fp32 products, TF32 never used.
inline void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                 float beta, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(c.device().index);
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum: only the beta term (cuBLASLt rejects k = 0)
    if (beta == 0.0f)
      c.zero_(stream);
    else
      kernels::scale(f(c), beta, c.numel(), stream.handle);
    return;
  }
  kernels::gemm_f32(cf(a), trans_a, cf(b), trans_b, f(c), m, n, k, alpha, beta, stream.handle);
}

// gemm with operands rounded to bf16 (or fp16) and tensor-core products, for callers whose fp32
// operands hold values of that precision (mixed-precision emulation): then the conversion is exact,
// every product of two bf16 (fp16) values is exact in fp32, and the result differs from gemm's only
// in the fp32 summation order. Other values are rounded to nearest even first.
// a, b, c: contiguous fp32 on one GPU, shapes as ops::gemm. The operands are converted into scratch
// tensors from the caching allocator (ordered on `stream`, returned to the cache on exit) and
// multiplied by kernels::gemm_bf16_auto / gemm_f16_auto (ours or cuBLASLt, whichever is faster for
// the shape) with fp32 accumulation into c.
inline void gemm_reduced(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                         float beta, DType operand_precision, Stream stream) {
  using namespace ops_detail;
  PARALLEL_CHECK(operand_precision == DType::BF16 || operand_precision == DType::F16,
                 "cuda::gemm_reduced: operand precision must be bf16 or fp16, got {}",
                 dtype_name(operand_precision));
  DeviceGuard guard(c.device().index);
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum: only the beta term, as gemm
    if (beta == 0.0f)
      c.zero_(stream);
    else
      kernels::scale(f(c), beta, c.numel(), stream.handle);
    return;
  }
  const auto s = static_cast<cudaStream_t>(stream.handle);
  Tensor a16 = Tensor::empty(a.shape(), operand_precision, c.device(), stream);
  Tensor b16 = Tensor::empty(b.shape(), operand_precision, c.device(), stream);
  PARALLEL_CUDA_CHECK(
      kernels::convert(a16.data_ptr(), operand_precision, a.data_ptr(), DType::F32, a.numel(), s));
  PARALLEL_CUDA_CHECK(
      kernels::convert(b16.data_ptr(), operand_precision, b.data_ptr(), DType::F32, b.numel(), s));
  if (operand_precision == DType::BF16)
    kernels::gemm_bf16_auto(static_cast<const bf16*>(a16.data_ptr()), trans_a,
                            static_cast<const bf16*>(b16.data_ptr()), trans_b, f(c), m, n, k, alpha, beta, {},
                            stream.handle);
  else
    kernels::gemm_f16_auto(static_cast<const f16*>(a16.data_ptr()), trans_a,
                           static_cast<const f16*>(b16.data_ptr()), trans_b, f(c), m, n, k, alpha, beta, {},
                           stream.handle);
}

inline void add_bias(Tensor& y, const Tensor& bias, Stream stream) {
  DeviceGuard guard(y.device().index);
  const int64_t h = bias.numel();
  kernels::add_bias(ops_detail::f(y), ops_detail::cf(bias), h == 0 ? 0 : y.numel() / h, h, stream.handle);
}
inline void bias_backward(const Tensor& dy, Tensor& dbias, Stream stream) {
  DeviceGuard guard(dy.device().index);
  const int64_t h = dbias.numel();
  kernels::bias_backward(ops_detail::cf(dy), ops_detail::f(dbias), h == 0 ? 0 : dy.numel() / h, h,
                         stream.handle);
}

// ---- element-wise -----------------------------------------------------------------------------
inline void add(const Tensor& a, const Tensor& b, Tensor& out, Stream stream) {
  DeviceGuard guard(a.device().index);
  kernels::add(ops_detail::cf(a), ops_detail::cf(b), ops_detail::f(out), a.numel(), stream.handle);
}
inline void add_(Tensor& a, const Tensor& b, Stream stream) {
  DeviceGuard guard(a.device().index);
  kernels::add(ops_detail::cf(a), ops_detail::cf(b), ops_detail::f(a), a.numel(), stream.handle);
}
inline void scale_(Tensor& a, float alpha, Stream stream) {
  DeviceGuard guard(a.device().index);
  kernels::scale(ops_detail::f(a), alpha, a.numel(), stream.handle);
}
// Mixed-precision emulation, bit-identical to the CPU kernel (see kernels::round_to_precision).
inline void round_to_precision_(Tensor& x, DType precision, Stream stream) {
  PARALLEL_CHECK(precision == DType::F32 || precision == DType::BF16 || precision == DType::F16,
                 "cuda::round_to_precision_: precision must be fp32, bf16 or fp16, got {}",
                 dtype_name(precision));
  if (precision == DType::F32 || x.numel() == 0) return;
  DeviceGuard guard(x.device().index);
  kernels::round_to_precision(ops_detail::f(x), x.numel(), precision, stream.handle);
}
inline void gelu_forward(const Tensor& x, Tensor& y, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::gelu_forward(ops_detail::cf(x), ops_detail::f(y), x.numel(), stream.handle);
}
inline void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::gelu_backward(ops_detail::cf(dy), ops_detail::cf(x), ops_detail::f(dx), x.numel(), stream.handle);
}
inline void swiglu_forward(const Tensor& x, Tensor& y, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::swiglu_forward(ops_detail::cf(x), ops_detail::f(y), ops_detail::rows_of(y), y.size(-1),
                          stream.handle);
}
inline void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::swiglu_backward(ops_detail::cf(dy), ops_detail::cf(x), ops_detail::f(dx), ops_detail::rows_of(dy),
                           dy.size(-1), stream.handle);
}
inline void dropout_forward(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset,
                            Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::dropout(ops_detail::cf(x), ops_detail::f(y), x.numel(), p, seed, offset, stream.handle);
}
// The backward is the same mask and scale applied to the gradient.
inline void dropout_backward(const Tensor& dy, Tensor& dx, float p, uint64_t seed, uint64_t offset,
                             Stream stream) {
  DeviceGuard guard(dy.device().index);
  kernels::dropout(ops_detail::cf(dy), ops_detail::f(dx), dy.numel(), p, seed, offset, stream.handle);
}

// ---- normalisation ----------------------------------------------------------------------------
inline void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                              Tensor& mean, Tensor& rstd, float eps, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::layernorm_forward(cf(x), cf(weight), cf(bias), f(y), f(mean), f(rstd), rows_of(x), weight.numel(),
                             eps, stream.handle);
}
inline void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias,
                               Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::layernorm_backward(cf(dy), cf(x), cf(weight), cf(mean), cf(rstd), f(dx), f(dweight), f(dbias),
                              rows_of(x), weight.numel(), stream.handle);
}
inline void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                            Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::rmsnorm_forward(cf(x), cf(weight), f(y), f(rstd), rows_of(x), weight.numel(), eps, stream.handle);
}
inline void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                             Tensor& dx, Tensor& dweight, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::rmsnorm_backward(cf(dy), cf(x), cf(weight), cf(rstd), f(dx), f(dweight), rows_of(x),
                            weight.numel(), stream.handle);
}

// ---- attention --------------------------------------------------------------------------------
inline void rope_forward(Tensor& x, int64_t position_offset, float theta, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::rope(ops_detail::f(x), x.size(0), x.size(1) * x.size(2), x.size(3), position_offset, theta, 1.0f,
                stream.handle);
}
inline void rope_backward(Tensor& dx, int64_t position_offset, float theta, Stream stream) {
  DeviceGuard guard(dx.device().index);
  kernels::rope(ops_detail::f(dx), dx.size(0), dx.size(1) * dx.size(2), dx.size(3), position_offset, theta,
                -1.0f, stream.handle);
}

inline kernels::AttentionShape attention_shape(const Tensor& q, const Tensor& k) {
  PARALLEL_CHECK(q.size(3) <= 256, "CUDA attention supports head dimensions up to 256, got {}", q.size(3));
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
}
// 16-bit tensor-core attention (kernels/attention/flash_attention_mma.cu) for fp32 tensors holding
// bf16 / fp16 values: the inputs are converted (exactly) into scratch, the outputs widened back.
inline bool use_attention_mma(const Tensor& q, DType operand_precision) {
  return operand_precision != DType::F32 && (q.size(3) == 64 || q.size(3) == 128);
}
inline Tensor to_16bit(const Tensor& x, DType precision, Stream stream) {
  Tensor out = Tensor::empty(x.shape(), precision, x.device(), stream);
  PARALLEL_CUDA_CHECK(kernels::convert(out.data_ptr(), precision, x.data_ptr(), DType::F32, x.numel(),
                                       static_cast<cudaStream_t>(stream.handle)));
  return out;
}
inline void widen_into(Tensor& dst, const Tensor& src16, Stream stream) {
  PARALLEL_CUDA_CHECK(kernels::convert(dst.data_ptr(), DType::F32, src16.data_ptr(), src16.dtype(),
                                       dst.numel(), static_cast<cudaStream_t>(stream.handle)));
}

// Head dimension d <= 256 in fp32; the backward's shared-memory tiles need d <= 128 on sm_80.
inline void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                              bool causal, float softmax_scale, DType operand_precision, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(q.device().index);
  if (kernels::attention_path() == kernels::AttentionPath::Plain)  // PARALLEL_ATTENTION=plain
    return attention_plain_forward(q, k, v, out, lse, causal, softmax_scale, stream, operand_precision);
  if (use_attention_mma(q, operand_precision)) {
    const kernels::AttentionShape shape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
    Tensor q16 = to_16bit(q, operand_precision, stream), k16 = to_16bit(k, operand_precision, stream);
    Tensor v16 = to_16bit(v, operand_precision, stream);
    Tensor o16 = Tensor::empty(out.shape(), operand_precision, out.device(), stream);
    if (operand_precision == DType::BF16)
      kernels::flash_attention_forward_bf16(
          static_cast<const bf16*>(q16.data_ptr()), static_cast<const bf16*>(k16.data_ptr()),
          static_cast<const bf16*>(v16.data_ptr()), static_cast<bf16*>(o16.data_ptr()), f(lse), shape, causal,
          softmax_scale, stream.handle);
    else
      kernels::flash_attention_forward_f16(
          static_cast<const f16*>(q16.data_ptr()), static_cast<const f16*>(k16.data_ptr()),
          static_cast<const f16*>(v16.data_ptr()), static_cast<f16*>(o16.data_ptr()), f(lse), shape, causal,
          softmax_scale, stream.handle);
    widen_into(out, o16, stream);
    return;
  }
  kernels::attention_forward(cf(q), cf(k), cf(v), f(out), f(lse), attention_shape(q, k), causal,
                             softmax_scale, stream.handle);
}
inline void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                               bool causal, float softmax_scale, DType operand_precision, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(q.device().index);
  if (kernels::attention_path() == kernels::AttentionPath::Plain)  // PARALLEL_ATTENTION=plain
    return attention_plain_backward(dout, q, k, v, out, dq, dk, dv, causal, softmax_scale, stream,
                                    operand_precision);
  if (use_attention_mma(q, operand_precision)) {
    const kernels::AttentionShape shape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
    const DType p = operand_precision;
    Tensor do16 = to_16bit(dout, p, stream), q16 = to_16bit(q, p, stream), k16 = to_16bit(k, p, stream);
    Tensor v16 = to_16bit(v, p, stream), o16 = to_16bit(out, p, stream);
    Tensor dq16 = Tensor::empty(dq.shape(), p, dq.device(), stream);
    Tensor dk16 = Tensor::empty(dk.shape(), p, dk.device(), stream);
    Tensor dv16 = Tensor::empty(dv.shape(), p, dv.device(), stream);
    if (p == DType::BF16)
      kernels::flash_attention_backward_bf16(
          static_cast<const bf16*>(do16.data_ptr()), static_cast<const bf16*>(q16.data_ptr()),
          static_cast<const bf16*>(k16.data_ptr()), static_cast<const bf16*>(v16.data_ptr()),
          static_cast<const bf16*>(o16.data_ptr()), cf(lse), static_cast<bf16*>(dq16.data_ptr()),
          static_cast<bf16*>(dk16.data_ptr()), static_cast<bf16*>(dv16.data_ptr()), shape, causal,
          softmax_scale, stream.handle);
    else
      kernels::flash_attention_backward_f16(
          static_cast<const f16*>(do16.data_ptr()), static_cast<const f16*>(q16.data_ptr()),
          static_cast<const f16*>(k16.data_ptr()), static_cast<const f16*>(v16.data_ptr()),
          static_cast<const f16*>(o16.data_ptr()), cf(lse), static_cast<f16*>(dq16.data_ptr()),
          static_cast<f16*>(dk16.data_ptr()), static_cast<f16*>(dv16.data_ptr()), shape, causal,
          softmax_scale, stream.handle);
    widen_into(dq, dq16, stream);
    widen_into(dk, dk16, stream);
    widen_into(dv, dv16, stream);
    return;
  }
  kernels::attention_backward(cf(dout), cf(q), cf(k), cf(v), cf(out), cf(lse), f(dq), f(dk), f(dv),
                              attention_shape(q, k), causal, softmax_scale, stream.handle);
}

// ---- embedding and loss -----------------------------------------------------------------------
inline void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out,
                              Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(weight.device().index);
  kernels::embedding_forward(ids(tokens), cf(weight), vocab_start, weight.size(0), f(out), tokens.size(0),
                             tokens.size(1), weight.size(1), stream.handle);
}
// Deterministic: a stable radix sort groups each id's rows, which are then summed in token order into
// dweight, the CPU kernel's summation order (bit-identical results).
inline void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight,
                               Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(dweight.device().index);
  kernels::embedding_backward(ids(tokens), cf(dout), vocab_start, f(dweight), dweight.size(0), tokens.size(0),
                              tokens.size(1), dweight.size(1), stream.handle);
}
inline void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                      int64_t vocab_size, Tensor& row_max, Tensor& target_logit,
                                      Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(logits.device().index);
  const int64_t n = logits.size(0), v = logits.size(1);
  kernels::ce_local_stats(cf(logits), ids(targets), n, v, vocab_start,
                          valid_columns(v, vocab_start, vocab_size), f(row_max), f(target_logit),
                          stream.handle);
}
inline void cross_entropy_sum_exp(const Tensor& logits, const Tensor& row_max, int64_t vocab_start,
                                  int64_t vocab_size, Tensor& sum_exp, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(logits.device().index);
  const int64_t n = logits.size(0), v = logits.size(1);
  kernels::ce_sum_exp(cf(logits), cf(row_max), n, v, valid_columns(v, vocab_start, vocab_size), f(sum_exp),
                      stream.handle);
}
inline void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                                   const Tensor& sum_exp, const Tensor& grad_scale, int64_t vocab_start,
                                   int64_t vocab_size, Tensor& dlogits, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(logits.device().index);
  const int64_t n = logits.size(0), v = logits.size(1);
  kernels::ce_backward(cf(logits), ids(targets), cf(row_max), cf(sum_exp), cf(grad_scale), n, v, vocab_start,
                       valid_columns(v, vocab_start, vocab_size), f(dlogits), stream.handle);
}

// ---- reductions -------------------------------------------------------------------------------
// Per-block partial sums in double, added in block order on the host: deterministic. Synchronises.
inline double sum_of_squares(const Tensor& x, Stream stream) {
  DeviceGuard guard(x.device().index);
  return kernels::sum_of_squares(ops_detail::cf(x), x.numel(), stream.handle);
}

// adamw_step and gemm_cublaslt_bf16 / _f16 (raw device buffers) are declared in kernels.hpp, and the
// bf16 / fp16 GEMMs (ours, and the automatic choice) in gemm/gemm.hpp, both included above.

}  // namespace parallel::cuda
