// The planner's cost model and step simulation (step_cost.hpp) on cases checked by hand, the
// hardware descriptions (hardware.hpp), and the step traced on meta (trace_step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "parallel/allocator.hpp"
#include "parallel/error.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {
namespace {

// A machine whose numbers make times easy: 1 TFLOP/s for everything (an op of 1e12 FLOPs takes
// 1 s), no overhead, links of 1 GB/s with no latency.
HardwareDescription simple_machine() {
  return parse_hardware(R"(
name: simple
device:
  matmul_tflops: {fp32: 1}
  vector_tflops: 1
  memory_bandwidth_GBps: 1000000
  op_overhead_us: 0
node:
  devices: 8
links:
  node: {bandwidth_GBps: 1, latency_us: 0}
  cluster: {bandwidth_GBps: 0.5, latency_us: 0}
)",
                        "simple.yaml");
}

// What parse_hardware says of `yaml` as "bad.yaml"; "" when it accepts it.
std::string error_of(const std::string& yaml) {
  try {
    parse_hardware(yaml, "bad.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TimelineEntry op(double seconds) {
  TimelineEntry e;
  e.kind = TimelineEntry::Kind::Op;
  e.op.op = "add";
  e.op.flops = seconds * 1e12;
  return e;
}

TimelineEntry comm(int64_t call, std::string kind, std::string group, std::vector<int> ranks, int64_t bytes,
                   bool async, std::vector<int> peers = {}) {
  TimelineEntry e;
  e.kind = TimelineEntry::Kind::Comm;
  e.call = call;
  e.comm.kind = std::move(kind);
  e.comm.group = std::move(group);
  e.comm.ranks = std::move(ranks);
  e.comm.bytes = bytes;
  e.comm.async = async;
  e.comm.peers = std::move(peers);
  return e;
}

TimelineEntry wait(int64_t call) {
  TimelineEntry e;
  e.kind = TimelineEntry::Kind::Wait;
  e.call = call;
  return e;
}

TEST(CollectiveCost, RingAllReduceIsTwoNMinusOneOverN) {
  // 2 (n-1)/n B / bw + 2 (n-1) a: every rank sends and receives 2 (n-1) chunks of B / n.
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(8e9, 8, 1e9, 0), 2.0 * 7 / 8 * 8);
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(8e9, 2, 1e9, 0), 8.0);
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(0, 4, 1e9, 1e-6), 6e-6);
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(1e9, 1, 1e9, 1e-6), 0.0);
  EXPECT_DOUBLE_EQ(ring_gather_seconds(8e9, 4, 1e9, 0), 6.0);
  // Small messages at scale: the tree's 2 log2(n) latency beats the ring's 2 (n-1).
  EXPECT_DOUBLE_EQ(all_reduce_seconds(8, 1024, 1e9, 1e-5), tree_all_reduce_seconds(8, 1024, 1e9, 1e-5));
  EXPECT_DOUBLE_EQ(all_reduce_seconds(8e9, 8, 1e9, 1e-5), ring_all_reduce_seconds(8e9, 8, 1e9, 1e-5));
}

TEST(CollectiveCost, GroupOnOneNodeUsesTheNodeLinkElseTheCluster) {
  const CostModel cost(simple_machine(), 16);  // 8 ranks per node
  CommEvent e;
  e.kind = "all_reduce";
  e.bytes = 1'000'000'000;
  e.ranks = {0, 1};
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 1.0);  // 2 (1/2) 1 GB / 1 GB/s
  e.ranks = {0, 8};
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 2.0);  // across nodes at 0.5 GB/s
  EXPECT_DOUBLE_EQ(cost.p2p_seconds(500'000'000, 7, 8), 1.0);
}

TEST(CollectiveCost, AMeasuredSmallCollectiveReplacesTheLatencyTerm) {
  // 2 ranks: 10 us, 4 ranks: 30 us measured; the bandwidth term stays the ring's.
  HardwareDescription hw = simple_machine();
  hw.node_link.collective_us["all_reduce"] = {{2, 10}, {4, 30}};
  hw.node_link.collective_us["all_gather"] = {{2, 5}};
  const CostModel cost(hw, 8);
  CommEvent e;
  e.kind = "all_reduce";
  e.bytes = 1'000'000'000;
  e.ranks = {0, 1};
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 10e-6 + 1.0);
  e.bytes = 0;
  e.ranks = {0, 1, 2};
  EXPECT_NEAR(cost.collective_seconds(e), 20e-6, 1e-15);  // linear between 2 and 4
  e.ranks = {0, 1, 2, 3, 4, 5, 6};
  EXPECT_NEAR(cost.collective_seconds(e), 30e-6 * 6 / 3, 1e-15);  // beyond 4: as n - 1
  e.kind = "all_gather";
  e.ranks = {0, 1, 2, 3};
  EXPECT_NEAR(cost.collective_seconds(e), 5e-6 * 3, 1e-15);
  e.kind = "reduce_scatter";  // not measured: the formula (no latency on this machine)
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 0.0);
  // Without the table (the GPU descriptions) nothing changes: the tree's 2 log2(n) latency here.
  HardwareDescription plain = simple_machine();
  plain.node_link.latency_us = 1;
  e.kind = "all_reduce";
  EXPECT_NEAR(CostModel(plain, 8).collective_seconds(e), 4e-6, 1e-15);
  // Written and read back.
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_EQ(back.node_link.collective_us, hw.node_link.collective_us);
  EXPECT_TRUE(back.cluster_link.collective_us.empty());
}

