// The layout search (layout_search.hpp) on a small world, against a brute force: every layout it
// returns passes the layout rules and fits memory, they are ranked by predicted step time, the
// first one's time is a direct plan_step of its config, and no layout the brute force finds (every
// enumerated layout that passes the rules and fits, each simulated) is faster than the first -
// which also checks the search's time lower bound and recompute dominance on this model.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/layout_search.hpp"
#include "parallel/memory_plan.hpp"

namespace parallel::plan {
namespace {

HardwareDescription machine(double memory_gib, int devices_per_node = 4) {
  return parse_hardware(fmt::format(R"(
name: test
device:
  matmul_tflops: {{fp32: 10, bf16: 40}}
  matmul_efficiency: [[16, 0.2], [256, 0.8]]
  vector_tflops: 1
  memory_bandwidth_GBps: 100
  op_overhead_us: 2
  memory_GiB: {}
node:
  devices: {}
links:
  node: {{bandwidth_GBps: 50, latency_us: 2}}
  cluster: {{bandwidth_GBps: 10, latency_us: 5}}
)",
                                    memory_gib, devices_per_node),
                        "test.yaml");
}

Config model() {
  return parse_config(R"(
model: {num_layers: 8, hidden_size: 64, num_attention_heads: 2, vocab_size: 512, seq_length: 64}
train: {micro_batch_size: 1, global_batch_size: 16, steps: 1, precision: bf16}
data: {path: synthetic}
)",
                      {}, 1);
}

// 4 experts, top 2, all-to-all dispatch: small enough to brute-force every layout of 4 ranks.
Config moe_model() {
  return parse_config(R"(
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 2, vocab_size: 512, seq_length: 64,
        num_experts: 4, moe_router_topk: 2, moe_ffn_hidden_size: 64, moe_token_dispatcher: alltoall}
train: {micro_batch_size: 1, global_batch_size: 8, steps: 1, precision: bf16}
data: {path: synthetic}
)",
                      {}, 1);
}

int64_t largest(const Config& c, int world) {
  int64_t peak = 0;
  for (const RankMemoryPlan& r : plan_memory(c, world).ranks) peak = std::max(peak, r.allocator_bytes);
  return peak;
}

TEST(LayoutSearch, FitsFollowsTheRulesRanksByTimeAndBeatsTheBruteForce) {
  constexpr int kWorld = 4;
  // A memory limit between the layouts' peaks, so that some do not fit.
  const double limit_gib = 4.0 / 1024;  // 4 MiB
  const HardwareDescription hw = machine(limit_gib);
  SearchOptions options;
  options.top_k = 4;
  options.micro_batch_sizes = {1, 2};
  const SearchResult r = search_layouts(model(), kWorld, hw, options);
  ASSERT_FALSE(r.top.empty());
  EXPECT_GT(r.rejected_by_rules, 0);
  EXPECT_LE(static_cast<int>(r.top.size()), options.top_k);
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const SearchedLayout& s = r.top[i];
    Config c = s.config;
    EXPECT_NO_THROW(validate_config(c, kWorld)) << s.layout;
    EXPECT_LE(static_cast<double>(s.peak_bytes), r.memory_limit_bytes) << s.layout;
    EXPECT_EQ(s.peak_bytes, largest(s.config, kWorld)) << s.layout;
    EXPECT_LE(s.time_lower_bound_s, s.step_time_s) << s.layout;
    if (i > 0) EXPECT_LE(r.top[i - 1].step_time_s, s.step_time_s);
  }
  // The first layout's time is the plan of its config.
  const StepPlan direct = plan_step(r.top.front().config, kWorld, hw);
  EXPECT_EQ(direct.sim.step_time_s, r.top.front().step_time_s);

  // Brute force over the same enumeration: nothing that fits is faster than the first.
  const SearchResult all = [&] {
    SearchOptions o = options;
    o.top_k = 1 << 20;    // everything that fits is kept
    o.exhaustive = true;  // no time bound, no recompute dominance: every layout simulated
    return search_layouts(model(), kWorld, machine(1e6), o);
  }();
  double best = std::numeric_limits<double>::infinity();
  int fits = 0, too_big = 0;
  for (const SearchedLayout& s : all.top) {
    EXPECT_LE(s.time_lower_bound_s, s.step_time_s) << s.layout;  // the bounds hold on every layout
    EXPECT_LE(memory_lower_bound(s.config), static_cast<double>(s.peak_bytes)) << s.layout;
    if (static_cast<double>(s.peak_bytes) > r.memory_limit_bytes) {
      ++too_big;
      continue;
    }
    ++fits;
    best = std::min(best, s.step_time_s);
  }
  EXPECT_GT(too_big, 0) << "the limit should rule some layouts out";
  EXPECT_GT(fits, 0);
  EXPECT_EQ(r.top.front().step_time_s, best) << r.top.front().layout << " / " << [&] {
    for (const SearchedLayout& s : all.top)
      if (s.step_time_s == best && static_cast<double>(s.peak_bytes) <= r.memory_limit_bytes) return s.layout;
    return std::string();
  }();
  EXPECT_LT(r.simulated, all.simulated);  // the pruning pruned
}

