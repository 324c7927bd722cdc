#pragma once
// The NCCL backend: CUDA tensors. Operations run on the communicator's own stream, ordered after
// the caller's stream with an event; Work::wait() makes the caller's stream wait on the completion
// event (the host does not block), so compute can overlap communication.
//
// Available only in builds with PARALLEL_HAVE_CUDA; creating one elsewhere throws.
#include <memory>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace parallel {

struct NcclOptions {
  // The stream the caller computes on: every operation starts after the work queued there, and
  // Work::wait() makes it wait for the operation. {} is the legacy default stream.
  Stream compute_stream{};
  // CPU tensors (the scalars a trainer reduces: a loss, a norm, a flag, checkpoint metadata) go
  // over the MPI communicator this one was bootstrapped from, which must then outlive it. Without
  // it a CPU tensor is an error. Both backends see every rank's calls in the same order, so mixing
  // them cannot deadlock; NCCL calls never block the host.
  bool host_fallback = true;
  // Point-to-point over dedicated links: for each direction between ring neighbours (rank r and
  // r +- 1 mod size) a two-rank NCCL communicator with its own stream. NCCL sends and receives
  // block the GPU stream they run on until matched; on one shared stream a send to a neighbour
  // waiting for its own send to us would deadlock (NCCL asks for such pairs to be grouped). On
  // per-direction links a link carries messages one way, in the order both sides post them, so a
  // pipeline schedule that is deadlock-free over non-blocking MPI sends stays so here. Messages to
  // other peers use the main communicator. Costs 2 (size 2) or 4 communicators per rank: meant
  // for the pipeline group.
  bool p2p_links = false;
};

// Creates a NCCL communicator over the same ranks as `bootstrap` (rank 0 makes the unique id and
// broadcasts it over MPI). Each rank uses the GPU `device`. Collective over `bootstrap`.
std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, Device device,
                                                     NcclOptions options = {});

}  // namespace parallel
