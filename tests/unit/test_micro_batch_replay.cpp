// The planner's micro-batch replay (step_cost.hpp MicroBatchReplay): a step traced with replayed
// micro-batches, expanded, is the step traced by running every micro-batch - entry by entry (ops,
// calls, waits and their numbering) - and so its simulated time is the same. Layouts: every
// pipeline schedule, tp + sp, cp, dp with each sharding mode and overlapped reductions, full and
// selective recompute, MoE with ep, on 8-rank jobs, every stage of each.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "parallel/config.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {
namespace {

HardwareDescription machine() {
  return parse_hardware(R"(
name: test
device:
  matmul_tflops: {fp32: 10, bf16: 40}
  matmul_efficiency: [[16, 0.2], [256, 0.8]]
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
}

void expect_same_entries(const std::vector<TimelineEntry>& a, const std::vector<TimelineEntry>& b,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const TimelineEntry &x = a[i], &y = b[i];
    ASSERT_EQ(x.kind, y.kind) << what << " entry " << i;
    ASSERT_EQ(x.call, y.call) << what << " entry " << i;
    if (x.kind == TimelineEntry::Kind::Op) {
      ASSERT_EQ(x.op.op, y.op.op) << what << " entry " << i;
      ASSERT_EQ(x.op.shapes, y.op.shapes) << what << " entry " << i;
      ASSERT_EQ(x.op.dtypes, y.op.dtypes) << what << " entry " << i;
      ASSERT_EQ(x.op.flops, y.op.flops) << what << " entry " << i;
      ASSERT_EQ(x.op.bytes_read, y.op.bytes_read) << what << " entry " << i;
      ASSERT_EQ(x.op.bytes_written, y.op.bytes_written) << what << " entry " << i;
    }
    if (x.kind == TimelineEntry::Kind::Comm) ASSERT_EQ(x.comm.str(), y.comm.str()) << what << " entry " << i;
  }
}

struct Case {
  const char* name;
  const char* parallel;
  const char* optimizer = "{}";
  const char* recompute = "none";
  const char* model_extra = "";
  int global_batch = 16;
};

class Replay : public ::testing::TestWithParam<Case> {};

TEST_P(Replay, ExpandedEqualsTheRunOfEveryMicroBatch) {
  const Case& k = GetParam();
  const std::string yaml = fmt::format(R"(
model: {{num_layers: 8, hidden_size: 64, num_attention_heads: 4, vocab_size: 512, seq_length: 64{}}}
train: {{micro_batch_size: 1, global_batch_size: {}, steps: 1, precision: bf16, recompute: {}}}
data: {{path: synthetic}}
parallel: {}
optimizer: {}
)",
                                       k.model_extra, k.global_batch, k.recompute, k.parallel, k.optimizer);
  const Config c = parse_config(yaml, {}, 8);
  const CostModel cost(machine(), 8);
  std::map<int, std::vector<TimelineEntry>> full, replayed;
  int replays = 0;
  for (int r : representative_ranks(c, 8)) {
    const RankTrace all = trace_step(c, 8, r, false);
    const RankTrace some = trace_step(c, 8, r, true);
    for (const TimelineEntry& e : some.timeline) replays += e.kind == TimelineEntry::Kind::Replay;
    expect_same_entries(expand_timeline(some.timeline), all.timeline,
                        std::string(k.name) + " rank " + std::to_string(r));
    EXPECT_DOUBLE_EQ(some.flops, all.flops);
    full[r] = all.timeline;
    replayed[r] = some.timeline;
  }
  EXPECT_GT(replays, 0) << "nothing was replayed";
  const SimulationResult a = simulate(full, cost), b = simulate(replayed, cost);
  EXPECT_NEAR(b.step_time_s, a.step_time_s, 1e-12 * a.step_time_s);
  EXPECT_NEAR(b.bubble_fraction, a.bubble_fraction, 1e-9);
  for (const char* d : kDimensions)
    EXPECT_NEAR(b.exposed_s.at(d), a.exposed_s.at(d), 1e-12 * a.step_time_s) << d;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Replay,
    ::testing::Values(
        Case{.name = "pp4_1f1b_dp2", .parallel = "{pipeline: 4}"},
        Case{.name = "pp2_tp2_sp_dp2_recompute",
             .parallel = "{pipeline: 2, tensor: 2, sequence_parallel: true}",
             .recompute = "full"},
        Case{.name = "pp4_interleaved", .parallel = "{pipeline: 4, virtual_stages: 2}"},
        Case{.name = "pp2_zb_h1_dp4_optim",
             .parallel = "{pipeline: 2, pipeline_schedule: zb-h1}",
             .optimizer = "{sharding: optim, overlap_grad_reduce: true}"},
        Case{.name = "pp2_zb_v", .parallel = "{pipeline: 2, virtual_stages: 2, pipeline_schedule: zb-v}"},
        Case{.name = "dp8_zero3_overlap",
             .parallel = "{}",
             .optimizer =
                 "{sharding: optim_grads_params, overlap_grad_reduce: true, overlap_param_gather: true}",
             .global_batch = 64},
        Case{.name = "pp2_cp2_dp2_zero2",
             .parallel = "{pipeline: 2, context: 2}",
             .optimizer = "{sharding: optim_grads}"},
        Case{.name = "tp2_pp2_dp2_selective",
             .parallel = "{pipeline: 2, tensor: 2}",
             .recompute = "selective"},
        Case{.name = "moe_ep2_pp2",
             .parallel = "{pipeline: 2, expert: 2}",
             .model_extra = ", num_experts: 4, moe_router_topk: 2"}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace parallel::plan