TEST(CollectiveCost, AMeasuredBusBandwidthReplacesTheLinkBandwidthForItsKind) {
  // all_reduce: 0.5 GB/s bus bandwidth at 1 MB, 0.25 at 100 MB (log-linear between, flat beyond);
  // send: 2 GB/s. Kinds without a table keep the link's 1 GB/s.
  HardwareDescription hw = simple_machine();
  hw.node_link.bus_GBps[DType::F32]["all_reduce"][2] = {{1e6, 0.5}, {1e8, 0.25}};
  hw.node_link.bus_GBps[DType::F32]["send"][2] = {{1e6, 2}};
  hw.node_link.bus_GBps[DType::F32]["all_gather"][2] = {{1e6, 4}};
  const CostModel cost(hw, 8);
  CommEvent e;
  e.kind = "all_reduce";
  e.ranks = {0, 1};
  e.bytes = 1'000'000;
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 1e6 / 0.5e9);  // 2 (1/2) B / busbw
  e.bytes = 10'000'000;                                       // halfway in log(bytes): 0.375 GB/s
  EXPECT_NEAR(cost.collective_seconds(e), 1e7 / 0.375e9, 1e-12);
  e.bytes = 1'000'000'000;  // beyond the largest: flat
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 1e9 / 0.25e9);
  e.bytes = 1000;  // below the smallest: flat
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 1000 / 0.5e9);
  e.kind = "reduce_scatter";  // no table: the link's bandwidth
  e.bytes = 1'000'000'000;
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 0.5);
  e.kind = "all_to_all";  // all_gather's table
  EXPECT_DOUBLE_EQ(cost.collective_seconds(e), 0.5e9 / 4e9);
  EXPECT_DOUBLE_EQ(cost.p2p_seconds(1'000'000'000, 0, 1), 0.5);  // send's table
  EXPECT_DOUBLE_EQ(cost.p2p_seconds(1'000'000'000, 0, 8), 2.0);  // across nodes: the cluster's link
  // Written and read back; absent (the GPU descriptions), the link's bandwidth as before.
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_EQ(back.node_link.bus_GBps, hw.node_link.bus_GBps);
  EXPECT_TRUE(back.cluster_link.bus_GBps.empty());
  EXPECT_DOUBLE_EQ(simple_machine().node_link.bus_bandwidth_Bps("all_reduce", 1e6), 1e9);
}

TEST(CollectiveCost, TheBusBandwidthOfTheGroupsSizeAndOfTheTensorsDtype) {
  // all_reduce fp32 measured on 2, 4 and 8 ranks (1, 0.5 and 0.25 GB/s: ranks sharing cores and
  // memory), bf16 on 2 and 8 (0.25 and 0.125 GB/s: MPI's user-defined op); all_gather fp32 on one
  // size only (4: serves every size); no bf16 all_gather table (fp32's).
  HardwareDescription hw = simple_machine();
  auto& fp32 = hw.node_link.bus_GBps[DType::F32];
  fp32["all_reduce"] = {{2, {{1e6, 1}}}, {4, {{1e6, 0.5}}}, {8, {{1e6, 0.25}}}};
  fp32["all_gather"] = {{4, {{1e6, 2}}}};
  hw.node_link.bus_GBps[DType::BF16]["all_reduce"] = {{2, {{1e6, 0.25}}}, {8, {{1e6, 0.125}}}};
  const CostModel cost(hw, 8);
  CommEvent e;
  e.kind = "all_reduce";
  e.bytes = 1'000'000'000;
  const auto at = [&](std::vector<int> ranks, DType dtype) {
    e.ranks = std::move(ranks);
    e.dtype = dtype;
    return cost.collective_seconds(e);
  };
  const double B = 1e9;
  // The group's size picks its table: 2 (n-1)/n B / busbw.
  EXPECT_DOUBLE_EQ(at({0, 1}, DType::F32), 1.0 * B / 1e9);
  EXPECT_DOUBLE_EQ(at({0, 1, 2, 3}, DType::F32), 1.5 * B / 0.5e9);
  EXPECT_DOUBLE_EQ(at({0, 1, 2, 3, 4, 5, 6, 7}, DType::F32), 1.75 * B / 0.25e9);
  // Between measured sizes, linear in the size: 6 ranks halfway between 4 and 8 (0.375 GB/s).
  EXPECT_NEAR(at({0, 1, 2, 3, 4, 5}, DType::F32), 2.0 * 5 / 6 * B / 0.375e9, 1e-9);
  // A bf16 all-reduce takes bf16's table; on 4 ranks, linear between its 2 and 8 (0.2083 GB/s).
  EXPECT_DOUBLE_EQ(at({0, 1}, DType::BF16), 1.0 * B / 0.25e9);
  EXPECT_NEAR(at({0, 1, 2, 3}, DType::BF16), 1.5 * B / ((0.25 + (0.125 - 0.25) / 3) * 1e9), 1e-9);
  // fp16 has no table: fp32's.
  EXPECT_DOUBLE_EQ(at({0, 1, 2, 3}, DType::F16), 1.5 * B / 0.5e9);
  // Beyond the largest measured size: its table (on one node of 8 no such group; the level spans
  // the cluster link then, which has none): checked on the link directly.
  EXPECT_DOUBLE_EQ(hw.node_link.bus_bandwidth_Bps("all_reduce", B, 16, DType::F32), 0.25e9);
  // all_gather's one table (measured on 4) serves 2 and 8 ranks, and bf16 (no bf16 table).
  e.kind = "all_gather";
  EXPECT_DOUBLE_EQ(at({0, 1}, DType::BF16), 0.5 * B / 2e9);
  EXPECT_DOUBLE_EQ(at({0, 1, 2, 3, 4, 5, 6, 7}, DType::F32), 0.875 * B / 2e9);
  // reduce_scatter has no table at all: the link's 1 GB/s.
  e.kind = "reduce_scatter";
  EXPECT_DOUBLE_EQ(at({0, 1, 2, 3}, DType::BF16), 0.75 * B / 1e9);
  // Written (dtype and group-size levels) and read back.
  const std::string yaml = hardware_yaml(hw);
  EXPECT_NE(yaml.find("bf16: {all_reduce: {2: [[1000000, 0.25]], 8: [[1000000, 0.125]]}}"), std::string::npos)
      << yaml;
  const HardwareDescription back = parse_hardware(yaml, "round trip");
  EXPECT_EQ(back.node_link.bus_GBps, hw.node_link.bus_GBps);
  // The single forms: a plain list is group size 2's (so every size's), a map of kinds fp32's.
  std::string text = hardware_yaml(simple_machine());
  const std::string link = "shared_by: 1}";
  text.replace(text.find(link), link.size(),
               "shared_by: 1, bus_GBps: {all_reduce: [[1e6, 0.5]], send: {2: [[1e6, 3]]}}}");
  const HardwareDescription plain = parse_hardware(text, "plain.yaml");
  ASSERT_EQ(plain.node_link.bus_GBps.size(), 1u);
  EXPECT_EQ(plain.node_link.bus_GBps.at(DType::F32).at("all_reduce").count(2), 1u);
  EXPECT_DOUBLE_EQ(plain.node_link.bus_bandwidth_Bps("all_reduce", 1e6, 8, DType::BF16), 0.5e9);
  // Written back in the single form, which says the same.
  EXPECT_NE(hardware_yaml(plain).find("bus_GBps: {all_reduce: [[1000000, 0.5]], send: [[1000000, 3]]}"),
            std::string::npos)
      << hardware_yaml(plain);
}

TEST(Simulate, AnAsyncCallOverALinkWithoutProgressRunsAtItsWait) {
  // The dp all-reduce of AsyncAllReduceOverlapsCompute (0.5 s beside a 1 s op) on a link whose
  // asynchronous calls do not progress during compute (MPI without a progress thread): it starts
  // at the wait, so the step is 1.5 s and its 0.5 s are exposed.
  HardwareDescription hw = simple_machine();
  hw.node_link.async_progress = false;
  std::map<int, std::vector<TimelineEntry>> t;
  t[0] = {comm(0, "all_reduce", "dp", {0, 1}, 500'000'000, true), op(1), wait(0)};
  const SimulationResult deferred = simulate(t, CostModel(hw, 2));
  EXPECT_DOUBLE_EQ(deferred.step_time_s, 1.5);
  EXPECT_DOUBLE_EQ(deferred.exposed_s.at("dp"), 0.5);
  EXPECT_DOUBLE_EQ(simulate(t, CostModel(simple_machine(), 2)).step_time_s, 1.0);  // progressing
  // cp's ring exchange likewise; a call that is never waited for (a polled send) stays where it
  // was issued: the two-stage pipeline's activation send still reaches stage 1 at 1 s.
  std::map<int, std::vector<TimelineEntry>> cp;
  cp[0] = {comm(0, "batch_p2p", "cp", {0, 1}, 1'000'000'000, true, {1, 1}), op(1), wait(0)};
  cp[0][0].comm.detail = "send 500000000,recv 500000000";
  EXPECT_DOUBLE_EQ(simulate(cp, CostModel(hw, 2)).exposed_s.at("cp"), 0.5);
  std::map<int, std::vector<TimelineEntry>> pp;
  pp[0] = {op(1), comm(0, "send", "pp", {0, 1}, 1000, true, {1}), op(1)};
  pp[1] = {comm(0, "recv", "pp", {0, 1}, 1000, true, {0}), wait(0), op(1)};
  const SimulationResult pipe = simulate(pp, CostModel(hw, 2));
  EXPECT_NEAR(pipe.ranks[1].end_s, 2.0 + 1e-6, 1e-9);  // 1 us on the wire at 1 GB/s
  // The key reads back, and a cluster link keeps its own.
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_FALSE(back.node_link.async_progress);
  EXPECT_TRUE(back.cluster_link.async_progress);
}

TEST(Simulate, ABlockingWaitOnAnOversubscribedNodeCostsTheMeasuredWait) {
  // Two ranks per device (4 ranks, 2 devices) cost 0.5 s a blocking wait, four 1 s; beyond one rank
  // a device the curve starts at 0 (3 ranks on 2 devices: 1.5 per device -> 0.25 s).
  HardwareDescription two = simple_machine();
  two.devices_per_node = 2;
  two.oversubscribed_wait_us = {{2, 0.5e6}, {4, 1e6}};
  EXPECT_DOUBLE_EQ(two.oversubscribed_wait_s(1.0), 0.0);
  EXPECT_DOUBLE_EQ(two.oversubscribed_wait_s(1.5), 0.25);
  EXPECT_DOUBLE_EQ(two.oversubscribed_wait_s(3.0), 0.75);
  EXPECT_DOUBLE_EQ(two.oversubscribed_wait_s(8.0), 1.0);
  EXPECT_DOUBLE_EQ(CostModel(two, 4, 4).oversubscribed_wait_s(), 0.5);
  EXPECT_DOUBLE_EQ(CostModel(two, 2, 2).oversubscribed_wait_s(), 0.0);  // a device per rank
  // The pipeline of OversubscribedRanksShareTheCoresOfThoseThatCompute: stage 1 blocks on stage
  // 0's message (2 s before); it resumes 0.5 s later, and the step moves by that.
  std::map<int, std::vector<TimelineEntry>> chain;
  chain[0] = {op(1), comm(0, "send", "pp", {0, 2}, 0, true, {2})};
  chain[2] = {comm(0, "recv", "pp", {0, 2}, 0, true, {0}), wait(0), op(1)};
  const SimulationResult r = simulate(chain, CostModel(two, 4, 4));
  EXPECT_DOUBLE_EQ(r.step_time_s, 2.5);
  EXPECT_DOUBLE_EQ(r.ranks[1].oversubscribed_wait_s, 0.5);
  EXPECT_EQ(r.ranks[1].blocking_waits, 1);
  EXPECT_EQ(r.ranks[0].blocking_waits, 0);          // the sender never waits
  EXPECT_DOUBLE_EQ(r.oversubscribed_wait_s, 0.25);  // mean over the two representatives
  // A wait whose call is already complete does not block and costs nothing: stage 1 computes 3 s
  // of its own first (sharing the cores with stage 0 for the first 2), then finds the message.
  chain[2].insert(chain[2].begin(), op(3));
  const SimulationResult late = simulate(chain, CostModel(two, 4, 4));
  EXPECT_EQ(late.ranks[1].blocking_waits, 0);
  EXPECT_DOUBLE_EQ(late.oversubscribed_wait_s, 0.0);
  // Not oversubscribed (a device per rank): the same timelines cost no wait.
  HardwareDescription four = two;
  four.devices_per_node = 4;
  chain[2].erase(chain[2].begin());
  EXPECT_DOUBLE_EQ(simulate(chain, CostModel(four, 4, 4)).step_time_s, 2.0);
}

TEST(Simulate, AWaitOnASmallGroupInsideAnOversubscribedJobCostsTheSubgroupWait) {
  // 4 ranks on 2 devices: a wait on all 4 costs oversubscribed_wait_us (0.5 s at two a device), a
  // wait on a pair of them subgroup_wait_us (0.2 s); without that key, the pair's is 0.5 s too.
  HardwareDescription two = simple_machine();
  two.devices_per_node = 2;
  two.oversubscribed_wait_us = {{2, 0.5e6}, {4, 1e6}};
  two.subgroup_wait_us = {{2, 0.2e6}, {4, 0.6e6}};
  EXPECT_DOUBLE_EQ(two.subgroup_wait_s(1.0), 0.0);
  EXPECT_DOUBLE_EQ(two.subgroup_wait_s(1.5), 0.1);
  EXPECT_DOUBLE_EQ(two.subgroup_wait_s(3.0), 0.4);
  const CostModel four_ranks(two, 4, 4);
  EXPECT_DOUBLE_EQ(four_ranks.oversubscribed_wait_s(4), 0.5);
  EXPECT_DOUBLE_EQ(four_ranks.oversubscribed_wait_s(2), 0.2);
  EXPECT_DOUBLE_EQ(CostModel(two, 2, 2).oversubscribed_wait_s(2), 0.0);  // a device per rank
  // The same pipeline (stage 1 blocks 2 s on stage 0's message) on a pair of the 4-rank job: the
  // pair's wait, 0.2 s.
  std::map<int, std::vector<TimelineEntry>> chain;
  chain[0] = {op(1), comm(0, "send", "pp", {0, 2}, 0, true, {2})};
  chain[2] = {comm(0, "recv", "pp", {0, 2}, 0, true, {0}), wait(0), op(1)};
  SimulationResult r = simulate(chain, CostModel(two, 4, 4));
  EXPECT_DOUBLE_EQ(r.step_time_s, 2.2);
  EXPECT_DOUBLE_EQ(r.ranks[1].oversubscribed_wait_s, 0.2);
  // A collective of all 4 ranks (one representative: its peers are symmetric) that blocks - the
  // call outlasts nothing here, so one whose end comes after the rank's clock: a pipeline whose
  // stage 1 waits for a world all-reduce that stage 0 joins after 2 s of compute - costs the
  // whole-job figure.
  std::map<int, std::vector<TimelineEntry>> world;
  world[0] = {op(1), comm(0, "all_reduce", "world", {0, 1, 2, 3}, 0, false)};
  world[1] = {comm(0, "all_reduce", "world", {0, 1, 2, 3}, 0, false), op(1)};
  r = simulate(world, CostModel(two, 4, 4));
  EXPECT_DOUBLE_EQ(r.ranks[1].oversubscribed_wait_s, 0.5);
  // Without subgroup_wait_us every group's wait is oversubscribed_wait_us.
  HardwareDescription plain = two;
  plain.subgroup_wait_us.clear();
  EXPECT_DOUBLE_EQ(simulate(chain, CostModel(plain, 4, 4)).step_time_s, 2.5);
  // The key reads back; a file without it has none.
  const HardwareDescription back = parse_hardware(hardware_yaml(two), "round trip");
  ASSERT_EQ(back.subgroup_wait_us.size(), 2u);
  EXPECT_DOUBLE_EQ(back.subgroup_wait_us[1].second, 0.6e6);
  EXPECT_TRUE(parse_hardware(hardware_yaml(plain), "round trip").subgroup_wait_us.empty());
}

TEST(OpCost, RanksThatTimeShareACoreRunEachOpSlowerByTheMeasuredFactor) {
  // 2 devices; 1.2 at two ranks a device, 1.5 at four; the curve starts at (1, 1).
  HardwareDescription two = simple_machine();
  two.devices_per_node = 2;
  two.shared_core_slowdown = {{0, {{2, 1.2}, {4, 1.5}}}};  // one curve: every working set
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(1.0), 1.0);
  EXPECT_NEAR(two.shared_core_slowdown_at(1.5), 1.1, 1e-12);
  EXPECT_NEAR(two.shared_core_slowdown_at(3.0), 1.35, 1e-12);
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(8.0), 1.5);
  OpEvent g;
  g.op = "gelu_forward";
  g.dtypes = {DType::F32};
  g.flops = 1e12;
  // A device per rank: 1 s, no factor. Four ranks on two devices: half a device (2 s) x 1.2.
  EXPECT_DOUBLE_EQ(CostModel(two, 2, 2).shared_core_slowdown(), 1.0);
  EXPECT_DOUBLE_EQ(CostModel(two, 2, 2).op_seconds(g), 1.0);
  EXPECT_DOUBLE_EQ(CostModel(two, 4, 4).shared_core_slowdown(), 1.2);
  EXPECT_DOUBLE_EQ(CostModel(two, 4, 4).op_seconds(g), 2.4);
  EXPECT_DOUBLE_EQ(CostModel(two, 8, 8).op_seconds(g), 4.0 * 1.5);
  // Without the key every op keeps its processor-sharing time.
  EXPECT_DOUBLE_EQ(CostModel(simple_machine(), 16, 16).op_seconds(g), 2.0);
  // Written and read back; a factor below 1 is refused with its key.
  const HardwareDescription back = parse_hardware(hardware_yaml(two), "round trip");
  EXPECT_EQ(back.shared_core_slowdown, two.shared_core_slowdown);
  std::string bad = hardware_yaml(two);
  const std::size_t at = bad.find("[4, 1.5]");
  ASSERT_NE(at, std::string::npos) << bad;
  bad.replace(at, 8, "[4, 0.8]");
  const std::string error = error_of(bad);
  EXPECT_NE(error.find("node.shared_core_slowdown[1][1] must be a factor >= 1, got 0.8"), std::string::npos)
      << error;
}

TEST(OpCost, SharedCoreSlowdownDependsOnTheOpsWorkingSet) {
  // 2 devices; at 256 KiB an op runs 1.4 times longer at two ranks a device (1.6 at four), at
  // 4 MiB 1.1 (1.2): linear in log(bytes) between, the nearest size's beyond.
  HardwareDescription two = simple_machine();
  two.devices_per_node = 2;
  two.shared_core_slowdown = {{262144, {{2, 1.4}, {4, 1.6}}}, {4194304, {{2, 1.1}, {4, 1.2}}}};
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(1.0, 1000), 1.0);
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(2.0, 1000), 1.4);
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(2.0, 262144), 1.4);
  EXPECT_NEAR(two.shared_core_slowdown_at(2.0, 1048576), 1.4 + 0.5 * (1.1 - 1.4), 1e-12);  // halfway in log
  EXPECT_NEAR(two.shared_core_slowdown_at(3.0, 1048576), 0.5 * (1.5 + 1.15), 1e-12);
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(2.0, 4194304), 1.1);
  EXPECT_DOUBLE_EQ(two.shared_core_slowdown_at(8.0, 1e9), 1.2);
  // Per op by its bytes read + written: a 64 KiB memory-bound op at four ranks on two devices
  // takes 2 x 1.4 its time alone, a 64 MiB one 2 x 1.1.
  const auto streaming = [](int64_t bytes) {
    OpEvent e;
    e.op = "add";
    e.dtypes = {DType::F32};
    e.bytes_read = bytes / 2;
    e.bytes_written = bytes / 2;
    return e;
  };
  for (int64_t bytes : {int64_t{65536}, int64_t{67108864}}) {
    const double alone = CostModel(two, 2, 2).op_seconds(streaming(bytes));
    EXPECT_NEAR(CostModel(two, 4, 4).op_seconds(streaming(bytes)), alone * 2 * (bytes < 262144 ? 1.4 : 1.1),
                1e-9 * alone);
  }
  EXPECT_DOUBLE_EQ(CostModel(two, 4, 4).shared_core_slowdown(), 1.4);  // the smallest ops'
  EXPECT_DOUBLE_EQ(CostModel(two, 2, 2).shared_core_slowdown(), 1.0);
  // Written as the map form and read back the same; the single list is its one entry at 0 bytes.
  const std::string yaml = hardware_yaml(two);
  EXPECT_NE(yaml.find("shared_core_slowdown: {262144: [[2, 1.4], [4, 1.6]], 4194304: [[2, 1.1], [4, 1.2]]}"),
            std::string::npos)
      << yaml;
  EXPECT_EQ(parse_hardware(yaml, "round trip").shared_core_slowdown, two.shared_core_slowdown);
  // Bad values name the key and the rule.
  const auto error_with = [&yaml](const std::string& from, const std::string& to) {
    std::string bad = yaml;
    const std::size_t at = bad.find(from);
    EXPECT_NE(at, std::string::npos) << bad;
    if (at == std::string::npos) return std::string();
    return error_of(bad.replace(at, from.size(), to));
  };
  EXPECT_NE(error_with("4194304: [[2, 1.1]", "4194304: [[2, 0.9]")
                .find("bad.yaml: node.shared_core_slowdown.4194304[0][1] must be a factor >= 1, got 0.9"),
            std::string::npos);
  EXPECT_NE(
      error_with("{262144:", "{-5:")
          .find("node.shared_core_slowdown.-5 must be keyed by an op's working set in bytes > 0, got '-5'"),
      std::string::npos);
  EXPECT_NE(
      error_with("{262144:", "{big:")
          .find("node.shared_core_slowdown.big must be keyed by an op's working set in bytes > 0, got 'big'"),
      std::string::npos);
  EXPECT_NE(error_with("[[2, 1.4], [4, 1.6]]", "[[4, 1.4], [2, 1.6]]")
                .find("node.shared_core_slowdown.262144[1][0] must increase, got 2 after 4"),
            std::string::npos);
  EXPECT_NE(error_with("{262144: [[2, 1.4], [4, 1.6]], 4194304: [[2, 1.1], [4, 1.2]]}", "{}")
                .find("node.shared_core_slowdown must map working-set bytes to [[ranks per device, factor], "
                      "...] lists, or be one such list"),
            std::string::npos);
}

