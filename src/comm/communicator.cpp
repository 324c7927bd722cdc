#include "parallel/communicator.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "parallel/error.hpp"

namespace parallel {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkHandle completed_work() {
  // Stateless, so one shared instance serves every caller.
  static const WorkHandle done = std::make_shared<CompletedWork>();
  return done;
}

Chunk chunk_of(int64_t n, int parts, int index) {
  PARALLEL_CHECK(n >= 0, "chunk_of: negative element count {}", n);
  PARALLEL_CHECK(parts > 0, "chunk_of: {} parts", parts);
  PARALLEL_CHECK(index >= 0 && index < parts, "chunk_of: index {} outside [0, {})", index, parts);
  const int64_t base = n / parts;
  const int64_t extra = n % parts;
  Chunk c;
  c.count = base + (index < extra ? 1 : 0);
  c.offset = index * base + std::min<int64_t>(index, extra);
  return c;
}

void check_all_to_allv(const Communicator& comm, const Tensor& in, std::span<const int64_t> send_counts,
                       const Tensor& out, std::span<const int64_t> recv_counts) {
  const auto p = static_cast<std::size_t>(comm.size());
  PARALLEL_CHECK(send_counts.size() == p && recv_counts.size() == p,
                 "all_to_allv on {}: {} send and {} receive counts for {} ranks", describe_group(comm),
                 send_counts.size(), recv_counts.size(), p);
  PARALLEL_CHECK(in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype(),
                 "all_to_allv on {}: in {} and out {} must be contiguous and of one dtype",
                 describe_group(comm), in.str(), out.str());
  const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  PARALLEL_CHECK(
      sent == in.numel() && received == out.numel(),
      "all_to_allv on {}: counts sum to {} sent and {} received, but in has {} and out {} elements",
      describe_group(comm), sent, received, in.numel(), out.numel());
}

std::unique_ptr<Communicator> Communicator::split_group(const std::vector<int>& members) {
  if (members.empty()) return split(-1, 0);
  const auto it = std::find(members.begin(), members.end(), rank());
  PARALLEL_CHECK(it != members.end(), "split_group on {}: rank {} is not among the members",
                 describe_group(*this), rank());
  return split(members.front(), static_cast<int>(it - members.begin()));
}

WorkHandle Communicator::all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                                     std::span<const int64_t> recv_counts, bool async) {
  check_all_to_allv(*this, in, send_counts, out, recv_counts);
  Tensor src = in.flatten(), dst = out.flatten();
  std::vector<P2POp> ops;
  int64_t send_at = 0, recv_at = 0;
  for (int r = 0; r < size(); ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (recv_counts[i] > 0) ops.push_back({P2POp::Kind::Recv, dst.narrow(0, recv_at, recv_counts[i]), r});
    if (send_counts[i] > 0) ops.push_back({P2POp::Kind::Send, src.narrow(0, send_at, send_counts[i]), r});
    send_at += send_counts[i];
    recv_at += recv_counts[i];
  }
  WorkHandle work = batch_p2p(ops);
  if (!async) {
    work->wait();
    return completed_work();
  }
  return work;
}

}  // namespace parallel
