// A peer that never arrives, for the communication watchdog (communicator.hpp): rank 1 sleeps while
// the others wait on it, in the operation named by argv[1]:
//   all_reduce  rank 0 in an all-reduce over a group named "pair" (world ranks 0 and 1)
//   recv        rank 0 in a receive from rank 1 over the same group
//   barrier     every rank but 1 in a barrier over the world
// With set_comm_timeout(argv[2]) the waiting rank must log the pending operation and group and end
// the job; watchdog.sh checks how long that takes and what the log says. A first, completed
// all-reduce shows that waits which finish in time are unaffected.
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "parallel/runtime.hpp"

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) {
    const std::string op = argc > 1 ? argv[1] : "all_reduce";
    parallel::set_comm_timeout(argc > 2 ? std::atof(argv[2]) : 2.0);
    auto& world = rt.world();
    auto pair = world.split(rt.rank() < 2 ? 0 : -1, rt.rank());
    if (pair) pair->set_name("pair");
    parallel::Tensor t = parallel::Tensor::full({1024}, 1.0, parallel::DType::F32);
    world.all_reduce(t, parallel::ReduceOp::Sum, false);  // everyone arrives: no expiry
    if (rt.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(120));  // the stalled peer
      return 0;
    }
    if (op == "barrier") {
      world.barrier();
    } else if (pair) {
      if (op == "recv")
        pair->recv(t, 1, 7)->wait();
      else
        pair->all_reduce(t, parallel::ReduceOp::Sum, false);
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(120));  // not in the pair: waits to be aborted
    }
    return 0;
  });
}