// First and last stage layer counts (SearchOptions::stage_layer_shift): on a model whose output
// layer outweighs two transformer layers (vocabulary 16384 at width 64), the search tries pp 2 with 5 / 3
// and 3 / 5 layers beside 4 / 4; both bounds hold on every such layout of the brute force, the
// last stage holding one layer fewer is predicted faster than the even split (it also runs the
// output layer), and the search's first is the brute force's fastest. Shift 0: the even split only.
TEST(LayoutSearch, FirstAndLastStageLayerCountsAreSearched) {
  Config base = model();
  base.model.vocab_size = 16384;
  constexpr int kWorld = 2;
  SearchOptions options;
  options.top_k = 3;
  options.micro_batch_sizes = {1, 2};
  options.stage_layer_shift = 1;
  const SearchResult all = [&] {
    SearchOptions o = options;
    o.top_k = 1 << 20;
    o.exhaustive = true;
    return search_layouts(base, kWorld, machine(1e6), o);
  }();
  std::map<std::string, double> step;  // pp2 1f1b, no sharding, no recompute, mb 1: by layer counts
  int uneven = 0;
  for (const SearchedLayout& s : all.top) {
    const ParallelConfig& p = s.config.parallel;
    if (p.first_stage_layers > 0 || p.last_stage_layers > 0) {
      ++uneven;
      EXPECT_NE(s.layout.find(fmt::format("pp2 layers {}-{} v1", p.first_stage_layers, p.last_stage_layers)),
                std::string::npos)
          << s.layout;
      EXPECT_EQ(p.first_stage_layers + p.last_stage_layers, 8) << s.layout;
    }
    EXPECT_LE(s.time_lower_bound_s, s.step_time_s) << s.layout;
    EXPECT_LE(memory_lower_bound(s.config), static_cast<double>(s.peak_bytes)) << s.layout;
    if (p.pipeline == 2 && p.pipeline_schedule == PipelineSchedule::OneFOneB &&
        s.config.optimizer.sharding == Sharding::None && s.config.train.recompute == Recompute::None &&
        s.config.train.micro_batch_size == 1)
      step[fmt::format("{}-{}", p.first_stage_layers, p.last_stage_layers)] = s.step_time_s;
  }
  EXPECT_GT(uneven, 0);
  ASSERT_TRUE(step.count("0-0") && step.count("5-3") && step.count("3-5")) << step.size();
  EXPECT_LT(step["5-3"], step["0-0"]);
  EXPECT_LT(step["0-0"], step["3-5"]);
  EXPECT_FALSE(step.count("6-2"));  // beyond the shift
  const SearchResult r = search_layouts(base, kWorld, machine(1e6), options);
  ASSERT_FALSE(r.top.empty());
  double best = std::numeric_limits<double>::infinity();
  for (const SearchedLayout& s : all.top) best = std::min(best, s.step_time_s);
  EXPECT_EQ(r.top.front().step_time_s, best) << r.top.front().layout;
  // Shift 0: no explicit counts.
  SearchOptions even = options;
  even.stage_layer_shift = 0;
  even.top_k = 1 << 20;
  even.exhaustive = true;
  for (const SearchedLayout& s : search_layouts(base, kWorld, machine(1e6), even).top)
    EXPECT_EQ(s.config.parallel.first_stage_layers + s.config.parallel.last_stage_layers, 0) << s.layout;
}

