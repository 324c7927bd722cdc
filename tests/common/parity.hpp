#pragma once
// Comparing one rank's slice of a parameter with the one-rank reference model's whole parameter:
// the check every layout-parity test makes (tensor, pipeline, sequence parallel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "compare.hpp"
#include "parallel/parameter.hpp"

namespace parallel::testing {

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.to_float_vector()) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

inline bool is_vocab_param(const std::string& name) {
  return name == "embedding.word.weight" || name == "output.weight";
}

// Checks this rank's gradient slice of `p` against the reference gradient of the same parameter.
// Vocabulary weights are padded to different heights at different tp: only the `vocab` real rows
// are compared, and padded rows must have exactly zero gradient. `key_bias_is_inert`: without rope,
// adding a bias to every key shifts each score row by a constant, which softmax ignores, so the exact
// gradient is 0 and both sides hold rounding noise only (|g| ~ 1e-9): compared absolutely.
inline void expect_grad_matches(const Parameter& p, const Parameter& ref, int64_t vocab,
                                bool key_bias_is_inert, const std::string& what, double tol) {
  Tensor mine = p.grad, expected;
  if (is_vocab_param(p.name)) {
    ASSERT_EQ(p.partition_dim, 0) << what;
    const int64_t start = p.partition_offset, rows = p.value.size(0);
    const int64_t real = std::clamp<int64_t>(vocab - start, 0, rows);
    for (float x : p.grad.narrow(0, real, rows - real).contiguous().to_float_vector())
      ASSERT_EQ(x, 0.0f) << what << ": padded row has a gradient";
    if (real == 0) return;
    mine = p.grad.narrow(0, 0, real);
    expected = ref.grad.narrow(0, start, real);
  } else {
    ASSERT_EQ(p.global_shape, ref.global_shape) << what;
    expected = p.partition_dim < 0
                   ? ref.grad
                   : ref.grad.narrow(p.partition_dim, p.partition_offset, p.value.size(p.partition_dim));
  }
  ASSERT_EQ(mine.shape(), expected.shape()) << what;
  if (key_bias_is_inert) {
    EXPECT_LE(max_abs(mine), 1e-6) << what;
    EXPECT_LE(max_abs(expected), 1e-6) << what;
    return;
  }
  EXPECT_LE(rel_err(mine, expected), tol) << what;
  // Every gradient must carry signal, or the comparison proves nothing.
  EXPECT_GT(max_abs(expected), 0.0) << what << ": zero reference gradient";
}

}  // namespace parallel::testing
