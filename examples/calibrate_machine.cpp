// calibrate_machine: measures this machine and writes its hardware description (hardware.hpp) for
// the planner. Run it as two ranks with one OpenMP thread each:
//
//   OMP_NUM_THREADS=1 mpirun -np 2 build/bin/calibrate_machine --out configs/hardware/this_cpu.yaml
//
// The device is one core (node.devices: the cores), and ranks run one OpenMP thread each; a job with
// more ranks than cores time-shares them (the cost model's share, hardware.hpp). Rank 0 times the
// kernels while rank 1 sleeps (polling a message every 10 ms); then both time MPI messages:
//   - GEMM (ops::gemm, fp32 and bf16) on m = n = k from 32 to 1024: the best rate per dtype is the
//     peak, fp32's rate by size over its peak the efficiency curve;
//   - gelu_forward on a cache-resident tensor (8 FLOPs an element): the vector rate;
//   - ops::add on 3 x 128 MiB: memory bandwidth (bytes read and written over time);
//   - ops::add on one element: the per-op overhead;
//   - ping-pong of 8 bytes (latency) and 4 MiB (bandwidth) between the two ranks.
// Kernels are timed in the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that other processes
// on a shared machine slow the measurement but do not change it; messages by the fastest of many
// round trips in wall time (a round trip that was not descheduled).
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "parallel/hardware.hpp"
#include "parallel/ops.hpp"
#include "parallel/runtime.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU seconds per call of `f` on this thread: the best of 5 rounds, each at least `min_s` long.
double time_per_call(const std::function<void()>& f, double min_s = 0.05) {
  f();  // warm up
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    int64_t calls = 0;
    const double start = thread_seconds();
    double elapsed = 0;
    do {
      f();
      ++calls;
      elapsed = thread_seconds() - start;
    } while (elapsed < min_s);
    best = std::min(best, elapsed / static_cast<double>(calls));
  }
  return best;
}

// Wall seconds of the fastest of `n` calls of `f`.
double fastest_call(const std::function<void()>& f, int n) {
  f();
  double best = 1e30;
  for (int i = 0; i < n; ++i) {
    const auto start = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures this machine and writes its hardware description for the planner"};
  std::string out_path, name = "this_cpu";
  app.add_option("--out", out_path, "where to write the YAML (default: print it)");
  app.add_option("--name", name, "the description's name");
  CLI11_PARSE(app, argc, argv);
  using namespace parallel;
  return run_main(argc, argv, [&](Runtime& rt) {
    MpiCommunicator& world = rt.world();
    PARALLEL_CHECK(world.size() == 2, "calibrate_machine: run it as 2 ranks (mpirun -np 2), got {}",
                   world.size());
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    PARALLEL_CHECK(omp != nullptr && std::atoi(omp) == 1,
                   "calibrate_machine: run it with OMP_NUM_THREADS=1 (the device is one core), got {}",
                   omp == nullptr ? "unset" : omp);
    HardwareDescription hw;
    hw.name = name;
    std::string notes;
    Tensor flag = Tensor::zeros({1}, DType::U8);
    if (world.rank() == 1) {
      WorkHandle done = world.recv(flag, 0, 0);
      while (!done->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      // GEMM by size, fp32 and bf16.
      std::vector<std::pair<double, double>> fp32_rate;
      for (DType dt : {DType::F32, DType::BF16}) {
        double best = 0;
        for (int n : {32, 64, 128, 256, 512, 1024}) {
          Tensor a = Tensor::full({n, n}, 0.5f, dt), b = Tensor::full({n, n}, 0.25f, dt),
                 c = Tensor::empty({n, n}, dt);
          const double t = time_per_call([&] { ops::gemm(a, false, b, false, c); });
          const double rate = 2.0 * n * n * n / t;
          best = std::max(best, rate);
          if (dt == DType::F32) fp32_rate.emplace_back(n, rate);
          notes += fmt::format("gemm {} {}^3: {:.2f} GFLOP/s\n", dtype_name(dt), n, rate / 1e9);
        }
        hw.matmul_tflops[dt] = best / 1e12;
      }
      const double peak = hw.matmul_tflops[DType::F32] * 1e12;
      for (const auto& [n, rate] : fp32_rate)
        hw.matmul_efficiency.emplace_back(n, std::min(1.0, rate / peak));
      {
        Tensor x = Tensor::full({64 * 1024}, 0.5f, DType::F32), y = Tensor::empty({64 * 1024}, DType::F32);
        hw.vector_tflops = 8.0 * 64 * 1024 / time_per_call([&] { ops::gelu_forward(x, y); }) / 1e12;
      }
      {
        const int64_t n = 32 * 1024 * 1024;
        Tensor a = Tensor::full({n}, 1.0f, DType::F32), b = Tensor::full({n}, 2.0f, DType::F32),
               c = Tensor::empty({n}, DType::F32);
        hw.memory_bandwidth_GBps = 3.0 * 4 * n / time_per_call([&] { ops::add(a, b, c); }, 0.3) / 1e9;
      }
      {
        Tensor a = Tensor::full({1}, 1.0f, DType::F32), b = Tensor::full({1}, 2.0f, DType::F32),
               c = Tensor::empty({1}, DType::F32);
        hw.op_overhead_us = time_per_call([&] { ops::add(a, b, c); }) * 1e6;
      }
      world.send(flag, 1, 0)->wait();
    }
    // Ping-pong: one-way time = round trip / 2.
    auto one_way = [&](int64_t bytes, int trips) {
      Tensor t = Tensor::zeros({bytes}, DType::U8);
      return fastest_call(
                 [&] {
                   if (world.rank() == 0) {
                     world.send(t, 1, 0)->wait();
                     world.recv(t, 1, 0)->wait();
                   } else {
                     world.recv(t, 0, 0)->wait();
                     world.send(t, 0, 0)->wait();
                   }
                 },
                 trips) /
             2;
    };
    const double small = one_way(8, 2000);
    const int64_t big_bytes = 4 << 20;
    const double big = one_way(big_bytes, 100);
    if (world.rank() != 0) return 0;
    hw.node_link.latency_us = small * 1e6;
    hw.node_link.bandwidth_GBps = static_cast<double>(big_bytes) / std::max(big - small, 1e-9) / 1e9;
    hw.node_link.shared_by = 1;
    hw.cluster_link = hw.node_link;  // one node: never spanned; the node's figures stand in
    hw.devices_per_node = cores;
    double load[3] = {0, 0, 0};
    (void)getloadavg(load, 3);
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    const std::string comment = fmt::format(
        "Measured by calibrate_machine (examples/calibrate_machine.cpp) on {}, {} cores, {}; load average "
        "{:.2f} while measuring.\n"
        "Command: OMP_NUM_THREADS=1 mpirun -np 2 calibrate_machine --out <this file>\n"
        "device = one core (kernels timed in thread CPU time); links.cluster copies links.node (one "
        "machine).\n{}",
        cpu_model(), cores, date, load[0], notes);
    const std::string yaml = hardware_yaml(hw, comment);
    (void)parse_hardware(yaml, out_path.empty() ? "calibration" : out_path);  // it must read back
    if (out_path.empty()) {
      std::printf("%s", yaml.c_str());
    } else {
      std::ofstream(out_path) << yaml;
      std::printf("wrote %s\n", out_path.c_str());
    }
    return 0;
  });
}
