#pragma once
// The plain attention path (attention_plain.cu): attention as batched cuBLAS products around a
// row-softmax kernel, with an [s, s] score matrix materialised per head. Slow and memory-hungry
// next to FlashAttention, but built from library GEMMs and two short, obviously-correct kernels,
// so that a GPU can train while our own flash kernels (flash_attention.cu, flash_attention_mma.cu)
// fail their checks. Selected by PARALLEL_ATTENTION=plain (default flash); see docs/gpu.md.
// UNVERIFIED ON A GPU: compiled for sm_80 / sm_90 only, like the rest of kernels/ (2026-11).
//
// Contract (the same layouts as kernels::attention_forward, kernels.hpp, and ops.hpp):
//   q, dq  [s, b, hq, d]    k, dk  [s, b, hkv, d]    v, dv  [s, b, hkv, dv]    out, dout  [s, b, hq, dv]
//   lse  [b, hq, s] fp32    (dv = shape.value_dim(), the value head size; d the query/key one)
// Query head h reads kv head h / (hq / hkv); `mask` (parallel/attention_mask.hpp, doc_start in device
// memory) says which keys each query row sees (attention_tiles.hpp). The [s, s] products are full
// whatever the mask: this path applies it in the softmax but skips no tile. A row that sees no key
// gets out = 0 and lse = -inf. Inputs (q, k, v, and in the backward dout and out) are of `dtype`: F32, BF16
// or F16; the outputs (out, lse, dq, dk, dv) are fp32, written (not accumulated); dk, dv sum over the
// query heads that share them, in head order (deterministic).
//
// Algorithm, per (batch, query head):
//   forward   S = scale * Q K^T (fp32 [s, s]);  P = softmax_row(S) with the mask, lse = logsumexp_row;
//             O = P V.
//   backward  P recomputed as above (from q, k; the forward's lse is not used);  dP = dO V^T;
//             D_i = sum_e dO_ie O_ie;  dS = P * (dP - D);  dQ = scale dS K;  dK = scale dS^T Q;
//             dV = P^T dO.
// GEMMs: cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F (fp32 accumulation; TF32 never used), A and
// B of `dtype`, C fp32. With 16-bit inputs P and dS are rounded to that type before the products
// that read them (P V, P^T dO, dS K, dS^T Q), as FlashAttention and our mma kernels do. GQA: one
// strided-batched call per query head of a group (batch over (b, kv head)); dK, dV accumulate those
// calls with beta = 1.
//
// Memory: the [s, s] workspaces come from the caching allocator on `stream`, in chunks of
// (b, kv head) pairs of at most ~512 MiB (at least one pair: 12 s^2 bytes in the backward).
// Pointers are device memory of the current device; work is ordered on `stream` (a cudaStream_t).
// Throws parallel::Error on a CUDA or cuBLAS failure.
#include <cstdint>

#include "../cuda/kernels.hpp"  // AttentionShape
#include "parallel/dtype.hpp"

namespace parallel::kernels {

enum class AttentionPath : uint8_t { Flash, Plain };

// The path the CUDA attention launchers (kernels/cuda/cuda_ops.hpp) take: set_attention_path's
// value if one was set, else PARALLEL_ATTENTION (read once: flash | plain; unset or "" = flash).
// An invalid PARALLEL_ATTENTION throws parallel::Error naming the variable and the allowed values.
AttentionPath attention_path();
// Overrides PARALLEL_ATTENTION for the rest of the process (tests and benchmarks compare paths).
void set_attention_path(AttentionPath path);
AttentionPath parse_attention_path(const char* value);
const char* attention_path_name(AttentionPath path);  // "flash", "plain"

void attention_plain_forward(const void* q, const void* k, const void* v, DType dtype, float* out, float* lse,
                             const AttentionShape& shape, const AttentionBounds& mask, float softmax_scale,
                             void* stream);
// lse: the forward's [b, hq, s] (fp32); P is recomputed from it.
void attention_plain_backward(const void* dout, const void* q, const void* k, const void* v, const void* out,
                              const float* lse, DType dtype, float* dq, float* dk, float* dv,
                              const AttentionShape& shape, const AttentionBounds& mask, float softmax_scale,
                              void* stream);

}  // namespace parallel::kernels