// Planning on several threads (SearchOptions::threads) gives the sequential search's result: the
// same top k in the same order, the same times, peaks and bounds, and the same counts - on the
// dense model under a limit that rules layouts out (so that fits and dominance decide what is
// planned) and on a MoE model, on 1, 2 and 4 threads.
TEST(LayoutSearch, ThreadsGiveTheSequentialResult) {
  const Config moe = moe_model();
  struct Case {
    Config config;
    double limit_gib;
  };
  for (const Case& k : {Case{model(), 4.0 / 1024}, Case{moe, 3.0 / 1024}}) {
    const auto search = [&](int threads) {
      SearchOptions o;
      o.top_k = 6;
      o.micro_batch_sizes = {1, 2};
      o.threads = threads;
      return search_layouts(k.config, 4, machine(k.limit_gib), o);
    };
    const SearchResult one = search(1);
    ASSERT_GE(one.top.size(), 2u);
    EXPECT_GT(one.rejected_by_memory + one.implied_too_big, 0) << "the limit should rule layouts out";
    for (int threads : {2, 4}) {
      const SearchResult many = search(threads);
      ASSERT_EQ(many.top.size(), one.top.size()) << threads;
      for (std::size_t i = 0; i < one.top.size(); ++i) {
        EXPECT_EQ(many.top[i].layout, one.top[i].layout) << threads << " threads, #" << i;
        EXPECT_EQ(many.top[i].step_time_s, one.top[i].step_time_s) << one.top[i].layout;
        EXPECT_EQ(many.top[i].peak_bytes, one.top[i].peak_bytes) << one.top[i].layout;
        EXPECT_EQ(many.top[i].time_lower_bound_s, one.top[i].time_lower_bound_s) << one.top[i].layout;
        EXPECT_EQ(many.top[i].mfu, one.top[i].mfu) << one.top[i].layout;
      }
      EXPECT_EQ(many.enumerated, one.enumerated);
      EXPECT_EQ(many.rejected_by_rules, one.rejected_by_rules);
      EXPECT_EQ(many.rejected_by_memory_bound, one.rejected_by_memory_bound);
      EXPECT_EQ(many.dominated, one.dominated);
      EXPECT_EQ(many.simulated, one.simulated);
      EXPECT_EQ(many.memory_plans, one.memory_plans);
      EXPECT_EQ(many.rejected_by_memory, one.rejected_by_memory);
      EXPECT_EQ(many.implied_too_big, one.implied_too_big);
    }
    fmt::print("{}: {} simulated, {} memory plans, {} did not fit, fastest {}\n",
               k.config.model.num_experts > 0 ? "moe" : "dense", one.simulated, one.memory_plans,
               one.rejected_by_memory, one.top.front().layout);
  }
}

// The time bound under the unfused attention kernel (its passes over the scores are priced into the
// bound) and dropout, on nodes of 2 devices (so that HSDP, sharding within a node, is enumerated and
// groups span nodes): below the predicted step time of every layout.
TEST(LayoutSearch, TimeBoundHoldsUnderUnfusedAttention) {
  SearchOptions o;
  o.top_k = 1 << 20;
  o.exhaustive = true;
  o.micro_batch_sizes = {2};
  o.cost = {.attention = AttentionKernel::Unfused, .attention_dropout = 0.1};
  Config c = model();
  c.model.dropout = 0.1;
  const SearchResult all = search_layouts(c, 4, machine(1e6, 2), o);
  ASSERT_GT(all.top.size(), 10u);
  int hsdp = 0;
  for (const SearchedLayout& s : all.top) {
    EXPECT_LE(s.time_lower_bound_s, s.step_time_s) << s.layout;
    EXPECT_LE(memory_lower_bound(s.config), static_cast<double>(s.peak_bytes)) << s.layout;
    hsdp += s.config.optimizer.sharding_group_size > 0;
  }
  EXPECT_GT(hsdp, 0);
}

