#pragma once
// The MPI backend: CPU tensors, non-blocking collectives (MPI-3) for the async handles. Every
// operation is posted non-blocking; a synchronous call, Work::wait() and barrier() poll it with
// MPI_Testall against comm_timeout() (communicator.hpp's watchdog) instead of blocking in MPI_Wait.
#include <mpi.h>

#include <memory>

#include "parallel/communicator.hpp"

namespace parallel {

namespace detail {
struct MpiGroupLabel;  // a group's name and world ranks (mpi_communicator.cpp)
}

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm`, so our traffic never mixes with the caller's, and sets MPI_ERRORS_RETURN on
  // the duplicate so failures become parallel::Error with file:line. Named "world" when `comm` has
  // MPI_COMM_WORLD's ranks in its order, else "unnamed" until set_name().
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }
  void set_name(std::string name) override;
  std::vector<int> world_ranks() const override;

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
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(int code) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  // Name and world ranks, shared with the pending operations for the watchdog's message.
  std::shared_ptr<detail::MpiGroupLabel> label_;
};

}  // namespace parallel
