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

Call plain_call(int64_t q0, int64_t k0, int64_t n, bool causal) {
  return {q0, k0, n, ops::AttentionMask::plain(causal)};
}

// True when some query at positions [qp, qp + n) sees some key at [kp, kp + n) (attention_mask.hpp),
// doc_start (host, [b, S] contiguous) or null.
bool any_visible(const ops::AttentionMask& m, const int32_t* doc_start, int64_t b, int64_t S, int64_t qp,
                 int64_t kp, int64_t n) {
  if (kp > qp + n - 1) return false;  // causal: every key after every query
  AttentionBounds bounds;
  bounds.window = m.window;
  bounds.doc_start = doc_start;
  bounds.doc_stride = S;
  for (int64_t e = 0; e < b; ++e)
    for (int64_t p = std::max(qp, kp); p < qp + n; ++p)
      if (bounds.lo(e, p) <= kp + n - 1) return true;
  return false;
}

// Rank i's queries against the K/V of rank j (context_parallel.hpp's block rule). Under a window
// or documents: the four chunk pairs at their global positions, those with no visible pair left out.
std::vector<Call> block_calls(int i, int j, int c, int64_t L, const ops::AttentionMask& mask,
                              const Tensor& doc_start_host) {
  if (mask.window == 0 && !mask.has_documents()) {
    if (j == i) return {plain_call(0, 0, 2 * L, true)};
    if (j < i) return {plain_call(0, 0, L, false), plain_call(L, 0, L, false)};
    return {plain_call(L, 0, L, false), plain_call(L, L, L, false)};
  }
  const int32_t* ds = doc_start_host.defined() ? doc_start_host.data<int32_t>() : nullptr;
  const int64_t b = ds != nullptr ? doc_start_host.size(0) : 0,
                S = ds != nullptr ? doc_start_host.size(1) : 0;
  const int64_t q_pos[2] = {i * L, (2 * c - 1 - i) * L}, k_pos[2] = {j * L, (2 * c - 1 - j) * L};
  std::vector<Call> calls;
  for (int a = 0; a < 2; ++a)
    for (int e = 0; e < 2; ++e) {
      if (!any_visible(mask, ds, std::max<int64_t>(b, 1), S, q_pos[a], k_pos[e], L)) continue;
      Call call{a * L, e * L, L, mask};
      call.mask.causal = true;
      call.mask.q_pos0 = q_pos[a];
      call.mask.k_pos0 = k_pos[e];
      calls.push_back(call);
    }
  return calls;
}

// K and V of one rank in one buffer [2, 2L, b, hkv, d]: one message per ring step.
Tensor pack_kv(const Tensor& k, const Tensor& v) {
  Shape shape{2};
  for (int64_t s : k.shape()) shape.push_back(s);
  Tensor kv = Tensor::empty(shape, k.dtype(), k.device());
  Tensor k_part = kv.select(0), v_part = kv.select(1);
  k_part.copy_(k);
  v_part.copy_(v);
  return kv;
}

// acc (fp32, contiguous) += x, on x's device.
void add_into(Tensor acc, const Tensor& x) { ops::add_(acc, x.to(DType::F32)); }

// Forward of every call of one block, merged into the accumulators. `poll` (may be null) is given
// a chance to progress between calls: MPI moves a transfer only inside its own calls.
void block_forward(const Tensor& q, const Tensor& kv, const std::vector<Call>& calls, float scale,
                   Tensor& out_acc, Tensor& lse_acc, const WorkHandle& poll) {
  const Tensor k = kv.select(0), v = kv.select(1);
  const int64_t b = q.size(1), hq = q.size(2), d = q.size(3);
  for (const Call& c : calls) {
    Tensor o = Tensor::empty({c.n, b, hq, d}, q.dtype(), q.device());
    Tensor l = Tensor::empty({b, hq, c.n}, DType::F32, q.device());
    ops::attention_forward(q.narrow(0, c.q0, c.n), k.narrow(0, c.k0, c.n), v.narrow(0, c.k0, c.n), o, l,
                           c.mask, scale);
    ops::attention_merge(out_acc, lse_acc, o, l, c.q0);
    if (poll) poll->is_completed();
  }
}

