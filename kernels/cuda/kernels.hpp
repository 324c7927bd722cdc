#pragma once
// Raw-pointer launchers of the CUDA kernels (kernels/cuda/*.cu, kernels/attention/*.cu), one per op
// of include/parallel/ops.hpp. Plain C++ without fmt or CUDA headers, so that both the .cu files
// (which cannot include fmt) and host code include it. All pointers are device memory of the
// current device, contiguous (dtypes below; int32 ids); work is ordered on `stream` (a cudaStream_t).
// Failures throw parallel::Error. Shapes are validated by the callers (src/ops/ops.cpp and
// cuda_ops.hpp); launchers assume them.
#include <cstdint>

#include "parallel/attention_mask.hpp"
#include "parallel/dtype.hpp"
#include "parallel/rope.hpp"

namespace parallel::kernels {

using stream_t = void*;  // cudaStream_t

// Activations are passed as untyped pointers with their DType (F32, BF16 or F16, one per call: the
// op's activation dtype); parameter values (bias, norm weights, embedding table) with their own
// DType, F32 or the activations'; statistics and parameter gradients are float*. Every kernel
// computes in fp32 and rounds 16-bit outputs to nearest even (common.cuh, to_storage).

// ---- elementwise.cu ----
void add_bias(void* y, DType dtype, const void* bias, DType bias_dtype, int64_t rows, int64_t h,
              stream_t stream);
void bias_backward(const void* dy, DType dtype, float* dbias, int64_t rows, int64_t h,
                   stream_t stream);  // += , deterministic
void add(const void* a, const void* b, void* out, DType dtype, int64_t n, stream_t stream);  // out may alias
void scale(void* a, DType dtype, float alpha, int64_t n, stream_t stream);
void gelu_forward(const void* x, void* y, DType dtype, int64_t n, stream_t stream);
void gelu_backward(const void* dy, const void* x, void* dx, DType dtype, int64_t n, stream_t stream);
void swiglu_forward(const void* x, void* y, DType dtype, int64_t rows, int64_t f, stream_t stream);
void swiglu_backward(const void* dy, const void* x, void* dx, DType dtype, int64_t rows, int64_t f,
                     stream_t stream);
void dropout(const void* x, void* y, DType dtype, int64_t n, float p, uint64_t seed, uint64_t offset,
             stream_t stream);

// ---- convert.cu ---- mixed-precision emulation: rounds n fp32 values in place to the nearest bf16
// (precision BF16) or fp16 (F16) value, widened back to fp32; ties to even, NaN -> quiet NaN, fp16
// overflow -> inf, fp16 subnormals kept. Bit for bit the CPU kernel's result
// (kernels/cpu/elementwise.cpp, round_bf16_chunk / round_f16_chunk). F32: nothing to do.
void round_to_precision(float* x, int64_t n, DType precision, stream_t stream);

// ---- norm.cu ---- x, y, dy, dx of `dtype`; w, b of `w_dtype`; mean, rstd, dw, db fp32.
void layernorm_forward(const void* x, const void* w, const void* b, DType w_dtype, void* y, DType dtype,
                       float* mean, float* rstd, int64_t rows, int64_t h, float eps, stream_t stream);
// dresidual (nullptr or of `dtype`, may be dx): dx = norm'(dy) + dresidual, added in fp32 and rounded
// once.
void layernorm_backward(const void* dy, const void* x, const void* w, DType w_dtype, const float* mean,
                        const float* rstd, const void* dresidual, void* dx, DType dtype, float* dw, float* db,
                        int64_t rows, int64_t h, stream_t stream);
void rmsnorm_forward(const void* x, const void* w, DType w_dtype, void* y, DType dtype, float* rstd,
                     int64_t rows, int64_t h, float eps, stream_t stream);
void rmsnorm_backward(const void* dy, const void* x, const void* w, DType w_dtype, const float* rstd,
                      const void* dresidual, void* dx, DType dtype, float* dw, int64_t rows, int64_t h,
                      stream_t stream);

// ---- rope.cu ---- x [s, per_pos, d] of `dtype`, in place; direction +1 forward, -1 backward.
void rope(void* x, DType dtype, int64_t s, int64_t per_pos, int64_t d, int64_t position_offset,
          const Rope& rope, float direction, stream_t stream);

// ---- embedding.cu ---- tokens [b, s]; weight [rows, h] of w_dtype; out / dout [s, b, h] of dtype;
// dweight fp32.
void embedding_forward(const int32_t* tokens, const void* weight, DType w_dtype, int64_t vocab_start,
                       int64_t rows, void* out, DType dtype, int64_t b, int64_t s, int64_t h,
                       stream_t stream);
void embedding_backward(const int32_t* tokens, const void* dout, DType dtype, int64_t vocab_start,
                        float* dweight, int64_t rows, int64_t b, int64_t s, int64_t h, stream_t stream);

// ---- rows.cu ---- src / out / a / b of `dtype` ([rows, h]); int64 indices (negative: a zero row);
// scale, weight (may be null: ones) and out of row_dot fp32; gather_sum_rows' out of out_dtype
// (fp32 or dtype). Deterministic gathers, no atomics.
void gather_rows(const void* src, const int64_t* index, void* out, DType dtype, int64_t n, int64_t h,
                 stream_t stream);
void gather_rows_scaled(const void* src, const int64_t* index, const float* scale, void* out, DType dtype,
                        int64_t n, int64_t h, stream_t stream);
void gather_sum_rows(const void* src, DType dtype, const int64_t* index, const float* weight, void* out,
                     DType out_dtype, int64_t rows, int64_t k, int64_t h, stream_t stream);
void row_dot(const void* a, const void* b, DType dtype, const int64_t* index, float* out, int64_t n,
             int64_t h, stream_t stream);

// ---- cross_entropy.cu ---- logits (and dlogits) [n, v] of `dtype`; columns [0, valid) are real
// vocabulary; the per-row vectors are fp32.
void ce_local_stats(const void* logits, DType dtype, const int32_t* targets, int64_t n, int64_t v,
                    int64_t vocab_start, int64_t valid, float* row_max, float* target_logit, stream_t stream);
void ce_sum_exp(const void* logits, DType dtype, const float* row_max, int64_t n, int64_t v, int64_t valid,
                float* sum_exp, stream_t stream);
void ce_backward(const void* logits, const int32_t* targets, const float* row_max, const float* sum_exp,
                 const float* grad_scale, int64_t n, int64_t v, int64_t vocab_start, int64_t valid,
                 void* dlogits, DType dtype, stream_t stream);

// ---- reduce.cu ---- synchronises the stream.
double sum_of_squares(const void* x, DType dtype, int64_t n, stream_t stream);

// ---- normalize.cu ---- x /= max(||x||_F, eps), fp32, no host read.
void normalize(float* x, int64_t n, float eps, stream_t stream);

// ---- gemm_cublaslt.cu ---- row-major fp32 c[m, n] = alpha op(a) op(b) + beta c, no TF32.
void gemm_f32(const float* a, bool trans_a, const float* b, bool trans_b, float* c, int64_t m, int64_t n,
              int64_t k, float alpha, float beta, stream_t stream);

// ---- attention/flash_attention.cu ---- q, dq [s, b, hq, d]; k, dk [s, b, hkv, d]; v, dv
// [s, b, hkv, dv]; out, dout [s, b, hq, dv]; lse [b, hq, s]. d, dv <= 256 (dv: the value head size,
// MLA's differs from the query/key one). `mask` (parallel/attention_mask.hpp; doc_start in device memory)
// says which keys each query row sees; key tiles no row of a query tile sees are skipped (and query tiles
// none of a key tile's keys are seen by, in the backward's dK/dV pass). A row that sees no key gets out = 0
// and lse = -inf.
struct AttentionShape {
  int64_t s, b, hq, hkv, d;
  int64_t dv = 0;  // value head size; 0: d
  int64_t value_dim() const { return dv > 0 ? dv : d; }
};
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       const AttentionShape& shape, const AttentionBounds& mask, float softmax_scale,
                       stream_t stream);
