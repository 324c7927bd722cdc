#pragma once
// The MPI backend: CPU tensors, non-blocking collectives (MPI-3) for the async handles. Every
// operation is posted non-blocking; a synchronous call, Work::wait() and barrier() poll it with
// MPI_Testall against comm_timeout() (communicator.hpp's watchdog) instead of blocking in MPI_Wait.
//
// Two-rank sums. In a group of two, all_reduce and reduce_scatter with ReduceOp::Sum of fp32, bf16
// or fp16 tensors of point_to_point_sum_min_bytes() or more do not go through MPI's collectives
// (whose temporaries of the whole message are mapped and page-faulted afresh at every call above
// glibc's mmap threshold): the ranks exchange halves point to point on a duplicate communicator and
// both reduce at once, all_reduce in pieces of reduce_piece_bytes() through one buffer of half a
// piece that the communicator keeps, reduce_scatter straight into `out`. The results are bitwise
// those of MPI's in-place binomial all-reduce (where both ranks hold a NaN, rank 0's is kept). Such
// an operation advances only inside wait() / is_completed() of its own or a later such operation on
// the same communicator (in call order, as on the peer), so with async=true a rank's work is not
// delayed by a peer that has not reached the call yet.
//
// Larger groups' sums. In a group of three or more, the same sums go round a ring of point-to-point
// messages (NCCL's ring: reduce-scatter, then all-gather), a piece of at most
// reduce_piece_bytes() / 4 per rank and step, received into two buffers the communicator keeps
// (src/comm/ring_reduce.hpp). Each element is summed once, on the rank whose chunk holds it, in a
// fixed order of the ranks, and copied to the others: every rank ends bitwise identical. The
// results may differ in the last bits from MPI's (which adds in an order of its own choosing).
// reduce_scatter may write into this rank's own chunk of `in`. They advance like the two-rank
// sums: inside wait() / is_completed(), in call order.
#include <mpi.h>

#include <memory>

#include "parallel/communicator.hpp"

namespace parallel {

namespace detail {
struct MpiGroupLabel;  // a group's name and world ranks (src/comm/mpi_group_label.hpp)
struct MpiPairState;   // two-rank reductions' communicator, buffer and queue (mpi_communicator.cpp)
struct RingState;      // larger groups' sums: communicator, buffers and queue (src/comm/ring_reduce.hpp)
}  // namespace detail

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

  // The piece size of two-rank all-reduces and of larger groups' rings (above); the same on every
  // rank. Smaller pieces need smaller buffers, larger ones fewer round trips.
  static constexpr int64_t kDefaultReducePieceBytes = int64_t{8} << 20;
  void set_reduce_piece_bytes(int64_t bytes);
  int64_t reduce_piece_bytes() const { return piece_bytes_; }
  // The smallest sum that goes point to point (two-rank sums and rings, above); smaller ones use
  // MPI's collectives. The same on every rank. Measured in docs/benchmarks.md (2026-11-27).
  static constexpr int64_t kDefaultPointToPointSumMinBytes = int64_t{1} << 20;
  void set_point_to_point_sum_min_bytes(int64_t bytes);
  int64_t point_to_point_sum_min_bytes() const { return p2p_min_bytes_; }

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
  std::shared_ptr<detail::MpiPairState> pair_;  // groups of two only
  std::shared_ptr<detail::RingState> ring_;     // groups of three or more
  int64_t piece_bytes_ = kDefaultReducePieceBytes;
  int64_t p2p_min_bytes_ = kDefaultPointToPointSumMinBytes;
};

}  // namespace parallel
