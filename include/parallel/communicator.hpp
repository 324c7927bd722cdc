#pragma once
// One interface for collectives and point-to-point messages, with two backends:
//   MpiCommunicator  (mpi_communicator.hpp)  - CPU tensors, and the bootstrap for NCCL
//   NcclCommunicator (nccl_communicator.hpp) - CUDA tensors, on its own stream
//
// Every operation may run asynchronously: it returns a Work handle, and the caller must keep using
// the tensors only after wait(). With async == false the call returns once the operation is done
// (the handle is then already complete). On CUDA "done" means "ordered before later work on the
// caller's stream", as in PyTorch's ProcessGroupNCCL: wait() never blocks the host there.
//
// All tensors must be contiguous. fp32, bf16, fp16 and integer tensors are supported; bf16/fp16
// reductions accumulate pairwise in fp32 and round once per step, as NCCL does.
//
// Watchdog: every wait the host blocks in (a synchronous call, Work::wait(), barrier()) has a
// deadline, comm_timeout() (600 s unless set_comm_timeout() changed it; the trainer sets
// train.comm_timeout_s). On expiry the waiting rank logs one error line naming the operation, the
// group (name() and world_ranks()) and for point-to-point the peers, then ends the whole job
// (MPI_Abort; on NCCL after ncclCommAbort). A stopped or hung rank thus ends the job instead of
// stalling it forever.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor.hpp"

namespace parallel {

enum class ReduceOp : uint8_t { Sum, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;          // idempotent
  virtual bool is_completed() = 0;  // non-blocking poll; also drives MPI progress
};
using WorkHandle = std::shared_ptr<Work>;

// A handle that is already complete (the synchronous result, or an empty batch).
WorkHandle completed_work();

struct P2POp {
  enum class Kind : uint8_t { Send, Recv };
  Kind kind;
  Tensor tensor;
  int peer;
  int tag = 0;
};

// The slice of n elements that part `index` of `parts` owns in reduce_scatter / all_gather:
// the first n % parts parts hold one element more (numpy's array_split). Every rank computes the
// same split, so uneven sizes need no extra communication.
struct Chunk {
  int64_t offset = 0;
  int64_t count = 0;
};
Chunk chunk_of(int64_t n, int parts, int index);

// The deadline of every blocking communication wait in this process, in seconds (> 0; default 600,
// NCCL's). Process-wide: it applies to the waits that start after the call. Throws parallel::Error
// for a value that is not a finite number > 0.
void set_comm_timeout(double seconds);
double comm_timeout();
// Seconds this process has spent blocked in communication waits so far (monotonic): the step time
// minus this is the time a rank was busy, which is what tells a straggler from the ranks waiting
// for it (their step times are equal, since each step ends in collectives).
double comm_wait_seconds();

class Communicator {
 public:
  virtual ~Communicator() = default;

  // The group's purpose, for messages ("world", "tp", "dp", "pp", ...: ParallelState and the
  // runtime name theirs); "unnamed" until set.
  virtual void set_name(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }
  // This group's members as ranks of MPI_COMM_WORLD, in group-rank order; empty if unknown.
  virtual std::vector<int> world_ranks() const { return {}; }

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "mpi", "nccl" or "local" (one rank)

  // In-place reduction of `tensor` over every rank.
  virtual WorkHandle all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum, bool async = false) = 0;
  // `in` holds n elements on every rank; rank r receives the reduction of chunk_of(n, size, r) in
  // `out`, whose numel must be that chunk's count.
  virtual WorkHandle reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum,
                                    bool async = false) = 0;
  // `out` holds n elements; rank r contributes chunk_of(n, size, r) from `in` (numel = its count).
  virtual WorkHandle all_gather(const Tensor& in, Tensor& out, bool async = false) = 0;
  virtual WorkHandle broadcast(Tensor& tensor, int root, bool async = false) = 0;
  // `in` and `out` hold size * k elements; block j of `in` goes to rank j, block i of `out` comes
  // from rank i.
  virtual WorkHandle all_to_all(const Tensor& in, Tensor& out, bool async = false) = 0;
  // Variable-size all-to-all (MoE token dispatch): `in` holds send_counts[0] elements for rank 0,
  // then send_counts[1] for rank 1, ...; `out` receives recv_counts[i] elements from rank i, back to
  // back in rank order. Counts are elements, one per rank, and must agree pairwise (what rank i
  // sends to j is what j expects from i): callers exchange them first with all_to_all. The default
  // is one batch_p2p of the non-empty blocks (NCCL: grouped send/recv); MPI uses MPI_Ialltoallv.
  virtual WorkHandle all_to_allv(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                                 std::span<const int64_t> recv_counts, bool async = false);

  // Point-to-point messages are always asynchronous. `peer` is a rank in this communicator.
  virtual WorkHandle send(const Tensor& tensor, int peer, int tag = 0) = 0;
  virtual WorkHandle recv(Tensor& tensor, int peer, int tag = 0) = 0;
  // Posts all sends and receives together (one NCCL group / one MPI request set), so neighbours
  // exchanging in both directions cannot deadlock. One handle completes when all have.
  virtual WorkHandle batch_p2p(std::span<const P2POp> ops) = 0;

  virtual void barrier() = 0;

  // Collective over this communicator: ranks giving the same color form a new communicator,
  // ordered by key (then by rank). A negative color means "not a member": returns nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The same collective where every member knows the group: `members` are this communicator's
  // ranks in group-rank order, the same list on each member (empty: not a member, nullptr). The
  // default is split(members.front(), position in members); a backend that cannot ask the other
  // ranks (MetaCommunicator) builds the group from the list.
  virtual std::unique_ptr<Communicator> split_group(const std::vector<int>& members);

  // Ends the whole job from this rank (MPI_Abort / ncclCommAbort): for fatal errors only.
  [[noreturn]] virtual void abort(int code) = 0;

 private:
  std::string name_ = "unnamed";
};

// all_to_allv's argument checks (counts per rank, sums against the tensors), shared by the backends.
void check_all_to_allv(const Communicator& comm, const Tensor& in, std::span<const int64_t> send_counts,
                       const Tensor& out, std::span<const int64_t> recv_counts);

// "group dp (world ranks 0,2)", or "group dp" when the ranks are unknown.
std::string describe_group(const Communicator& comm);

}  // namespace parallel