void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, float* dq, float* dk, float* dv, const AttentionShape& shape,
                        const AttentionBounds& mask, float softmax_scale, stream_t stream);

// ---- attention_merge.cu ---- out_acc [S, b, h, d] and lse_acc [b, h, S] fp32, in place; out_blk
// [n, b, h, d] of `dtype`, lse_blk [b, h, n] fp32: the block's rows are rows q0 .. q0 + n - 1 of the
// accumulators (ops.hpp, attention_merge).
void attention_merge(float* out_acc, float* lse_acc, const void* out_blk, DType dtype, const float* lse_blk,
                     int64_t S, int64_t b, int64_t h, int64_t d, int64_t n, int64_t q0, stream_t stream);

}  // namespace parallel::kernels

namespace parallel::cuda {

// ---- adamw.cu: a fused AdamW step over flat fp32 buffers ----
// torch.optim.AdamW's single-tensor arithmetic, operation for operation (as src/optim/adamw.cpp):
//   g = grad * grad_scale; p *= 1 - lr wd (decayed elements); m = b1 m + (1 - b1) g;
//   v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled, on decayed elements only
  int64_t step = 1;           // 1 for the first update (bias correction)
  float grad_scale = 1.0f;    // multiplies every gradient first (the clip coefficient; 1 = none)
};

