// Which tokens of a sample a cp rank holds, and their global positions (context_parallel.hpp).
#include "parallel/context_parallel.hpp"
#include "parallel/error.hpp"

namespace parallel::cp {

int64_t chunk_length(int64_t seq, int cp_size) {
  PARALLEL_CHECK(cp_size >= 1 && seq % (2 * cp_size) == 0,
                 "context parallel: sequence length {} is not divisible by 2 * cp = {}", seq, 2 * cp_size);
  return seq / (2 * cp_size);
}

std::vector<Segment> segments(int64_t local_seq, int rank, int cp_size, int64_t row0, int64_t rows) {
  PARALLEL_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= local_seq,
                 "context parallel: rows [{}, {}) outside the local sequence of {}", row0, row0 + rows,
                 local_seq);
  if (cp_size == 1) return {Segment{0, rows, row0}};
  PARALLEL_CHECK(local_seq % 2 == 0, "context parallel: local sequence {} is not two chunks", local_seq);
  const int64_t L = local_seq / 2;
  // Local row r < L is row r of chunk `rank`; r >= L is row r - L of chunk 2 cp - 1 - rank.
  const int64_t first = static_cast<int64_t>(rank) * L,
                second = static_cast<int64_t>(2 * cp_size - 1 - rank) * L;
  std::vector<Segment> out;
  if (row0 < L) {
    const int64_t n = std::min(rows, L - row0);
    out.push_back({0, n, first + row0});
  }
  const int64_t end = row0 + rows;
  if (end > L) {
    const int64_t start = std::max(row0, L);
    out.push_back({start - row0, end - start, second + (start - L)});
  }
  return out;
}

Tensor slice_sequence(const Tensor& samples, int rank, int cp_size) {
  if (cp_size == 1) return samples;
  PARALLEL_CHECK(samples.dim() == 2, "context parallel: samples {} must be [b, s]", samples.str());
  const int64_t b = samples.size(0), s = samples.size(1), L = chunk_length(s, cp_size);
  Tensor out = Tensor::empty({b, 2 * L}, samples.dtype(), samples.device());
  Tensor first = out.narrow(1, 0, L), second = out.narrow(1, L, L);
  first.copy_(samples.narrow(1, static_cast<int64_t>(rank) * L, L));
  second.copy_(samples.narrow(1, static_cast<int64_t>(2 * cp_size - 1 - rank) * L, L));
  return out;
}

}  // namespace parallel::cp
