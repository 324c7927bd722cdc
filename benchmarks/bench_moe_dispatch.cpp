// Bandwidth of the MoE token dispatch (model.moe_token_dispatcher: alltoall): what MoELayer::forward
// does on the wire per layer and micro-batch - the per-expert counts exchanged with all_to_all,
// then the permuted rows with the variable-size Communicator::all_to_allv.
//
//   mpirun -np 4 ./bin/bench_moe_dispatch [--benchmark_filter=bf16]
//
// Each rank routes T tokens of width h to top-2 of 8 experts drawn uniformly at random (a balanced
// router; seed fixed per rank), so a rank sends about (p-1)/p of its 2T rows to the others with
// uneven block sizes. Reported like nccl-tests' alltoall: algbw = bytes of this rank's permuted rows
// (2 T h element bytes) / time, busbw = algbw * (p-1)/p (the fraction that crosses a link). Each
// iteration is the slowest rank's time; the count exchange is included (it is part of the dispatch).
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "mpi_benchmark.hpp"
#include "parallel/runtime.hpp"

namespace parallel {
namespace {

constexpr int kExperts = 8, kTopk = 2;

void dispatch(benchmark::State& state, MpiCommunicator& comm, DType dtype, int64_t tokens, int64_t h) {
  Communicator& c = comm;
  const int p = c.size();
  // Rows per destination rank (experts split evenly over the ranks; p must divide 8).
  std::mt19937 gen(1234 + static_cast<unsigned>(c.rank()));
  std::uniform_int_distribution<int> expert(0, kExperts - 1);
  std::vector<int64_t> per_expert(kExperts, 0);
  for (int64_t t = 0; t < tokens * kTopk; ++t) ++per_expert[static_cast<std::size_t>(expert(gen))];
  Tensor counts = Tensor::from_vector(per_expert, {kExperts});
  Tensor received_counts = Tensor::empty({kExperts}, DType::I64);
  c.all_to_all(counts, received_counts);
  const int local = kExperts / p;
  std::vector<int64_t> send(static_cast<std::size_t>(p), 0), recv(static_cast<std::size_t>(p), 0);
  for (int r = 0; r < p; ++r)
    for (int e = 0; e < local; ++e) {
      send[static_cast<std::size_t>(r)] += per_expert[static_cast<std::size_t>(r * local + e)] * h;
      recv[static_cast<std::size_t>(r)] += received_counts.data<int64_t>()[r * local + e] * h;
    }
  int64_t n_in = 0, n_out = 0;
  for (int r = 0; r < p; ++r) {
    n_in += send[static_cast<std::size_t>(r)];
    n_out += recv[static_cast<std::size_t>(r)];
  }
  Tensor in = Tensor::full({n_in}, 1.0, dtype);
  Tensor out = Tensor::empty({n_out}, dtype);
  auto op = [&] {
    c.all_to_all(counts, received_counts);
    c.all_to_allv(in, send, out, recv);
  };
  op();
  comm.barrier();
  double total = 0;
  for (auto _ : state) {
    const double start = MPI_Wtime();
    op();
    const double slowest = bench::slowest_over_ranks(comm, MPI_Wtime() - start);
    state.SetIterationTime(slowest);
    total += slowest;
  }
  const double seconds = total / static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(tokens * kTopk * h) * static_cast<double>(dtype_size(dtype));
  const double algbw = seconds > 0 ? bytes / seconds / 1e9 : 0.0;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * (p - 1) / std::max(p, 1);
  state.counters["MiB_per_rank"] = bytes / (1 << 20);
}

void register_benchmarks(MpiCommunicator& comm) {
  if (kExperts % comm.size() != 0) return;
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t tokens : {512, 2048, 8192}) {
      const int64_t h = 1024;
      const std::string name = fmt::format("alltoall_dispatch/{}/T{}/h{}", dtype_name(dtype), tokens, h);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&comm, dtype, tokens, h](benchmark::State& state) {
                                     dispatch(state, comm, dtype, tokens, h);
                                   })
          ->Iterations(tokens >= 8192 ? 5 : 20)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
}

}  // namespace
}  // namespace parallel

int main(int argc, char** argv) { return parallel::bench::run_mpi_benchmarks(argc, argv, parallel::register_benchmarks); }
