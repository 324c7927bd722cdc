#pragma once
// The CUDA kernels behind parallel::ops (include/parallel/ops.hpp): one function per op, the same
// signature as the op. src/ops/ops.cpp validates arguments (defined, contiguous, one device, the
// dtypes of the op's contract, shapes) before calling these; they make the tensors' GPU current, pass raw
// pointers to the launchers of kernels.hpp (the .cu files) and order the work on `stream`.
//
// Header-only host C++: the .cu files cannot include fmt (nor therefore tensor.hpp), so the Tensor
// layer lives here and is compiled by the host compiler in the files that include it.
//
// Dtypes: every op takes what the CPU op takes (ops.hpp, "Precision"): activations fp32, bf16 or
// fp16, parameter values fp32 or the activations' dtype, statistics and parameter gradients fp32.
// The kernels are templated on the storage type: they load 16-bit values as float, compute in fp32
// and store 16-bit outputs rounded to nearest even with the CPU's narrowing (kernels/cuda/common.cuh),
// so an output is bit-identical to the CPU's wherever the fp32 arithmetic is. GEMM and attention
// read 16-bit tensors directly on the tensor cores (no conversion kernels). UNVERIFIED ON A GPU.
//
// Numerics follow kernels/cpu/ (same formulas, same dropout masks); tolerances are in
// tests/cuda/test_cuda_ops.cpp. Every op is deterministic run to run: no float atomics anywhere
// (bias / norm / embedding parameter gradients use ordered partial sums or a stable sort,
// attention's dq has its own pass).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

// Relative includes: usable from tests and benchmarks, which do not see the private include dirs.
#include "../attention/attention_launch.hpp"
#include "../attention/attention_plain_ops.hpp"
#include "../attention/attention_tiles.hpp"
#include "../attention/flash_attention_mma.hpp"
#include "../gemm/gemm.hpp"
#include "convert.hpp"
#include "cuda_check.hpp"
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
inline bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }
// An fp32 copy of a 16-bit tensor (exact), from the caching allocator, ordered on `stream`.
inline Tensor widened(const Tensor& x, Stream stream) {
  Tensor out = Tensor::empty(x.shape(), DType::F32, x.device(), stream);
  PARALLEL_CUDA_CHECK(kernels::convert(out.data_ptr(), DType::F32, x.data_ptr(), x.dtype(), x.numel(),
                                       static_cast<cudaStream_t>(stream.handle)));
  return out;
}
// dst (16-bit) = src32 (fp32) rounded to nearest even.
inline void narrow_into(Tensor& dst, const Tensor& src32, Stream stream) {
  PARALLEL_CUDA_CHECK(kernels::convert(dst.data_ptr(), dst.dtype(), src32.data_ptr(), DType::F32, dst.numel(),
                                       static_cast<cudaStream_t>(stream.handle)));
}
}  // namespace ops_detail

// ---- dense algebra ----------------------------------------------------------------------------
// fp32 a, b (and so fp32 c): cuBLASLt with CUBLAS_COMPUTE_32F, true fp32 products, TF32 never used.
// 16-bit a, b (one dtype) and c fp32 or that dtype: the tensor-core GEMM on the operands where they
// lie (no conversion), with fp32 accumulation; c fp32 is accumulated in fp32 (beta = 1: weight
// gradients, Megatron's gradient-accumulation fusion), a 16-bit c is rounded once at the end.
// kernels::gemm_16_auto picks our mma.sync kernel or cuBLASLt by a fixed rule of shape, dtypes and
// compute capability, the same on every rank and run (kernels/gemm/gemm_rule.hpp;
// PARALLEL_GEMM=ours|cublaslt|auto|timed).
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
      kernels::scale(c.data_ptr(), c.dtype(), beta, c.numel(), stream.handle);
    return;
  }
  if (a.dtype() == DType::F32) {
    kernels::gemm_f32(cf(a), trans_a, cf(b), trans_b, f(c), m, n, k, alpha, beta, stream.handle);
    return;
  }
  kernels::gemm_16_auto(a.dtype(), a.data_ptr(), trans_a, b.data_ptr(), trans_b, c.data_ptr(), c.dtype(), m,
                        n, k, alpha, beta, {}, stream.handle);
}

