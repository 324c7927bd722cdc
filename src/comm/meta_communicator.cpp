// MetaCommunicator (meta_communicator.hpp): checks, records, moves nothing.
#include "parallel/meta_communicator.hpp"

#include <numeric>

#include "parallel/error.hpp"
#include "parallel/meta_timeline.hpp"
#include "parallel/recording_communicator.hpp"

namespace parallel {

namespace {
void check_tensor(const Communicator& comm, const Tensor& t, const char* what, const char* op) {
  PARALLEL_CHECK(t.defined(), "MetaCommunicator::{} on {}: {} is an undefined tensor", op,
                 describe_group(comm), what);
  PARALLEL_CHECK(t.is_contiguous(), "MetaCommunicator::{} on {}: {} {} must be contiguous", op,
                 describe_group(comm), what, t.str());
}
void check_same_dtype(const Communicator& comm, const Tensor& in, const Tensor& out, const char* op) {
  PARALLEL_CHECK(in.dtype() == out.dtype(), "MetaCommunicator::{} on {}: in is {} but out is {}", op,
                 describe_group(comm), dtype_name(in.dtype()), dtype_name(out.dtype()));
}
void check_peer(const Communicator& comm, int peer, int tag, const char* op) {
  PARALLEL_CHECK(peer >= 0 && peer < comm.size(), "MetaCommunicator::{} on {}: peer {} outside [0, {})", op,
                 describe_group(comm), peer, comm.size());
  PARALLEL_CHECK(tag >= 0, "MetaCommunicator::{}: negative tag {}", op, tag);
}
// An asynchronous meta call's handle: complete at once; its first wait() marks on the live timeline
// the point where this rank needs the call done (meta_timeline.hpp).
class MetaWork final : public Work {
 public:
  MetaWork(MetaTimeline* timeline, int64_t call) : timeline_(timeline), call_(call) {}
  void wait() override {
    if (timeline_ != nullptr && !waited_ && meta::live_timeline() == timeline_) timeline_->add_wait(call_);
    waited_ = true;
  }
  bool is_completed() override { return true; }

 private:
  MetaTimeline* timeline_;
  int64_t call_;
  bool waited_ = false;
};
}  // namespace

WorkHandle MetaCommunicator::record(CommEvent e) {
  const bool async = e.async;
  MetaTimeline* timeline = meta::live_timeline();
  const int64_t call = timeline != nullptr ? timeline->add_comm(e) : -1;
  log_->add(std::move(e));
  if (!async || timeline == nullptr) return completed_work();
  return std::make_shared<MetaWork>(timeline, call);
}

MetaCommunicator::MetaCommunicator(int rank, int world_size, std::shared_ptr<CommLog> log)
    : log_(std::move(log)) {
  PARALLEL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
                 "MetaCommunicator: rank {} of a world of {} ranks", rank, world_size);
  PARALLEL_CHECK(log_ != nullptr, "MetaCommunicator: no log to record into");
  members_.resize(static_cast<std::size_t>(world_size));
  std::iota(members_.begin(), members_.end(), 0);
  rank_ = rank;
  Communicator::set_name("world");
}

MetaCommunicator::MetaCommunicator(std::vector<int> members, int rank, std::shared_ptr<CommLog> log)
    : members_(std::move(members)), rank_(rank), log_(std::move(log)) {}

WorkHandle MetaCommunicator::all_reduce(Tensor& tensor, ReduceOp op, bool async) {
  check_tensor(*this, tensor, "tensor", "all_reduce");
  return record(comm_event(*this, "all_reduce", tensor, async, std::string(reduce_op_name(op))));
}

WorkHandle MetaCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) {
  check_tensor(*this, in, "in", "reduce_scatter");
  check_tensor(*this, out, "out", "reduce_scatter");
  check_same_dtype(*this, in, out, "reduce_scatter");
  const Chunk c = chunk_of(in.numel(), size(), rank_);
  PARALLEL_CHECK(out.numel() == c.count,
                 "MetaCommunicator::reduce_scatter on {}: out has {} elements, rank {}'s chunk of {} is {}",
                 describe_group(*this), out.numel(), rank_, in.numel(), c.count);
  return record(comm_event(*this, "reduce_scatter", in, async, std::string(reduce_op_name(op))));
}

