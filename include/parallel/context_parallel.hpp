#pragma once
// Context parallelism (parallel.context = c; docs/parallelism.md): each sample's sequence of s
// tokens is cut into 2c chunks of L = s / (2c) tokens, and cp rank i holds chunks i and 2c-1-i, in
// that order (Megatron-Core / Transformer Engine's load balancing: under a causal mask chunk k
// attends to k + 1 chunks, so every rank does the same work); with documents or windows, the
// balanced Layout below instead (parallel.context_layout). Every layer but attention works on a
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

// Which positions of a sequence of S tokens each cp rank holds, for every sample of a micro-batch
// (parallel.context_layout; docs/parallelism.md). The sequence is cut into N = 2 c m granules of
// G = S / N tokens; rank r holds 2m of them, its local rows being their tokens in increasing
// position order (so a rank's rows are causal among themselves). The zigzag above is m = 1 with
// rank r holding granules r and 2c-1-r. Every attention call is a square of whole granules (the
// kernels take as many keys as queries), and adjacent granules of a rank at consecutive positions
// form one run.
class Layout {
 public:
  // granules[r]: the granules of rank r (each of 0 .. N-1 exactly once, 2m per rank; sorted here).
  Layout(int64_t seq, int cp_size, int64_t granule, std::vector<std::vector<int64_t>> granules);
  static Layout zigzag(int64_t seq, int cp_size);

  int cp_size() const { return static_cast<int>(granules_.size()); }
  int64_t seq() const { return seq_; }
  int64_t granule() const { return granule_; }
  int64_t local_length() const { return seq_ / cp_size(); }
  bool is_zigzag() const { return zigzag_; }
  const std::vector<int64_t>& granules(int rank) const { return granules_[static_cast<std::size_t>(rank)]; }
  // Rank `rank`'s rows as maximal runs at consecutive positions (row counted from its row 0).
  const std::vector<Segment>& runs(int rank) const { return runs_[static_cast<std::size_t>(rank)]; }
  // segments() above for this layout: rows [row0, row0 + rows) of rank `rank`, rows counted from row0.
  std::vector<Segment> segments(int rank, int64_t row0, int64_t rows) const;
  // [b, S] -> [b, S / c]: rank `rank`'s rows of every sample (slice_sequence for a zigzag layout).
  Tensor slice(const Tensor& samples, int rank) const;

 private:
  int64_t seq_, granule_;
  bool zigzag_;
  std::vector<std::vector<int64_t>> granules_;
  std::vector<std::vector<Segment>> runs_;
};

// What a position's work counts: `layers` attention layers with sliding window `window` (0: full
// causal). A model's mix is one entry per distinct window (ModelConfig::layer_window).
struct LayerMix {
  int64_t window = 0;
  double layers = 1;
};
std::vector<LayerMix> layer_mix(const ModelConfig& model);

// The visible (query, key) pairs of each rank's queries (attention_mask.hpp's rule), summed over
// the samples of doc_start and the mix's layers: the attention work of every exchange but a2a,
// which splits heads and so is balanced whatever the layout. doc_start: int32 [b, S] on the host,
// or undefined (one document per sample).
std::vector<double> rank_load(const Layout& layout, const Tensor& doc_start,
                              const std::vector<LayerMix>& mix);

// The balanced layout (parallel.context_layout: balanced). doc_start: int32 [b, S] on the host or
// undefined; mix: the model's layers (layer_mix). The sequence is cut into 2c m granules, m = 2..16
// with granules of at least min_granule tokens (the CPU kernels' tiles are 64), trying the fewest
// granules first; each try assigns them by their work (rank_load's count of their queries) in
// snake order of decreasing work, then swaps between the most and the least loaded rank. Equal
// work steps along a document make the snake a zigzag per group of 2c granules, so a long document
// is balanced as a whole causal sequence is; short ones fill in. It stops at the first m whose
// largest load is within 2 % of the mean. The zigzag is returned for plain causal attention (no
// documents, no window: the zigzag balances it), when it is itself within 5 % of the mean (its few
// large calls against many small ones), or when no m beats it by more than 2 %.
Layout balanced_layout(const Tensor& doc_start, int64_t seq, int cp_size, const std::vector<LayerMix>& mix,
                       int64_t min_granule = 32);

// Whether a run's micro-batches get balanced_layout (parallel.context_layout): balanced, or auto
// with p2p or allgather and documents (data.reset_attention_mask) or a sliding window; never at cp 1.
bool uses_balanced_layout(const ParallelConfig& parallel, const ModelConfig& model, bool documents);

// One attention call of a block: query rows [q0, q0 + n) of rank i's local sequence against K/V
// rows [k0, k0 + n) of rank j's, the queries at global positions from q_pos, the keys from k_pos
// (a plain zigzag block uses local row order: q_pos = k_pos = 0, causal only on the diagonal).
struct BlockCall {
  int64_t q0 = 0, k0 = 0, n = 0, q_pos = 0, k_pos = 0;
  bool causal = true;
};
// The calls of rank i's queries against rank j's K/V under causal attention with `window` (0:
// none) and documents (doc_start: int32 [b, S] on the host, or undefined), leaving out every
// square in which no query sees a key (an empty list: the ring skips the block's computation).
// The plain zigzag (no window, no documents) keeps the chunk rule above; every other case cuts the
// block into squares of whole granules of the two ranks' runs at their global positions.
std::vector<BlockCall> block_calls(const Layout& layout, int i, int j, int64_t window,
                                   const Tensor& doc_start);

// Beyond plain causal (ops::AttentionMask with a window or documents; its positions are ignored:
// each call gets its block's), and on any layout but the zigzag, p2p and allgather cut every block
// into block_calls' squares at their global positions and skip those where no query sees a key
// (under documents or a window most of them on a long sequence); doc_start covers the whole
// sequence [b, s] (not sliced), and is read on the host to decide which squares to skip. a2a moves
// each rank's runs to their positions and runs the mask over the whole sequence as it is.
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
    std::shared_ptr<const Layout> layout;  // which positions each cp rank holds
    bool defined() const { return out.defined() && out.numel() > 0; }
  };
  // q [2L, b, hq, d], k [2L, b, hkv, d], v [2L, b, hkv, dv] (contiguous, positions already
  // applied): this rank's chunks; the value head size dv may differ from d (MLA), and every
  // exchange carries K and V at their own sizes. Returns out [2L, b, hq, dv] in q's dtype. mask:
  // causal (required), plus an optional window and documents over the whole sequence (see above).
  // layout: which positions each rank's rows are (null: the zigzag); the same on every cp rank.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved,
                 const ops::AttentionMask& mask = {}, std::shared_ptr<const Layout> layout = nullptr) const;
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
