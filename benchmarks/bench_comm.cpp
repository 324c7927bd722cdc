// Bandwidth of the MPI backend's collectives, reported like nccl-tests (algbw and busbw).
//
//   mpirun -np 4 ./bin/bench_comm [--benchmark_filter=all_reduce]
//   (PARALLEL_BENCH_PIECE_BYTES=N: the two-rank all-reduce's and the ring's piece size;
//    PARALLEL_BENCH_P2P_MIN_BYTES=N: the smallest sum that goes point to point, 0 for every size and
//    a large N for MPI's collectives at every size: for choosing the defaults)
//
// Every rank runs every benchmark in lockstep, so iteration counts are fixed per size: Google
// Benchmark's adaptive counts differ between ranks and would leave some ranks waiting in a
// collective that others never enter. Each iteration's time is the slowest rank's (the collective
// is done when the last rank is done), and only rank 0 prints.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mpi_benchmark.hpp"
#include "parallel/runtime.hpp"

namespace parallel {
namespace {

std::string size_name(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes >> 10) + "KiB";
}

// Large transfers take long enough per iteration that a few give a stable mean.
int64_t iterations_for(int64_t bytes) {
  if (bytes <= (int64_t{256} << 10)) return 50;
  if (bytes <= (int64_t{4} << 20)) return 10;
  return 3;
}

// busbw / algbw, from nccl-tests' PERFORMANCE.md: the fraction of the buffer each rank's link must
// carry, which makes numbers comparable across rank counts.
double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 1.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all")
    return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast, ping-pong
}

// Runs `op` once untimed (connection set-up, first-touch of buffers), then times every iteration
// as the maximum over ranks.
void run_timed(benchmark::State& state, MpiCommunicator& comm, const std::string& op_name, int64_t bytes,
               const std::function<void()>& op, double time_scale = 1.0) {
  op();
  comm.barrier();
  double total = 0;
  for (auto _ : state) {
    const double start = MPI_Wtime();
    op();
    const double slowest = bench::slowest_over_ranks(comm, (MPI_Wtime() - start) * time_scale);
    state.SetIterationTime(slowest);
    total += slowest;
  }
  const double seconds = total / static_cast<double>(state.iterations());
  const double algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * bus_factor(op_name, comm.size());
}

void bench(benchmark::State& state, MpiCommunicator& comm, const std::string& op, DType dtype,
           int64_t bytes) {
  const int p = comm.size(), r = comm.rank();
  int64_t n = bytes / static_cast<int64_t>(dtype_size(dtype));
  if (op == "all_to_all") n -= n % p;
  const int64_t moved = n * static_cast<int64_t>(dtype_size(dtype));
  const Chunk mine = chunk_of(n, p, r);

  if (op == "all_reduce") {
    Tensor t = Tensor::full({n}, 1.0, dtype);
    run_timed(state, comm, op, moved, [&] { comm.all_reduce(t, ReduceOp::Sum, false); });
  } else if (op == "reduce_scatter") {
    Tensor in = Tensor::full({n}, 1.0, dtype);
    Tensor out = Tensor::empty({mine.count}, dtype);
    run_timed(state, comm, op, moved, [&] { comm.reduce_scatter(in, out, ReduceOp::Sum, false); });
  } else if (op == "all_gather") {
    Tensor in = Tensor::full({mine.count}, 1.0, dtype);
    Tensor out = Tensor::empty({n}, dtype);
    run_timed(state, comm, op, moved, [&] { comm.all_gather(in, out, false); });
  } else if (op == "broadcast") {
    Tensor t = Tensor::full({n}, 1.0, dtype);
    run_timed(state, comm, op, moved, [&] { comm.broadcast(t, 0, false); });
  } else if (op == "all_to_all") {
    Tensor in = Tensor::full({n}, 1.0, dtype);
    Tensor out = Tensor::empty({n}, dtype);
    run_timed(state, comm, op, moved, [&] { comm.all_to_all(in, out, false); });
  } else if (op == "ping_pong") {
    // Ranks 0 and 1 bounce the buffer; the rest only take part in the timing reduction. Half a
    // round trip is one transfer.
    Tensor t = Tensor::full({n}, 1.0, dtype);
    run_timed(
        state, comm, op, moved,
        [&] {
          if (r == 0) {
            comm.send(t, 1, 0)->wait();
            comm.recv(t, 1, 0)->wait();
          } else if (r == 1) {
            comm.recv(t, 0, 0)->wait();
            comm.send(t, 0, 0)->wait();
          }
        },
        0.5);
  }
}

// PARALLEL_BENCH_PIECE_BYTES and PARALLEL_BENCH_P2P_MIN_BYTES set the point-to-point sums' piece
// size and threshold (mpi_communicator.hpp).
void register_benchmarks(MpiCommunicator& comm) {
  if (const char* piece = std::getenv("PARALLEL_BENCH_PIECE_BYTES"))
    comm.set_reduce_piece_bytes(std::atoll(piece));
  if (const char* min_bytes = std::getenv("PARALLEL_BENCH_P2P_MIN_BYTES"))
    comm.set_point_to_point_sum_min_bytes(std::atoll(min_bytes));
  const std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather",
                                        "broadcast",  "all_to_all",     "ping_pong"};
  for (const std::string& op : ops) {
    if (op == "ping_pong" && comm.size() < 2) continue;
    for (DType dtype : {DType::F32, DType::BF16})
      for (int64_t bytes :
           {int64_t{4} << 10, int64_t{16} << 10, int64_t{64} << 10, int64_t{256} << 10, int64_t{1} << 20,
            int64_t{4} << 20, int64_t{8} << 20, int64_t{16} << 20, int64_t{32} << 20, int64_t{64} << 20}) {
        const std::string name = fmt::format("{}/{}/{}", op, dtype_name(dtype), size_name(bytes));
        benchmark::RegisterBenchmark(
            name.c_str(),
            [&comm, op, dtype, bytes](benchmark::State& state) { bench(state, comm, op, dtype, bytes); })
            ->Iterations(iterations_for(bytes))
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
  }
}

}  // namespace
}  // namespace parallel

int main(int argc, char** argv) {
  return parallel::bench::run_mpi_benchmarks(argc, argv, parallel::register_benchmarks);
}