TEST(OpCost, RooflineWithShapeCurveAndOverhead) {
  HardwareDescription hw = simple_machine();
  hw.matmul_efficiency[DType::F32] = {{100, 0.25}, {10000, 1.0}};
  hw.op_overhead_us = 10;
  hw.memory_bandwidth_GBps = 1;
  const CostModel cost(hw, 8);
  OpEvent g;
  g.op = "gemm";
  g.dtypes = {DType::F32};
  g.flops = 2.0 * 1000 * 1000 * 1000;  // m = n = k = 1000: half way on the log scale -> 0.625
  EXPECT_NEAR(hw.matmul_efficiency_at(1000), 0.625, 1e-12);
  EXPECT_NEAR(cost.op_seconds(g), 1e-5 + 2e9 / (1e12 * 0.625), 1e-12);
  g.bytes_read = 1'000'000'000;  // 1 s at 1 GB/s: memory-bound now
  EXPECT_NEAR(cost.op_seconds(g), 1e-5 + 1.0, 1e-12);
  // Four ranks on a node of two devices: each rank gets half a device; two ranks a whole one each.
  HardwareDescription two = simple_machine();
  two.devices_per_node = 2;
  const CostModel shared(two, 4, 4);
  EXPECT_TRUE(shared.oversubscribed());
  EXPECT_DOUBLE_EQ(shared.share(), 0.5);
  EXPECT_DOUBLE_EQ(shared.op_seconds(op(1).op), 2.0);
  EXPECT_DOUBLE_EQ(CostModel(two, 2, 2).share(), 1.0);
}

