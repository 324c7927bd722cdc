#pragma once
// Process start-up and shut-down: rank discovery, MPI, logging, and the fatal-error path.
//
// A program does
//     int main(int argc, char** argv) {
//       return parallel::run_main(argc, argv, [](parallel::Runtime& rt) { ... return 0; });
//     }
// and gets: MPI initialised (or adopted if the caller already did), the world communicator, rank
// and host in every log line, and an uncaught exception on any rank logged once with its rank and
// host and turned into MPI_Abort, so the other ranks end within seconds instead of hanging.
//
// It starts MPI and hands out the world's MpiCommunicator, so it belongs to the communication layer
// (src/comm/runtime.cpp); reading the launcher's environment needs no MPI and stays in the core
// (launch.hpp).
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "parallel/launch.hpp"
#include "parallel/mpi_communicator.hpp"

namespace parallel {

class Runtime {
 public:
  // Initialises MPI (MPI_THREAD_FUNNELED) unless it already is, checks that MPI's view of the job
  // agrees with the launcher's, and sets up logging and the error context. Before MPI (and so before
  // CUDA) starts it sets two environment variables, each only where the user has not: Open MPI's
  // mpi_yield_when_idle to 0, and in a job of several ranks CUDA_MODULE_LOADING to EAGER (a kernel
  // loaded lazily can wait for an NCCL kernel spinning on a peer: see runtime.cpp).
  Runtime(int* argc, char*** argv);
  ~Runtime();  // finalises MPI if this object initialised it
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const LaunchInfo& launch() const { return launch_; }
  int rank() const { return launch_.rank; }
  int world_size() const { return launch_.world_size; }
  MpiCommunicator& world() { return *world_; }

 private:
  LaunchInfo launch_;
  std::unique_ptr<MpiCommunicator> world_;
  bool owns_mpi_ = false;
};

// Runs `body` inside a Runtime. A ConfigError thrown on every rank alike prints one line (from rank
// 0) and returns 2 on every rank; an AgreedStop thrown on every rank alike prints one line and
// returns its exit code; any other exception logs "rank R on HOST: message" and aborts the job with
// MPI_Abort.
int run_main(int argc, char** argv, const std::function<int(Runtime&)>& body);

// Logs `message` with rank and host, then ends the whole job. Safe to call from any rank at any time.
[[noreturn]] void fatal(const std::string& message);

}  // namespace parallel
