#pragma once
// Where this process sits in the job, read from the launcher's environment (no MPI needed): the
// Runtime (runtime.hpp) checks it against MPI at start-up, and the trainer reads the local rank and
// size from it to pick a GPU and share the host's memory.
#include <functional>
#include <string>

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

}  // namespace parallel
