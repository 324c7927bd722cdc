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

// Creates a NCCL communicator over the same ranks as `bootstrap` (rank 0 makes the unique id and
// broadcasts it over MPI). Each rank uses the GPU `device`, and orders work after `compute_stream`.
std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator& bootstrap, Device device,
                                                     Stream compute_stream = {});

}  // namespace parallel
