#pragma once
// The CPU kernels behind parallel::ops (include/parallel/ops.hpp): one function per op, same
// signature minus the Stream. src/ops/ops.cpp validates arguments (defined, contiguous, dtype,
// shapes) before calling these, so the kernels assume well-formed tensors of the dtypes ops.hpp
// allows: fp32 / bf16 / fp16 activations (read and written through widen.hpp), fp32 statistics
// and gradients, int32 ids.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cpu {

// ---- dense algebra (gemm.cpp, elementwise.cpp) ---------------------------------------------
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta);
void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias, Tensor& c);
// The fp32 gemm through oneDNN whatever gemm routes it to (benchmarks run it beside the own GEMM).
void gemm_onednn_f32(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                     float beta);
// oneDNN's name for the implementation it picks for a GEMM with these operands on this CPU (e.g.
// "brg:avx512_core_bf16"), for benchmarks and logs.
// ops::WeightPackingScope's CPU side (gemm.cpp): the buffers whose GEMM operands are packed once.
void open_weight_packing(const std::vector<std::pair<const void*, int64_t>>& buffers);
void close_weight_packing();
int64_t weight_packs_made();  // reorders done so far, for tests
std::string gemm_implementation(DType operands);
// Whether oneDNN has a matmul for these operands on this CPU (else gemm widens them to fp32, and a
// packing scope packs nothing).
bool native_gemm(DType operands);
void add_bias(Tensor& y, const Tensor& bias);
void bias_backward(const Tensor& dy, Tensor& dbias);

// ---- element-wise (elementwise.cpp) --------------------------------------------------------
void add(const Tensor& a, const Tensor& b, Tensor& out);
void add_(Tensor& a, const Tensor& b);
void scale_(Tensor& a, float alpha);
void round_to_bf16_(Tensor& x);
void round_to_f16_(Tensor& x);
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
void gelu_backward_bias(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& dbias);
void swiglu_forward(const Tensor& x, Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
void dropout_forward(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset);
void dropout_backward(const Tensor& dy, Tensor& dx, float p, uint64_t seed, uint64_t offset);
void dropout_add(const Tensor& branch, const Tensor& residual, Tensor& out, float p, uint64_t seed,
                 uint64_t offset);

// ---- normalisation (norm.cpp) --------------------------------------------------------------
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                       Tensor& rstd, float eps);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias);
void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight);
// The residual add fused with the norm (ops.hpp): LayerNorm when bias / mean are defined. An
// undefined branch (dresidual) is the plain norm forward (backward), which the functions above call.
void residual_norm_forward(const Tensor& residual, const Tensor& branch, float p, uint64_t seed,
                           uint64_t offset, const Tensor& weight, const Tensor& bias, Tensor& sum, Tensor& y,
                           Tensor& mean, Tensor& rstd, float eps);
void norm_backward_residual(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                            Tensor& dbias, float p, uint64_t seed, uint64_t offset, Tensor& dbranch);

// ---- attention (rope.cpp; attention.cpp, attention_bf16.cpp, attention_merge.cpp) ------------
void rope_forward(Tensor& x, int64_t position_offset, const Rope& rope);
void rope_backward(Tensor& dx, int64_t position_offset, const Rope& rope);
// The mask's doc_start (if any) is host memory here. Rows that see no key: zero output, lse -inf.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionBounds& mask, float softmax_scale);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionBounds& mask, float softmax_scale);
int64_t attention_workspace_bytes(DType dtype, int64_t s, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                                  int64_t dv, bool backward, int threads);
void attention_merge(Tensor& out_acc, Tensor& lse_acc, const Tensor& out_blk, const Tensor& lse_blk,
                     int64_t q0);
// The bf16 kernels on AVX512-BF16 dot products, which attention_* dispatch to where supported
// (bf16 tensors, even head dim, a CPU with AVX512-BF16, value head size equal to the query/key
// one; other head sizes are widened to fp32): P and dS are rounded to bf16 before their products,
// as in FlashAttention.
bool attention_bf16_supported(DType dtype, int64_t head_dim);
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                            const AttentionBounds& mask, float softmax_scale);
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionBounds& mask, float softmax_scale);

// ---- embedding and loss (embedding.cpp, cross_entropy.cpp) ---------------------------------
void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out);
void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight);
void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               int64_t vocab_size, Tensor& row_max, Tensor& target_logit);
void cross_entropy_sum_exp(const Tensor& logits, const Tensor& row_max, int64_t vocab_start,
                           int64_t vocab_size, Tensor& sum_exp);
void cross_entropy_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                         Tensor& row_max, Tensor& target_logit, Tensor& sum_exp);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            const Tensor& sum_exp, const Tensor& grad_scale, int64_t vocab_start,
                            int64_t vocab_size, Tensor& dlogits);

void cross_entropy_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        Tensor& loss);

// ---- rows by index (rows.cpp) ----------------------------------------------------------------
void gather_rows(const Tensor& src, const Tensor& index, Tensor& out);
void gather_rows_scaled(const Tensor& src, const Tensor& index, const Tensor& scale, Tensor& out);
// weight may be undefined (all ones).
void gather_sum_rows(const Tensor& src, const Tensor& index, const Tensor& weight, Tensor& out);
void row_dot(const Tensor& a, const Tensor& b, const Tensor& index, Tensor& out);

// ---- reductions (reduce.cpp) ---------------------------------------------------------------
double sum_of_squares(const Tensor& x);
void sum_of_squares_accumulate(const Tensor& x, Tensor& acc);
void normalize_(Tensor& x, float eps);
void sum_of_squares_accumulate_multi(const std::vector<Tensor>& xs, Tensor& acc);

// ---- optimizer (adamw.cpp) -----------------------------------------------------------------
void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                   const ops::AdamWStep& h, Tensor* model_copy);
void adamw_update_multi_(const std::vector<ops::AdamWTensors>& tensors, const ops::AdamWStep& h);

}  // namespace parallel::cpu
