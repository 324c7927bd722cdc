// The NCCL communicator for builds without the CUDA backend (its real one is
// src/cuda/nccl_communicator.cpp): creating one says so plainly. It lives in the communication
// layer, beside the communicators, so that the core's CUDA seam (core/cuda_backend_none.cpp) knows
// nothing of NCCL.
#include "parallel/build_config.hpp"
#if !PARALLEL_HAVE_CUDA
#include "parallel/error.hpp"
#include "parallel/nccl_communicator.hpp"

namespace parallel {

std::unique_ptr<Communicator> make_nccl_communicator(MpiCommunicator&, Device, NcclOptions) {
  PARALLEL_FAIL(
      "this build of libparallel has no CUDA backend (configure with PARALLEL_WITH_CUDA=ON on a "
      "machine with the CUDA toolkit)");
}

}  // namespace parallel
#endif
