#include "parallel/local_communicator.hpp"

#include <cstdlib>

#include "parallel/error.hpp"

namespace parallel {
namespace {

// A self-message: complete once matched. Waiting on one that never can be is a program error,
// reported instead of hanging (there is no other rank that could still post the match).
class LocalWork final : public Work {
 public:
  LocalWork(std::shared_ptr<bool> done, std::string what) : done_(std::move(done)), what_(std::move(what)) {}
  void wait() override {
    PARALLEL_CHECK(*done_, "{}: waited on before a matching operation was posted (a one-rank group)", what_);
  }
  bool is_completed() override { return *done_; }

 private:
  std::shared_ptr<bool> done_;
  std::string what_;
};

}  // namespace

LocalCommunicator::LocalCommunicator(Communicator& host, Stream stream) : host_(host), stream_(stream) {
  PARALLEL_CHECK(host.size() == 1, "LocalCommunicator stands for a one-rank group, got {} ranks ({})",
                 host.size(), describe_group(host));
  set_name(host.name());
}

void LocalCommunicator::copy(const Tensor& in, Tensor& out, const char* what) {
  PARALLEL_CHECK(
      in.is_contiguous() && out.is_contiguous() && in.dtype() == out.dtype() && in.numel() == out.numel(),
      "{} on {}: in {} and out {} must be contiguous, of one dtype and size (one rank)", what,
      describe_group(*this), in.str(), out.str());
  if (in.numel() == 0 || in.data_ptr() == out.data_ptr()) return;
  Tensor dst = out.flatten();
  dst.copy_(in.flatten(), stream_);
}

void LocalCommunicator::check_peer(int peer, const char* what) const {
  PARALLEL_CHECK(peer == 0, "{} on {}: peer {} outside a one-rank group", what, describe_group(*this), peer);
}

WorkHandle LocalCommunicator::all_reduce(Tensor& tensor, ReduceOp, bool) {
  PARALLEL_CHECK(tensor.is_contiguous(), "all_reduce on {}: {} must be contiguous", describe_group(*this),
                 tensor.str());
  return completed_work();
}

WorkHandle LocalCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp, bool) {
  copy(in, out, "reduce_scatter");
  return completed_work();
}

WorkHandle LocalCommunicator::all_gather(const Tensor& in, Tensor& out, bool) {
  copy(in, out, "all_gather");
  return completed_work();
}

WorkHandle LocalCommunicator::broadcast(Tensor& tensor, int root, bool) {
  check_peer(root, "broadcast");
  PARALLEL_CHECK(tensor.is_contiguous(), "broadcast on {}: {} must be contiguous", describe_group(*this),
                 tensor.str());
  return completed_work();
}

WorkHandle LocalCommunicator::all_to_all(const Tensor& in, Tensor& out, bool) {
  copy(in, out, "all_to_all");
  return completed_work();
}

WorkHandle LocalCommunicator::all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                                          std::span<const int64_t> recv_counts, bool) {
  check_all_to_allv(*this, in, send_counts, out, recv_counts);
  PARALLEL_CHECK(send_counts[0] == recv_counts[0],
                 "all_to_allv on {}: sends {} elements to itself, expects {}", describe_group(*this),
                 send_counts[0], recv_counts[0]);
  copy(in, out, "all_to_allv");
  return completed_work();
}

void LocalCommunicator::match() {
  for (auto r = recvs_.begin(); r != recvs_.end();) {
    auto s = sends_.begin();
    while (s != sends_.end() && s->tag != r->tag) ++s;
    if (s == sends_.end()) {
      ++r;
      continue;
    }
    PARALLEL_CHECK(s->tensor.numel() == r->tensor.numel() && s->tensor.dtype() == r->tensor.dtype(),
                   "send/recv on {} (tag {}): sent {}, receiving into {}", describe_group(*this), r->tag,
                   s->tensor.str(), r->tensor.str());
    copy(s->tensor, r->tensor, "recv");
    *s->done = true;
    *r->done = true;
    sends_.erase(s);
    r = recvs_.erase(r);
  }
}

WorkHandle LocalCommunicator::send(const Tensor& tensor, int peer, int tag) {
  check_peer(peer, "send");
  auto done = std::make_shared<bool>(false);
  sends_.push_back({tensor, tag, done});
  match();
  return std::make_shared<LocalWork>(done, "send to itself on " + describe_group(*this));
}

WorkHandle LocalCommunicator::recv(Tensor& tensor, int peer, int tag) {
  check_peer(peer, "recv");
  auto done = std::make_shared<bool>(false);
  recvs_.push_back({tensor, tag, done});
  match();
  return std::make_shared<LocalWork>(done, "recv from itself on " + describe_group(*this));
}

WorkHandle LocalCommunicator::batch_p2p(std::span<const P2POp> ops) {
  std::vector<WorkHandle> works;
  for (const P2POp& op : ops) {
    Tensor t = op.tensor;
    works.push_back(op.kind == P2POp::Kind::Send ? send(t, op.peer, op.tag) : recv(t, op.peer, op.tag));
  }
  // The batch is posted whole, so every message in it must have found its match.
  for (const WorkHandle& w : works) w->wait();
  return completed_work();
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int) {
  if (color < 0) return nullptr;
  auto sub = std::make_unique<LocalCommunicator>(host_, stream_);
  return sub;
}

void LocalCommunicator::abort(int code) {
  host_.abort(code);
  std::abort();  // not reached (host_.abort ends the job), but the compiler cannot see through the call
}

std::unique_ptr<Communicator> make_device_communicator(MpiCommunicator& group, Device device,
                                                       NcclOptions options) {
  // One rank exchanges nothing: no NCCL communicator (nor a working NCCL) is needed for it.
  if (group.size() == 1) return std::make_unique<LocalCommunicator>(group, options.compute_stream);
  return make_nccl_communicator(group, device, options);
}

}  // namespace parallel
