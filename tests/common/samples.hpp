#pragma once
// Deterministic training samples for the multi-rank tests: every rank and the one-rank reference
// compute the same tokens from (step, sample index) alone.
#include <utility>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/tensor.hpp"

namespace parallel::testing {

// Sample `i` of step `step`: tokens and next-token targets [1, s].
inline std::pair<Tensor, Tensor> sample(const ModelConfig& c, int step, int i) {
  std::vector<int32_t> ids(static_cast<std::size_t>(c.seq_length + 1));
  for (std::size_t j = 0; j < ids.size(); ++j)
    ids[j] = static_cast<int32_t>((j * 97 + static_cast<std::size_t>(i) * 131 +
                                   static_cast<std::size_t>(step) * 71 + (j * j * 13) % 29 + 7) %
                                  static_cast<std::size_t>(c.vocab_size));
  std::vector<int32_t> in(ids.begin(), ids.end() - 1), out(ids.begin() + 1, ids.end());
  return {Tensor::from_vector(in, {1, c.seq_length}), Tensor::from_vector(out, {1, c.seq_length})};
}

}  // namespace parallel::testing
