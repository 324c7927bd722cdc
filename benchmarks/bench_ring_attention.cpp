// Ring attention (parallel.context_comm: p2p; include/parallel/context_parallel.hpp) with the K/V
// and dK/dV transfers overlapped with the block computations, against the same ring waiting for
// each transfer before computing; and the ring's transfers alone (no computation), for scale.
// Forward + backward of one attention layer over the whole world as the cp group.
//
//   mpirun -np 2 ./bin/bench_ring_attention      (or -np 4)
//
// Every rank runs every benchmark in lockstep with a fixed iteration count; an iteration's time is
// the slowest rank's; only rank 0 prints (mpi_benchmark.hpp). Counters: kv_MB, one K/V message;
// wait_ms, rank 0's time blocked waiting for transfers per iteration (comm_wait_seconds), the part of
// the communication the block computations did not hide.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "mpi_benchmark.hpp"
#include "parallel/communicator.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/runtime.hpp"

namespace parallel {
namespace {

constexpr int64_t kHeads = 8, kHeadDim = 64;

Tensor random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 - 0.5);
  }
  return t;
}

void bench_ring(benchmark::State& state, MpiCommunicator& world, int64_t seq, bool overlap) {
  const int c = world.size();
  const int64_t local = seq / c;
  cp::Attention attention(&world, ContextComm::P2P, 1.0f / std::sqrt(static_cast<float>(kHeadDim)));
  attention.set_overlap(overlap);
  const Shape shape{local, 1, kHeads, kHeadDim};
  const Tensor q = random(shape, 1 + world.rank()), k = random(shape, 11 + world.rank()),
               v = random(shape, 21 + world.rank()), dout = random(shape, 31 + world.rank());
  Tensor dq = Tensor::empty(shape, DType::F32), dk = Tensor::empty(shape, DType::F32),
         dv = Tensor::empty(shape, DType::F32);
  auto step = [&] {
    cp::Attention::Saved saved;
    attention.forward(q, k, v, saved);
    attention.backward(dout, saved, dq, dk, dv);
  };
  step();  // untimed: first touch
  world.barrier();
  double waited = 0;
  for (auto _ : state) {
    const double start = MPI_Wtime(), waited_before = comm_wait_seconds();
    step();
    waited += comm_wait_seconds() - waited_before;
    state.SetIterationTime(bench::slowest_over_ranks(world, MPI_Wtime() - start));
  }
  state.counters["kv_MB"] = 2.0 * static_cast<double>(q.nbytes()) / 1e6;
  // Rank 0's time blocked in the transfers' waits per iteration: what the computation did not hide.
  state.counters["wait_ms"] = 1e3 * waited / static_cast<double>(state.iterations());
}

// The ring's messages alone: c - 1 K/V exchanges forward, c - 1 K/V and c dK/dV (fp32) backward.
void bench_transfers(benchmark::State& state, MpiCommunicator& world, int64_t seq) {
  const int c = world.size(), i = world.rank();
  const int64_t local = seq / c;
  const Shape kv_shape{2, local, 1, kHeads, kHeadDim};
  Tensor kv = random(kv_shape, 3), incoming = Tensor::empty(kv_shape, DType::F32);
  const int next = (i + 1) % c, prev = (i + c - 1) % c;
  auto exchange = [&] {
    const P2POp ops[] = {{P2POp::Kind::Send, kv, next, 0}, {P2POp::Kind::Recv, incoming, prev, 0}};
    world.batch_p2p(ops)->wait();
  };
  world.barrier();
  for (auto _ : state) {
    const double start = MPI_Wtime();
    for (int n = 0; n < 3 * c - 2; ++n) exchange();
    state.SetIterationTime(bench::slowest_over_ranks(world, MPI_Wtime() - start));
  }
  state.counters["kv_MB"] = static_cast<double>(kv.nbytes()) / 1e6;
}