// n elements of device buffers on the current device: param, exp_avg, exp_avg_sq updated in place,
// grad read. Decayed elements: decay_mask[i] != 0 when decay_mask is given, else i in
// [decay_begin, decay_end) (pass 0, 0 for no decay). model_bf16 (optional) receives the updated
// params rounded to bf16 (nearest even) in the same pass. Ordered on `stream` (a cudaStream_t).
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, bf16* model_bf16,
                int64_t n, const AdamWHyper& hyper, const uint8_t* decay_mask, int64_t decay_begin,
                int64_t decay_end, void* stream);

// ---- gemm_cublaslt.cu: cuBLASLt bf16 x bf16 -> fp32 (fp32 accumulation), row-major ----
// c[m, n] = alpha op(a) op(b) + beta c; k >= 1 (cuBLASLt rejects k = 0). The baseline our own mma
// GEMM is measured against, and the other candidate of kernels::gemm_bf16_auto (gemm/gemm.hpp).
void gemm_cublaslt_bf16(const bf16* a, bool trans_a, const bf16* b, bool trans_b, float* c, int64_t m,
                        int64_t n, int64_t k, float alpha, float beta, void* stream);
// The same with fp16 inputs (fp32 accumulation and output).
void gemm_cublaslt_f16(const f16* a, bool trans_a, const f16* b, bool trans_b, float* c, int64_t m, int64_t n,
                       int64_t k, float alpha, float beta, void* stream);
// a, b of ab_dtype (BF16 or F16), c of c_dtype (F32 or ab_dtype: the fp32 result, formed with fp32
// accumulation and scale type, rounded into 16 bits by cuBLASLt; beta c read in c's type).
void gemm_cublaslt_16(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                      DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta, void* stream);
// The same plus bias[n] (of bias_dtype: F32, or c's dtype) added in cuBLASLt's epilogue
// (CUBLASLT_EPILOGUE_BIAS) in fp32 before c's one rounding; k >= 1. False, with nothing run, when
// cuBLASLt has no algorithm for it (then our kernel, which has the epilogue, runs the call). Seen on
// an H200 with cuBLAS 13.1 (2026-11-28): no algorithm for an fp32 bias with a bf16 c; a bf16 bias
// with a bf16 c is cuBLASLt's default combination.
bool gemm_cublaslt_16_bias(DType ab_dtype, const void* a, bool trans_a, const void* b, bool trans_b, void* c,
                           DType c_dtype, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                           const void* bias, DType bias_dtype, void* stream);

}  // namespace parallel::cuda
