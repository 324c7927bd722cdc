// One rank fails while the others are already inside a collective that can never complete.
// run_main must log the failure with its rank and turn it into MPI_Abort, so the whole job ends
// promptly instead of hanging; expect_abort.sh checks exactly that.
#include "parallel/runtime.hpp"

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [](parallel::Runtime& rt) {
    auto& comm = rt.world();
    parallel::Tensor t = parallel::Tensor::full({1024}, 1.0, parallel::DType::F32);
    for (int step = 0; step < 3; ++step) comm.all_reduce(t, parallel::ReduceOp::Sum, false);
    if (rt.rank() == 1) throw parallel::Error("injected failure on rank 1");
    // Rank 1 never joins: without the abort this blocks forever.
    comm.all_reduce(t, parallel::ReduceOp::Sum, false);
    return 0;
  });
}
