#pragma once
// Context parallelism (parallel.context = c; docs/parallelism.md): each sample's sequence of s
// tokens is cut into 2c chunks of L = s / (2c) tokens, and cp rank i holds chunks i and 2c-1-i, in
// that order (Megatron-Core / Transformer Engine's load balancing: under a causal mask chunk k
// attends to k + 1 chunks, so every rank does the same work). Every layer but attention works on a
// rank's 2L tokens alone; attention is exact over the whole sequence by one of three exchanges
// (parallel.context_comm):
//   p2p       ring attention: K/V blocks go around the cp ring with send/recv, each transfer posted
//             before the block computation it overlaps; partial outputs are merged with their
//             log-sum-exp; the backward passes dK/dV around the ring back to their owners.
//   allgather K/V gathered from every cp rank, the same block computation, dK/dV reduce-scattered.
//   a2a       Ulysses: all-to-all from sequence-sharded [2L, b, heads, d] to head-sharded
//             [s, b, heads / c, d], ordinary causal attention, and back (heads must divide by c).
//
// Block rule of p2p and allgather (rank i's queries against the K/V of rank j, chunks of L rows):
//   j == i: causal over the rank's own 2L rows (its chunk order is the global order);
//   j <  i: both query chunks attend fully to chunk j and not at all to chunk 2c-1-j;
//   j >  i: only the second query chunk (2c-1-i) attends, fully, to both of j's chunks.
// Every block is an L x L (or the diagonal 2L x 2L) call of ops::attention_forward, merged as
// out = sum_k exp(lse_k - lse) out_k, lse = log sum_k exp(lse_k); the backward calls
// ops::attention_backward per block with the merged out and lse, which is exactly the block's part
// of the whole softmax's gradient.
//
// Device-agnostic: every step is a device op (ops::attention_forward / _backward / _merge, ops::add_,
// Tensor::copy_ of narrowed views) or a collective, so CUDA tensors work as CPU ones do. The CUDA
// path is compiled and CPU-checked through the same op sequence but has not run on a GPU
// (docs/gpu.md).
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cp {

// L = seq / (2 * cp_size); throws unless it divides.
int64_t chunk_length(int64_t seq, int cp_size);

// Rows [row, row + rows) of a span of a rank's local sequence (counted from the span's first row)
// sit at global positions [position, position + rows).
struct Segment {
  int64_t row = 0, rows = 0, position = 0;
};
// The global positions of rows [row0, row0 + rows) of cp rank `rank`'s local sequence of
// `local_seq` = 2L rows, as one or two segments (split where the rank's two chunks meet), rows
// counted from row0. With cp_size 1 the local sequence is the sequence: one segment at position row0.
std::vector<Segment> segments(int64_t local_seq, int rank, int cp_size, int64_t row0, int64_t rows);

// [b, s] (tokens or targets) -> [b, s / cp_size]: chunks rank and 2 cp_size - 1 - rank of every
// sample, in that order. cp_size 1: the input itself.
Tensor slice_sequence(const Tensor& samples, int rank, int cp_size);

// Beyond plain causal (ops::AttentionMask with a window or documents; its positions are ignored:
// each call gets its block's), p2p and allgather cut every block into the L x L calls of the
// rank's chunk pairs at their global positions and skip the pairs where no query sees a key
// (under documents or a window most of them on a long sequence); doc_start covers the whole
// sequence [b, s] (not sliced), and is read on the host to decide which pairs to skip. a2a runs
// the mask over the whole sequence as it is.
//
// Exact causal self-attention over the whole sequence from this rank's two chunks. One object per
// attention layer; it keeps no per-micro-batch state (that is in Saved).
class Attention {
 public:
  // cp: the context-parallel group (null or size 1: plain ops::attention_forward, bit for bit).
  Attention(Communicator* cp, ContextComm comm, float softmax_scale);

  // What the backward needs. p2p / allgather: this rank's q, k, v, the merged out and lse;
  // a2a: the head-sharded whole-sequence q, k, v, out and lse. Empty after backward().
  struct Saved {
    Tensor q, k, v, out, lse;
    ops::AttentionMask mask;
    Tensor doc_start_host;  // p2p / allgather under documents: the mask's doc_start on the host
    bool defined() const { return out.defined() && out.numel() > 0; }
  };
  // q [2L, b, hq, d], k, v [2L, b, hkv, d] (contiguous, positions already applied): this rank's
  // chunks. Returns out [2L, b, hq, d] in q's dtype. mask: causal (required), plus an optional
  // window and documents over the whole sequence (see above).
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved,
                 const ops::AttentionMask& mask = {}) const;
  // dq, dk, dv: written, shaped as q, k, v. Frees `saved`.
  void backward(const Tensor& dout, Saved& saved, Tensor& dq, Tensor& dk, Tensor& dv) const;

  // p2p only, for benchmarks: false waits for each K/V (and dK/dV) transfer before the block
  // computation instead of overlapping them. Same numbers either way.
  void set_overlap(bool overlap) { overlap_ = overlap; }

 private:
  Tensor ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved) const;
  void ring_backward(const Tensor& dout, Saved& saved, Tensor& dq, Tensor& dk, Tensor& dv) const;
  Tensor ulysses_forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved) const;
  void ulysses_backward(const Tensor& dout, Saved& saved, Tensor& dq, Tensor& dk, Tensor& dv) const;

  Communicator* cp_;
  ContextComm comm_;
  float scale_;
  bool overlap_ = true;
};

}  // namespace parallel::cp
