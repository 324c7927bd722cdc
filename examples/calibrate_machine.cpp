// calibrate_machine: measures this machine and writes its hardware description (hardware.hpp) for
// the planner. Run it as the largest job to be planned here (up to 8 ranks), one OpenMP thread each:
//
//   OMP_NUM_THREADS=1 mpirun -np 8 --oversubscribe --bind-to none \
//     build/bin/calibrate_machine --out configs/hardware/this_cpu.yaml
//
// The device is one core (node.devices: the cores), and ranks run one OpenMP thread each; a job with
// more ranks than cores time-shares them (the cost model's share, hardware.hpp). Rank 0 times the
// kernels while the other ranks sleep (polling a message every millisecond); then ranks 0 and 1
// time MPI messages, and groups of 2, 4 and 8 ranks small collectives and, beyond one rank a
// core, what a blocking wait costs (measure_collectives below):
//   - GEMM (ops::gemm, fp32 and bf16) on a linear layer's three products (m = 2s tokens, n = s,
//     k = s / 2; s from 32 to 1536): the best rate per dtype is the peak, each dtype's rate by size
//     over its peak its efficiency curve (device.matmul_efficiency.fp32, .bf16);
//   - gelu_forward on a cache-resident tensor (8 FLOPs an element): the vector rate, the fallback;
//   - each element-wise, norm, loss, optimizer and attention kernel the trainer's step runs, on
//     training-sized operands (1024 tokens): its own rate (device.op_tflops), the FLOPs being
//     those the op records on the meta device (ops.cpp), so the planner's count and the measured
//     time go together. Per counted FLOP these kernels differ by an order of magnitude (gelu's
//     tanh against AdamW's streaming update), which one vector rate cannot say. Each runs in fp32
//     and, where the bf16 training step runs its 16-bit variant, in bf16 (device.op_tflops.bf16:
//     a 16-bit kernel widens and narrows its blocks and runs at its own rate);
//   - ops::add on 3 x 128 MiB: memory bandwidth (bytes read and written over time);
//   - ops::add on one element: the per-op overhead;
//   - a small GPT chunk's step less its ops' own time, per op: the host code between ops
//     (device.host_us_per_op; measure_host_code below);
//   - ping-pong of 8 bytes (latency) and 4 MiB (bandwidth) between ranks 0 and 1;
//   - on the first g = 2, 4, 8 ranks: the median time of a small all_reduce, all_gather and
//     reduce_scatter (links.node.collective_us), and, where g exceeds the cores, the median step
//     of "compute, then a small blocking all_reduce" beyond its compute at the shared rate and the
//     collective's own time: what each blocking wait costs an oversubscribed rank
//     (node.oversubscribed_wait_us); and the same with the g ranks in pairs, each pair's
//     all_reduce at once, beyond the two-rank call: a small group's wait inside the larger job
//     (node.subgroup_wait_us);
//   - where 4 or 8 ranks exceed the cores: a GPT chunk's step on all of them at once over its
//     time alone, both in thread CPU time, at two sizes (width 128 and 512: working sets within and
//     beyond the core's L2), keyed by the step's working set (node.shared_core_slowdown;
//     measure_shared_core_slowdown below);
//   - on the first g = 2, 4, 8 ranks: all_reduce, reduce_scatter and all_gather (and on 2 ranks
//     send) from 64 KiB to 64 MiB, issued asynchronously and waited for as the step does, in fp32,
//     and the reductions again in bf16 (links.node.bus_GBps, per dtype and group size;
//     measure_bus_bandwidth below);
//   - on ranks 0 and 1: whether an asynchronous call progresses while its rank computes
//     (links.node.async_progress; measure_async_progress below).
// Kernels are timed in the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that other processes
// on a shared machine slow the measurement but do not change it; messages by the fastest of many
// round trips in wall time (a round trip that was not descheduled); collectives and oversubscribed
// waits by the median, since a step's calls meet whatever the scheduler does; the waits of ranks in
// pairs by the group's makespan (measure_collectives says why).
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
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/gpt_model.hpp"
#include "parallel/hardware.hpp"
#include "parallel/meta.hpp"
#include "parallel/op_times.hpp"
#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parameter.hpp"
#include "parallel/runtime.hpp"
#include "parallel/step_cost.hpp"

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

// The rate of one kernel: `build(device)` makes its operands on `device` and returns the call of
// the kernel on them. On the meta device the call records the op (its name, counted FLOPs and
// operand dtypes, whence the dtype the cost model prices it in: plan::op_dtype); on the CPU the
// call alone is timed, its operands made once beforehand.
using Runner = std::function<void()>;
struct KernelRate {
  std::string op;
  parallel::DType dtype;
  double flops_per_s;
};
KernelRate kernel_rate(const std::function<Runner(parallel::Device)>& build) {
  parallel::MetaOpRecorder rec;
  build(parallel::Device::meta())();
  PARALLEL_CHECK(!rec.events().empty(), "calibrate_machine: the kernel recorded no op on meta");
  const parallel::OpEvent e = rec.events().back();
  const Runner run = build(parallel::Device::cpu());
  return {e.op, parallel::plan::op_dtype(e), e.flops / time_per_call(run, 0.1)};
}

// ---- What an op costs beyond its work ----

