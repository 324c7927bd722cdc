// Context-parallel attention: the dispatch, and the block computation that ring attention (p2p) and
// the K/V all-gather share (context_parallel.hpp has the layout and the block rule).
#include <algorithm>
#include <limits>

#include "parallel/context_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/ops.hpp"

namespace parallel::cp {
namespace {

// One ops::attention call of a block: query rows [q0, q0 + n) against K/V rows [k0, k0 + n) of the
// block's K/V (equal lengths, as the kernels take them), under `mask`.
struct Call {
  int64_t q0, k0, n;
  ops::AttentionMask mask;
};

// Rank i's queries against the K/V of rank j (block_calls), each call with its mask: the plain
// zigzag's by local rows, every other at its global positions. On the meta device the document
// starts have no values: the blocks are those of one document per sequence (ops.hpp's FLOP count).
std::vector<Call> calls_of(const Layout& layout, int i, int j, const Attention::Saved& saved) {
  const ops::AttentionMask& mask = saved.mask;
  const bool plain = layout.is_zigzag() && mask.window == 0 && !saved.doc_start_host.defined();
  std::vector<Call> calls;
  for (const BlockCall& b : block_calls(layout, i, j, mask.window, saved.doc_start_host)) {
    Call call{b.q0, b.k0, b.n, plain ? ops::AttentionMask::plain(b.causal) : mask};
    if (!plain) {
      call.mask.causal = true;
      call.mask.q_pos0 = b.q_pos;
      call.mask.k_pos0 = b.k_pos;
    }
    calls.push_back(call);
  }
  return calls;
}

// K [2L, b, hkv, d] and V [2L, b, hkv, dv] of one rank in one flat buffer, K's elements then V's:
// one message per ring step. The head sizes may differ (MLA), so the buffer is not [2, ...] but
// numel(k) + numel(v) long; KV names the two parts (and the same layout of their gradients).
struct KV {
  Shape k_shape, v_shape;
  int64_t numel() const { return shape_numel(k_shape) + shape_numel(v_shape); }
  static int64_t shape_numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t e : s) n *= e;
    return n;
  }
  // buf: a contiguous 1-D buffer of numel() elements.
  Tensor k(const Tensor& buf) const { return buf.narrow(0, 0, shape_numel(k_shape)).view(k_shape); }
  Tensor v(const Tensor& buf) const {
    return buf.narrow(0, shape_numel(k_shape), shape_numel(v_shape)).view(v_shape);
  }
};

Tensor pack_kv(const KV& layout, const Tensor& k, const Tensor& v) {
  Tensor kv = Tensor::empty({layout.numel()}, k.dtype(), k.device());
  Tensor k_part = layout.k(kv), v_part = layout.v(kv);
  k_part.copy_(k);
  v_part.copy_(v);
  return kv;
}

// acc (fp32, contiguous) += x, on x's device.
void add_into(Tensor acc, const Tensor& x) { ops::add_(acc, x.to(DType::F32)); }

// Forward of every call of one block, merged into the accumulators. `poll` (may be null) is given
// a chance to progress between calls: MPI moves a transfer only inside its own calls.
void block_forward(const Tensor& q, const KV& layout, const Tensor& kv, const std::vector<Call>& calls,
                   float scale, Tensor& out_acc, Tensor& lse_acc, const WorkHandle& poll) {
  const Tensor k = layout.k(kv), v = layout.v(kv);
  const int64_t b = q.size(1), hq = q.size(2), dv = v.size(3);
  for (const Call& c : calls) {
    Tensor o = Tensor::empty({c.n, b, hq, dv}, q.dtype(), q.device());
    Tensor l = Tensor::empty({b, hq, c.n}, DType::F32, q.device());
    ops::attention_forward(q.narrow(0, c.q0, c.n), k.narrow(0, c.k0, c.n), v.narrow(0, c.k0, c.n), o, l,
                           c.mask, scale);
    ops::attention_merge(out_acc, lse_acc, o, l, c.q0);
    if (poll) poll->is_completed();
  }
}

