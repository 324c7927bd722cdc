#pragma once
// Google Benchmark under mpirun. Every rank runs every benchmark with the same FIXED iteration count
// (adaptive counts would differ between ranks and deadlock their collectives); an iteration's time
// is the slowest rank's; only rank 0 reports and writes --benchmark_out.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstring>
#include <functional>
#include <vector>

#include "parallel/runtime.hpp"

namespace parallel::bench {

// The slowest rank's seconds for an iteration that took `local` seconds here.
inline double slowest_over_ranks(MpiCommunicator& comm, double local) {
  double slowest = 0;
  PARALLEL_MPI_CHECK(MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm.handle()));
  return slowest;
}

// Runs `register_benchmarks(world)` and then the benchmarks on every rank, reporting from rank 0.
inline int run_mpi_benchmarks(int argc, char** argv,
                              const std::function<void(MpiCommunicator&)>& register_benchmarks) {
  class NullReporter : public benchmark::BenchmarkReporter {
   public:
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>&) override {}
  };
  return run_main(argc, argv, [&](Runtime& rt) {
    // Only rank 0 may write --benchmark_out, or every rank would truncate and write the same file.
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i)
      if (rt.rank() == 0 || std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
    int nargs = static_cast<int>(args.size());
    benchmark::Initialize(&nargs, args.data());
    if (benchmark::ReportUnrecognizedArguments(nargs, args.data())) return 1;
    register_benchmarks(rt.world());
    if (rt.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      NullReporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    benchmark::Shutdown();
    return 0;
  });
}

}  // namespace parallel::bench