TEST(OpCost, AMeasuredKernelRateReplacesTheVectorRateAndTheMatmulCurve) {
  HardwareDescription hw = simple_machine();
  hw.op_tflops[DType::F32] = {{"gelu_forward", 0.25}, {"attention_forward", 0.5}};
  const CostModel cost(hw, 8);
  OpEvent g;
  g.op = "gelu_forward";
  g.flops = 1e12;
  EXPECT_DOUBLE_EQ(cost.op_seconds(g), 4.0);  // 1e12 FLOPs at 0.25 TFLOP/s
  g.op = "add";
  EXPECT_DOUBLE_EQ(cost.op_seconds(g), 1.0);  // not listed: the vector rate
  OpEvent a;
  a.op = "attention_forward";
  a.dtypes = {DType::F32};
  a.shapes = {{1024, 1, 8, 64}};
  a.flops = 1e12;
  EXPECT_DOUBLE_EQ(cost.op_seconds(a), 2.0);
  // Written and read back; a non-number is refused with its key.
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_EQ(back.op_tflops, hw.op_tflops);
  std::string bad = hardware_yaml(hw);
  bad.replace(bad.find("gelu_forward: 0.25"), 18, "gelu_forward: -1");
  const std::string error = error_of(bad);
  EXPECT_NE(error.find("device.op_tflops.gelu_forward must be a number > 0"), std::string::npos) << error;
}

