#pragma once
// Tensor-core FlashAttention-2 for bf16 / fp16 (flash_attention_mma.cu): forward and backward,
// mma.sync.m16n8k16 with fp32 accumulation, for sm_80 and later. Plain C++ (no CUDA or fmt
// headers), like gemm/gemm.hpp.
//
// Contract (the same as the fp32 kernels::attention_forward / attention_backward, kernels.hpp):
//   q, out, dout, dq  [s, b, hq, d]      k, v, dk, dv  [s, b, hkv, d]      lse  [b, hq, s] fp32
// Query head h reads kv head h / (hq / hkv) (grouped-query attention; hq % hkv == 0). lse is the
// natural log-sum-exp of each query row's scaled scores softmax_scale * q.k, saved by the forward
// for the backward. `mask` (parallel/attention_mask.hpp, doc_start in device memory) says which
// keys each query row sees: one contiguous range per row (attention_tiles.hpp); key tiles outside a
// query tile's ranges are skipped, and so are query tiles that see none of a key tile in the dK/dV
// pass. A row that sees no key gets out = 0 and lse = -inf.
// out, dq, dk, dv are written (not accumulated) in the input's 16-bit type, from fp32
// accumulators; dk, dv sum over the query heads that share them.
//
// Requirements (checked; a violation throws parallel::Error): d = 64 or 128; hq % hkv == 0;
// b * hq and b * hkv at most 65535; every tensor pointer 16-byte aligned (cudaMalloc'd and
// contiguous tensors are). Any s >= 0 (partial tiles are masked).
//
// Pointers are device memory of the current device; work is ordered on `stream` (a cudaStream_t;
// nullptr is the default stream). The backward needs b * hq * s floats of scratch (D = rowsum(dO * O));
// it takes them from the library's caching device allocator, ordered on `stream`, and returns them
// before returning. No atomics: the gradients are bit-identical from run to run.
#include "../cuda/kernels.hpp"  // AttentionShape
#include "parallel/dtype.hpp"

namespace parallel::kernels {

void flash_attention_forward_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse,
                                  const AttentionShape& shape, const AttentionBounds& mask,
                                  float softmax_scale, void* stream);
void flash_attention_forward_f16(const f16* q, const f16* k, const f16* v, f16* out, float* lse,
                                 const AttentionShape& shape, const AttentionBounds& mask,
                                 float softmax_scale, void* stream);

// out and lse are the forward's outputs for the same q, k, v, mask and softmax_scale.
void flash_attention_backward_bf16(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                                   const bf16* out, const float* lse, bf16* dq, bf16* dk, bf16* dv,
                                   const AttentionShape& shape, const AttentionBounds& mask,
                                   float softmax_scale, void* stream);
void flash_attention_backward_f16(const f16* dout, const f16* q, const f16* k, const f16* v, const f16* out,
                                  const float* lse, f16* dq, f16* dk, f16* dv, const AttentionShape& shape,
                                  const AttentionBounds& mask, float softmax_scale, void* stream);

}  // namespace parallel::kernels
