#pragma once
// A communicator of one rank, for the size-1 groups of a parallel layout (tensor = 1, pipeline = 1,
// one data-parallel replica, ...). On a GPU those groups would otherwise each get a NCCL
// communicator, so a single-GPU run would need a working NCCL although nothing is ever exchanged.
//
// Every collective over one rank is the identity: all_reduce and broadcast leave the tensor as it
// is; reduce_scatter, all_gather, all_to_all and all_to_allv copy `in` to `out`. A message to
// itself (peer 0) is matched with the receive of the same tag, in posting order, and copied. Any
// device: CUDA tensors are copied on `stream` (ordered after the caller's work there, as NCCL's
// operations are), CPU tensors on the host. Every operation is complete when it returns.
#include <deque>
#include <memory>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/nccl_communicator.hpp"

namespace parallel {

class LocalCommunicator final : public Communicator {
 public:
  // `host`: the one-rank MPI group this stands for (its world rank, for messages; abort() goes
  // through it). Must outlive this communicator. `stream`: where CUDA copies are ordered.
  explicit LocalCommunicator(Communicator& host, Stream stream = {});

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  std::vector<int> world_ranks() const override { return host_.world_ranks(); }

  WorkHandle all_reduce(Tensor& tensor, ReduceOp op, bool async) override;
  WorkHandle reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, bool async) override;
  WorkHandle all_gather(const Tensor& in, Tensor& out, bool async) override;
  WorkHandle broadcast(Tensor& tensor, int root, bool async) override;
  WorkHandle all_to_all(const Tensor& in, Tensor& out, bool async) override;
  WorkHandle all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                         std::span<const int64_t> recv_counts, bool async) override;
  WorkHandle send(const Tensor& tensor, int peer, int tag) override;
  WorkHandle recv(Tensor& tensor, int peer, int tag) override;
  WorkHandle batch_p2p(std::span<const P2POp> ops) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(int code) override;

 private:
  struct Pending {
    Tensor tensor;
    int tag;
    std::shared_ptr<bool> done;  // set when matched; what the operation's Work reports
  };
  void copy(const Tensor& in, Tensor& out, const char* what);
  void check_peer(int peer, const char* what) const;
  void match();  // copies every send that has a receive of the same tag (first posted first)

  Communicator& host_;
  Stream stream_;
  std::deque<Pending> sends_, recvs_;
};

// The communicator a group uses for tensors on `device`: a LocalCommunicator for a one-rank group
// (no NCCL needed, nor touched), else make_nccl_communicator(group, device, options). `group` must
// outlive the result. Collective over `group` when it has more than one rank.
std::unique_ptr<Communicator> make_device_communicator(MpiCommunicator& group, Device device,
                                                       NcclOptions options = {});

}  // namespace parallel
