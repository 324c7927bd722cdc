#pragma once
// A decorator that records every collective and point-to-point call made on a communicator (and on
// the groups split from it) into a CommLog, then forwards the call unchanged. It is how a test
// counts what the real backends (MPI, NCCL) are asked to do, to hold the meta run
// (meta_communicator.hpp) to it.
#include <memory>

#include "parallel/comm_log.hpp"
#include "parallel/communicator.hpp"

namespace parallel {

class RecordingCommunicator final : public Communicator {
 public:
  // Records into `log`; `inner` must outlive this (the root) - split groups own their inner.
  RecordingCommunicator(Communicator& inner, std::shared_ptr<CommLog> log);
  RecordingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CommLog> log);

  const std::shared_ptr<CommLog>& log() const { return log_; }
  Communicator& inner() { return *inner_; }

  void set_name(std::string name) override;
  std::vector<int> world_ranks() const override { return inner_->world_ranks(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }

  WorkHandle all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum, bool async = false) override;
  WorkHandle reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum,
                            bool async = false) override;
  WorkHandle all_gather(const Tensor& in, Tensor& out, bool async = false) override;
  WorkHandle broadcast(Tensor& tensor, int root, bool async = false) override;
  WorkHandle all_to_all(const Tensor& in, Tensor& out, bool async = false) override;
  WorkHandle all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                         std::span<const int64_t> recv_counts, bool async = false) override;
  WorkHandle send(const Tensor& tensor, int peer, int tag = 0) override;
  WorkHandle recv(Tensor& tensor, int peer, int tag = 0) override;
  WorkHandle batch_p2p(std::span<const P2POp> ops) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_group(const std::vector<int>& members) override;
  [[noreturn]] void abort(int code) override;

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  std::shared_ptr<CommLog> log_;
};

// The event of one call on `comm` (shared by RecordingCommunicator and MetaCommunicator, so that
// both describe a call the same way). Peers are group ranks, turned into world ranks here.
CommEvent comm_event(const Communicator& comm, const char* kind, const Tensor& t, bool async,
                     std::string detail = {}, std::vector<int> peers = {});
CommEvent comm_event_p2p(const Communicator& comm, std::span<const P2POp> ops);

}  // namespace parallel
