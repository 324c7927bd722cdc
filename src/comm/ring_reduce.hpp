#pragma once
// Sums over groups of three or more ranks as a ring of point-to-point messages through buffers the
// group keeps (internal; mpi_communicator.hpp states when MpiCommunicator uses them).
//
// Open MPI's MPI_Iallreduce and MPI_Ireduce_scatter (libnbc) malloc a temporary of the whole
// message at every call; above glibc's mmap threshold that memory is mapped and page-faulted afresh
// each time. A ring needs no such temporary: the message is cut into pieces, and each piece is
// reduced with NCCL's ring algorithm (p - 1 reduce-scatter steps, then, for an all-reduce, p - 1
// all-gather steps), every step one message to the right-hand neighbour (rank + 1) and one from the
// left (rank - 1). What a rank receives goes into one of two buffers of at most piece_bytes / 4
// each, kept by the group from the first call on, so nothing is allocated afterwards.
//
// Summation order. Element i of rank c's chunk (chunk_of(n, p, c)) is summed once, on rank c, as
//     ((x[c+1] + x[c+2]) + x[c+3]) + ... + x[c+p]        (ranks mod p, so the last term is x[c])
// each + being pair_reduce(partial, local): fp32 arithmetic, 16-bit types widened and rounded back
// after every step (as NCCL does per step). An all-reduce then copies that result to every rank,
// so all ranks end bitwise identical; the order depends on the element's chunk, not on the rank.
//
// The work runs inside wait() / is_completed() of its own or a later ring operation of the same
// group, one operation at a time in call order (the same on every rank), on a duplicate of the
// group's communicator, so its messages never match the caller's own point-to-point traffic.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/in_order_queue.hpp"
#include "parallel/communicator.hpp"

namespace parallel::detail {

struct MpiGroupLabel;
class RingWork;

struct RingState {
  MPI_Comm comm = MPI_COMM_NULL;  // duplicate of the group's, for these messages alone
  std::shared_ptr<const MpiGroupLabel> label;
  int rank = 0;
  int size = 0;
  int64_t piece_bytes = 0;  // the two receive buffers hold piece_bytes / 4 each
  std::unique_ptr<std::byte[]> buffers;
  int64_t buffer_bytes = 0;      // both buffers together
  InOrderQueue<RingWork> queue;  // pending operations

  std::byte* buffers_of(int64_t bytes);  // grows (never shrinks) to `bytes` for both together
};

// The sum over the group of `tensor` in place (`out` undefined: all-reduce), or of `tensor` into
// `out` (rank r's chunk_of(numel, size, r): reduce-scatter). F32, BF16 or F16; `out` may be
// `tensor`'s own chunk (the slot this rank receives) but must not overlap it otherwise. The handle
// keeps both tensors alive until the operation completes.
std::shared_ptr<Work> ring_sum(std::shared_ptr<RingState> state, const char* operation, Tensor tensor,
                               Tensor out);

}  // namespace parallel::detail
