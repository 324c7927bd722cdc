#pragma once
// The error measure of every parity test: max |actual - expected| / max(max |expected|, floor).
// Relative to the largest reference value rather than element-wise, so entries that are tiny
// through cancellation do not dominate; `floor` guards all-zero references.
#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/tensor.hpp"

namespace parallel::testing {

inline double rel_err(const Tensor& actual, const Tensor& expected, double floor = 1e-30) {
  const std::vector<float> a = actual.to_float_vector(), e = expected.to_float_vector();
  double diff = 0.0, scale = floor;
  for (std::size_t i = 0; i < e.size() && i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - e[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(e[i])));
  }
  return diff / scale;
}

}  // namespace parallel::testing