TEST(OpCost, AKernelsFixedCostIsPerCallAndPerAttentionHeadPair) {
  // op_fixed_us (calibrate_machine: a kernel's time on a small operand less its work at its rate):
  // added once per call, for attention once per (batch, head) pair of its q (forward) or dout
  // (backward) [s, b, heads, d]; an op without an entry pays only the overhead.
  HardwareDescription hw = simple_machine();
  hw.op_overhead_us = 1;
  hw.op_fixed_us = {{"gelu_forward", 3}, {"attention_forward", 2}, {"attention_backward", 5}};
  const CostModel cost(hw, 8);
  OpEvent g;
  g.op = "gelu_forward";
  EXPECT_DOUBLE_EQ(cost.op_seconds(g), 4e-6);
  g.op = "add";
  EXPECT_DOUBLE_EQ(cost.op_seconds(g), 1e-6);
  OpEvent a;
  a.op = "attention_forward";
  a.dtypes = {DType::F32};
  a.shapes = {{32, 2, 4, 16}, {32, 2, 4, 16}, {32, 2, 4, 16}};
  EXPECT_DOUBLE_EQ(fixed_cost_units(a), 8);
  EXPECT_DOUBLE_EQ(cost.op_seconds(a), 1e-6 + 8 * 2e-6);
  a.op = "attention_backward";  // dout first, q's shape
  EXPECT_DOUBLE_EQ(cost.op_seconds(a), 1e-6 + 8 * 5e-6);
  // They are the rank's own work: on a node where two ranks share a device, each costs twice.
  HardwareDescription two = hw;
  two.devices_per_node = 2;
  EXPECT_DOUBLE_EQ(CostModel(two, 4, 4).op_seconds(a), 2 * (1e-6 + 8 * 5e-6));
  // Written and read back.
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_EQ(back.op_fixed_us, hw.op_fixed_us);
  EXPECT_DOUBLE_EQ(back.op_fixed_s("attention_forward", 8), 16e-6);
  EXPECT_DOUBLE_EQ(back.op_fixed_s("add"), 0.0);
}

// A machine with one curve and one set of kernel rates per dtype, whose bf16 figures differ from
// fp32's by known factors: a bf16 op priced by fp32's figures gets a different time.
HardwareDescription two_dtype_machine() {
  return parse_hardware(R"(
name: two_dtypes
device:
  matmul_tflops: {fp32: 1, bf16: 2}
  matmul_efficiency:
    fp32: [[100, 1], [10000, 1]]
    bf16: [[100, 0.25], [10000, 0.5]]
  vector_tflops: 1
  op_tflops:
    fp32: {gelu_forward: 0.5, adamw_update_: 0.25}
    bf16: {gelu_forward: 0.125}
  memory_bandwidth_GBps: 1000000
  op_overhead_us: 0
node:
  devices: 8
links:
  node: {bandwidth_GBps: 1, latency_us: 0}
  cluster: {bandwidth_GBps: 0.5, latency_us: 0}
)",
                        "two_dtypes.yaml");
}

TEST(OpCost, TheHostCodePerOpIsAddedToEveryOpAndTimeShared) {
  // device.host_us_per_op (calibrate_machine: a small GPT chunk's step less its ops, per op): the
  // caller's code around each op, paid once per op like the overhead, and like it time-shared
  // when ranks share the devices. Absent: 0, the op priced as before.
  HardwareDescription hw = simple_machine();
  hw.op_overhead_us = 1;
  OpEvent g;
  g.op = "add";
  EXPECT_DOUBLE_EQ(CostModel(hw, 8).op_seconds(g), 1e-6);
  hw.host_us_per_op = 2;
  EXPECT_DOUBLE_EQ(CostModel(hw, 8).op_seconds(g), 3e-6);
  hw.devices_per_node = 2;
  EXPECT_DOUBLE_EQ(CostModel(hw, 4, 4).op_seconds(g), 6e-6);  // half a device each
  // It reads back, and a description without it reads 0.
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_DOUBLE_EQ(back.host_us_per_op, 2);
  EXPECT_DOUBLE_EQ(parse_hardware(hardware_yaml(simple_machine()), "none").host_us_per_op, 0);
  EXPECT_EQ(hardware_yaml(simple_machine()).find("host_us_per_op"), std::string::npos);
}

TEST(OpCost, ABf16OpIsPricedByTheBf16CurveAndKernelRate) {
  const HardwareDescription hw = two_dtype_machine();
  const CostModel cost(hw, 8);
  OpEvent g;
  g.op = "gemm";
  g.flops = 2.0 * 1e9;  // m = n = k = 1000: size 1000, half way on the log scale
  g.dtypes = {DType::F32, DType::F32, DType::F32};
  EXPECT_DOUBLE_EQ(cost.op_seconds(g), 2e9 / 1e12);  // fp32: 1 TFLOP/s x 1
  g.dtypes = {DType::BF16, DType::BF16, DType::BF16};
  // bf16: its peak 2 TFLOP/s x its curve's 0.375 at size 1000 (fp32's curve would give 1e-3 s)
  EXPECT_NEAR(hw.matmul_efficiency_at(1000, DType::BF16), 0.375, 1e-12);
  EXPECT_NEAR(cost.op_seconds(g), 2e9 / (2e12 * 0.375), 1e-15);
  // A dtype without its own curve takes fp32's (fp16: the fp32 peak too, having no entry).
  g.dtypes = {DType::F16, DType::F16, DType::F16};
  EXPECT_DOUBLE_EQ(hw.matmul_efficiency_at(1000, DType::F16), 1.0);
  EXPECT_DOUBLE_EQ(cost.op_seconds(g), 2e9 / 1e12);
  // Kernel rates: the op's dtype's entry, else fp32's entry, else the vector rate.
  OpEvent e;
  e.op = "gelu_forward";
  e.flops = 1e12;
  e.dtypes = {DType::F32, DType::F32};
  EXPECT_DOUBLE_EQ(cost.op_seconds(e), 2.0);
  e.dtypes = {DType::BF16, DType::BF16};
  EXPECT_DOUBLE_EQ(cost.op_seconds(e), 8.0);
  // AdamW reads fp32 and writes the model's bf16 copy: a bf16 op, priced by fp32's entry for want
  // of a bf16 one.
  e.op = "adamw_update_";
  e.dtypes = {DType::F32, DType::F32, DType::F32, DType::F32,
              DType::F32, DType::F32, DType::F32, DType::BF16};
  EXPECT_EQ(op_dtype(e), DType::BF16);
  EXPECT_DOUBLE_EQ(cost.op_seconds(e), 4.0);
  e.op = "add";
  EXPECT_DOUBLE_EQ(cost.op_seconds(e), 1.0);
  // Integer operands do not make an op integer: cross-entropy's targets beside bf16 logits.
  e.dtypes = {DType::I32, DType::F32};
  EXPECT_EQ(op_dtype(e), DType::F32);
  e.dtypes = {DType::F32, DType::I32, DType::BF16};
  EXPECT_EQ(op_dtype(e), DType::BF16);
}

TEST(Hardware, PerDtypeCurvesAndRatesReadBackAndTheSingleFormServesEveryDtype) {
  const HardwareDescription hw = two_dtype_machine();
  ASSERT_EQ(hw.matmul_efficiency.size(), 2u);
  EXPECT_EQ(hw.op_tflops.at(DType::BF16).size(), 1u);
  const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");
  EXPECT_EQ(back.matmul_efficiency, hw.matmul_efficiency);
  EXPECT_EQ(back.op_tflops, hw.op_tflops);
  EXPECT_EQ(back.matmul_tflops, hw.matmul_tflops);
  // The single list and map: fp32's entries, which every dtype falls back to.
  const HardwareDescription one = parse_hardware(R"(
name: one
device:
  matmul_tflops: {fp32: 1, bf16: 2}
  matmul_efficiency: [[100, 0.25], [10000, 0.5]]
  vector_tflops: 1
  op_tflops: {gelu_forward: 0.5}
  memory_bandwidth_GBps: 1
  op_overhead_us: 0
node: {devices: 1}
links:
  node: {bandwidth_GBps: 1, latency_us: 0}
  cluster: {bandwidth_GBps: 1, latency_us: 0}
)",
                                                 "one.yaml");
  ASSERT_EQ(one.matmul_efficiency.size(), 1u);
  EXPECT_EQ(one.matmul_efficiency.count(DType::F32), 1u);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    EXPECT_NEAR(one.matmul_efficiency_at(1000, t), 0.375, 1e-12);
    EXPECT_DOUBLE_EQ(one.op_tflops_for("gelu_forward", t), 0.5);
    EXPECT_DOUBLE_EQ(one.op_tflops_for("add", t), 0.0);
  }
  // ... and written back in the single form.
  const std::string yaml = hardware_yaml(one);
  EXPECT_NE(yaml.find("matmul_efficiency: [[100, 0.25], [10000, 0.5]]"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("op_tflops: {gelu_forward: 0.5}"), std::string::npos) << yaml;
}