// Packed documents (ops::AttentionMask::doc_start): short documents (16 to 63 tokens) filling half
// the sequence, then one long one; ring attention on the zigzag and on the balanced layout
// (parallel.context_layout). Each rank's q, k, v are its rows of the same global tensors, so both
// layouts compute the same attention; the time is the slowest rank's, which the balance shortens.
void bench_documents(benchmark::State& state, MpiCommunicator& world, int64_t seq, bool balanced) {
  const int c = world.size();
  Tensor doc_start = Tensor::empty({1, seq}, DType::I32);
  int32_t* ds = doc_start.data<int32_t>();
  int64_t p = 0;
  for (int k = 0; p < seq / 2; ++k)
    for (int64_t i = 0, n = 16 + (k * 37) % 48; i < n && p < seq / 2; ++i, ++p)
      ds[p] = static_cast<int32_t>(p - i);
  for (const int64_t start = p; p < seq; ++p) ds[p] = static_cast<int32_t>(start);
  const std::vector<cp::LayerMix> mix{{0, 1.0}};
  auto layout = std::make_shared<const cp::Layout>(balanced ? cp::balanced_layout(doc_start, seq, c, mix)
                                                            : cp::Layout::zigzag(seq, c));
  cp::Attention attention(&world, ContextComm::P2P, 1.0f / std::sqrt(static_cast<float>(kHeadDim)));
  const Shape shape{seq / c, 1, kHeads, kHeadDim};
  // The whole sequence [S, 1, h, d] -> this rank's rows, run by run.
  const auto mine = [&](uint64_t seed) {
    const Tensor whole = random({seq, 1, kHeads, kHeadDim}, seed);
    Tensor out = Tensor::empty(shape, DType::F32);
    for (const cp::Segment& run : layout->runs(world.rank())) {
      Tensor to = out.narrow(0, run.row, run.rows);
      to.copy_(whole.narrow(0, run.position, run.rows));
    }
    return out;
  };
  const Tensor q = mine(1), k = mine(11), v = mine(21), dout = mine(31);
  Tensor dq = Tensor::empty(shape, DType::F32), dk = Tensor::empty(shape, DType::F32),
         dv = Tensor::empty(shape, DType::F32);
  ops::AttentionMask mask;
  mask.doc_start = doc_start;
  auto step = [&] {
    cp::Attention::Saved saved;
    attention.forward(q, k, v, saved, mask, layout);
    attention.backward(dout, saved, dq, dk, dv);
  };
  step();
  world.barrier();
  for (auto _ : state) {
    const double start = MPI_Wtime();
    step();
    state.SetIterationTime(bench::slowest_over_ranks(world, MPI_Wtime() - start));
  }
  const std::vector<double> load = cp::rank_load(*layout, doc_start, mix);
  double total = 0, top = 0;
  for (double x : load) total += x, top = std::max(top, x);
  state.counters["max_over_mean_load"] = top * c / total;
}

void register_benchmarks(MpiCommunicator& world) {
  for (int64_t seq : {4096, 8192})
    for (bool balanced : {false, true}) {
      const std::string name =
          "ring_documents_fwd_bwd/seq_" + std::to_string(seq) + (balanced ? "/balanced" : "/zigzag");
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&world, seq, balanced](benchmark::State& state) { bench_documents(state, world, seq, balanced); })
          ->Iterations(5)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  for (int64_t seq : {1024, 4096}) {
    for (bool overlap : {false, true}) {
      const std::string name =
          "ring_fwd_bwd/seq_" + std::to_string(seq) + (overlap ? "/overlap_on" : "/overlap_off");
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&world, seq, overlap](benchmark::State& state) { bench_ring(state, world, seq, overlap); })
          ->Iterations(10)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
    const std::string name = "ring_transfers_only/seq_" + std::to_string(seq);
    benchmark::RegisterBenchmark(
        name.c_str(), [&world, seq](benchmark::State& state) { bench_transfers(state, world, seq); })
        ->Iterations(10)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace parallel

int main(int argc, char** argv) {
  return parallel::bench::run_mpi_benchmarks(argc, argv, parallel::register_benchmarks);
}
