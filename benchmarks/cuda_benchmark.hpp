#pragma once
// Google Benchmark on one GPU: the skip for machines without one, and timing with CUDA events.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "parallel/device.hpp"

namespace parallel::bench {

// True (and the benchmark marked skipped) on a machine without a GPU.
inline bool no_gpu(benchmark::State& state) {
  if (cuda_device_count() > 0) return false;
  state.SkipWithError("no CUDA device: GPU benchmarks skipped");
  return true;
}

// Runs fn once to warm up (a GEMM dispatcher makes its choice there), then once per iteration
// between CUDA events on the default stream, where the benchmarked calls run; sets the manual
// time and returns the mean seconds per iteration.
template <typename F>
double time_loop(benchmark::State& state, F&& fn) {
  double total = 0.0;
  int64_t iters = 0;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();
  cudaDeviceSynchronize();
  for (auto _ : state) {
    cudaEventRecord(start);
    fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
    total += ms / 1e3;
    iters++;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return iters > 0 ? total / static_cast<double>(iters) : 0.0;
}

}  // namespace parallel::bench