inline void add_bias(Tensor& y, const Tensor& bias, Stream stream) {
  DeviceGuard guard(y.device().index);
  const int64_t h = bias.numel();
  kernels::add_bias(y.data_ptr(), y.dtype(), bias.data_ptr(), bias.dtype(), h == 0 ? 0 : y.numel() / h, h,
                    stream.handle);
}
// c = op(a) @ op(b) + bias, rounded once as the CPU's gemm_bias: 16-bit operands add the bias in the
// GEMM's fp32 epilogue before c's one rounding (a separate add would round the product to 16 bits
// first, and a bias cancelling it would leave that rounding error: hundreds of ulp of c). A bias of
// c's 16-bit dtype (the mixed-precision model's) goes to cuBLASLt's bias epilogue as it is where
// kernels::gemm_bias16_in_cublaslt allows (gemm_rule.hpp), unless PARALLEL_GEMM=ours; otherwise it is widened
// to fp32 for the dispatcher's epilogue path (gemm_16_auto: cuBLASLt with an fp32 bias, which cuBLAS 13.1 has
// no algorithm for with a 16-bit c, else ours). fp32: the product, then the bias.
inline void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                      Tensor& c, Stream stream) {
  using namespace ops_detail;
  const int64_t m = c.size(0), n = c.size(1), k = trans_a ? a.size(0) : a.size(1);
  if (a.dtype() == DType::F32 || m == 0 || n == 0 || k == 0) {
    gemm(a, trans_a, b, trans_b, c, 1.0f, 0.0f, stream);
    add_bias(c, bias, stream);
    return;
  }
  DeviceGuard guard(c.device().index);
  auto aligned16 = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  if (bias.dtype() == c.dtype() && kernels::gemm_mode() != kernels::GemmMode::Ours &&
      kernels::gemm_bias16_in_cublaslt(trans_a, trans_b, m, n, k,
                                       aligned16(a) && aligned16(b) && aligned16(bias) && aligned16(c)) &&
      cuda::gemm_cublaslt_16_bias(a.dtype(), a.data_ptr(), trans_a, b.data_ptr(), trans_b, c.data_ptr(),
                                  c.dtype(), m, n, k, 1.0f, 0.0f, bias.data_ptr(), bias.dtype(),
                                  stream.handle))
    return;
  Tensor bias32 = bias;
  if (bias.dtype() != DType::F32) {  // the epilogue reads an fp32 bias; converted on `stream`
    bias32 = Tensor::empty(bias.shape(), DType::F32, bias.device(), stream);
    bias32.copy_(bias, stream);
  }
  kernels::GemmEpilogue epilogue;
  epilogue.bias = cf(bias32);
  kernels::gemm_16_auto(a.dtype(), a.data_ptr(), trans_a, b.data_ptr(), trans_b, c.data_ptr(), c.dtype(), m,
                        n, k, 1.0f, 0.0f, epilogue, stream.handle);
}
inline void bias_backward(const Tensor& dy, Tensor& dbias, Stream stream) {
  DeviceGuard guard(dy.device().index);
  const int64_t h = dbias.numel();
  kernels::bias_backward(dy.data_ptr(), dy.dtype(), ops_detail::f(dbias), h == 0 ? 0 : dy.numel() / h, h,
                         stream.handle);
}

