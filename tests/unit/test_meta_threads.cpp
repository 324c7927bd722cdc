// The meta device per thread (meta.hpp): two threads that each run a meta rank count only their
// own tensors, so two plans at once (the layout search's parallel candidates) get the peaks, the
// timelines and the step times they get alone.
#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

#include "parallel/allocator.hpp"
#include "parallel/config.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/step_cost.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

// A tensor made on one thread and freed on another leaves the account of the thread that made it,
// and neither thread's statistics see the other's tensors.
TEST(MetaThreads, EachThreadCountsItsOwnTensors) {
  const std::size_t base = memory_stats(Device::meta()).allocated;
  std::promise<Tensor> made;
  std::promise<void> freed;
  std::future<Tensor> made_f = made.get_future();
  std::future<void> freed_f = freed.get_future();
  std::size_t other_after_make = 0, other_after_free = 0, other_peak = 0;
  std::thread other([&] {
    const std::size_t other_base = memory_stats(Device::meta()).allocated;
    EXPECT_EQ(other_base, 0u);                                          // a fresh thread holds no meta bytes
    Tensor t = Tensor::empty({1000, 250}, DType::F32, Device::meta());  // 1,000,000 bytes
    other_after_make = memory_stats(Device::meta()).allocated;
    made.set_value(std::move(t));
    freed_f.wait();
    const MemoryStats s = memory_stats(Device::meta());
    other_after_free = s.allocated;
    other_peak = s.peak_allocated;
  });
  {
    Tensor t = made_f.get();
    EXPECT_EQ(memory_stats(Device::meta()).allocated, base);  // not this thread's
    Tensor mine = Tensor::empty({10}, DType::F32, Device::meta());
    EXPECT_EQ(memory_stats(Device::meta()).allocated, base + 40);
  }  // both freed here, `t` on this thread
  EXPECT_EQ(memory_stats(Device::meta()).allocated, base);
  freed.set_value();
  other.join();
  EXPECT_EQ(other_after_make, 1000000u);
  EXPECT_EQ(other_after_free, 0u);
  EXPECT_EQ(other_peak, 1000000u);
}

Config layout(const char* parallel) {
  return parse_config(fmt::format(R"(
model: {{num_layers: 8, hidden_size: 64, num_attention_heads: 4, vocab_size: 512, seq_length: 128,
        dropout: 0.1}}
parallel: {}
train: {{micro_batch_size: 2, global_batch_size: 32, steps: 1, precision: bf16}}
optimizer: {{distributed: true}}
data: {{path: synthetic}}
)",
                                  parallel),
                      {}, 8);
}

struct Planned {
  std::vector<int64_t> allocator_bytes;  // per rank of the memory plan
  std::vector<int64_t> trace_peaks;      // per pipeline stage's traced rank (no replay)
  std::vector<std::size_t> timeline_sizes;
  double step_time_s = 0;
};

Planned plan(const Config& c, const HardwareDescription& hw) {
  Planned out;
  for (const RankMemoryPlan& r : plan_memory_on_meta(c, 8).ranks)
    out.allocator_bytes.push_back(r.allocator_bytes);
  for (int rank : plan::representative_ranks(c, 8)) {
    const plan::RankTrace t = plan::trace_step(c, 8, rank, /*replay=*/false);
    out.trace_peaks.push_back(t.peak_bytes);
    out.timeline_sizes.push_back(t.timeline.size());
  }
  out.step_time_s = plan::plan_step(c, 8, hw).sim.step_time_s;
  return out;
}

// Two different layouts planned at once, each several times over so that the runs interleave:
// every memory plan, traced peak, timeline and step time is the one planned alone.
TEST(MetaThreads, TwoPlansAtOnceGetThePeaksTheyGetAlone) {
  const HardwareDescription hw = parse_hardware(R"(
name: test
device:
  matmul_tflops: {fp32: 10, bf16: 40}
  vector_tflops: 1
  memory_bandwidth_GBps: 100
  op_overhead_us: 2
node:
  devices: 4
links:
  node: {bandwidth_GBps: 50, latency_us: 2}
  cluster: {bandwidth_GBps: 10, latency_us: 5}
)",
                                                "test.yaml");
  const Config a = layout("{tensor: 2, sequence_parallel: true, pipeline: 4, pipeline_schedule: 1f1b}");
  const Config b = layout("{pipeline: 2, virtual_stages: 2, pipeline_schedule: zb-v}");
  const Planned alone_a = plan(a, hw), alone_b = plan(b, hw);
  ASSERT_NE(alone_a.allocator_bytes, alone_b.allocator_bytes);  // the two differ: a mix-up would show
  constexpr int kRounds = 3;
  std::vector<Planned> at_once_a(kRounds), at_once_b(kRounds);
  std::thread first([&] {
    for (Planned& p : at_once_a) p = plan(a, hw);
  });
  std::thread second([&] {
    for (Planned& p : at_once_b) p = plan(b, hw);
  });
  first.join();
  second.join();
  for (int i = 0; i < kRounds; ++i) {
    EXPECT_EQ(at_once_a[i].allocator_bytes, alone_a.allocator_bytes) << i;
    EXPECT_EQ(at_once_a[i].trace_peaks, alone_a.trace_peaks) << i;
    EXPECT_EQ(at_once_a[i].timeline_sizes, alone_a.timeline_sizes) << i;
    EXPECT_EQ(at_once_a[i].step_time_s, alone_a.step_time_s) << i;
    EXPECT_EQ(at_once_b[i].allocator_bytes, alone_b.allocator_bytes) << i;
    EXPECT_EQ(at_once_b[i].trace_peaks, alone_b.trace_peaks) << i;
    EXPECT_EQ(at_once_b[i].timeline_sizes, alone_b.timeline_sizes) << i;
    EXPECT_EQ(at_once_b[i].step_time_s, alone_b.step_time_s) << i;
  }
}

}  // namespace
}  // namespace parallel
