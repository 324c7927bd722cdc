#pragma once
// A communicator that stands for one rank of a job that does not exist: rank r of an N-rank world,
// or of a group split from it. It checks each call's contract (communicator.hpp: contiguous
// tensors, one dtype, reduce_scatter / all_gather chunk sizes, all_to_all(v) counts, peers in
// range), records the call into its CommLog exactly as RecordingCommunicator describes a real one
// (comm_event), and does nothing to any data: meta tensors have none, and a CPU tensor passed to it
// keeps its values (there are no other ranks' values to combine). Every call completes at once.
// Under a live MetaTimeline (meta_timeline.hpp) each call and each wait on an asynchronous call's
// handle also go there, in issue order with the ops.
//
// Groups: split_group(members) - ParallelState's form, with members from the real RankGrid - gives
// the group of those world ranks. split(color, key) needs every rank's color and is refused (HSDP's
// replica / shard split of DataParallel is such a call: not supported on meta yet).
#include <memory>
#include <vector>

#include "parallel/comm_log.hpp"
#include "parallel/communicator.hpp"

namespace parallel {

class MetaCommunicator final : public Communicator {
 public:
  // Rank `rank` of a world of `world_size` ranks, recording into `log`.
  MetaCommunicator(int rank, int world_size, std::shared_ptr<CommLog> log);

  const std::shared_ptr<CommLog>& log() const { return log_; }

  std::vector<int> world_ranks() const override { return members_; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string_view backend() const override { return "meta"; }

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
  MetaCommunicator(std::vector<int> members, int rank, std::shared_ptr<CommLog> log);
  // Logs `e`, and puts it on the live MetaTimeline (meta_timeline.hpp) with a handle whose wait()
  // is recorded there when the call is asynchronous.
  WorkHandle record(CommEvent e);
  std::vector<int> members_;  // world ranks, in group-rank order
  int rank_ = 0;              // this rank's position in members_
  std::shared_ptr<CommLog> log_;
};

}  // namespace parallel