// ---- element-wise -----------------------------------------------------------------------------
// fp32, bf16 or fp16 (one dtype per call); 16-bit outputs rounded to nearest even as on the CPU.
inline void add(const Tensor& a, const Tensor& b, Tensor& out, Stream stream) {
  DeviceGuard guard(a.device().index);
  kernels::add(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.dtype(), a.numel(), stream.handle);
}
inline void add_(Tensor& a, const Tensor& b, Stream stream) {
  DeviceGuard guard(a.device().index);
  kernels::add(a.data_ptr(), b.data_ptr(), a.data_ptr(), a.dtype(), a.numel(), stream.handle);
}
inline void scale_(Tensor& a, float alpha, Stream stream) {
  DeviceGuard guard(a.device().index);
  kernels::scale(a.data_ptr(), a.dtype(), alpha, a.numel(), stream.handle);
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
  kernels::gelu_forward(x.data_ptr(), y.data_ptr(), x.dtype(), x.numel(), stream.handle);
}
inline void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::gelu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), x.dtype(), x.numel(), stream.handle);
}
inline void swiglu_forward(const Tensor& x, Tensor& y, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::swiglu_forward(x.data_ptr(), y.data_ptr(), x.dtype(), ops_detail::rows_of(y), y.size(-1),
                          stream.handle);
}
inline void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::swiglu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), x.dtype(), ops_detail::rows_of(dy),
                           dy.size(-1), stream.handle);
}
inline void dropout_forward(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset,
                            Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::dropout(x.data_ptr(), y.data_ptr(), x.dtype(), x.numel(), p, seed, offset, stream.handle);
}
// The backward is the same mask and scale applied to the gradient.
inline void dropout_backward(const Tensor& dy, Tensor& dx, float p, uint64_t seed, uint64_t offset,
                             Stream stream) {
  DeviceGuard guard(dy.device().index);
  kernels::dropout(dy.data_ptr(), dx.data_ptr(), dy.dtype(), dy.numel(), p, seed, offset, stream.handle);
}

// ---- normalisation ----------------------------------------------------------------------------
// x, y, dy, dx of the activation dtype; weight, bias fp32 or that dtype; statistics and parameter
// gradients fp32.
inline void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                              Tensor& mean, Tensor& rstd, float eps, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  // The kernel takes one parameter dtype: a weight and bias of different dtypes (each fp32 or the
  // activations') run as fp32, the 16-bit one widened (exactly) into an h-element scratch.
  Tensor w = weight, b = bias;
  if (w.dtype() != b.dtype()) {
    if (w.dtype() != DType::F32) w = widened(w, stream);
    if (b.dtype() != DType::F32) b = widened(b, stream);
  }
  kernels::layernorm_forward(x.data_ptr(), w.data_ptr(), b.data_ptr(), w.dtype(), y.data_ptr(), x.dtype(),
                             f(mean), f(rstd), rows_of(x), w.numel(), eps, stream.handle);
}
// dresidual (optional): added to dx in fp32 before dx's one rounding (norm_backward_residual; it
// may be dx itself).
inline void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias, Stream stream,
                               const Tensor* dresidual = nullptr) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::layernorm_backward(dy.data_ptr(), x.data_ptr(), weight.data_ptr(), weight.dtype(), cf(mean),
                              cf(rstd), dresidual ? dresidual->data_ptr() : nullptr, dx.data_ptr(), x.dtype(),
                              f(dweight), f(dbias), rows_of(x), weight.numel(), stream.handle);
}
inline void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                            Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::rmsnorm_forward(x.data_ptr(), weight.data_ptr(), weight.dtype(), y.data_ptr(), x.dtype(), f(rstd),
                           rows_of(x), weight.numel(), eps, stream.handle);
}
inline void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                             Tensor& dx, Tensor& dweight, Stream stream, const Tensor* dresidual = nullptr) {
  using namespace ops_detail;
  DeviceGuard guard(x.device().index);
  kernels::rmsnorm_backward(dy.data_ptr(), x.data_ptr(), weight.data_ptr(), weight.dtype(), cf(rstd),
                            dresidual ? dresidual->data_ptr() : nullptr, dx.data_ptr(), x.dtype(), f(dweight),
                            rows_of(x), weight.numel(), stream.handle);
}
// The norm's backward (LayerNorm when mean is defined) with the residual added before dx's one
// rounding, as the CPU; then dropout's backward into dbranch when defined.
inline void norm_backward_residual(const Tensor& dy, const Tensor& dresidual, const Tensor& x,
                                   const Tensor& weight, const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                   Tensor& dweight, Tensor& dbias, float p, uint64_t seed, uint64_t offset,
                                   Tensor& dbranch, Stream stream) {
  if (mean.defined())
    layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias, stream, &dresidual);
  else
    rmsnorm_backward(dy, x, weight, rstd, dx, dweight, stream, &dresidual);
  if (dbranch.defined()) dropout_backward(dx, dbranch, p, seed, offset, stream);
}