// Backward of every call of one block: dq_acc [2L, b, hq, d] and dkv (fp32, kv's layout) accumulate;
// out and lse are the merged forward results.
void block_backward(const Tensor& dout, const Tensor& q, const Tensor& out, const Tensor& lse,
                    const KV& layout, const Tensor& kv, const std::vector<Call>& calls, float scale,
                    Tensor& dq_acc, const Tensor& dkv, const WorkHandle& poll) {
  const Tensor k = layout.k(kv), v = layout.v(kv);
  Tensor dk_acc = layout.k(dkv), dv_acc = layout.v(dkv);
  for (const Call& c : calls) {
    const Tensor qc = q.narrow(0, c.q0, c.n), kc = k.narrow(0, c.k0, c.n), vc = v.narrow(0, c.k0, c.n);
    Tensor dq = Tensor::empty(qc.shape(), q.dtype(), q.device());
    Tensor dk = Tensor::empty(kc.shape(), k.dtype(), k.device());
    Tensor dv = Tensor::empty(vc.shape(), v.dtype(), v.device());
    ops::attention_backward(dout.narrow(0, c.q0, c.n), qc, kc, vc, out.narrow(0, c.q0, c.n),
                            lse.narrow(2, c.q0, c.n).contiguous(), dq, dk, dv, c.mask, scale);
    add_into(dq_acc.narrow(0, c.q0, c.n), dq);
    add_into(dk_acc.narrow(0, c.k0, c.n), dk);
    add_into(dv_acc.narrow(0, c.k0, c.n), dv);
    if (poll) poll->is_completed();
  }
}

}  // namespace

Attention::Attention(Communicator* cp, ContextComm comm, float softmax_scale)
    : cp_(cp != nullptr && cp->size() > 1 ? cp : nullptr), comm_(comm), scale_(softmax_scale) {}

Tensor Attention::forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved,
                          const ops::AttentionMask& mask, std::shared_ptr<const Layout> layout) const {
  PARALLEL_CHECK(mask.causal, "context-parallel attention: the mask must be causal");
  saved.mask = mask;
  saved.mask.q_pos0 = saved.mask.k_pos0 = 0;
  if (cp_ == nullptr) {
    const int64_t s = q.size(0), b = q.size(1), hq = q.size(2);
    saved.q = q;
    saved.k = k;
    saved.v = v;
    saved.out = Tensor::empty({s, b, hq, v.size(3)}, q.dtype(), q.device());  // the value head size
    saved.lse = Tensor::empty({b, hq, s}, DType::F32, q.device());
    ops::attention_forward(q, k, v, saved.out, saved.lse, saved.mask, scale_);
    return saved.out;
  }
  if (mask.has_documents() && comm_ != ContextComm::A2A && !q.device().is_meta())
    saved.doc_start_host = mask.doc_start.device().is_cpu() ? mask.doc_start.contiguous()
                                                            : mask.doc_start.to(Device::cpu()).contiguous();
  const int c = cp_->size();
  saved.layout = layout != nullptr ? std::move(layout)
                                   : std::make_shared<const Layout>(Layout::zigzag(q.size(0) * c, c));
  PARALLEL_CHECK(saved.layout->cp_size() == c && saved.layout->local_length() == q.size(0),
                 "context-parallel attention: {} rows do not match a layout of {} tokens over cp = {}",
                 q.size(0), saved.layout->seq(), saved.layout->cp_size());
  if (comm_ == ContextComm::A2A) return ulysses_forward(q, k, v, saved);
  return ring_forward(q, k, v, saved);
}

void Attention::backward(const Tensor& dout, Saved& saved, Tensor& dq, Tensor& dk, Tensor& dv) const {
  if (cp_ == nullptr) {
    ops::attention_backward(dout, saved.q, saved.k, saved.v, saved.out, saved.lse, dq, dk, dv, saved.mask,
                            scale_);
  } else if (comm_ == ContextComm::A2A) {
    ulysses_backward(dout, saved, dq, dk, dv);
  } else {
    ring_backward(dout, saved, dq, dk, dv);
  }
  saved = Saved{};
}

