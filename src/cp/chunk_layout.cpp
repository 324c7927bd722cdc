// Which tokens of a sample a cp rank holds, and their global positions (context_parallel.hpp).
#include <algorithm>

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

Layout::Layout(int64_t seq, int cp_size, int64_t granule, std::vector<std::vector<int64_t>> granules)
    : seq_(seq), granule_(granule), zigzag_(false), granules_(std::move(granules)) {
  PARALLEL_CHECK(cp_size >= 1 && static_cast<int>(granules_.size()) == cp_size,
                 "context parallel layout: {} ranks' granules for cp = {}", granules_.size(), cp_size);
  PARALLEL_CHECK(granule > 0 && seq % granule == 0, "context parallel layout: granule {} does not divide {}",
                 granule, seq);
  const int64_t n = seq / granule;
  PARALLEL_CHECK(n % (2 * cp_size) == 0, "context parallel layout: {} granules are not 2 * cp = {} groups", n,
                 2 * cp_size);
  std::vector<int> owner(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < cp_size; ++r) {
    std::vector<int64_t>& mine = granules_[static_cast<std::size_t>(r)];
    PARALLEL_CHECK(static_cast<int64_t>(mine.size()) * cp_size == n,
                   "context parallel layout: rank {} holds {} of {} granules (not 1 / {})", r, mine.size(), n,
                   cp_size);
    std::sort(mine.begin(), mine.end());
    for (int64_t g : mine) {
      PARALLEL_CHECK(g >= 0 && g < n && owner[static_cast<std::size_t>(g)] < 0,
                     "context parallel layout: granule {} out of range or held twice", g);
      owner[static_cast<std::size_t>(g)] = r;
    }
  }
  zigzag_ = n == 2 * cp_size;
  for (int r = 0; r < cp_size && zigzag_; ++r)
    zigzag_ = granules_[static_cast<std::size_t>(r)] ==
              std::vector<int64_t>{r, 2 * static_cast<int64_t>(cp_size) - 1 - r};
  runs_.resize(granules_.size());
  for (std::size_t r = 0; r < granules_.size(); ++r) {
    int64_t row = 0;
    for (int64_t g : granules_[r]) {
      std::vector<Segment>& runs = runs_[r];
      if (!runs.empty() && runs.back().position + runs.back().rows == g * granule)
        runs.back().rows += granule;
      else
        runs.push_back({row, granule, g * granule});
      row += granule;
    }
  }
}

Layout Layout::zigzag(int64_t seq, int cp_size) {
  const int64_t L = chunk_length(seq, cp_size);
  std::vector<std::vector<int64_t>> granules;
  for (int r = 0; r < cp_size; ++r) granules.push_back({r, 2 * static_cast<int64_t>(cp_size) - 1 - r});
  return Layout(seq, cp_size, L, std::move(granules));
}

std::vector<Segment> Layout::segments(int rank, int64_t row0, int64_t rows) const {
  PARALLEL_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= local_length(),
                 "context parallel: rows [{}, {}) outside the local sequence of {}", row0, row0 + rows,
                 local_length());
  std::vector<Segment> out;
  for (const Segment& run : runs(rank)) {
    const int64_t begin = std::max(run.row, row0), end = std::min(run.row + run.rows, row0 + rows);
    if (begin < end) out.push_back({begin - row0, end - begin, run.position + (begin - run.row)});
  }
  return out;
}

Tensor Layout::slice(const Tensor& samples, int rank) const {
  PARALLEL_CHECK(samples.dim() == 2 && samples.size(1) == seq_,
                 "context parallel: samples {} must be [b, {}]", samples.str(), seq_);
  if (cp_size() == 1) return samples;
  Tensor out = Tensor::empty({samples.size(0), local_length()}, samples.dtype(), samples.device());
  for (const Segment& run : runs(rank)) {
    Tensor part = out.narrow(1, run.row, run.rows);
    part.copy_(samples.narrow(1, run.position, run.rows));
  }
  return out;
}

}  // namespace parallel::cp
