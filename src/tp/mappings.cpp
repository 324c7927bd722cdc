// The communication mappings between tensor-parallel regions. Each forward is one collective on a
// flattened contiguous tensor; the backward of each is its dual (see tensor_parallel.hpp).
#include "parallel/tensor_parallel.hpp"

namespace parallel::tp {
namespace {

Shape with_dim0(const Shape& s, int64_t n) {
  Shape out = s;
  out[0] = n;
  return out;
}

}  // namespace

// At tp = 1 every mapping is the identity; the result may then share storage with x.
Tensor all_reduce(Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  Tensor y = x.clone();
  tp.all_reduce(y, ReduceOp::Sum);
  return y;
}

Tensor gather_sequence(Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  PARALLEL_CHECK(x.dim() >= 1, "gather_sequence: {} has no sequence dimension", x.str());
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(with_dim0(x.shape(), x.size(0) * tp.size()), x.dtype(), x.device());
  tp.all_gather(in, out);
  return out;
}

Tensor reduce_scatter_sequence(Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  PARALLEL_CHECK(x.dim() >= 1 && x.size(0) % tp.size() == 0,
                 "reduce_scatter_sequence: sequence length of {} must be divisible by tp = {}", x.str(),
                 tp.size());
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(with_dim0(x.shape(), x.size(0) / tp.size()), x.dtype(), x.device());
  tp.reduce_scatter(in, out, ReduceOp::Sum);
  return out;
}

Tensor split_sequence(Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  PARALLEL_CHECK(x.dim() >= 1 && x.size(0) % tp.size() == 0,
                 "split_sequence: sequence length of {} must be divisible by tp = {}", x.str(), tp.size());
  const int64_t n = x.size(0) / tp.size();
  return x.narrow(0, tp.rank() * n, n).contiguous();
}

Tensor gather_last_dim(Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  const int64_t p = tp.size(), n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  Tensor in = x.contiguous();
  // all_gather concatenates whole ranks' tensors: [tp, rows, n]. The result wants each rank's
  // columns side by side, [rows, tp * n]: one strided copy per rank.
  Tensor stacked = Tensor::empty({p, rows, n}, x.dtype(), x.device());
  tp.all_gather(in, stacked);
  Shape shape = x.shape();
  shape.back() = n * p;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  Tensor out2d = out.view({rows, n * p});
  for (int64_t r = 0; r < p; ++r) {
    Tensor dst = out2d.narrow(1, r * n, n);
    dst.copy_(stacked.select(r));
  }
  return out;
}

Tensor split_last_dim(Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  const int64_t n = x.size(-1);
  PARALLEL_CHECK(n % tp.size() == 0, "split_last_dim: last dimension of {} must be divisible by tp = {}",
                 x.str(), tp.size());
  const int64_t local = n / tp.size();
  return x.narrow(x.dim() - 1, tp.rank() * local, local).contiguous();
}

void reduce_sequence_parallel_grads(const std::vector<Parameter*>& params, Communicator& tp) {
  if (tp.size() == 1) return;
  // Post every reduction before waiting on any, so they can proceed together.
  std::vector<WorkHandle> pending;
  for (Parameter* p : params)
    if (p->sequence_parallel_grad && !p->frozen && p->grad.numel() > 0)
      pending.push_back(tp.all_reduce(p->grad, ReduceOp::Sum, /*async=*/true));
  for (auto& w : pending) w->wait();
}

}  // namespace parallel::tp