TEST(Simulate, OversubscribedRanksShareTheCoresOfThoseThatCompute) {
  // Four ranks on a node of two devices (share 0.5), two stages of two ranks each. An op of 1 s of
  // a whole device is costed 2 s at the static share.
  HardwareDescription two = simple_machine();
  two.devices_per_node = 2;
  const CostModel cost(two, 4, 4);
  // Both stages compute at once: the static share holds (2 s each).
  std::map<int, std::vector<TimelineEntry>> both;
  both[0] = {op(1)};
  both[2] = {op(1)};
  EXPECT_DOUBLE_EQ(simulate(both, cost).step_time_s, 2.0);
  // Stage 1 waits for stage 0: while it waits, stage 0's two ranks have both cores (1 s), then
  // stage 1 has them (1 s): 2 s, not the static share's 4 s.
  std::map<int, std::vector<TimelineEntry>> chain;
  chain[0] = {op(1), comm(0, "send", "pp", {0, 2}, 0, true, {2})};
  chain[2] = {comm(0, "recv", "pp", {0, 2}, 0, true, {0}), wait(0), op(1)};
  const SimulationResult r = simulate(chain, cost);
  EXPECT_DOUBLE_EQ(r.step_time_s, 2.0);
  EXPECT_DOUBLE_EQ(r.ranks[1].bubble_s, 1.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].compute_s, 1.0);
  // In part: stage 1 has 0.5 s of work of its own first. Both compute from 0 at half a device;
  // stage 1's op ends at 1, then stage 0 alone finishes its last 0.5 s at full speed (1.5), then
  // stage 1 alone its 1 s (2.5).
  std::map<int, std::vector<TimelineEntry>> part;
  part[0] = {op(1), comm(0, "send", "pp", {0, 2}, 0, true, {2})};
  part[2] = {op(0.5), comm(0, "recv", "pp", {0, 2}, 0, true, {0}), wait(0), op(1)};
  EXPECT_DOUBLE_EQ(simulate(part, cost).step_time_s, 2.5);
}

TEST(Simulate, TwoStagePipelineBubble) {
  // Two stages, two micro-batches, forward only, 1 s each; messages cost nothing.
  // Stage 0: F0 [0,1] F1 [1,2]; stage 1 receives at 1 and 2: F0 [1,2] F1 [2,3]. Stage 1 idles
  // 1 s first: step 3 s, bubble (0 + 1) / 2 / 3.
  std::map<int, std::vector<TimelineEntry>> t;
  t[0] = {op(1), comm(0, "send", "pp", {0, 1}, 0, true, {1}), op(1),
          comm(1, "send", "pp", {0, 1}, 0, true, {1})};
  t[1] = {comm(0, "recv", "pp", {0, 1}, 0, true, {0}), wait(0), op(1),
          comm(1, "recv", "pp", {0, 1}, 0, true, {0}), wait(1), op(1)};
  const SimulationResult r = simulate(t, CostModel(simple_machine(), 2));
  EXPECT_DOUBLE_EQ(r.step_time_s, 3.0);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(r.ranks[0].end_s, 2.0);
  EXPECT_DOUBLE_EQ(r.ranks[1].bubble_s, 1.0);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(r.exposed_s.at("pp"), 0.0);
  // Messages of 0.25 s. A transfer starts when both sides have posted it (as NCCL's send/recv):
  // the first at 1 (stage 1 posted at 0), arriving 1.25 - 1 s of bubble, 0.25 s on the wire; F0
  // [1.25, 2.25]; the second was sent at 2 but is received only from 2.25: arrives 2.5 (0.25 s on
  // the wire again); F1 [2.5, 3.5].
  t[0][1].comm.bytes = t[0][3].comm.bytes = t[1][0].comm.bytes = t[1][3].comm.bytes = 250'000'000;
  const SimulationResult w = simulate(t, CostModel(simple_machine(), 2));
  EXPECT_DOUBLE_EQ(w.step_time_s, 3.5);
  EXPECT_DOUBLE_EQ(w.ranks[1].bubble_s, 1.0);
  EXPECT_DOUBLE_EQ(w.ranks[1].exposed_s.at("pp"), 0.5);
}

