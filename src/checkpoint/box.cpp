// N-d box intersection: the whole of resharding is "copy the intersection of every saved box with
// every requested box".
#include <algorithm>

#include "parallel/checkpoint.hpp"

namespace parallel::checkpoint {

bool intersect(const Box& a, const Box& b, Box& out) {
  PARALLEL_CHECK(a.offset.size() == a.shape.size() && b.offset.size() == b.shape.size() &&
                     a.shape.size() == b.shape.size(),
                 "intersect: boxes of rank {}/{} and {}/{}", a.offset.size(), a.shape.size(), b.offset.size(),
                 b.shape.size());
  Box r;
  r.offset.resize(a.shape.size());
  r.shape.resize(a.shape.size());
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return false;
    r.offset[d] = lo;
    r.shape[d] = hi - lo;
  }
  out = std::move(r);
  return true;
}

}  // namespace parallel::checkpoint
