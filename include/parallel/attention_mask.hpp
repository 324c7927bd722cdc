#pragma once
// Which keys a query sees: the one mask contract shared by every attention kernel (CPU and CUDA,
// ours and the plain path), by context parallelism's blocks and by the meta device's FLOP count.
//
// Positions are absolute token positions in a (packed) sequence of S tokens. Query row i of a
// kernel call sits at position q_pos0 + i and key row j at k_pos0 + j (context parallelism hands
// a kernel blocks of the sequence). A query at position p of batch element b sees the key at
// position t iff
//   causal:     t <= p
//   window > 0: t >  p - window          (Mistral's sliding_window: the query and window - 1 keys)
//   documents:  t >= doc_start[b, p]     (the first position of p's document: Megatron's
//                                         reset_attention_mask; FlashAttention's cu_seqlens as
//                                         one start per position)
// Documents and windows need causal (a GPT's mask). So each query row's visible keys are one
// contiguous range [lo(b, p), p]: a kernel skips every tile outside it, which makes a packed
// sequence cost the sum of its documents' squared lengths and a window cost linear in S.
//
// Plain C++ without fmt, so that .cu files include it; doc_start points at int32 memory on the
// device the kernel runs on ([b, S] row-major with row stride doc_stride), or is null.
#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define PARALLEL_MASK_HD __host__ __device__
#else
#define PARALLEL_MASK_HD
#endif

namespace parallel {

struct AttentionBounds {
  bool causal = true;
  int64_t window = 0;  // 0: no window
  int64_t q_pos0 = 0;  // position of query row 0
  int64_t k_pos0 = 0;  // position of key row 0
  const int32_t* doc_start = nullptr;
  int64_t doc_stride = 0;

  // First key position query position p (of batch element b) may see.
  PARALLEL_MASK_HD int64_t lo(int64_t b, int64_t p) const {
    int64_t l = 0;
    if (window > 0) l = p - window + 1 > l ? p - window + 1 : l;
    if (doc_start != nullptr) {
      const int64_t d = doc_start[b * doc_stride + p];
      l = d > l ? d : l;
    }
    return l;
  }
  // True when nothing beyond plain causal (or no) masking applies.
  PARALLEL_MASK_HD bool plain() const { return window == 0 && doc_start == nullptr; }
};

}  // namespace parallel

#undef PARALLEL_MASK_HD