TEST(Simulate, AsyncAllReduceOverlapsCompute) {
  // A dp all-reduce of 0.5 s (ring, 2 ranks, 0.5 GB at 1 GB/s) beside a 1 s op: hidden.
  auto run = [](int64_t bytes, bool async) {
    std::map<int, std::vector<TimelineEntry>> t;
    t[0] = {comm(0, "all_reduce", "dp", {0, 1}, bytes, async), op(1)};
    if (async) t[0].push_back(wait(0));
    return simulate(t, CostModel(simple_machine(), 2));
  };
  const SimulationResult hidden = run(500'000'000, true);
  EXPECT_DOUBLE_EQ(hidden.step_time_s, 1.0);
  EXPECT_DOUBLE_EQ(hidden.exposed_s.at("dp"), 0.0);
  const SimulationResult longer = run(1'500'000'000, true);  // 1.5 s: 0.5 s exposed
  EXPECT_DOUBLE_EQ(longer.step_time_s, 1.5);
  EXPECT_DOUBLE_EQ(longer.exposed_s.at("dp"), 0.5);
  const SimulationResult sync = run(500'000'000, false);  // synchronous: in series
  EXPECT_DOUBLE_EQ(sync.step_time_s, 1.5);
  EXPECT_DOUBLE_EQ(sync.exposed_s.at("dp"), 0.5);
}

TEST(Simulate, CallsOnOneGroupRunInOrderAndGroupsSpanningStagesMeet) {
  // Two async all-reduces on one group queue behind each other: 0.5 + 0.5 s.
  std::map<int, std::vector<TimelineEntry>> t;
  t[0] = {comm(0, "all_reduce", "dp", {0, 1}, 500'000'000, true),
          comm(1, "all_reduce", "dp", {0, 1}, 500'000'000, true), wait(1)};
  EXPECT_DOUBLE_EQ(simulate(t, CostModel(simple_machine(), 2)).step_time_s, 1.0);
  // The model group spans both representatives: rank 0 issues at 0, rank 1 after 2 s of work,
  // so the (0.5 s) all-reduce ends at 2.5 on both and rank 0 waits 2.5 s.
  std::map<int, std::vector<TimelineEntry>> m;
  m[0] = {comm(0, "all_reduce", "model", {0, 1}, 500'000'000, false)};
  m[1] = {op(2), comm(0, "all_reduce", "model", {0, 1}, 500'000'000, false)};
  const SimulationResult r = simulate(m, CostModel(simple_machine(), 2));
  EXPECT_DOUBLE_EQ(r.ranks[0].end_s, 2.5);
  EXPECT_DOUBLE_EQ(r.ranks[1].end_s, 2.5);
}

TEST(Simulate, SameStagePeersAreSymmetricADeadlockOrAStrayPipelinePeerIsAnError) {
  std::map<int, std::vector<TimelineEntry>> t;
  t[0] = {comm(0, "recv", "pp", {0, 1}, 8, true, {1}), wait(0)};
  t[1] = {comm(0, "recv", "pp", {0, 1}, 8, true, {0}), wait(0)};
  EXPECT_THROW(
      {
        try {
          simulate(t, CostModel(simple_machine(), 2));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  // A peer in the same stage (cp's ring) is symmetric: its side is posted at once.
  std::map<int, std::vector<TimelineEntry>> cp;
  cp[0] = {comm(0, "batch_p2p", "cp", {0, 1}, 1'000'000'000, true, {1, 1}), op(1), wait(0)};
  cp[0][0].comm.detail = "send 500000000,recv 500000000";
  const SimulationResult ring = simulate(cp, CostModel(simple_machine(), 2));
  EXPECT_DOUBLE_EQ(ring.step_time_s, 1.0);  // 0.5 s on the wire, hidden behind the op
  cp[0][1] = op(0.25);
  EXPECT_DOUBLE_EQ(simulate(cp, CostModel(simple_machine(), 2)).exposed_s.at("cp"), 0.25);
  std::map<int, std::vector<TimelineEntry>> u;
  u[0] = {comm(0, "send", "pp", {0, 3}, 8, true, {3})};
  EXPECT_THROW(simulate(u, CostModel(simple_machine(), 4)), Error);
}

std::string source_dir() {
  const char* dir = std::getenv("PARALLEL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";  // ctest sets it
}

TEST(Hardware, EveryShippedDescriptionParses) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/configs/hardware")) {
    if (entry.path().extension() != ".yaml") continue;
    const HardwareDescription hw = load_hardware(entry.path().string());
    EXPECT_FALSE(hw.name.empty()) << entry.path();
    EXPECT_GT(hw.matmul_flops(DType::F32), 0) << entry.path();
    const HardwareDescription back = parse_hardware(hardware_yaml(hw), "round trip");  // writes what it reads
    EXPECT_EQ(back.name, hw.name);
    EXPECT_EQ(back.matmul_efficiency, hw.matmul_efficiency) << entry.path();
    EXPECT_EQ(back.op_tflops, hw.op_tflops) << entry.path();
    EXPECT_EQ(back.op_fixed_us, hw.op_fixed_us) << entry.path();
    ++count;
  }
  EXPECT_GE(count, 3);
}

TEST(Hardware, BadDescriptionsNameTheKey) {
  const std::string good = hardware_yaml(simple_machine());
  EXPECT_EQ(error_of(good), "");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_NE(error_of(with("memory_bandwidth_GBps: 1e+06", "memory_bandwidth_GBps: -3"))
                .find("bad.yaml: device.memory_bandwidth_GBps must be a number > 0, got -3"),
            std::string::npos);
  EXPECT_NE(error_of(with("vector_tflops", "vector_tflop")).find("device.vector_tflop is not a known key"),
            std::string::npos);
  EXPECT_NE(error_of(with("fp32: 1", "fp33: 1")).find("device.matmul_tflops.fp33 is not a dtype"),
            std::string::npos);
  EXPECT_NE(error_of(with("devices: 8", "devices: 1.5")).find("node.devices must be a whole number"),
            std::string::npos);
  EXPECT_NE(error_of(with("cluster: {bandwidth_GBps: 0.5, ", "cluster: {"))
                .find("links.cluster.bandwidth_GBps is missing"),
            std::string::npos);
  EXPECT_NE(error_of(with("vector_tflops: ", "host_us_per_op: -0.5\n  vector_tflops: "))
                .find("bad.yaml: device.host_us_per_op must be a number >= 0, got -0.5"),
            std::string::npos);
  EXPECT_NE(error_of(with("vector_tflops: ", "host_us_per_op: fast\n  vector_tflops: "))
                .find("bad.yaml: device.host_us_per_op must be a number >= 0, got 'fast'"),
            std::string::npos);
  // The measured communication terms: every error names its key.
  EXPECT_NE(error_of(with("devices: 8", "devices: 8\n  oversubscribed_wait_us: [[2, 40], [2, 50]]"))
                .find("bad.yaml: node.oversubscribed_wait_us[1][0] must increase, got 2 after 2"),
            std::string::npos);
  EXPECT_NE(error_of(with("devices: 8", "devices: 8\n  oversubscribed_wait_us: [[1, 40]]"))
                .find("node.oversubscribed_wait_us[0][0] must be a number > 1, got 1"),
            std::string::npos);
  EXPECT_NE(error_of(with("devices: 8", "devices: 8\n  subgroup_wait_us: [[1, 40]]"))
                .find("node.subgroup_wait_us[0][0] must be a number > 1, got 1"),
            std::string::npos);
  EXPECT_NE(error_of(with("devices: 8", "devices: 8\n  subgroup_wait_us: [[2, -4]]"))
                .find("node.subgroup_wait_us[0][1] must be a number >= 0, got -4"),
            std::string::npos);
  EXPECT_NE(
      error_of(with("devices: 8", "devices: 8\n  oversubscribed_wait_us: 40"))
          .find("node.oversubscribed_wait_us must be a list of [ranks per device > 1, microseconds] pairs"),
      std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, collective_us: {all_reduce: [[2, -1]]}}"))
                .find("links.node.collective_us.all_reduce[0][1] must be a number >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, collective_us: {broadcast: [[2, 3]]}}"))
                .find("links.node.collective_us.broadcast is not a known key"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, collective_us: {all_gather: [[2]]}}"))
                .find("links.node.collective_us.all_gather[0] must be a pair [group size > 1, microseconds]"),
            std::string::npos);
  // The kernels' fixed costs: microseconds >= 0 per op, one map for every dtype.
  const std::string overhead = "op_overhead_us: 0";
  EXPECT_NE(error_of(with(overhead, overhead + "\n  op_fixed_us: {attention_forward: -1}"))
                .find("bad.yaml: device.op_fixed_us.attention_forward must be a number >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_of(with(overhead, overhead + "\n  op_fixed_us: 3"))
                .find("bad.yaml: device.op_fixed_us must map op names to microseconds per call"),
            std::string::npos);
  EXPECT_NE(error_of(with(overhead, overhead + "\n  op_fixed_us: {fp32: {attention_forward: 1}}"))
                .find("bad.yaml: device.op_fixed_us.fp32 must be a number of microseconds"),
            std::string::npos);
  EXPECT_NE(error_of(with(overhead, overhead + "\n  op_fixed_us: {attention_forward: many}"))
                .find("device.op_fixed_us.attention_forward must be a number"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {all_reduce: [[65536, 0]]}}"))
                .find("bad.yaml: links.node.bus_GBps.all_reduce[0][1] must be a number > 0 (GB/s), got 0"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {all_reduce: [[1000, 1], [100, 2]]}}"))
                .find("links.node.bus_GBps.all_reduce[1][0] must increase, got 100 after 1000"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {recv: [[1e6, 1]]}}"))
                .find("links.node.bus_GBps.recv is not a known key"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {send: 3}}"))
                .find("links.node.bus_GBps.send must be a list of [message bytes > 0, GB/s > 0] pairs"),
            std::string::npos);
  // Per group size and per dtype: the key and the rule.
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {all_reduce: {1: [[1e6, 1]]}}}"))
                .find("bad.yaml: links.node.bus_GBps.all_reduce.1 is not a group size (a whole number > 1"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {all_reduce: {four: [[1e6, 1]]}}}"))
                .find("links.node.bus_GBps.all_reduce.four is not a group size"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {all_reduce: {4: [[1e6, -2]]}}}"))
                .find("links.node.bus_GBps.all_reduce.4[0][1] must be a number >= 0, got -2"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {all_reduce: {}}}"))
                .find("links.node.bus_GBps.all_reduce must map group sizes (> 1)"),
            std::string::npos);
  EXPECT_NE(
      error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {bf16: {all_reduce: [[1e6, 1]]}}}"))
          .find("bad.yaml: links.node.bus_GBps.fp32 is missing (the fallback tables of a per-dtype map)"),
      std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}",
                          "shared_by: 1, bus_GBps: {fp32: {send: [[1e6, 1]]}, all_reduce: [[1e6, 1]]}}"))
                .find("links.node.bus_GBps.all_reduce is not a dtype: a per-dtype bus_GBps maps every key"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}",
                          "shared_by: 1, bus_GBps: {fp32: {send: [[1e6, 1]]}, bf16: {recv: [[1e6, 1]]}}}"))
                .find("links.node.bus_GBps.bf16.recv is not a known key"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, bus_GBps: {fp32: {send: [[1e6, 1]]}, int32: {}}}"))
                .find("links.node.bus_GBps.int32 is not a floating dtype"),
            std::string::npos);
  EXPECT_NE(error_of(with("shared_by: 1}", "shared_by: 1, async_progress: no}"))
                .find("bad.yaml: links.node.async_progress must be true or false, got 'no'"),
            std::string::npos);
}