// A mixture-of-experts model: expert (1, 2, 4) and expert-tensor parallelism (1, 2, 4: the expert
// width 64 split up to a node's 4 devices) are enumerated with everything else, and HSDP's group
// sizes with them. Against the brute force: both bounds hold on every layout (etp > 1 and HSDP ones
// among them), and under a memory limit that rules out half of the layouts the search's fastest is
// the brute force's fastest that fits.
TEST(LayoutSearch, ExpertTensorParallelLayoutsAgainstTheBruteForce) {
  constexpr int kWorld = 4;
  const Config moe = moe_model();
  SearchOptions options;
  options.micro_batch_sizes = {2};
  const SearchResult all = [&] {
    SearchOptions o = options;
    o.top_k = 1 << 20;
    o.exhaustive = true;
    return search_layouts(moe, kWorld, machine(1e6), o);
  }();
  std::vector<int64_t> peaks;
  int etp = 0, hsdp = 0;
  for (const SearchedLayout& s : all.top) {
    EXPECT_LE(s.time_lower_bound_s, s.step_time_s) << s.layout;
    EXPECT_LE(memory_lower_bound(s.config), static_cast<double>(s.peak_bytes)) << s.layout;
    Config c = s.config;
    EXPECT_NO_THROW(validate_config(c, kWorld)) << s.layout;
    peaks.push_back(s.peak_bytes);
    etp += s.config.parallel.expert_tensor > 1;
    hsdp += s.config.optimizer.sharding_group_size > 0;
  }
  EXPECT_GT(etp, 0) << "no layout with expert-tensor parallelism was enumerated";
  EXPECT_GT(hsdp, 0);
  // How far the time bound sits below the step: the experts' GEMMs, the dispatch and each GEMM's
  // op overhead are in it.
  std::vector<double> ratios;
  for (const SearchedLayout& s : all.top) ratios.push_back(s.step_time_s / s.time_lower_bound_s);
  std::sort(ratios.begin(), ratios.end());
  fmt::print("moe: predicted step / time bound over {} layouts: min {:.2f}, median {:.2f}, max {:.2f}\n",
             ratios.size(), ratios.front(), ratios[ratios.size() / 2], ratios.back());
  // With neither (attention and dense GEMMs only) it sat 20 to 79 times below; now 2.8 to 5.8
  // (what is left: the router, the permutation, norms and element-wise ops, each an op's overhead).
  EXPECT_LT(ratios.back(), 8.0) << "the time bound is loose on MoE layouts";

  // A limit at the median peak: about half the layouts fit.
  std::sort(peaks.begin(), peaks.end());
  ASSERT_FALSE(peaks.empty());
  const double limit = static_cast<double>(peaks[peaks.size() / 2]);
  options.top_k = 2;
  const SearchResult r = search_layouts(moe, kWorld, machine(limit / (1024.0 * 1024.0 * 1024.0)), options);
  ASSERT_FALSE(r.top.empty());
  double best = std::numeric_limits<double>::infinity();
  for (const SearchedLayout& s : all.top)
    if (static_cast<double>(s.peak_bytes) <= r.memory_limit_bytes) best = std::min(best, s.step_time_s);
  EXPECT_EQ(r.top.front().step_time_s, best) << r.top.front().layout;
  for (const SearchedLayout& s : r.top) {
    EXPECT_LE(static_cast<double>(s.peak_bytes), r.memory_limit_bytes) << s.layout;
    EXPECT_EQ(s.peak_bytes, largest(s.config, kWorld)) << s.layout;
  }
  EXPECT_LT(r.simulated, all.simulated);
  fmt::print(
      "moe: {} layouts enumerated, {} valid ({} with etp > 1, {} HSDP); the search simulated {}, "
      "fastest under {:.2f} MiB: {}\n",
      all.enumerated, all.top.size(), etp, hsdp, r.simulated, limit / (1 << 20), r.top.front().layout);
}

// The memory bound's activations are measured (kept_activation_bytes_per_layer: layers run on the
// meta device), not listed by hand: on a model whose activations outweigh its weights (sequence 256,
// dropout), under every pipeline schedule the search enumerates, tp with sequence parallelism and
// each recompute, the bound stays below the memory plan's largest rank, and without full recompute
// it accounts for most of the plan's activations term (the hand-written floor it replaced counted
// the layer input, q, k, v and the MLP's first output: about half here, a quarter or less at scale).
TEST(LayoutSearch, MemoryBoundCountsTheMeasuredActivations) {
  const Config base = parse_config(R"(
model: {num_layers: 8, hidden_size: 64, num_attention_heads: 2, vocab_size: 512, seq_length: 256, dropout: 0.1}
train: {micro_batch_size: 1, global_batch_size: 32, steps: 1, precision: bf16}
data: {path: synthetic}
)",
                                   {}, 1);
  int checked = 0;
  for (int tp : {1, 2})
    for (int pp : {2, 4})
      for (PipelineSchedule schedule : {PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved,
                                        PipelineSchedule::ZeroBubbleH1, PipelineSchedule::ZeroBubbleV})
        for (Recompute recompute : {Recompute::None, Recompute::Selective, Recompute::Full}) {
          if (tp * pp > 4) continue;
          Config c = base;
          c.parallel.tensor = tp;
          c.parallel.sequence_parallel = tp > 1;
          c.parallel.pipeline = pp;
          c.parallel.pipeline_schedule = schedule;
          const bool chunks =
              schedule == PipelineSchedule::Interleaved || schedule == PipelineSchedule::ZeroBubbleV;
          c.parallel.virtual_stages = chunks ? 2 : 1;
          c.parallel.data = 0;
          c.train.recompute = recompute;
          validate_config(c, 4);
          const std::string name = layout_name(c);
          int64_t peak = 0, activations = 0;
          for (const RankMemoryPlan& r : plan_memory(c, 4).ranks)
            if (r.allocator_bytes > peak) {
              peak = r.allocator_bytes;
              for (const MemoryTerm& t : r.terms)
                if (t.name == "activations") activations = t.bytes;
            }
          const double kept = kept_activation_bytes_per_layer(c);
          EXPECT_GT(kept, 0) << name;
          const double bound = memory_lower_bound(c, kept);
          EXPECT_EQ(bound, memory_lower_bound(c)) << name;
          EXPECT_LE(bound, static_cast<double>(peak)) << name;
          if (recompute != Recompute::Full)
            EXPECT_GE(bound - memory_lower_bound(c, 0), 0.6 * static_cast<double>(activations)) << name;
          ++checked;
        }
  EXPECT_EQ(checked, 36);
}

