// Rotary embedding at per-token positions: each batch entry's runs of consecutive positions as one
// rope op each (a document, or the part of one in a cp chunk).
#include "rotary.hpp"

#include "parallel/context_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/ops.hpp"

namespace parallel::model {
namespace {

void rope_run(Tensor& x, int64_t position, const Rope& rope, bool backward) {
  if (backward)
    ops::rope_backward(x, position, rope);
  else
    ops::rope_forward(x, position, rope);
}

// A batch entry is a strided view of x, so for b > 1 it goes through a contiguous copy.
void rope_at_positions(Tensor& x, const Tensor& positions, const Rope& rope, bool backward) {
  const int64_t s = x.size(0), b = x.size(1);
  PARALLEL_CHECK(positions.dim() == 2 && positions.size(0) == b && positions.size(1) == s,
                 "attention: positions {} must be [b, s] = [{}, {}]", positions.str(), b, s);
  const Tensor pos_c = positions.contiguous();
  const int32_t* pos = pos_c.data<int32_t>();
  for (int64_t e = 0; e < b; ++e) {
    Tensor xb = b == 1 ? x : x.narrow(1, e, 1).contiguous();
    const int32_t* p = pos + e * s;
    for (int64_t r = 0; r < s;) {
      int64_t n = 1;
      while (r + n < s && p[r + n] == p[r + n - 1] + 1) ++n;
      Tensor run = xb.narrow(0, r, n);
      rope_run(run, p[r], rope, backward);
      r += n;
    }
    if (b > 1) {
      Tensor dst = x.narrow(1, e, 1);
      dst.copy_(xb);
    }
  }
}

}  // namespace

void rotate(Tensor& x, const Tensor& positions, const cp::Layout* layout, const LayerEnv& env,
            const Rope& rope, bool backward) {
  if (positions.defined()) {
    rope_at_positions(x, positions, rope, backward);
    return;
  }
  // Each run of rows at its global positions (from 0 without context parallelism).
  const int64_t s = x.size(0);
  for (const cp::Segment& seg :
       layout ? layout->segments(env.cp_rank(), 0, s) : cp::segments(s, env.cp_rank(), env.cp_size(), 0, s)) {
    Tensor xs = x.narrow(0, seg.row, seg.rows);
    rope_run(xs, seg.position, rope, backward);
  }
}

}  // namespace parallel::model