WorkHandle MetaCommunicator::all_gather(const Tensor& in, Tensor& out, bool async) {
  check_tensor(*this, in, "in", "all_gather");
  check_tensor(*this, out, "out", "all_gather");
  check_same_dtype(*this, in, out, "all_gather");
  const Chunk c = chunk_of(out.numel(), size(), rank_);
  PARALLEL_CHECK(in.numel() == c.count,
                 "MetaCommunicator::all_gather on {}: in has {} elements, rank {}'s chunk of {} is {}",
                 describe_group(*this), in.numel(), rank_, out.numel(), c.count);
  return record(comm_event(*this, "all_gather", out, async));
}

WorkHandle MetaCommunicator::broadcast(Tensor& tensor, int root, bool async) {
  check_tensor(*this, tensor, "tensor", "broadcast");
  PARALLEL_CHECK(root >= 0 && root < size(), "MetaCommunicator::broadcast on {}: root {} outside [0, {})",
                 describe_group(*this), root, size());
  return record(comm_event(*this, "broadcast", tensor, async, {}, {root}));
}

WorkHandle MetaCommunicator::all_to_all(const Tensor& in, Tensor& out, bool async) {
  check_tensor(*this, in, "in", "all_to_all");
  check_tensor(*this, out, "out", "all_to_all");
  check_same_dtype(*this, in, out, "all_to_all");
  PARALLEL_CHECK(
      in.numel() == out.numel() && in.numel() % size() == 0,
      "MetaCommunicator::all_to_all on {}: in has {} and out {} elements; both must be equal and a "
      "multiple of {}",
      describe_group(*this), in.numel(), out.numel(), size());
  return record(comm_event(*this, "all_to_all", in, async));
}

WorkHandle MetaCommunicator::all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                                         std::span<const int64_t> recv_counts, bool async) {
  check_all_to_allv(*this, in, send_counts, out, recv_counts);
  return record(comm_event(*this, "all_to_allv", in, async));
}

WorkHandle MetaCommunicator::send(const Tensor& tensor, int peer, int tag) {
  check_tensor(*this, tensor, "tensor", "send");
  check_peer(*this, peer, tag, "send");
  return record(comm_event(*this, "send", tensor, true, {}, {peer}));
}

WorkHandle MetaCommunicator::recv(Tensor& tensor, int peer, int tag) {
  check_tensor(*this, tensor, "tensor", "recv");
  check_peer(*this, peer, tag, "recv");
  return record(comm_event(*this, "recv", tensor, true, {}, {peer}));
}

WorkHandle MetaCommunicator::batch_p2p(std::span<const P2POp> ops) {
  for (const P2POp& op : ops) {
    check_tensor(*this, op.tensor, "tensor", "batch_p2p");
    check_peer(*this, op.peer, op.tag, "batch_p2p");
  }
  return record(comm_event_p2p(*this, ops));
}

void MetaCommunicator::barrier() { record(comm_event(*this, "barrier", Tensor(), false)); }

std::unique_ptr<Communicator> MetaCommunicator::split(int color, int key) {
  PARALLEL_FAIL(
      "MetaCommunicator::split({}, {}) on {}: a meta rank cannot learn the other ranks' colors; use "
      "split_group with the members (ParallelState does)",
      color, key, describe_group(*this));
}

std::unique_ptr<Communicator> MetaCommunicator::split_group(const std::vector<int>& members) {
  if (members.empty()) return nullptr;
  std::vector<int> world;
  int position = -1;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    PARALLEL_CHECK(m >= 0 && m < size(), "MetaCommunicator::split_group on {}: member {} outside [0, {})",
                   describe_group(*this), m, size());
    if (m == rank_) position = static_cast<int>(i);
    world.push_back(members_[static_cast<std::size_t>(m)]);
  }
  PARALLEL_CHECK(position >= 0, "MetaCommunicator::split_group on {}: rank {} is not among the members",
                 describe_group(*this), rank_);
  return std::unique_ptr<Communicator>(new MetaCommunicator(std::move(world), position, log_));
}

void MetaCommunicator::abort(int code) {
  PARALLEL_FAIL("MetaCommunicator::abort({}) on {}: a meta run has no job to end", code,
                describe_group(*this));
}

}  // namespace parallel