// ---- attention --------------------------------------------------------------------------------
inline void rope_forward(Tensor& x, int64_t position_offset, const Rope& rope, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::rope(x.data_ptr(), x.dtype(), x.size(0), x.size(1) * x.size(2), x.size(3), position_offset, rope,
                1.0f, stream.handle);
}
inline void rope_backward(Tensor& dx, int64_t position_offset, const Rope& rope, Stream stream) {
  DeviceGuard guard(dx.device().index);
  kernels::rope(dx.data_ptr(), dx.dtype(), dx.size(0), dx.size(1) * dx.size(2), dx.size(3), position_offset,
                rope, -1.0f, stream.handle);
}

inline kernels::AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v) {
  PARALLEL_CHECK(q.size(3) <= 256 && v.size(3) <= 256,
                 "CUDA attention supports head dimensions up to 256, got {} (qk) and {} (v)", q.size(3),
                 v.size(3));
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}

// 16-bit tensors go to the tensor-core FlashAttention-2 kernels (flash_attention_mma.cu) directly
// when those take the problem (kernels::attention_mma_can_implement: head dim 64 or 128 for q, k and v,
// b * hq <= 65535, every tensor 16-byte aligned; cudaMalloc'd tensors are, a view may not be).
// Otherwise (other head dims, odd views, more batch x heads) the fp32 flash kernel runs on widened
// copies and the outputs are rounded back (conversion kernels, the exception rather than the rule);
// it covers any batch x heads in launches of at most 65535 pairs.
inline bool use_attention_mma(const kernels::AttentionShape& shape, DType dtype,
                              std::initializer_list<const Tensor*> all) {
  bool aligned = true;
  for (const Tensor* t : all) aligned = aligned && ops_detail::aligned16(*t);
  return kernels::attention_mma_can_implement(shape, dtype, aligned);
}

