// RecordingCommunicator (recording_communicator.hpp) and the description of one call, comm_event,
// which MetaCommunicator shares.
#include "parallel/recording_communicator.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <exception>
#include <ostream>

#include "parallel/error.hpp"

namespace parallel {

namespace {
int world_rank_of(const Communicator& comm, int peer) {
  const std::vector<int> ranks = comm.world_ranks();
  return peer >= 0 && peer < static_cast<int>(ranks.size()) ? ranks[static_cast<std::size_t>(peer)] : peer;
}
}  // namespace

std::string CommEvent::str() const {
  return fmt::format("{}{}{} {} B {} on {} [{}]{}{}", kind, detail.empty() ? "" : " ", detail, bytes,
                     dtype_name(dtype), group, fmt::join(ranks, ", "),
                     peers.empty() ? "" : fmt::format(" peers [{}]", fmt::join(peers, ", ")),
                     async ? " async" : "");
}

std::ostream& operator<<(std::ostream& os, const CommEvent& e) { return os << e.str(); }

CommEvent comm_event(const Communicator& comm, const char* kind, const Tensor& t, bool async,
                     std::string detail, std::vector<int> peers) {
  CommEvent e;
  e.kind = kind;
  e.group = comm.name();
  e.ranks = comm.world_ranks();
  e.bytes = t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  e.dtype = t.dtype();
  for (int& p : peers) p = world_rank_of(comm, p);
  e.peers = std::move(peers);
  e.detail = std::move(detail);
  e.async = async;
  return e;
}

CommEvent comm_event_p2p(const Communicator& comm, std::span<const P2POp> ops) {
  CommEvent e;
  e.kind = "batch_p2p";
  e.group = comm.name();
  e.ranks = comm.world_ranks();
  e.async = true;
  for (const P2POp& op : ops) {
    e.bytes += static_cast<int64_t>(op.tensor.nbytes());
    e.dtype = op.tensor.dtype();
    e.peers.push_back(world_rank_of(comm, op.peer));
    if (!e.detail.empty()) e.detail += ",";
    e.detail += fmt::format("{} {}", op.kind == P2POp::Kind::Send ? "send" : "recv", op.tensor.nbytes());
  }
  return e;
}

RecordingCommunicator::RecordingCommunicator(Communicator& inner, std::shared_ptr<CommLog> log)
    : inner_(&inner), log_(std::move(log)) {
  Communicator::set_name(inner.name());
}

RecordingCommunicator::RecordingCommunicator(std::unique_ptr<Communicator> inner,
                                             std::shared_ptr<CommLog> log)
    : owned_(std::move(inner)), inner_(owned_.get()), log_(std::move(log)) {
  PARALLEL_CHECK(inner_ != nullptr, "RecordingCommunicator: no communicator to record");
  Communicator::set_name(inner_->name());
}

void RecordingCommunicator::set_name(std::string name) {
  inner_->set_name(name);
  Communicator::set_name(std::move(name));
}

WorkHandle RecordingCommunicator::all_reduce(Tensor& tensor, ReduceOp op, bool async) {
  log_->add(comm_event(*this, "all_reduce", tensor, async, std::string(reduce_op_name(op))));
  return inner_->all_reduce(tensor, op, async);
}

WorkHandle RecordingCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) {
  log_->add(comm_event(*this, "reduce_scatter", in, async, std::string(reduce_op_name(op))));
  return inner_->reduce_scatter(in, out, op, async);
}

WorkHandle RecordingCommunicator::all_gather(const Tensor& in, Tensor& out, bool async) {
  log_->add(comm_event(*this, "all_gather", out, async));
  return inner_->all_gather(in, out, async);
}

WorkHandle RecordingCommunicator::broadcast(Tensor& tensor, int root, bool async) {
  log_->add(comm_event(*this, "broadcast", tensor, async, {}, {root}));
  return inner_->broadcast(tensor, root, async);
}

WorkHandle RecordingCommunicator::all_to_all(const Tensor& in, Tensor& out, bool async) {
  log_->add(comm_event(*this, "all_to_all", in, async));
  return inner_->all_to_all(in, out, async);
}

WorkHandle RecordingCommunicator::all_to_allv(const Tensor& in, std::span<const int64_t> send_counts,
                                              Tensor& out, std::span<const int64_t> recv_counts, bool async) {
  log_->add(comm_event(*this, "all_to_allv", in, async));
  return inner_->all_to_allv(in, send_counts, out, recv_counts, async);
}

WorkHandle RecordingCommunicator::send(const Tensor& tensor, int peer, int tag) {
  log_->add(comm_event(*this, "send", tensor, true, {}, {peer}));
  return inner_->send(tensor, peer, tag);
}

WorkHandle RecordingCommunicator::recv(Tensor& tensor, int peer, int tag) {
  log_->add(comm_event(*this, "recv", tensor, true, {}, {peer}));
  return inner_->recv(tensor, peer, tag);
}

WorkHandle RecordingCommunicator::batch_p2p(std::span<const P2POp> ops) {
  log_->add(comm_event_p2p(*this, ops));
  return inner_->batch_p2p(ops);
}

void RecordingCommunicator::barrier() {
  log_->add(comm_event(*this, "barrier", Tensor(), false));
  inner_->barrier();
}

std::unique_ptr<Communicator> RecordingCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> child = inner_->split(color, key);
  if (child == nullptr) return nullptr;
  return std::make_unique<RecordingCommunicator>(std::move(child), log_);
}

std::unique_ptr<Communicator> RecordingCommunicator::split_group(const std::vector<int>& members) {
  std::unique_ptr<Communicator> child = inner_->split_group(members);
  if (child == nullptr) return nullptr;
  return std::make_unique<RecordingCommunicator>(std::move(child), log_);
}

void RecordingCommunicator::abort(int code) {
  inner_->abort(code);
  std::terminate();  // not reached: abort() does not return
}

}  // namespace parallel