// MoE (every second layer, ep enumerated): the measured activations take the smaller of a
// dense and a MoE layer, and the bound stays below the plan on every layout of a brute force; the
// time bound, which takes each layer as the cheaper kind, below the predicted step - under both
// dispatchers, and with a capacity that drops assignments.
TEST(LayoutSearch, BoundsHoldOnMoE) {
  for (const char* dispatch :
       {"moe_token_dispatcher: alltoall", "moe_token_dispatcher: allgather, moe_capacity_factor: 0.5"}) {
    const Config c = parse_config(fmt::format(R"(
model: {{num_layers: 4, hidden_size: 64, num_attention_heads: 2, vocab_size: 512, seq_length: 128,
        num_experts: 4, moe_router_topk: 2, moe_ffn_hidden_size: 64, moe_layer_freq: 2, {}}}
train: {{micro_batch_size: 1, global_batch_size: 8, steps: 1, precision: bf16}}
data: {{path: synthetic}}
)",
                                              dispatch),
                                  {}, 1);
    SearchOptions o;
    o.top_k = 1 << 20;
    o.exhaustive = true;
    o.micro_batch_sizes = {1};
    const SearchResult all = search_layouts(c, 4, machine(1e6), o);
    ASSERT_GT(all.top.size(), 10u) << dispatch;
    int moe = 0;
    for (const SearchedLayout& s : all.top) {
      EXPECT_LE(memory_lower_bound(s.config), static_cast<double>(s.peak_bytes))
          << dispatch << ": " << s.layout;
      EXPECT_LE(s.time_lower_bound_s, s.step_time_s) << dispatch << ": " << s.layout;
      moe += s.config.parallel.expert > 1;
    }
    EXPECT_GT(moe, 0) << dispatch;
  }
}

// The search asks the memory plan only whether a layout fits (MetaPlanOptions::
// stop_above_allocator_bytes): at the largest rank's peak the plan is whole and the same; a byte
// below it, it stops at a stage above the limit.
TEST(LayoutSearch, MemoryPlanStopsAboveTheLimit) {
  Config c = model();
  c.parallel.pipeline = 4;
  c.parallel.data = 0;
  validate_config(c, 4);
  const MemoryPlan whole = plan_memory(c, 4);
  const int64_t peak = largest(c, 4);
  const MemoryPlan at = plan_memory_on_meta(c, 4, {.stop_above_allocator_bytes = static_cast<double>(peak)});
  EXPECT_TRUE(at.complete);
  ASSERT_EQ(at.ranks.size(), whole.ranks.size());
  for (std::size_t i = 0; i < at.ranks.size(); ++i)
    EXPECT_EQ(at.ranks[i].allocator_bytes, whole.ranks[i].allocator_bytes);
  const MemoryPlan below =
      plan_memory_on_meta(c, 4, {.stop_above_allocator_bytes = static_cast<double>(peak - 1)});
  EXPECT_FALSE(below.complete);
  EXPECT_LT(below.ranks.size(), whole.ranks.size());
  EXPECT_EQ(below.largest().allocator_bytes, peak);
}

}  // namespace
}  // namespace parallel::plan