// q, k, v, out of one dtype (fp32, bf16, fp16); lse fp32. Head dimension d <= 256 in fp32; the
// backward's shared-memory tiles need d <= 128 on sm_80. `mask` (parallel/attention_mask.hpp) says
// which keys each query row sees; its doc_start, when set, is int32 memory on q's GPU. Every path
// applies it (a row that sees no key: out 0, lse -inf); the flash kernels skip the tiles it empties.
inline void check_attention_mask(const AttentionBounds& mask) {
  const char* why = kernels::attention_bounds_error(mask);
  PARALLEL_CHECK(why == nullptr, "CUDA attention: {}", why ? why : "");
}
inline void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                              const AttentionBounds& mask, float softmax_scale, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(q.device().index);
  check_attention_mask(mask);
  if (kernels::attention_path() == kernels::AttentionPath::Plain)  // PARALLEL_ATTENTION=plain
    return attention_plain_forward(q, k, v, out, lse, mask, softmax_scale, stream);
  const kernels::AttentionShape shape = attention_shape(q, k, v);
  if (use_attention_mma(shape, q.dtype(), {&q, &k, &v, &out})) {
    if (q.dtype() == DType::BF16)
      kernels::flash_attention_forward_bf16(
          static_cast<const bf16*>(q.data_ptr()), static_cast<const bf16*>(k.data_ptr()),
          static_cast<const bf16*>(v.data_ptr()), static_cast<bf16*>(out.data_ptr()), f(lse), shape, mask,
          softmax_scale, stream.handle);
    else
      kernels::flash_attention_forward_f16(
          static_cast<const f16*>(q.data_ptr()), static_cast<const f16*>(k.data_ptr()),
          static_cast<const f16*>(v.data_ptr()), static_cast<f16*>(out.data_ptr()), f(lse), shape, mask,
          softmax_scale, stream.handle);
    return;
  }
  if (q.dtype() != DType::F32) {  // 16-bit, but not a problem the tensor-core kernel takes
    const Tensor q32 = widened(q, stream), k32 = widened(k, stream), v32 = widened(v, stream);
    Tensor o32 = Tensor::empty(out.shape(), DType::F32, out.device(), stream);
    kernels::attention_forward(cf(q32), cf(k32), cf(v32), f(o32), f(lse), shape, mask, softmax_scale,
                               stream.handle);
    narrow_into(out, o32, stream);
    return;
  }
  kernels::attention_forward(cf(q), cf(k), cf(v), f(out), f(lse), shape, mask, softmax_scale, stream.handle);
}
inline void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                               const AttentionBounds& mask, float softmax_scale, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(q.device().index);
  check_attention_mask(mask);
  if (kernels::attention_path() == kernels::AttentionPath::Plain)  // PARALLEL_ATTENTION=plain
    return attention_plain_backward(dout, q, k, v, out, lse, dq, dk, dv, mask, softmax_scale, stream);
  const kernels::AttentionShape shape = attention_shape(q, k, v);
  if (use_attention_mma(shape, q.dtype(), {&dout, &q, &k, &v, &out, &dq, &dk, &dv})) {
    if (q.dtype() == DType::BF16)
      kernels::flash_attention_backward_bf16(
          static_cast<const bf16*>(dout.data_ptr()), static_cast<const bf16*>(q.data_ptr()),
          static_cast<const bf16*>(k.data_ptr()), static_cast<const bf16*>(v.data_ptr()),
          static_cast<const bf16*>(out.data_ptr()), cf(lse), static_cast<bf16*>(dq.data_ptr()),
          static_cast<bf16*>(dk.data_ptr()), static_cast<bf16*>(dv.data_ptr()), shape, mask, softmax_scale,
          stream.handle);
    else
      kernels::flash_attention_backward_f16(
          static_cast<const f16*>(dout.data_ptr()), static_cast<const f16*>(q.data_ptr()),
          static_cast<const f16*>(k.data_ptr()), static_cast<const f16*>(v.data_ptr()),
          static_cast<const f16*>(out.data_ptr()), cf(lse), static_cast<f16*>(dq.data_ptr()),
          static_cast<f16*>(dk.data_ptr()), static_cast<f16*>(dv.data_ptr()), shape, mask, softmax_scale,
          stream.handle);
    return;
  }
  if (q.dtype() != DType::F32) {  // 16-bit, but not a problem the tensor-core kernel takes
    const Tensor do32 = widened(dout, stream), q32 = widened(q, stream), k32 = widened(k, stream);
    const Tensor v32 = widened(v, stream), o32 = widened(out, stream);
    Tensor dq32 = Tensor::empty(dq.shape(), DType::F32, dq.device(), stream);
    Tensor dk32 = Tensor::empty(dk.shape(), DType::F32, dk.device(), stream);
    Tensor dv32 = Tensor::empty(dv.shape(), DType::F32, dv.device(), stream);
    kernels::attention_backward(cf(do32), cf(q32), cf(k32), cf(v32), cf(o32), cf(lse), f(dq32), f(dk32),
                                f(dv32), shape, mask, softmax_scale, stream.handle);
    narrow_into(dq, dq32, stream);
    narrow_into(dk, dk32, stream);
    narrow_into(dv, dv32, stream);
    return;
  }
  kernels::attention_backward(cf(dout), cf(q), cf(k), cf(v), cf(out), cf(lse), f(dq), f(dk), f(dv), shape,
                              mask, softmax_scale, stream.handle);
}

// out_acc, lse_acc, lse_blk fp32; out_blk of the activation dtype, read as stored (no widened copy).
inline void attention_merge(Tensor& out_acc, Tensor& lse_acc, const Tensor& out_blk, const Tensor& lse_blk,
                            int64_t q0, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(out_acc.device().index);
  kernels::attention_merge(f(out_acc), f(lse_acc), out_blk.data_ptr(), out_blk.dtype(), cf(lse_blk),
                           out_acc.size(0), out_acc.size(1), out_acc.size(2), out_acc.size(3),
                           out_blk.size(0), q0, stream.handle);
}

