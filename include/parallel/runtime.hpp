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
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "parallel/mpi_communicator.hpp"

namespace parallel {

// Where this process's place in the job came from.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string source;  // "mpi (already initialised)", "open-mpi", "slurm", "torchrun", "single process"
  std::string host;
};

// Reads the launcher's environment variables, in this order: Open MPI (OMPI_COMM_WORLD_*), Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), PMI (PMI_RANK, PMI_SIZE), torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE); none of them means one process alone. `env` maps
// names to values (tests pass a table; the runtime passes the process environment). Inconsistent
// values (rank >= world size, a non-number) throw parallel::Error naming the variable.
LaunchInfo discover_launch(const std::function<const char*(const char*)>& env);
LaunchInfo discover_launch_from_environment();

class Runtime {
 public:
  // Initialises MPI (MPI_THREAD_FUNNELED) unless it already is, checks that MPI's view of the job
  // agrees with the launcher's, and sets up logging and the error context.
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