// Backward of every call of one block: dq_acc [2L, b, hq, d] and dkv [2, 2L, b, hkv, d] (both
// fp32) accumulate; out and lse are the merged forward results.
void block_backward(const Tensor& dout, const Tensor& q, const Tensor& out, const Tensor& lse,
                    const Tensor& kv, const std::vector<Call>& calls, float scale, Tensor& dq_acc,
                    Tensor& dkv, const WorkHandle& poll) {
  const Tensor k = kv.select(0), v = kv.select(1);
  for (const Call& c : calls) {
    const Tensor qc = q.narrow(0, c.q0, c.n), kc = k.narrow(0, c.k0, c.n);
    Tensor dq = Tensor::empty(qc.shape(), q.dtype(), q.device());
    Tensor dk = Tensor::empty(kc.shape(), k.dtype(), k.device());
    Tensor dv = Tensor::empty(kc.shape(), k.dtype(), k.device());
    ops::attention_backward(dout.narrow(0, c.q0, c.n), qc, kc, v.narrow(0, c.k0, c.n),
                            out.narrow(0, c.q0, c.n), lse.narrow(2, c.q0, c.n).contiguous(), dq, dk, dv,
                            c.mask, scale);
    add_into(dq_acc.narrow(0, c.q0, c.n), dq);
    add_into(dkv.select(0).narrow(0, c.k0, c.n), dk);
    add_into(dkv.select(1).narrow(0, c.k0, c.n), dv);
    if (poll) poll->is_completed();
  }
}

}  // namespace

Attention::Attention(Communicator* cp, ContextComm comm, float softmax_scale)
    : cp_(cp != nullptr && cp->size() > 1 ? cp : nullptr), comm_(comm), scale_(softmax_scale) {}

Tensor Attention::forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved,
                          const ops::AttentionMask& mask) const {
  PARALLEL_CHECK(mask.causal, "context-parallel attention: the mask must be causal");
  saved.mask = mask;
  saved.mask.q_pos0 = saved.mask.k_pos0 = 0;
  if (cp_ == nullptr) {
    const int64_t s = q.size(0), b = q.size(1), hq = q.size(2);
    saved.q = q;
    saved.k = k;
    saved.v = v;
    saved.out = Tensor::empty(q.shape(), q.dtype(), q.device());
    saved.lse = Tensor::empty({b, hq, s}, DType::F32, q.device());
    ops::attention_forward(q, k, v, saved.out, saved.lse, saved.mask, scale_);
    return saved.out;
  }
  if (mask.has_documents() && comm_ != ContextComm::A2A && !q.device().is_meta())
    saved.doc_start_host = mask.doc_start.device().is_cpu() ? mask.doc_start.contiguous()
                                                            : mask.doc_start.to(Device::cpu()).contiguous();
  PARALLEL_CHECK(q.size(0) % 2 == 0, "context-parallel attention: {} rows are not two chunks", q.size(0));
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
  const int64_t L = q.size(0) / 2, b = q.size(1), hq = q.size(2);
  Tensor out_acc = Tensor::zeros(q.shape(), DType::F32, q.device());
  Tensor lse_acc =
      Tensor::full({b, hq, 2 * L}, -std::numeric_limits<double>::infinity(), DType::F32, q.device());
  Tensor kv = pack_kv(k, v);
  if (comm_ == ContextComm::AllGather) {
    Shape shape{c};
    for (int64_t s : kv.shape()) shape.push_back(s);
    Tensor all = Tensor::empty(shape, kv.dtype(), kv.device());
    cp_->all_gather(kv, all);
    for (int j = 0; j < c; ++j)
      block_forward(q, all.select(j), block_calls(i, j, c, L, saved.mask, saved.doc_start_host), scale_,
                    out_acc, lse_acc, {});
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
      block_forward(q, kv, block_calls(i, src, c, L, saved.mask, saved.doc_start_host), scale_, out_acc,
                    lse_acc, transfer);
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
  const int64_t L = q.size(0) / 2;
  Tensor dq_acc = Tensor::zeros(q.shape(), DType::F32, q.device());
  Tensor kv = pack_kv(saved.k, saved.v);
  Tensor own;  // this rank's dK/dV [2, 2L, b, hkv, d], fp32
  if (comm_ == ContextComm::AllGather) {
    Shape shape{c};
    for (int64_t s : kv.shape()) shape.push_back(s);
    Tensor all = Tensor::empty(shape, kv.dtype(), kv.device());
    cp_->all_gather(kv, all);  // again rather than kept from the forward: c times the K/V
    Tensor dkv_all = Tensor::zeros(shape, DType::F32, kv.device());
    for (int j = 0; j < c; ++j) {
      Tensor dkv_j = dkv_all.select(j);
      block_backward(dout, q, saved.out, saved.lse, all.select(j),
                     block_calls(i, j, c, L, saved.mask, saved.doc_start_host), scale_, dq_acc, dkv_j, {});
    }
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
      block_backward(dout, q, saved.out, saved.lse, kv,
                     block_calls(i, src, c, L, saved.mask, saved.doc_start_host), scale_, dq_acc, dkv,
                     transfer ? transfer : grads_transfer);
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
  dk.copy_(own.select(0));
  dv.copy_(own.select(1));
}

}  // namespace parallel::cp
