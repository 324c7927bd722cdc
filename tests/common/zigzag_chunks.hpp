#pragma once
// The context-parallel tests' slice of a whole-sequence reference tensor: rank r of c holds chunks
// r and 2c - 1 - r of the 2c equal chunks along the sequence (the zigzag layout of
// context_parallel.hpp), in that order.
#include "parallel/tensor.hpp"

namespace parallel::testing {

// `dim`: the sequence dimension (0 for [s, b, h, d], 2 for the log-sum-exp [b, h, s]).
inline Tensor zigzag_chunks(const Tensor& x, int dim, int rank, int c) {
  const int64_t L = x.size(dim) / (2 * c);
  Shape shape = x.shape();
  shape[dim] = 2 * L;
  Tensor out = Tensor::empty(shape, x.dtype());
  Tensor first = out.narrow(dim, 0, L), second = out.narrow(dim, L, L);
  first.copy_(x.narrow(dim, rank * L, L));
  second.copy_(x.narrow(dim, (2 * c - 1 - rank) * L, L));
  return out;
}

}  // namespace parallel::testing