// p2p and allgather: the same blocks, the K/V of rank j either arriving around the ring at step
// (i - j) mod c or gathered up front.
Tensor Attention::ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved) const {
  const int c = cp_->size(), i = cp_->rank();
  const int64_t b = q.size(1), hq = q.size(2);
  Tensor out_acc = Tensor::zeros({q.size(0), b, hq, v.size(3)}, DType::F32, q.device());
  Tensor lse_acc =
      Tensor::full({b, hq, q.size(0)}, -std::numeric_limits<double>::infinity(), DType::F32, q.device());
  const KV kv_layout{k.shape(), v.shape()};
  Tensor kv = pack_kv(kv_layout, k, v);
  if (comm_ == ContextComm::AllGather) {
    Tensor all = Tensor::empty({c, kv_layout.numel()}, kv.dtype(), kv.device());
    cp_->all_gather(kv, all);
    for (int j = 0; j < c; ++j)
      block_forward(q, kv_layout, all.select(j), calls_of(*saved.layout, i, j, saved), scale_, out_acc,
                    lse_acc, {});
  } else {
    const int next = (i + 1) % c, prev = (i + c - 1) % c;
    for (int t = 0; t < c; ++t) {
      const int src = (i - t + c) % c;
      WorkHandle transfer;
      Tensor incoming;
      if (t + 1 < c) {  // the next step's K/V travels while this step computes
        incoming = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
        const P2POp ops[] = {{P2POp::Kind::Send, kv, next, 0}, {P2POp::Kind::Recv, incoming, prev, 0}};
        transfer = cp_->batch_p2p(ops);
        if (!overlap_) transfer->wait();
      }
      block_forward(q, kv_layout, kv, calls_of(*saved.layout, i, src, saved), scale_, out_acc, lse_acc,
                    transfer);
      if (transfer) {
        transfer->wait();
        kv = incoming;
      }
    }
  }
  saved.q = q;
  saved.k = k;
  saved.v = v;
  saved.out = out_acc.dtype() == q.dtype() ? out_acc : out_acc.to(q.dtype());
  saved.lse = lse_acc;
  return saved.out;
}

void Attention::ring_backward(const Tensor& dout, Saved& saved, Tensor& dq, Tensor& dk, Tensor& dv) const {
  const int c = cp_->size(), i = cp_->rank();
  const Tensor& q = saved.q;
  Tensor dq_acc = Tensor::zeros(q.shape(), DType::F32, q.device());
  const KV kv_layout{saved.k.shape(), saved.v.shape()};
  Tensor kv = pack_kv(kv_layout, saved.k, saved.v);
  Tensor own;  // this rank's dK/dV in kv's layout, fp32
  if (comm_ == ContextComm::AllGather) {
    const Shape shape{c, kv_layout.numel()};
    Tensor all = Tensor::empty(shape, kv.dtype(), kv.device());
    cp_->all_gather(kv, all);  // again rather than kept from the forward: c times the K/V
    Tensor dkv_all = Tensor::zeros(shape, DType::F32, kv.device());
    for (int j = 0; j < c; ++j)
      block_backward(dout, q, saved.out, saved.lse, kv_layout, all.select(j),
                     calls_of(*saved.layout, i, j, saved), scale_, dq_acc, dkv_all.select(j), {});
    own = Tensor::empty(kv.shape(), DType::F32, kv.device());
    cp_->reduce_scatter(dkv_all, own);
  } else {
    // Step t holds the K/V of rank (i - t) mod c and the dK/dV that the ranks before it on the ring
    // accumulated for that block; after adding its own part it passes both on. After c steps each
    // block's dK/dV has visited every rank and arrives back at its owner.
    const int next = (i + 1) % c, prev = (i + c - 1) % c;
    WorkHandle grads_transfer;
    Tensor grads_sent, grads_in;
    for (int t = 0; t < c; ++t) {
      const int src = (i - t + c) % c;
      WorkHandle transfer;
      Tensor incoming;
      if (t + 1 < c) {
        incoming = Tensor::empty(kv.shape(), kv.dtype(), kv.device());
        const P2POp ops[] = {{P2POp::Kind::Send, kv, next, 0}, {P2POp::Kind::Recv, incoming, prev, 0}};
        transfer = cp_->batch_p2p(ops);
        if (!overlap_) transfer->wait();
      }
      Tensor dkv = Tensor::zeros(kv.shape(), DType::F32, kv.device());
      block_backward(dout, q, saved.out, saved.lse, kv_layout, kv, calls_of(*saved.layout, i, src, saved),
                     scale_, dq_acc, dkv, transfer ? transfer : grads_transfer);
      if (grads_transfer) {  // the previous ranks' part for this block
        grads_transfer->wait();
        add_into(dkv, grads_in);
      }
      grads_sent = dkv;
      grads_in = Tensor::empty(kv.shape(), DType::F32, kv.device());
      const P2POp ops[] = {{P2POp::Kind::Send, grads_sent, next, 1}, {P2POp::Kind::Recv, grads_in, prev, 1}};
      grads_transfer = cp_->batch_p2p(ops);
      if (!overlap_) grads_transfer->wait();
      if (transfer) {
        transfer->wait();
        kv = incoming;
      }
    }
    grads_transfer->wait();
    own = grads_in;
  }
  dq.copy_(dq_acc);
  dk.copy_(kv_layout.k(own));
  dv.copy_(kv_layout.v(own));
}

}  // namespace parallel::cp
