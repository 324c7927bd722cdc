// Training-step time of a small GPT under data parallelism with overlapped gradient reduction on
// and off (plain all-reduce DDP and the distributed optimizer's reduce-scatter + all-gather), and
// under ZeRO-3 (optimizer.sharding optim_grads_params) with the next unit's gather prefetched
// (prefetch_units 1) or gathered on demand (0).
//
//   mpirun -np 2 ./bin/bench_ddp_overlap
//
// Every rank runs every benchmark in lockstep with a fixed iteration count (adaptive counts would
// differ between ranks and deadlock the collectives). Each iteration's time is the slowest rank's;
// only rank 0 prints. Counter buckets_early: buckets whose reduction started before the backward
// of the last transformer layer (layer 0) finished, in the last iteration.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <vector>

#include "mpi_benchmark.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/runtime.hpp"

namespace parallel {
namespace {

ModelConfig bench_config() {
  ModelConfig c;
  c.num_layers = 4;
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.vocab_size = 2048;
  c.seq_length = 128;
  return c;
}

constexpr int kMicroBatches = 2;

// zero3_prefetch >= 0: ZeRO-3 with that many units prefetched (overlap, distributed ignored).
void bench_step(benchmark::State& state, MpiCommunicator& world, bool overlap, bool distributed,
                int zero3_prefetch = -1) {
  const ModelConfig c = bench_config();
  auto solo = world.split(world.rank(), 0);
  GPTModel model(c, {0, c.num_layers, true, true}, {.seed = 1}, *solo);
  OptimizerConfig oc;
  oc.distributed = distributed;
  oc.overlap_grad_reduce = overlap;
  oc.overlap_param_gather = overlap && distributed;
  oc.bucket_size = 500'000;  // ~8 buckets for ~3.9M parameters
  if (zero3_prefetch >= 0) {
    distributed = true;
    oc.distributed = true;
    oc.overlap_grad_reduce = oc.overlap_param_gather = false;
    oc.sharding = Sharding::OptimGradsParams;
    oc.prefetch_units = zero3_prefetch;
  }
  DataParallel ddp({&model}, world, DataParallelOptions::from(oc, Precision::FP32));
  const std::unique_ptr<Optimizer> opt = make_optimizer(ddp, oc, OptimizerGroups{nullptr, &world});
  std::vector<int32_t> ids(static_cast<std::size_t>(c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>((i * 131 + static_cast<std::size_t>(world.rank()) * 7) % 2048);
  const Tensor tokens = Tensor::from_vector(ids, {1, c.seq_length});
  const Tensor seed = Tensor::full({1}, 1.0 / (kMicroBatches * c.seq_length), DType::F32);

  auto step = [&] {
    ddp.zero_grad();
    for (int m = 0; m < kMicroBatches; ++m) {
      ddp.set_is_last_microbatch(m == kMicroBatches - 1);
      auto act = model.new_activations();
      model.forward(tokens, tokens, *act, static_cast<uint64_t>(m));
      model.backward(seed, *act);
    }
    ddp.finish_grad_sync();
    opt->step(1e-4);
  };
  step();  // untimed: first touch of every buffer
  world.barrier();
  for (auto _ : state) {
    ddp.events().clear();
    ddp.set_record_events(true);
    const double start = MPI_Wtime();
    step();
    ddp.finish_param_gather();
    state.SetIterationTime(bench::slowest_over_ranks(world, MPI_Wtime() - start));
  }
  // Without overlap there are no grad-ready events: every launch is in finish_grad_sync().
  int early = 0, launched = 0;
  for (const DdpEvent& e : ddp.events()) {
    if (e.kind == DdpEvent::Kind::GradReady && e.param->name.starts_with("layers.0.")) {
      early = launched;
      break;
    }
    launched += e.kind == DdpEvent::Kind::ReduceLaunched;
  }
  state.counters["buckets"] = static_cast<double>(ddp.buffer().buckets().size());
  state.counters["buckets_early"] = early;
}

void register_benchmarks(MpiCommunicator& world) {
  for (bool distributed : {false, true})
    for (bool overlap : {false, true}) {
      const std::string name = std::string(distributed ? "distributed_optimizer" : "all_reduce") +
                               (overlap ? "/overlap_on" : "/overlap_off");
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&world, overlap, distributed](benchmark::State& state) {
                                     bench_step(state, world, overlap, distributed);
                                   })
          ->Iterations(5)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  for (int prefetch : {0, 1}) {
    const std::string name = std::string("zero3/prefetch_") + (prefetch > 0 ? "on" : "off");
    benchmark::RegisterBenchmark(
        name.c_str(),
        [&world, prefetch](benchmark::State& state) { bench_step(state, world, false, true, prefetch); })
        ->Iterations(5)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace parallel

int main(int argc, char** argv) {
  return parallel::bench::run_mpi_benchmarks(argc, argv, parallel::register_benchmarks);
}
