// Ulysses context-parallel attention (parallel.context_comm: a2a): one all-to-all turns this rank's
// two chunks of every head into the whole sequence of 1/c of the heads, ordinary causal attention
// runs on that, and one all-to-all turns the output back (context_parallel.hpp).
#include "parallel/context_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/ops.hpp"

namespace parallel::cp {
namespace {

// [2L, b, H, d] (this rank's rows, all heads) -> [S, b, H/c, d] (whole sequence in global order,
// head group `rank`); each rank's rows go to their positions, run by run (layout).
Tensor seq_to_heads(Communicator& cp, const Layout& layout, const Tensor& x) {
  const int c = cp.size();
  const int64_t local = x.size(0), b = x.size(1), H = x.size(2), d = x.size(3);
  PARALLEL_CHECK(H % c == 0, "context parallel a2a: {} heads do not divide by cp = {}", H, c);
  const int64_t Hc = H / c;
  Tensor send = Tensor::empty({c, local, b, Hc, d}, x.dtype(), x.device());
  for (int j = 0; j < c; ++j) {
    Tensor block = send.select(j);
    block.copy_(x.narrow(2, j * Hc, Hc));
  }
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device());
  cp.all_to_all(send, recv);
  Tensor out = Tensor::empty({c * local, b, Hc, d}, x.dtype(), x.device());
  for (int r = 0; r < c; ++r) {
    const Tensor block = recv.select(r);
    for (const Segment& run : layout.runs(r)) {
      Tensor to = out.narrow(0, run.position, run.rows);
      to.copy_(block.narrow(0, run.row, run.rows));
    }
  }
  return out;
}

// The inverse: [S, b, H/c, d] -> [2L, b, H, d].
Tensor heads_to_seq(Communicator& cp, const Layout& layout, const Tensor& y) {
  const int c = cp.size();
  const int64_t local = y.size(0) / c, b = y.size(1), Hc = y.size(2), d = y.size(3);
  Tensor send = Tensor::empty({c, local, b, Hc, d}, y.dtype(), y.device());
  for (int r = 0; r < c; ++r) {
    Tensor block = send.select(r);
    for (const Segment& run : layout.runs(r)) {
      Tensor to = block.narrow(0, run.row, run.rows);
      to.copy_(y.narrow(0, run.position, run.rows));
    }
  }
  Tensor recv = Tensor::empty(send.shape(), y.dtype(), y.device());
  cp.all_to_all(send, recv);
  Tensor out = Tensor::empty({local, b, c * Hc, d}, y.dtype(), y.device());
  for (int j = 0; j < c; ++j) {
    Tensor heads = out.narrow(2, j * Hc, Hc);
    heads.copy_(recv.select(j));
  }
  return out;
}

}  // namespace

Tensor Attention::ulysses_forward(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved) const {
  saved.q = seq_to_heads(*cp_, *saved.layout, q);
  saved.k = seq_to_heads(*cp_, *saved.layout, k);
  saved.v = seq_to_heads(*cp_, *saved.layout, v);
  const int64_t s = saved.q.size(0), b = saved.q.size(1), h = saved.q.size(2);
  saved.out = Tensor::empty({s, b, h, saved.v.size(3)}, q.dtype(), q.device());  // value head size
  saved.lse = Tensor::empty({b, h, s}, DType::F32, q.device());
  ops::attention_forward(saved.q, saved.k, saved.v, saved.out, saved.lse, saved.mask, scale_);
  return heads_to_seq(*cp_, *saved.layout, saved.out);
}

void Attention::ulysses_backward(const Tensor& dout, Saved& saved, Tensor& dq, Tensor& dk, Tensor& dv) const {
  const Tensor dout_h = seq_to_heads(*cp_, *saved.layout, dout);
  Tensor dq_h = Tensor::empty(saved.q.shape(), dout.dtype(), dout.device());
  Tensor dk_h = Tensor::empty(saved.k.shape(), dout.dtype(), dout.device());
  Tensor dv_h = Tensor::empty(saved.v.shape(), dout.dtype(), dout.device());
  ops::attention_backward(dout_h, saved.q, saved.k, saved.v, saved.out, saved.lse, dq_h, dk_h, dv_h,
                          saved.mask, scale_);
  dq.copy_(heads_to_seq(*cp_, *saved.layout, dq_h));
  dk.copy_(heads_to_seq(*cp_, *saved.layout, dk_h));
  dv.copy_(heads_to_seq(*cp_, *saved.layout, dv_h));
}

}  // namespace parallel::cp