TEST(Hardware, BadPerDtypeCurvesAndRatesNameTheKey) {
  const std::string good = hardware_yaml(two_dtype_machine());
  EXPECT_EQ(error_of(good), "");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in\n" << good;
    return s.replace(at, from.size(), to);
  };
  auto expect_error = [](const std::string& error, const std::string& want) {
    EXPECT_NE(error.find(want), std::string::npos) << "got: " << error << "\nwant: " << want;
  };
  expect_error(error_of(with("    bf16: [[100", "    bf17: [[100")),
               "bad.yaml: device.matmul_efficiency.bf17 is not a dtype");
  expect_error(error_of(with("    bf16: [[100", "    int32: [[100")),
               "bad.yaml: device.matmul_efficiency.int32 is not a floating dtype");
  expect_error(error_of(with("    fp32: [[100, 1]", "    fp16: [[100, 1]")),
               "device.matmul_efficiency.fp32 is missing (the fallback curve of a per-dtype map)");
  expect_error(error_of(with("bf16: [[100, 0.25], [10000, 0.5]]", "bf16: [[100, 0.25], [50, 0.5]]")),
               "device.matmul_efficiency.bf16[1][0] sizes must increase, got 50 after 100");
  expect_error(error_of(with("bf16: [[100, 0.25], [10000, 0.5]]", "bf16: [[100, 0.25], [10000, 1.5]]")),
               "device.matmul_efficiency.bf16[1][1] is a fraction of peak and must be <= 1, got 1.5");
  expect_error(error_of(with("bf16: [[100, 0.25], [10000, 0.5]]", "bf16: 0.5")),
               "device.matmul_efficiency.bf16 must be a list of [gemm size, fraction of peak] pairs");
  expect_error(error_of(with("bf16: {gelu_forward: 0.125}", "bf16: {gelu_forward: -1}")),
               "device.op_tflops.bf16.gelu_forward must be a number > 0, got -1");
  expect_error(error_of(with("bf16: {gelu_forward: 0.125}", "bf16: 0.125")),
               "device.op_tflops.bf16 must map op names to TFLOP/s");
  // The two forms mixed: a dtype among ops, an op among dtypes.
  expect_error(error_of(with("bf16: {gelu_forward: 0.125}", "gelu_backward: 0.125")),
               "device.op_tflops.gelu_backward is not a dtype: a per-dtype op_tflops maps every key to");
  expect_error(error_of(with("    fp32: {adamw_update_", "    fp64: {adamw_update_")),
               "device.op_tflops.fp64 is not a dtype");
  std::string mixed = hardware_yaml(simple_machine());
  const std::string vector_line = "  vector_tflops: 1\n";
  mixed.replace(mixed.find(vector_line), vector_line.size(),
                vector_line + "  op_tflops: {gelu_forward: 1, bf16: 2}\n");
  expect_error(error_of(mixed),
               "device.op_tflops.bf16 is a dtype: give either {op: TFLOP/s} for every dtype");
}

TEST(MetaModel, ParametersAreBornOnMetaWithoutHostMemory) {
  // One rank of a 1T-parameter GPT (128 layers, hidden 25600, tp8 pp64: 2 layers, ~2.5e9
  // parameters here): construction takes no host memory and no init time.
  ModelConfig m;
  m.num_layers = 128;
  m.hidden_size = 25600;
  m.num_attention_heads = 160;
  m.vocab_size = 51200;
  m.seq_length = 2048;
  auto log = std::make_shared<CommLog>();
  MetaCommunicator tp(0, 8, log);
  const auto host_before = allocator_for(Device::cpu()).stats().allocated;
  const auto meta_before = allocator_for(Device::meta()).stats().allocated;
  ChunkSpec spec;
  spec.first_layer = 2;
  spec.num_layers = 2;
  spec.pre_process = false;
  spec.post_process = false;
  GPTModel::Options options;
  options.device = Device::meta();
  options.precision = Precision::BF16;
  GPTModel model(m, spec, options, tp);
  int64_t params = 0;
  for (Parameter* p : model.parameters()) {
    params += p->numel();
    EXPECT_TRUE(p->value.device().is_meta()) << p->name;
  }
  // 2 layers x 12 h^2 / 8 (plus biases and norms).
  EXPECT_NEAR(static_cast<double>(params), 2 * 12.0 * 25600.0 * 25600.0 / 8, 2e6);
  EXPECT_EQ(allocator_for(Device::cpu()).stats().allocated, host_before);
  // bf16 values and fp32 gradients: 6 bytes per parameter on the meta allocator.
  EXPECT_EQ(static_cast<int64_t>(allocator_for(Device::meta()).stats().allocated - meta_before), 6 * params);
}

TEST(StepPlan, TracesAPipelineAndFindsItsBubble) {
  const Config c = parse_config(R"(
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, vocab_size: 512, seq_length: 64}
train: {micro_batch_size: 2, global_batch_size: 8, steps: 1}
parallel: {pipeline: 2, tensor: 2}
data: {path: synthetic}
)",
                                {}, 8);
  EXPECT_EQ(representative_ranks(c, 8), (std::vector<int>{0, 4}));
  const StepPlan p = plan_step(c, 8, simple_machine());
  ASSERT_EQ(p.traces.size(), 2u);
  EXPECT_GT(p.sim.step_time_s, 0);
  EXPECT_GT(p.sim.bubble_fraction, 0);
  EXPECT_LT(p.sim.bubble_fraction, 0.5);
  EXPECT_GT(p.sim.exposed_s.at("tp"), 0);  // tensor-parallel all-reduces are synchronous
  EXPECT_GT(p.hardware_flops, p.model_flops * 0.9);
  EXPECT_NEAR(p.tokens_per_s * p.sim.step_time_s, 8 * 64, 1e-6);
  EXPECT_GT(p.timeline_entries, 0u);
  // Stage 1's timeline: a wait for each micro-batch's activations, after its receive.
  const RankTrace t = trace_step(c, 8, 4);
  int receives = 0, waits = 0;
  for (const TimelineEntry& e : t.timeline) {
    if (e.kind == TimelineEntry::Kind::Comm && (e.comm.kind == "recv" || e.comm.kind == "batch_p2p"))
      ++receives;
    waits += e.kind == TimelineEntry::Kind::Wait;
  }
  EXPECT_GE(receives, 2);  // 2 micro-batches (8 sequences, micro-batch 2, dp 2)
  EXPECT_GE(waits, receives);
}

TEST(StepPlan, TheTraceEndsWithTheTrainersPerStepAllReduceOverTheWorld) {
  // The trainer's timed span (trainer.cpp) holds, after TrainStep's step, an all-reduce of 4 int64
  // maxima over the world: the trace ends with it, so every rank of a job meets there.
  const Config c = parse_config(R"(
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, vocab_size: 512, seq_length: 32}
train: {micro_batch_size: 2, global_batch_size: 8, steps: 1}
data: {path: synthetic}
)",
                                {}, 2);
  const RankTrace t = trace_step(c, 2, 1);
  const auto last = std::find_if(t.timeline.rbegin(), t.timeline.rend(),
                                 [](const TimelineEntry& e) { return e.kind == TimelineEntry::Kind::Comm; });
  ASSERT_NE(last, t.timeline.rend());
  EXPECT_EQ(last->comm.kind, "all_reduce");
  EXPECT_EQ(last->comm.bytes, 32);
  EXPECT_EQ(last->comm.dtype, DType::I64);
  EXPECT_EQ(last->comm.ranks, (std::vector<int>{0, 1}));
  EXPECT_FALSE(last->comm.async);
}

}  // namespace
}  // namespace parallel::plan
