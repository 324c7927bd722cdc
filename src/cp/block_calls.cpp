// Which attention calls a block of ring attention (p2p) or of the K/V all-gather makes, and which
// it skips (context_parallel.hpp: block_calls).
#include <algorithm>

#include "parallel/context_parallel.hpp"
#include "parallel/error.hpp"

namespace parallel::cp {
namespace {

// True when some query at positions [qp, qp + n) sees some key at [kp, kp + n) (attention_mask.hpp),
// doc_start (host, [b, S] contiguous) or null.
bool any_visible(int64_t window, const int32_t* doc_start, int64_t b, int64_t S, int64_t qp, int64_t kp,
                 int64_t n) {
  if (kp > qp + n - 1) return false;  // causal: every key after every query
  if (window == 0 && doc_start == nullptr) return true;
  AttentionBounds bounds;
  bounds.window = window;
  bounds.doc_start = doc_start;
  bounds.doc_stride = S;
  for (int64_t e = 0; e < b; ++e)
    for (int64_t p = std::max(qp, kp); p < qp + n; ++p)
      if (bounds.lo(e, p) <= kp + n - 1) return true;
  return false;
}

}  // namespace

std::vector<BlockCall> block_calls(const Layout& layout, int i, int j, int64_t window,
                                   const Tensor& doc_start) {
  if (layout.is_zigzag() && window == 0 && !doc_start.defined()) {
    const int64_t L = layout.granule();
    if (j == i) return {BlockCall{0, 0, 2 * L, 0, 0, true}};
    if (j < i) return {BlockCall{0, 0, L, 0, 0, false}, BlockCall{L, 0, L, 0, 0, false}};
    return {BlockCall{L, 0, L, 0, 0, false}, BlockCall{L, L, L, 0, 0, false}};
  }
  const int32_t* ds = nullptr;
  int64_t b = 1;
  const int64_t S = layout.seq();
  if (doc_start.defined()) {
    PARALLEL_CHECK(doc_start.dim() == 2 && doc_start.size(1) == S && doc_start.dtype() == DType::I32 &&
                       doc_start.device().is_cpu() && doc_start.is_contiguous(),
                   "context parallel: doc_start {} must be contiguous int32 [b, {}] on the host",
                   doc_start.str(), S);
    ds = doc_start.data<int32_t>();
    b = doc_start.size(0);
  }
  // Every pair of runs as squares (the kernels take as many keys as queries): the longer side is cut
  // into squares of the shorter one's length, Euclid's way; each square is a whole number of granules.
  std::vector<BlockCall> calls;
  for (const Segment& q : layout.runs(i))
    for (const Segment& k : layout.runs(j)) {
      int64_t q0 = q.row, qp = q.position, qn = q.rows, k0 = k.row, kp = k.position, kn = k.rows;
      while (qn > 0 && kn > 0) {
        const int64_t n = std::min(qn, kn);
        if (any_visible(window, ds, b, S, qp, kp, n)) calls.push_back({q0, k0, n, qp, kp, true});
        if (qn >= kn) {
          q0 += n;
          qp += n;
          qn -= n;
        } else {
          k0 += n;
          kp += n;
          kn -= n;
        }
      }
    }
  return calls;
}

}  // namespace parallel::cp