// The per-op overhead as a step pays it, and the attention kernel's fixed cost per (batch, head)
// pair (hw.op_fixed_us), on rank 0 in thread CPU time, after the kernel rates (it reads them).
//
// A layer allocates each op's output before the call and frees it after (ops write, never
// allocate: ops.hpp), so the overhead is the time of an op on one element whose output is
// allocated and freed around the call: the argument checks, the dispatch, the Tensor and its
// storage, the allocator (a one-element add on a preallocated output, what this measured before,
// gave 1.2 us where ops of microseconds in the tiny model's step took 2-3 us each; docs/planner.md,
// "Where the tiny step's time goes").
//
// Attention splits its work into (batch, head) pairs, each with its own setup (key tile
// transposes, accumulators), which its rate at sequence 512 and head dimension 64 does not show:
// at sequence 32 and head dimension 16 a call took 6-8 times its work at that rate. The fixed cost
// is the time of one pair at sequence 32, head dimension 16, less that pair's FLOPs at the rate.
void measure_fixed_costs(parallel::HardwareDescription& hw, std::string& notes) {
  using namespace parallel;
  {
    const Tensor a = Tensor::full({1}, 1.0f, DType::F32), b = Tensor::full({1}, 2.0f, DType::F32);
    hw.op_overhead_us = time_per_call([&] {
                          Tensor c = Tensor::empty({1}, DType::F32);
                          ops::add(a, b, c);
                        }) *
                        1e6;
    notes += fmt::format("op overhead (a one-element add, its output allocated and freed): {:.2f} us\n",
                         hw.op_overhead_us);
  }
  const int64_t s = 32, d = 16;
  const double flops = 4.0 * s * s * d / 2;  // causal: ops.cpp's attention_flops
  Tensor q = Tensor::full({s, 1, 1, d}, 0.1f, DType::F32), o = Tensor::zeros({s, 1, 1, d}, DType::F32),
         lse = Tensor::zeros({1, 1, s}, DType::F32), dq = Tensor::zeros({s, 1, 1, d}, DType::F32),
         dk = Tensor::zeros({s, 1, 1, d}, DType::F32), dv = Tensor::zeros({s, 1, 1, d}, DType::F32);
  const double forward = time_per_call([&] { ops::attention_forward(q, q, q, o, lse, true, 0.25f); });
  const double backward =
      time_per_call([&] { ops::attention_backward(o, q, q, q, o, lse, dq, dk, dv, true, 0.25f); });
  const auto fixed = [&](const char* op, double seconds, double op_flops) {
    const double rate = hw.op_tflops_for(op, DType::F32) * 1e12;
    const double work = rate > 0 ? op_flops / rate : 0.0;
    hw.op_fixed_us[op] = std::max(0.0, seconds - work - hw.op_overhead_us * 1e-6) * 1e6;
    notes += fmt::format(
        "{} at sequence {}, head dimension {}, one pair: {:.2f} us, its FLOPs at the rate {:.2f} us\n", op, s,
        d, seconds * 1e6, work * 1e6);
  };
  fixed("attention_forward", forward, flops);
  fixed("attention_backward", backward, 2.5 * flops);
}

// ---- The host code between a step's ops ----

