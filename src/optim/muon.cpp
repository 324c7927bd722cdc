// Muon's update of the 2-D hidden weights (optimizer.type muon; docs/optimizer.md#muon): the
// recipe of torch.optim.Muon (Keller Jordan's Muon), with the Newton-Schulz iteration in fp32.
//
// Per matrix W [A, B] (the whole parameter across tp), with g its clipped gradient, mu the momentum:
//   buf = mu buf + (1 - mu) g              (torch's buf.lerp_(g, 1 - mu))
//   u   = (1 - mu) g + mu buf  (Nesterov;  torch's g.lerp(buf, mu)), else u = buf
//   O   = NS5(u)                           (quintic Newton-Schulz on the whole matrix)
//   W  *= 1 - lr wd;  W -= lr scale(A, B) O
// The momentum is element-wise, so it stays sharded like AdamW's moments; only u is assembled:
// the dp ranks holding pieces of a tp slice sum their zero-padded pieces (an all-reduce over the
// sharding group: exact, as every element comes from one rank and the rest add zeros), the tp ranks
// all-gather the slices, and each rank orthogonalises the whole matrix (the same float operations
// on every rank, so the copies agree) and applies its own piece. One matrix at a time: the
// transient memory is one matrix, not the model.
#include <cmath>
#include <utility>

#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"

namespace parallel {
namespace {

// Keller Jordan's quintic coefficients (torch.optim.Muon's defaults) and its eps.
constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;
constexpr float kNsEps = 1e-7f;

// O = NS_steps(G), G [A, B] fp32: X = G / max(||G||_F, eps); then `steps` times
//   Gram = X X^T; M = b Gram + c Gram Gram; X = a X + M X
// on the wide orientation (torch transposes a tall G first; X^T X and X M are the same products
// of the transpose, so no transpose is materialised).
Tensor newton_schulz(const Tensor& g, int steps) {
  const int64_t rows = g.size(0), cols = g.size(1);
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows;
  Tensor x = g.clone();
  ops::normalize_(x, kNsEps);
  Tensor y = Tensor::empty({rows, cols}, DType::F32, g.device());
  Tensor gram = Tensor::empty({m, m}, DType::F32, g.device());
  Tensor poly = Tensor::empty({m, m}, DType::F32, g.device());
  for (int k = 0; k < steps; ++k) {
    if (tall)
      ops::gemm(x, true, x, false, gram);  // X^T X
    else
      ops::gemm(x, false, x, true, gram);  // X X^T
    poly.copy_(gram);
    ops::gemm(gram, false, gram, false, poly, kNsC, kNsB);  // b Gram + c Gram Gram
    y.copy_(x);
    if (tall)
      ops::gemm(x, false, poly, false, y, 1.0f, kNsA);  // a X + X M
    else
      ops::gemm(poly, false, x, false, y, 1.0f, kNsA);  // a X + M X
    std::swap(x, y);
  }
  return x;
}

double muon_scale(MuonScale rule, int64_t a, int64_t b) {
  const double A = static_cast<double>(a), B = static_cast<double>(b);
  if (rule == MuonScale::Original) return std::sqrt(std::max(1.0, A / B));
  return 0.2 * std::sqrt(std::max(A, B));  // Moonlight: the update's RMS matches AdamW's
}

}  // namespace

void Optimizer::muon_update(double lr, float grad_scale) {
  const float mu = static_cast<float>(config_.muon_momentum);
  for (const MuonMatrix& m : muon_) {
    Parameter& p = *m.param;
    const Device device = m.device;
    // This tp rank's slice of u, flat, assembled from the dp shards' pieces.
    Tensor u =
        m.slot >= 0 && m.shard == nullptr ? Tensor() : Tensor::zeros({m.local_numel}, DType::F32, device);
    if (m.slot >= 0) {
      Slot& s = slots_[static_cast<std::size_t>(m.slot)];
      const int64_t n = s.grad.numel();
      if (!u.defined()) u = Tensor::empty({n}, DType::F32, device);
      Tensor g = Tensor::empty({n}, DType::F32, device);
      g.copy_(s.grad);
      ops::scale_(g, grad_scale * (1.0f - mu));  // (1 - mu) g, g clipped
      ops::scale_(s.momentum, mu);
      ops::add_(s.momentum, g);  // buf = mu buf + (1 - mu) g
      Tensor mine = u.narrow(0, s.param_offset, n);
      mine.copy_(s.momentum);
      if (config_.muon_nesterov) {
        ops::scale_(mine, mu);
        ops::add_(mine, g);  // u = (1 - mu) g + mu buf
      }
    }
    // Every rank of the sharding group now holds the whole slice: all of them take part in the tp
    // gather below, so the tp collectives match whichever ranks hold pieces.
    if (m.shard != nullptr) m.shard->all_reduce(u, ReduceOp::Sum);

    // The whole matrix [A, B] from the tp slices (rows, or columns, of equal size in rank order).
    const int64_t rows = p.global_shape[0], cols = p.global_shape[1];
    Tensor whole;
    if (m.tp == nullptr) {
      whole = u.view({rows, cols});
    } else {
      const int t = m.tp->size();
      Tensor gathered = Tensor::empty({m.local_numel * t}, DType::F32, device);
      m.tp->all_gather(u, gathered);
      if (p.partition_dim == 0) {
        whole = gathered.view({rows, cols});
      } else {
        const int64_t c = cols / t;
        whole = Tensor::empty({rows, cols}, DType::F32, device);
        for (int r = 0; r < t; ++r)
          whole.narrow(1, r * c, c)
              .copy_(gathered.narrow(0, r * m.local_numel, m.local_numel).view({rows, c}));
      }
    }
    if (m.slot < 0) continue;  // this rank holds no piece to update
    Tensor o = newton_schulz(whole, config_.muon_ns_steps);

    // This rank's slice, then its piece of it.
    Tensor slice = o;
    if (m.tp != nullptr) {
      const int64_t extent = (p.partition_dim == 0 ? rows : cols) / m.tp->size();
      PARALLEL_CHECK(p.partition_offset == extent * m.tp->rank(),
                     "Muon: {} starts at {} along dimension {}, not at tp rank {} times {}", p.name,
                     p.partition_offset, p.partition_dim, m.tp->rank(), extent);
      slice = o.narrow(p.partition_dim, p.partition_offset, extent).contiguous();
    }
    Slot& s = slots_[static_cast<std::size_t>(m.slot)];
    Tensor update = slice.flatten().narrow(0, s.param_offset, s.grad.numel());
    ops::scale_(s.main, 1.0f - static_cast<float>(lr * s.weight_decay));
    ops::scale_(update, static_cast<float>(-lr * muon_scale(config_.muon_scale, rows, cols)));
    ops::add_(s.main, update);
    if (s.target.defined()) s.target.copy_(s.main);  // the model's 16-bit copy
  }
}

}  // namespace parallel