// ---- embedding and loss -----------------------------------------------------------------------
// out of the activation dtype, weight fp32 or that dtype (equal dtypes copy the bits, an fp32 table
// is rounded); dout of the activation dtype, dweight fp32.
inline void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out,
                              Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(weight.device().index);
  kernels::embedding_forward(ids(tokens), weight.data_ptr(), weight.dtype(), vocab_start, weight.size(0),
                             out.data_ptr(), out.dtype(), tokens.size(0), tokens.size(1), weight.size(1),
                             stream.handle);
}
// Deterministic: a stable radix sort groups each id's rows, which are then summed in token order into
// dweight, the CPU kernel's summation order (bit-identical results).
inline void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight,
                               Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(dweight.device().index);
  kernels::embedding_backward(ids(tokens), dout.data_ptr(), dout.dtype(), vocab_start, f(dweight),
                              dweight.size(0), tokens.size(0), tokens.size(1), dweight.size(1),
                              stream.handle);
}
// logits and dlogits of the activation dtype; the per-row vectors fp32.
inline void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                      int64_t vocab_size, Tensor& row_max, Tensor& target_logit,
                                      Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(logits.device().index);
  const int64_t n = logits.size(0), v = logits.size(1);
  kernels::ce_local_stats(logits.data_ptr(), logits.dtype(), ids(targets), n, v, vocab_start,
                          valid_columns(v, vocab_start, vocab_size), f(row_max), f(target_logit),
                          stream.handle);
}
inline void cross_entropy_sum_exp(const Tensor& logits, const Tensor& row_max, int64_t vocab_start,
                                  int64_t vocab_size, Tensor& sum_exp, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(logits.device().index);
  const int64_t n = logits.size(0), v = logits.size(1);
  kernels::ce_sum_exp(logits.data_ptr(), logits.dtype(), cf(row_max), n, v,
                      valid_columns(v, vocab_start, vocab_size), f(sum_exp), stream.handle);
}
inline void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                                   const Tensor& sum_exp, const Tensor& grad_scale, int64_t vocab_start,
                                   int64_t vocab_size, Tensor& dlogits, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(logits.device().index);
  const int64_t n = logits.size(0), v = logits.size(1);
  kernels::ce_backward(logits.data_ptr(), ids(targets), cf(row_max), cf(sum_exp), cf(grad_scale), n, v,
                       vocab_start, valid_columns(v, vocab_start, vocab_size), dlogits.data_ptr(),
                       dlogits.dtype(), stream.handle);
}

// ---- rows by index ----------------------------------------------------------------------------
// Gathers with int64 indices on the device (kernels/cuda/rows.cu): every output element is one
// thread's, summed in index order, so results equal the CPU kernel's wherever the fp32 arithmetic does.
inline const int64_t* row_index(const Tensor& t) { return static_cast<const int64_t*>(t.data_ptr()); }
inline void gather_rows(const Tensor& src, const Tensor& index, Tensor& out, Stream stream) {
  DeviceGuard guard(out.device().index);
  kernels::gather_rows(src.data_ptr(), row_index(index), out.data_ptr(), out.dtype(), out.size(0),
                       out.size(1), stream.handle);
}
inline void gather_rows_scaled(const Tensor& src, const Tensor& index, const Tensor& scale, Tensor& out,
                               Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(out.device().index);
  kernels::gather_rows_scaled(src.data_ptr(), row_index(index), cf(scale), out.data_ptr(), out.dtype(),
                              out.size(0), out.size(1), stream.handle);
}
inline void gather_sum_rows(const Tensor& src, const Tensor& index, const Tensor& weight, Tensor& out,
                            Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(out.device().index);
  kernels::gather_sum_rows(src.data_ptr(), src.dtype(), row_index(index),
                           weight.defined() ? cf(weight) : nullptr, out.data_ptr(), out.dtype(), out.size(0),
                           index.size(1), out.size(1), stream.handle);
}
inline void row_dot(const Tensor& a, const Tensor& b, const Tensor& index, Tensor& out, Stream stream) {
  using namespace ops_detail;
  DeviceGuard guard(out.device().index);
  kernels::row_dot(a.data_ptr(), b.data_ptr(), a.dtype(), row_index(index), f(out), a.size(0), a.size(1),
                   stream.handle);
}

// ---- reductions -------------------------------------------------------------------------------
// Per-block partial sums in double, added in block order on the host: deterministic. Synchronises.
inline double sum_of_squares(const Tensor& x, Stream stream) {
  DeviceGuard guard(x.device().index);
  return kernels::sum_of_squares(x.data_ptr(), x.dtype(), x.numel(), stream.handle);
}

inline void normalize_(Tensor& x, float eps, Stream stream) {
  DeviceGuard guard(x.device().index);
  kernels::normalize(static_cast<float*>(x.data_ptr()), x.numel(), eps, stream.handle);
}

// adamw_step and gemm_cublaslt_bf16 / _f16 / _16 (raw device buffers) are declared in kernels.hpp, and
// the bf16 / fp16 GEMMs (ours, and the automatic choice) in gemm/gemm.hpp, both included above.

}  // namespace parallel::cuda