// What a step spends outside its ops on the issuing thread: the layers' views and shape logic, the
// bookkeeping of saved activations, the optimizer's loop over its parameters (on this machine 1.5-1.8
// us per op issued in the tiny model's step, 10-12 % of it; docs/planner.md, "Where the tiny step's
// time goes"). Measured on a small GPT chunk (2 layers, width 128, 4 heads, sequence 64, vocabulary
// 1024, micro-batch 2, fp32), one forward, backward and AdamW step at a time: its wall time less
// its ops' own (op_times.hpp), over the ops it issued; the fastest of 60 such steps, in wall time as
// the op timer is, on rank 0 while the others sleep. The shape is the library's, not a model's: the
// host code per op does not follow the operands' size (only the ops do), and it is a property of
// this library on this machine, which is why a calibration of the machine measures it.
void measure_host_code(parallel::HardwareDescription& hw, std::string& notes) {
  using namespace parallel;
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.vocab_size = 1024;
  c.seq_length = 64;
  const int64_t batch = 2;
  MpiCommunicator self(MPI_COMM_SELF);
  GPTModel model(c, ChunkSpec{0, c.num_layers, true, true}, {}, self);
  AdamW opt(model.parameters(), OptimizerConfig{}, Precision::FP32);
  std::vector<int32_t> ids(static_cast<std::size_t>(batch * c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
  const Tensor tokens = Tensor::from_vector(ids, {batch, c.seq_length});
  const Tensor seed = Tensor::full({1}, 1.0 / static_cast<double>(batch * c.seq_length), DType::F32);
  const auto step = [&] {
    zero_grads(model.parameters());
    auto act = model.new_activations();
    model.forward(tokens, tokens, *act);
    model.backward(seed, *act);
    opt.step(1e-4);
  };
  const bool was_enabled = ops::op_times_enabled();
  ops::set_op_times_enabled(true);
  for (int i = 0; i < 5; ++i) step();  // first-use allocations, packed weights
  double best = 1e30, best_ops = 0;
  int64_t calls = 0;
  for (int i = 0; i < 60; ++i) {
    ops::reset_op_times();
    const auto start = Clock::now();
    step();
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    double in_ops = 0;
    int64_t n = 0;
    for (const auto& [op, t] : ops::op_times()) {
      in_ops += t.seconds;
      n += t.calls;
    }
    if (n > 0 && (wall - in_ops) / static_cast<double>(n) < best) {
      best = (wall - in_ops) / static_cast<double>(n);
      best_ops = in_ops;
      calls = n;
    }
  }
  ops::reset_op_times();
  ops::set_op_times_enabled(was_enabled);
  hw.host_us_per_op = std::max(0.0, best) * 1e6;
  notes += fmt::format(
      "host code per op (a 2-layer, width-128 GPT chunk's forward, backward and AdamW step, {} ops taking "
      "{:.0f} us): {:.2f} us\n",
      calls, best_ops * 1e6, hw.host_us_per_op);
}

// ---- Communication by group size, and blocking waits on an oversubscribed node ----

// Ranks outside the group being measured sleep until rank 0 releases them, so that they take no
// core from it.
void idle_until_released(parallel::MpiCommunicator& world) {
  parallel::Tensor flag = parallel::Tensor::zeros({1}, parallel::DType::U8);
  parallel::WorkHandle done = world.recv(flag, 0, 7);
  while (!done->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void release_from(parallel::MpiCommunicator& world, int first) {
  parallel::Tensor flag = parallel::Tensor::zeros({1}, parallel::DType::U8);
  for (int r = first; r < world.size(); ++r) world.send(flag, r, 7)->wait();
}

// For each g in `sizes`, one after another, the first g ranks of `world` run `measure(g, group)`
// on a communicator of their own, between two barriers of that group, while the other ranks sleep
// until world rank 0 releases them. Every rank of `world` calls this.
void on_first_ranks(parallel::MpiCommunicator& world, const std::vector<int>& sizes,
                    const std::function<void(int g, parallel::Communicator& group)>& measure) {
  std::vector<std::unique_ptr<parallel::Communicator>> groups;
  for (int g : sizes) groups.push_back(world.split(world.rank() < g ? 0 : 1, world.rank()));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const int g = sizes[i];
    if (world.rank() >= g) {
      idle_until_released(world);
      continue;
    }
    parallel::Communicator& group = *groups[i];
    group.barrier();
    measure(g, group);
    group.barrier();
    if (world.rank() == 0) release_from(world, g);
  }
}

// Busy for `us` microseconds of this thread's CPU time (the compute between a step's waits).
void compute_for(double us) {
  static volatile double sink = 0;
  const double end = thread_seconds() + us * 1e-6;
  double x = 1;
  while (thread_seconds() < end)
    for (int i = 0; i < 256; ++i) x = x * 1.0000001 + 1e-9;
  sink = x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Wall seconds of each of `n` calls of `f` (after 20 to warm up), on this rank.
std::vector<double> each_call(const std::function<void()>& f, int n) {
  for (int i = 0; i < 20; ++i) f();
  std::vector<double> t;
  t.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return t;
}

// Every rank calls this. For g = 2, 4, 8 (up to the world size) the first g ranks measure while
// the others sleep: the median small all_reduce, all_gather and reduce_scatter (two floats per
// rank), and, where g exceeds `cores`, what a blocking wait costs a rank that time-shares a core
// (below), the mean over C = 25, 100 and 400 us of compute between waits, as the figure at
// g / cores ranks per core. Rank 0 fills `hw` and `notes`.
void measure_collectives(parallel::MpiCommunicator& world, int cores, parallel::HardwareDescription& hw,
                         std::string& notes) {
  using namespace parallel;
  std::vector<int> sizes;
  for (int g : {2, 4, 8})
    if (g <= world.size()) sizes.push_back(g);
  on_first_ranks(world, sizes, [&](int g, Communicator& group) {
    Tensor one = Tensor::full({2}, 1.0f, DType::F32), all = Tensor::full({2 * g}, 1.0f, DType::F32);
    const double reduce = median(each_call([&] { group.all_reduce(one); }, 400));
    const double gather = median(each_call([&] { group.all_gather(one, all); }, 400));
    const double scatter = median(each_call([&] { group.reduce_scatter(all, one); }, 400));
    if (world.rank() == 0) {
      hw.node_link.collective_us["all_reduce"].emplace_back(g, reduce * 1e6);
      hw.node_link.collective_us["all_gather"].emplace_back(g, gather * 1e6);
      hw.node_link.collective_us["reduce_scatter"].emplace_back(g, scatter * 1e6);
      notes += fmt::format(
          "{} ranks: small all_reduce {:.1f} us, all_gather {:.1f} us, reduce_scatter {:.1f} us "
          "(median)\n",
          g, reduce * 1e6, gather * 1e6, scatter * 1e6);
    }
    if (g > cores) {
      // Every rank computes C, then joins a small blocking all_reduce of the group, as a step's
      // ranks do between their tp / dp collectives. The model's step would be C at the shared
      // rate (g / cores ranks a core) plus the collective's own median; the rest is what each
      // blocking wait costs here: the waiter spins, yields and sleeps (the communicator's pacer),
      // and computes again only when the scheduler gives it a core back.
      const double per_core = static_cast<double>(g) / cores;
      double extra_sum = 0;
      std::string each;
      for (double c_us : {25.0, 100.0, 400.0}) {
        const int calls = static_cast<int>(std::clamp(200000.0 / (c_us * per_core), 100.0, 400.0));
        const double step = median(each_call(
            [&] {
              compute_for(c_us);
              group.all_reduce(one);
            },
            calls));
        const double extra = std::max(0.0, step - c_us * 1e-6 * per_core - reduce);
        extra_sum += extra;
        each += fmt::format("{}C = {:.0f} us: step {:.1f} us, extra {:.1f} us", each.empty() ? "" : "; ",
                            c_us, step * 1e6, extra * 1e6);
      }
      if (world.rank() == 0) {
        hw.oversubscribed_wait_us.emplace_back(per_core, extra_sum / 3 * 1e6);
        notes +=
            fmt::format("{} ranks on {} cores, compute C then a blocking all_reduce: {}\n", g, cores, each);
      }
      // The same inside groups of two, all pairs at once (a tp / pp / dp pair's waits inside a
      // larger job): a pair's rank that waits sleeps (the pacer), and its partner may be off its
      // core behind the other pairs' ranks, so the wait lasts until the partner has had its turn.
      // The model's step would be C at the shared rate plus the two-rank call measured with a
      // core each (2.9 us); the rest, by the group's longest time over the calls, is
      // node.subgroup_wait_us.
      std::unique_ptr<Communicator> pair = group.split(group.rank() / 2, group.rank());
      // Rank 0's two-rank median (the other ranks record nothing).
      const auto two = hw.node_link.collective_us.find("all_reduce");
      const double pair_reduce =
          two == hw.node_link.collective_us.end() ? 0.0 : two->second.front().second * 1e-6;
      double pair_sum = 0;
      std::string pair_each;
      for (double c_us : {25.0, 100.0, 400.0}) {
        const int calls = static_cast<int>(std::clamp(200000.0 / (c_us * per_core), 100.0, 400.0));
        // The makespan, not one rank's calls: pairs take turns on the cores, a pair running many
        // fast steps in its slice and then one long one while the others run (the median step of
        // 4 ranks in pairs at C = 25 us measured 35 us, under the 50 us of C at the shared rate),
        // and the pair that holds rank 0 may finish its calls first and leave the cores to the
        // rest (2026-11-28 01:35, 8 ranks at C = 400 us: rank 0's mean step 1,402 us, under the
        // 1,600 us of C at the shared rate, which no schedule gives every rank). A step ends when
        // its slowest rank does: the step here is the group's longest time over the calls, from
        // a common start, per call.
        for (int i = 0; i < 20; ++i) {  // warm up, as each_call does
          compute_for(c_us);
          pair->all_reduce(one);
        }
        group.barrier();
        const auto start = Clock::now();
        double own_mean = 0;
        for (int i = 0; i < calls; ++i) {
          const auto call_start = Clock::now();
          compute_for(c_us);
          pair->all_reduce(one);
          own_mean += std::chrono::duration<double>(Clock::now() - call_start).count() / calls;
        }
        Tensor longest = Tensor::zeros({1}, DType::I64);  // nanoseconds
        longest.data<int64_t>()[0] =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        group.all_reduce(longest, ReduceOp::Max);
        const double step = static_cast<double>(longest.data<int64_t>()[0]) * 1e-9 / calls;
        const double extra = std::max(0.0, step - c_us * 1e-6 * per_core - pair_reduce);
        pair_sum += extra;
        pair_each +=
            fmt::format("{}C = {:.0f} us: step {:.1f} us (rank 0's mean {:.1f}), extra {:.1f} us",
                        pair_each.empty() ? "" : "; ", c_us, step * 1e6, own_mean * 1e6, extra * 1e6);
      }
      if (world.rank() == 0) {
        hw.subgroup_wait_us.emplace_back(per_core, pair_sum / 3 * 1e6);
        notes +=
            fmt::format("{} ranks on {} cores in pairs, compute C then the pair's blocking all_reduce: {}\n",
                        g, cores, pair_each);
      }
    }
  });
}

// ---- Kernels when ranks time-share the cores ----

// Ranks that time-share a core also share its caches: each one's data is evicted by the others'
// while it is off the core, so its ops take longer in its own CPU time than the same ops alone
// (the tiny model's 4-rank step: 1.24 times the one-core calibration per op; docs/planner.md).
// How much depends on the op's working set: one that lives in the core's caches loses them at
// every switch, one that streams from memory anyway hardly notices. So the probe is a GPT chunk's
// step (forward, backward and AdamW: the kernels a step runs, with their host code) at two sizes:
// width 128 (its ops' working sets of tens to hundreds of KiB fit the core's L2) and width 512
// (MiBs: beyond it). Each is timed in thread CPU time, so that waiting for a core does not count
// (processor sharing prices that): the median step on rank 0 alone (the others sleep), then on
// the first g ranks at once for each g = 4, 8 above the cores (the mean of the ranks' medians).
// The ratio is node.shared_core_slowdown at g / cores ranks a core, keyed by the probe's working
// set: the median of its ops' bytes read + written weighted by their time (the cost model's on
// the description measured so far, from the same step recorded on the meta device), since the
// step's ratio is its ops' ratios weighted by their time.
struct SlowdownProbe {
  parallel::ModelConfig config;
  int64_t batch = 0;
  std::string label;
};

// The probe's step as `steps` calls of `run`, on `device` (meta: recorded, not run).
template <typename Run>
void probe_steps(const SlowdownProbe& p, parallel::Device device, int steps, Run&& run) {
  using namespace parallel;
  const ModelConfig& c = p.config;
  MpiCommunicator self(MPI_COMM_SELF);
  GPTModel::Options options;
  options.device = device;
  GPTModel model(c, ChunkSpec{0, c.num_layers, true, true}, options, self);
  AdamW opt(model.parameters(), OptimizerConfig{}, Precision::FP32);
  std::vector<int32_t> ids(static_cast<std::size_t>(p.batch * c.seq_length));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
  const Tensor tokens = Tensor::from_vector(ids, {p.batch, c.seq_length}).to(device);
  const Tensor seed =
      Tensor::full({1}, 1.0 / static_cast<double>(p.batch * c.seq_length), DType::F32).to(device);
  for (int i = 0; i < steps; ++i)
    run([&] {
      zero_grads(model.parameters());
      auto act = model.new_activations();
      model.forward(tokens, tokens, *act);
      model.backward(seed, *act);
      opt.step(1e-4);
    });
}

// The median step in thread CPU time (after 5 first-use steps).
double median_probe_step(const SlowdownProbe& p) {
  std::vector<double> t;
  int i = 0;
  probe_steps(p, parallel::Device::cpu(), 45, [&](auto&& step) {
    const double start = thread_seconds();
    step();
    if (i++ >= 5) t.push_back(thread_seconds() - start);
  });
  return median(t);
}

// The probe's working set: its ops' bytes read + written, the median weighted by their modelled
// time on one rank a device.
double probe_working_set(const SlowdownProbe& p, const parallel::HardwareDescription& hw) {
  using namespace parallel;
  MetaOpRecorder rec;
  probe_steps(p, Device::meta(), 1, [](auto&& step) { step(); });
  const plan::CostModel cost(hw, 1, 1);
  std::vector<std::pair<double, double>> by_bytes;  // (bytes, seconds)
  double total = 0;
  for (const OpEvent& e : rec.events()) {
    const double t = cost.op_seconds(e);
    by_bytes.emplace_back(static_cast<double>(e.bytes_read + e.bytes_written), t);
    total += t;
  }
  PARALLEL_CHECK(total > 0, "calibrate_machine: the {} probe recorded no op on meta", p.label);
  std::sort(by_bytes.begin(), by_bytes.end());
  double below = 0;
  for (const auto& [bytes, t] : by_bytes)
    if ((below += t) >= total / 2) return bytes;
  return by_bytes.back().first;
}

void measure_shared_core_slowdown(parallel::MpiCommunicator& world, int cores,
                                  parallel::HardwareDescription& hw, std::string& notes) {
  using namespace parallel;
  std::vector<SlowdownProbe> probes(2);
  for (auto& [c, batch, label] : probes) {
    c.num_layers = 2;
    c.num_attention_heads = 4;
    c.vocab_size = 1024;
  }
  probes[0].config.hidden_size = 128;
  probes[0].config.seq_length = 64;
  probes[0].batch = 2;
  probes[0].label = "2-layer width-128";
  // Its GEMMs' weights (512 x 2048 fp32: 4 MiB) and activations exceed the core's L2; 64 tokens
  // keep its step near 20 ms.
  probes[1].config.num_layers = 1;
  probes[1].config.hidden_size = 512;
  probes[1].config.seq_length = 32;
  probes[1].batch = 2;
  probes[1].label = "1-layer width-512";
  std::vector<int> sizes;
  for (int g : {4, 8})
    if (g > cores && g <= world.size()) sizes.push_back(g);
  for (const SlowdownProbe& probe : probes) {
    double alone = 0, bytes = 0;
    if (world.rank() == 0) {
      alone = median_probe_step(probe);
      bytes = probe_working_set(probe, hw);
      release_from(world, 1);
    } else {
      idle_until_released(world);
    }
    on_first_ranks(world, sizes, [&](int g, Communicator& group) {
      Tensor mine = Tensor::full({1}, static_cast<float>(median_probe_step(probe)), DType::F32);
      group.all_reduce(mine);
      if (world.rank() == 0) {
        const double shared = static_cast<double>(mine.data<float>()[0]) / g;
        const double factor = std::max(1.0, shared / alone);
        hw.shared_core_slowdown[bytes].emplace_back(static_cast<double>(g) / cores, factor);
        notes += fmt::format(
            "{} ranks on {} cores, a {} GPT chunk's step (working set {:.0f} KiB: its ops' bytes, the "
            "time-weighted median) in thread CPU time: {:.0f} us (mean of the ranks' medians) against {:.0f} "
            "us alone: x{:.3f}\n",
            g, cores, probe.label, bytes / 1024, shared * 1e6, alone * 1e6, factor);
      }
    });
  }
}

// ---- Large messages: bandwidth as the step uses the link, and asynchronous progress ----

// Bus bandwidth by message size (links.node.bus_GBps), on the first g = 2, 4, 8 ranks (up to the
// world size) while the others sleep, per dtype. For each kind a step issues (all_reduce,
// reduce_scatter, all_gather; on 2 ranks also send, for pipeline and context-parallel messages)
// and message sizes from 64 KiB to 64 MiB (a whole tensor's bytes, as the cost formulas count
// them): the fastest wall time of the call issued asynchronously and then polled until complete, as
// the trainer's wait polls it, less the small call's median (links.node.collective_us at g ranks; a
// send: the 8-byte latency), as nccl-tests' bus bandwidth (factor 2 (g-1)/g for all_reduce, (g-1)/g
// for reduce_scatter and all_gather, 1 for a send). On a CPU these calls are bound by memory - the
// reduction, MPI's temporary buffers and their first-touch page faults - not by the link, so a
// 64 MiB all-reduce runs an order of magnitude below a cache-resident ping-pong; and g ranks on
// fewer cores share the cores and the memory bus, so the figure depends on g. In bf16 only the
// reductions (all_reduce, reduce_scatter): below the communicator's point-to-point threshold MPI
// runs them through a user-defined op (mpi_communicator.cpp), slower per byte than fp32's built-in
// sum; above it two ranks take the pair path and more ranks the ring (pair_reduce.cpp,
// ring_reduce.cpp), both through the communicator, so these figures are the paths the step takes.
// A gather or a send moves bytes as fp32's does (the cost model's fallback to fp32's tables,
// hardware.hpp).
void measure_bus_bandwidth(parallel::MpiCommunicator& world, parallel::HardwareDescription& hw,
                           std::string& notes) {
  using namespace parallel;
  std::vector<int> sizes;
  for (int g : {2, 4, 8})
    if (g <= world.size()) sizes.push_back(g);
  // Polled until complete (each poll progresses MPI), not waited for: the communicator's wait
  // yields the core after 50 us, and where other processes are runnable a yield costs up to a
  // scheduler tick (a 786 KB all-reduce: 0.27 ms in MPI_Wait, 3.6 ms median through the pacer at
  // load 9.5). And the fastest call, as the ping-pong's bandwidth: under load the median of the
  // small sizes followed the load (64 KiB all-reduce 1.02 or 0.03 GB/s five minutes apart), while
  // a large call's cost (its reduction and page faults) is in every call, the fastest included.
  const auto finish = [](const WorkHandle& h) {
    while (!h->is_completed()) {
    }
  };
  on_first_ranks(world, sizes, [&](int gsize, Communicator& g) {
    const int peer = 1 - g.rank();  // send: ranks 0 and 1
    const auto small_s = [&](const std::string& kind) {
      if (kind == "send") return hw.node_link.latency_us * 1e-6;
      for (const auto& [n, us] : hw.node_link.collective_us[kind])
        if (static_cast<int>(n) == gsize) return us * 1e-6;
      return 0.0;
    };
    for (DType dt : {DType::F32, DType::BF16}) {
      std::vector<std::string> kinds{"all_reduce", "reduce_scatter"};
      if (dt == DType::F32) kinds.push_back("all_gather");
      if (dt == DType::F32 && gsize == 2) kinds.push_back("send");
      for (const std::string& kind : kinds) {
        std::string line = fmt::format("{} {} on {} ranks, bus GB/s by size:", kind, dtype_name(dt), gsize);
        for (const int64_t bytes :
             {int64_t{64} << 10, int64_t{256} << 10, int64_t{1} << 20, int64_t{8} << 20, int64_t{64} << 20}) {
          const int64_t n = bytes / static_cast<int64_t>(dtype_size(dt));
          Tensor full = Tensor::full({n}, 1.0f, dt), part = Tensor::full({n / gsize}, 1.0f, dt);
          // Fewer calls of the largest sizes on more ranks: 8 ranks time-share two cores.
          const int calls = bytes >= (int64_t{64} << 20)  ? (gsize > 2 ? 5 : 7)
                            : bytes >= (int64_t{8} << 20) ? 15
                                                          : 61;
          std::function<void()> call;
          const double g1 = static_cast<double>(gsize - 1) / gsize;
          double factor = g1;  // nccl-tests' bus factor on g ranks
          if (kind == "all_reduce") {
            call = [&] { finish(g.all_reduce(full, ReduceOp::Sum, true)); };
            factor = 2 * g1;
          } else if (kind == "reduce_scatter") {
            call = [&] { finish(g.reduce_scatter(full, part, ReduceOp::Sum, true)); };
          } else if (kind == "all_gather") {
            call = [&] { finish(g.all_gather(part, full, true)); };
          } else {
            factor = 1;
            call = [&] {  // one way = half a round trip
              if (g.rank() == 0) {
                finish(g.send(full, peer, 0));
                finish(g.recv(full, peer, 0));
              } else {
                finish(g.recv(full, peer, 0));
                finish(g.send(full, peer, 0));
              }
            };
          }
          g.barrier();
          std::vector<double> t;
          for (int i = 0; i < calls + 1; ++i) {
            g.barrier();
            const auto start = Clock::now();
            call();
            if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
          }
          double seconds = *std::min_element(t.begin(), t.end()) / (kind == "send" ? 2.0 : 1.0);
          seconds = std::max(seconds - small_s(kind), seconds * 0.05);
          const double gbps = factor * static_cast<double>(bytes) / seconds / 1e9;
          if (world.rank() == 0)
            hw.node_link.bus_GBps[dt][kind][gsize].emplace_back(static_cast<double>(bytes), gbps);
          line += fmt::format(" {} KiB {:.2f};", bytes >> 10, gbps);
        }
        if (world.rank() == 0) notes += line + "\n";
      }
    }
  });
}

// Whether an asynchronous call progresses while its rank computes (links.node.async_progress), on
// ranks 0 and 1 while the others sleep: an 8 MiB all_reduce and an 8 MiB exchange (both ranks send
// and receive, as context parallelism's ring does) issued, then C of compute (C = the call's own
// median time), then waited. A call that progresses ends the step at about max(C, T); one that
// does not, at C + T.
void measure_async_progress(parallel::MpiCommunicator& world, parallel::HardwareDescription& hw,
                            std::string& notes) {
  using namespace parallel;
  std::unique_ptr<Communicator> pair = world.split(world.rank() < 2 ? 0 : 1, world.rank());
  if (world.rank() >= 2) {
    idle_until_released(world);
    return;
  }
  Communicator& g = *pair;
  const int peer = 1 - g.rank();
  const int64_t n = (int64_t{8} << 20) / 4;
  Tensor a = Tensor::full({n}, 1.0f, DType::F32), b = Tensor::full({n}, 1.0f, DType::F32);
  const auto exchange = [&] {
    std::vector<P2POp> ops{P2POp{.kind = P2POp::Kind::Send, .tensor = a, .peer = peer, .tag = 1},
                           P2POp{.kind = P2POp::Kind::Recv, .tensor = b, .peer = peer, .tag = 1}};
    return g.batch_p2p(ops);
  };
  double worst_overlap = 1;
  for (const std::string kind : {"all_reduce", "exchange"}) {
    const auto issue = [&] {
      return kind == "all_reduce" ? g.all_reduce(a, ReduceOp::Sum, true) : exchange();
    };
    std::vector<double> alone, overlapped;
    for (int i = 0; i < 8; ++i) {
      g.barrier();
      auto start = Clock::now();
      issue()->wait();
      alone.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double call_s = median(alone);
    for (int i = 0; i < 8; ++i) {
      g.barrier();
      const auto start = Clock::now();
      WorkHandle h = issue();
      compute_for(call_s * 1e6);
      h->wait();
      overlapped.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    const double step = median(overlapped);
    // 1: the call ran entirely beside the compute; 0: after it.
    const double overlap = std::clamp((2 * call_s - step) / call_s, 0.0, 1.0);
    worst_overlap = std::min(worst_overlap, overlap);
    if (world.rank() == 0)
      notes += fmt::format(
          "async {} of 8 MiB: alone {:.2f} ms; issued, {:.2f} ms of compute, waited: {:.2f} ms (overlap "
          "{:.2f})\n",
          kind, call_s * 1e3, call_s * 1e3, step * 1e3, overlap);
  }
  hw.node_link.async_progress = worst_overlap >= 0.5;
  g.barrier();
  if (world.rank() == 0) release_from(world, 2);
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
    PARALLEL_CHECK(world.size() >= 2,
                   "calibrate_machine: run it as 2 to 8 ranks (mpirun -np 8 --oversubscribe), got {}",
                   world.size());
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    PARALLEL_CHECK(omp != nullptr && std::atoi(omp) == 1,
                   "calibrate_machine: run it with OMP_NUM_THREADS=1 (the device is one core), got {}",
                   omp == nullptr ? "unset" : omp);
    HardwareDescription hw;
    hw.name = name;
    std::string notes;
    if (world.rank() != 0) {
      idle_until_released(world);
    } else {
      // GEMM by size, fp32 and bf16, on the shapes a training step runs: a linear layer of m = 2s
      // tokens, n = s outputs and k = s / 2 inputs (geometric mean s), its three products (forward
      // x W^T, input gradient dy W, weight gradient dy^T x accumulated), timed together. Sizes
      // step by 1.5 and 4/3 in turn, so that power-of-two leading dimensions (whose cache-set
      // conflicts cost oneDNN up to a third at 512) are half of the points, not all of them.
      std::map<DType, std::vector<std::pair<double, double>>> rate_by_size;
      for (DType dt : {DType::F32, DType::BF16}) {
        double best = 0;
        for (int n : {32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536}) {
          const int64_t m = 2 * n, k = n / 2;
          Tensor x = Tensor::full({m, k}, 0.5f, dt), w = Tensor::full({n, k}, 0.25f, dt),
                 y = Tensor::empty({m, n}, dt), dy = Tensor::full({m, n}, 0.125f, dt),
                 dx = Tensor::empty({m, k}, dt), dw = Tensor::zeros({n, k}, dt);
          const double t = time_per_call([&] {
            ops::gemm(x, false, w, true, y);
            ops::gemm(dy, false, w, false, dx);
            ops::gemm(dy, true, x, false, dw, 1.0f, 1.0f);
          });
          const double rate = 3 * 2.0 * static_cast<double>(m * n * k) / t;
          best = std::max(best, rate);
          rate_by_size[dt].emplace_back(n, rate);
          notes += fmt::format("gemm {} {}x{}x{} (fwd, dgrad, wgrad): {:.2f} GFLOP/s\n", dtype_name(dt), m, n,
                               k, rate / 1e9);
        }
        hw.matmul_tflops[dt] = best / 1e12;
      }
      // Each dtype's curve is its rate by size over its own peak.
      for (const auto& [dt, rates] : rate_by_size) {
        const double peak = hw.matmul_tflops[dt] * 1e12;
        for (const auto& [n, rate] : rates)
          hw.matmul_efficiency[dt].emplace_back(n, std::min(1.0, rate / peak));
      }
      {
        Tensor x = Tensor::full({64 * 1024}, 0.5f, DType::F32), y = Tensor::empty({64 * 1024}, DType::F32);
        hw.vector_tflops = 8.0 * 64 * 1024 / time_per_call([&] { ops::gelu_forward(x, y); }) / 1e12;
      }
      {
        // The step's other kernels on training-sized operands: 1024 tokens of width 1024 (a 4x
        // MLP's 4096 for the activation), a vocabulary of 8192, 4 M parameters for the optimizer,
        // attention at sequence 512 with head dimension 64.
        using parallel::Device;
        const int64_t t = 1024, h = 1024, f = 4 * h, vocab = 8192, params = 4 << 20;
        auto full = [](const Shape& s, double v, DType dt, Device d) {
          return d.is_meta() ? Tensor::empty(s, dt, d) : Tensor::full(s, v, dt, d);
        };
        // Each kernel in fp32 and, where the bf16 step runs its 16-bit variant (docs/optimizer.md,
        // "Mixed precision"), in bf16: activations and parameter values in the dtype `a`,
        // parameter gradients and per-row statistics in fp32 (ops.hpp, "Precision"). The
        // gradient norm's sum of squares reads the fp32 gradients in both; AdamW under bf16 also
        // writes the model's bf16 copy (its 16-bit variant).
        const DType f32 = DType::F32;
        struct Kernel {
          bool runs_in_16_bit;
          std::function<Runner(Device, DType)> build;
        };
        std::vector<Kernel> kernels = {
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, f}, 0.5, a, d), y = full({t, f}, 0, a, d);
               return [=]() mutable { ops::gelu_forward(x, y); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, f}, 0.5, a, d), dy = full({t, f}, 0.1, a, d), dx = full({t, f}, 0, a, d);
               return [=]() mutable { ops::gelu_backward(dy, x, dx); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, 2 * f}, 0.5, a, d), y = full({t, f}, 0, a, d);
               return [=]() mutable { ops::swiglu_forward(x, y); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, 2 * f}, 0.5, a, d), dy = full({t, f}, 0.1, a, d),
                      dx = full({t, 2 * f}, 0, a, d);
               return [=]() mutable { ops::swiglu_backward(dy, x, dx); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, h}, 0.5, a, d), w = full({h}, 1, a, d), b = full({h}, 0, a, d),
                      y = full({t, h}, 0, a, d), mean = full({t}, 0, f32, d), rstd = full({t}, 0, f32, d);
               return [=]() mutable { ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5f); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, h}, 0.5, a, d), dy = full({t, h}, 0.1, a, d), w = full({h}, 1, a, d),
                      mean = full({t}, 0.5, f32, d), rstd = full({t}, 1, f32, d), dx = full({t, h}, 0, a, d),
                      dw = full({h}, 0, f32, d), db = full({h}, 0, f32, d);
               return [=]() mutable { ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, h}, 0.5, a, d), w = full({h}, 1, a, d), y = full({t, h}, 0, a, d),
                      rstd = full({t}, 0, f32, d);
               return [=]() mutable { ops::rmsnorm_forward(x, w, y, rstd, 1e-5f); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor x = full({t, h}, 0.5, a, d), dy = full({t, h}, 0.1, a, d), w = full({h}, 1, a, d),
                      rstd = full({t}, 1, f32, d), dx = full({t, h}, 0, a, d), dw = full({h}, 0, f32, d);
               return [=]() mutable { ops::rmsnorm_backward(dy, x, w, rstd, dx, dw); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor r = full({t, h}, 0.5, a, d), br = full({t, h}, 0.1, a, d), w = full({h}, 1, a, d),
                      b = full({h}, 0, a, d), sum = full({t, h}, 0, a, d), y = full({t, h}, 0, a, d),
                      mean = full({t}, 0, f32, d), rstd = full({t}, 0, f32, d);
               return [=]() mutable {
                 ops::residual_norm_forward(r, br, ops::DropoutSpec{}, w, b, sum, y, mean, rstd, 1e-5f);
               };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor dy = full({t, h}, 0.1, a, d), dres = full({t, h}, 0.1, a, d),
                      x = full({t, h}, 0.5, a, d), w = full({h}, 1, a, d), mean = full({t}, 0.5, f32, d),
                      rstd = full({t}, 1, f32, d), dx = full({t, h}, 0, a, d), dw = full({h}, 0, f32, d),
                      db = full({h}, 0, f32, d), dbr = full({t, h}, 0, a, d);
               return [=]() mutable {
                 ops::norm_backward_residual(dy, dres, x, w, mean, rstd, dx, dw, db, ops::DropoutSpec{}, dbr);
               };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor br = full({t, h}, 0.1, a, d), r = full({t, h}, 0.5, a, d), out = full({t, h}, 0, a, d);
               return [=]() mutable { ops::dropout_add(br, r, out, ops::DropoutSpec{}); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor dy = full({t, f}, 0.1, a, d), db = full({f}, 0, f32, d);
               return [=]() mutable { ops::bias_backward(dy, db); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor logits = full({t, vocab}, 0.5, a, d), tg = full({t}, 3, DType::I32, d),
                      mx = full({t}, 0, f32, d), tl = full({t}, 0, f32, d);
               return [=]() mutable { ops::cross_entropy_local_stats(logits, tg, 0, vocab, mx, tl); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor logits = full({t, vocab}, 0.5, a, d), mx = full({t}, 0.5, f32, d),
                      se = full({t}, 0, f32, d);
               return [=]() mutable { ops::cross_entropy_sum_exp(logits, mx, 0, vocab, se); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor logits = full({t, vocab}, 0.5, a, d), tg = full({t}, 3, DType::I32, d),
                      mx = full({t}, 0.5, f32, d), se = full({t}, 8192, f32, d),
                      gs = full({t}, 1.0 / 1024, f32, d), dl = full({t, vocab}, 0, a, d);
               return [=]() mutable { ops::cross_entropy_backward(logits, tg, mx, se, gs, 0, vocab, dl); };
             }},
            {false,
             [&](Device d, DType) -> Runner {
               Tensor x = full({params}, 0.01, f32, d), acc = full({1}, 0, f32, d);
               return [=]() mutable { ops::sum_of_squares_accumulate(x, acc); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor p = full({params}, 0.01, f32, d), g = full({params}, 0.001, f32, d),
                      m = full({params}, 0, f32, d), v = full({params}, 0, f32, d);
               if (a == f32) return [=]() mutable { ops::adamw_update_(p, g, m, v, ops::AdamWStep{}); };
               Tensor copy = full({params}, 0, a, d);
               return [=]() mutable { ops::adamw_update_(p, g, m, v, copy, ops::AdamWStep{}); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor q = full({512, 1, 4, 64}, 0.1, a, d), o = full({512, 1, 4, 64}, 0, a, d),
                      lse = full({1, 4, 512}, 0, f32, d);
               return [=]() mutable { ops::attention_forward(q, q, q, o, lse, true, 0.125f); };
             }},
            {true,
             [&](Device d, DType a) -> Runner {
               Tensor q = full({512, 1, 4, 64}, 0.1, a, d), o = full({512, 1, 4, 64}, 0.1, a, d),
                      lse = full({1, 4, 512}, 5.0, f32, d), dq = full({512, 1, 4, 64}, 0, a, d),
                      dk = full({512, 1, 4, 64}, 0, a, d), dv = full({512, 1, 4, 64}, 0, a, d);
               return
                   [=]() mutable { ops::attention_backward(o, q, q, q, o, lse, dq, dk, dv, true, 0.125f); };
             }},
        };
        for (DType a : {DType::F32, DType::BF16}) {
          for (const Kernel& k : kernels) {
            if (a != f32 && !k.runs_in_16_bit) continue;
            const KernelRate r = kernel_rate([&](Device d) { return k.build(d, a); });
            hw.op_tflops[r.dtype][r.op] = r.flops_per_s / 1e12;
            notes += fmt::format("{} {}: {:.3f} GFLOP/s of its counted FLOPs\n", r.op, dtype_name(r.dtype),
                                 r.flops_per_s / 1e9);
          }
        }
      }
      {
        const int64_t n = 32 * 1024 * 1024;
        Tensor a = Tensor::full({n}, 1.0f, DType::F32), b = Tensor::full({n}, 2.0f, DType::F32),
               c = Tensor::empty({n}, DType::F32);
        hw.memory_bandwidth_GBps = 3.0 * 4 * n / time_per_call([&] { ops::add(a, b, c); }, 0.3) / 1e9;
      }
      measure_fixed_costs(hw, notes);
      measure_host_code(hw, notes);
      release_from(world, 1);
    }
    // Ping-pong between ranks 0 and 1 (the others sleep): one-way time = round trip / 2.
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
    double small = 0, big = 0;
    const int64_t big_bytes = 4 << 20;
    if (world.rank() < 2) {
      small = one_way(8, 2000);
      big = one_way(big_bytes, 100);
      if (world.rank() == 0) release_from(world, 2);
    } else {
      idle_until_released(world);
    }
    hw.node_link.latency_us = small * 1e6;  // rank 0's: measure_collectives subtracts it
    measure_collectives(world, cores, hw, notes);
    measure_shared_core_slowdown(world, cores, hw, notes);
    measure_bus_bandwidth(world, hw, notes);
    measure_async_progress(world, hw, notes);
    if (world.rank() != 0) return 0;
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
        "Command: OMP_NUM_THREADS=1 mpirun -np {} --oversubscribe --bind-to none calibrate_machine --out "
        "<this "
        "file>\n"
        "device = one core (kernels timed in thread CPU time); links.cluster copies links.node (one "
        "machine).\n{}",
        cpu_model(), cores, date, load[0], world.size(), notes);
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
