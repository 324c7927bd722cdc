// The layout search (layout_search.hpp): enumerate, prune by the rules and lower bounds, simulate
// in order of the time bound, check memory on the layouts that would enter the top k.
#include "parallel/layout_search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "parallel/error.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/precision.hpp"
#include "parallel/sharding.hpp"

namespace parallel::plan {
namespace {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Weight elements of one transformer layer (dense, or the layer's share of the experts under ep).
double layer_weights(const ModelConfig& m, int layer, int ep) {
  const double h = m.hidden_size, heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double kv = h / heads * groups;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double gated = m.activation == Activation::SwiGLU ? 2 : 1;
  double mlp = (gated + 1) * h * ffn;
  if (m.num_experts > 0 && layer % std::max(1, m.moe_layer_freq) == 0) {
    const double eff = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : ffn;
    mlp = static_cast<double>(m.num_experts) / ep * (gated + 1) * h * eff;
  }
  return h * (h + 2 * kv) + h * h + mlp;
}

// Lower bound on a rank's bytes (layout_search.hpp, pruning 2): the fewest layers a stage holds.
double memory_lower_bound(const Config& c) {
  const ParallelConfig& p = c.parallel;
  const int stages = p.pipeline;
  double weights = 0;
  for (int i = 0; i < c.model.num_layers / stages; ++i) weights += layer_weights(c.model, i, p.expert);
  weights /= p.tensor;
  const double shards = static_cast<double>(p.data) * p.context;
  const Sharding s = c.optimizer.sharding;
  const double value_bytes = static_cast<double>(dtype_size(compute_dtype(c.train.precision)));
  const double values = weights * value_bytes / (s == Sharding::OptimGradsParams ? shards : 1.0);
  const double moments =
      c.optimizer.type == OptimizerType::AdamW ? weights * 8 / (s != Sharding::None ? shards : 1.0) : 0.0;
  return values + moments;
}

// Lower bound on the step time (layout_search.hpp, pruning 3): the compute stream of a rank holding
// the fewest layers runs every micro-batch's GEMMs and attention at least, each at the rate the
// cost model gives its size (m n k)^(1/3) at most (a GEMM the model splits further is smaller and
// slower; the backward's two GEMMs per weight have the forward's size), after the pipeline's fill.
double time_lower_bound(const Config& c, const HardwareDescription& hw, double share) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const double rate = hw.matmul_flops(compute_dtype(c.train.precision)) * share;
  const auto gemm = [&](double mm, double n, double k) {
    return 2 * mm * n * k / (rate * hw.matmul_efficiency_at(std::cbrt(mm * n * k)));
  };
  const double h = m.hidden_size, heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = h / heads, kv = d * groups;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double gated = m.activation == Activation::SwiGLU ? 2 : 1;
  const double tokens = static_cast<double>(c.train.micro_batch_size) * m.seq_length / p.context;
  const double local_seq = static_cast<double>(m.seq_length) / p.context;
  // Causal attention of this rank's heads over its share of the sequence (forward).
  const double attention_flops =
      2.0 * m.seq_length * m.seq_length * c.train.micro_batch_size * (heads / p.tensor) * d / p.context;
  const double attention =
      attention_flops / (rate * hw.matmul_efficiency_at(std::cbrt(local_seq * local_seq * d)));
  const int layers = m.num_layers / p.pipeline;  // every stage holds at least this many
  double forward = 0, backward = 0;
  for (int i = 0; i < layers; ++i) {
    const bool moe = m.num_experts > 0 && i % std::max(1, m.moe_layer_freq) == 0;
    double g = gemm(tokens, (h + 2 * kv) / p.tensor, h) + gemm(tokens, h, h / p.tensor);
    if (!moe) g += gemm(tokens, gated * ffn / p.tensor, h) + gemm(tokens, h, ffn / p.tensor);
    forward += g + attention;
    backward += 2 * g + 2.5 * attention;
  }
  if (p.pipeline == 1) {  // the one stage also has the output layer
    const double out = gemm(tokens, static_cast<double>(m.vocab_size) / p.tensor, h);
    forward += out;
    backward += 2 * out;
  }
  const double recompute = c.train.recompute == Recompute::Full ? forward : 0.0;
  const double micro_batches = static_cast<double>(c.train.global_batch_size) /
                               (static_cast<double>(c.train.micro_batch_size) * p.data);
  // The last stage starts no work before the first micro-batch's forward has passed the pp - 1
  // stages before it (any schedule): pp - 1 chunks of layers / (pp v) layers each.
  const double fill = (p.pipeline - 1) * forward / p.virtual_stages;
  return fill + micro_batches * (forward + backward + recompute);
}

}  // namespace

std::string layout_name(const Config& c) {
  const ParallelConfig& p = c.parallel;
  return fmt::format("tp{}{} pp{} v{} dp{} cp{} ep{} {} sharding {} recompute {} mb{}", p.tensor,
                     p.sequence_parallel ? "+sp" : "", p.pipeline, p.virtual_stages, p.data, p.context,
                     p.expert, pipeline::schedule_name(p.pipeline_schedule),
                     sharding_name(c.optimizer.sharding), recompute_name(c.train.recompute),
                     c.train.micro_batch_size);
}

SearchResult search_layouts(const Config& base, int world_size, const HardwareDescription& hw,
                            const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult result;
  result.memory_limit_bytes = hw.memory_GiB * 1024.0 * 1024.0 * 1024.0;
  const CostModel cost(hw, world_size, options.ranks_per_node);
  const ModelConfig& m = base.model;
  const int node = std::min(world_size, hw.devices_per_node);

  struct Candidate {
    Config config;
    double bound = 0;
  };
  std::vector<Candidate> candidates;
  std::vector<int> contexts{1};
  if (m.seq_length >= 8192)
    for (int cp : {2, 4, 8}) contexts.push_back(cp);
  const std::vector<int> experts = m.num_experts > 0 ? divisors(m.num_experts) : std::vector<int>{1};
  for (int tp : divisors(world_size)) {
    if (tp > node) continue;
    for (int pp : divisors(world_size / tp)) {
      if (pp > m.num_layers) continue;
      for (int cp : contexts) {
        if ((world_size / tp / pp) % cp != 0) continue;
        const int dp = world_size / (tp * pp * cp);
        for (int v = 1; pp * v <= m.num_layers; v *= 2) {
          if (v > 1 && (pp == 1 || m.num_layers % (pp * v) != 0)) break;
          std::vector<PipelineSchedule> schedules;
          if (v == 1) schedules = {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubbleH1};
          if (v > 1) schedules = {PipelineSchedule::Interleaved};
          if (v == 2) schedules.push_back(PipelineSchedule::ZeroBubbleV);
          if (pp == 1) schedules = {PipelineSchedule::OneFOneB};
          for (PipelineSchedule schedule : schedules)
            for (int ep : experts)
              for (Sharding sharding :
                   {Sharding::None, Sharding::Optim, Sharding::OptimGrads, Sharding::OptimGradsParams}) {
                if (dp * cp == 1 && sharding != Sharding::None) continue;
                for (Recompute recompute : {Recompute::None, Recompute::Selective, Recompute::Full})
                  for (int mb : options.micro_batch_sizes) {
                    ++result.enumerated;
                    Config c = base;
                    ParallelConfig& p = c.parallel;
                    p.tensor = tp;
                    p.pipeline = pp;
                    p.context = cp;
                    p.virtual_stages = v;
                    p.pipeline_schedule = schedule;
                    p.sequence_parallel = tp > 1;
                    p.expert = ep;
                    p.expert_tensor = 1;
                    p.first_stage_layers = p.last_stage_layers = 0;
                    p.data = 0;
                    c.optimizer.sharding = sharding;
                    c.optimizer.distributed = sharding != Sharding::None;
                    c.optimizer.sharding_group_size = 0;
                    if (sharding != Sharding::OptimGradsParams) c.optimizer.overlap_param_gather = false;
                    c.optimizer.reshard_after_forward = true;
                    c.train.recompute = recompute;
                    c.train.micro_batch_size = mb;
                    try {
                      validate_config(c, world_size);
                    } catch (const Error&) {
                      ++result.rejected_by_rules;
                      continue;
                    }
                    // The bound counts no activations: a stronger recompute cannot pass where a weaker
                    // failed.
                    if (result.memory_limit_bytes > 0 && memory_lower_bound(c) > result.memory_limit_bytes) {
                      ++result.rejected_by_memory_bound;
                      continue;
                    }
                    const double bound = time_lower_bound(c, hw, cost.share());
                    candidates.push_back({std::move(c), bound});
                  }
              }
        }
      }
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.bound < b.bound; });
  const auto kth = [&] {
    return static_cast<int>(result.top.size()) < options.top_k ? std::numeric_limits<double>::infinity()
                                                               : result.top.back().step_time_s;
  };
  // Recompute dominance (layout_search.hpp, pruning 4): per layout without its recompute, whether a
  // weaker recompute was taken or ruled out on time (then a stronger one is not tried).
  std::map<std::string, bool> weaker_settled;
  const auto sibling = [](const Config& c) {
    Config k = c;
    k.train.recompute = Recompute::None;
    return layout_name(k);
  };
  // Memory monotonicity (layout_search.hpp, pruning 5): layouts that did not fit, by everything but
  // micro-batch, sharding and recompute.
  std::map<std::string, std::vector<Config>> too_big;
  const auto frame = [](const Config& c) {
    Config k = c;
    k.train.recompute = Recompute::None;
    k.train.micro_batch_size = 1;
    k.optimizer.sharding = Sharding::None;
    k.optimizer.distributed = false;
    k.optimizer.overlap_param_gather = false;
    return layout_name(k);
  };
  const auto known_too_big = [&](const Config& c) {
    for (const Config& y : too_big[frame(c)])
      if (y.train.micro_batch_size <= c.train.micro_batch_size &&
          y.optimizer.sharding >= c.optimizer.sharding && y.train.recompute >= c.train.recompute)
        return true;
    return false;
  };
  for (Candidate& cand : candidates) {
    if (!options.exhaustive && cand.bound >= kth()) break;  // every later one is bounded as high
    const std::string key = sibling(cand.config);
    if (!options.exhaustive && weaker_settled[key]) {
      ++result.dominated;
      continue;
    }
    if (!options.exhaustive && known_too_big(cand.config)) {
      weaker_settled[key] = false;
      ++result.implied_too_big;
      continue;
    }
    weaker_settled[key] = true;  // unless it turns out not to fit, below
    const StepPlan p = plan_step(cand.config, world_size, hw, options.ranks_per_node);
    ++result.simulated;
    if (p.sim.step_time_s >= kth() && !options.exhaustive) continue;
    int64_t peak = 0;
    const MemoryPlan mem = plan_memory(cand.config, world_size);
    ++result.memory_plans;
    for (const RankMemoryPlan& r : mem.ranks) peak = std::max(peak, r.allocator_bytes);
    if (result.memory_limit_bytes > 0 && static_cast<double>(peak) > result.memory_limit_bytes) {
      weaker_settled[key] = false;  // a stronger recompute may fit
      too_big[frame(cand.config)].push_back(cand.config);
      ++result.rejected_by_memory;
      continue;
    }
    SearchedLayout s;
    s.layout = layout_name(cand.config);
    s.config = std::move(cand.config);
    s.step_time_s = p.sim.step_time_s;
    s.model_tflops_per_device = p.model_tflops_per_device;
    s.mfu = p.mfu;
    s.bubble_fraction = p.sim.bubble_fraction;
    s.time_lower_bound_s = cand.bound;
    s.peak_bytes = peak;
    const auto at = std::upper_bound(result.top.begin(), result.top.end(), s.step_time_s,
                                     [](double t, const SearchedLayout& x) { return t < x.step_time_s; });
    result.top.insert(at, std::move(s));
    if (static_cast<int>(result.top.size()) > options.top_k) result.top.pop_back();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string search_table(const SearchResult& r) {
  std::string out = fmt::format(
      "search: {} layouts enumerated, {} broke the layout rules, {} exceeded the memory lower bound, {} "
      "dominated by a weaker recompute, {} simulated, {} memory plans, {} did not fit, {} implied not to "
      "fit; "
      "{:.1f} s\n",
      r.enumerated, r.rejected_by_rules, r.rejected_by_memory_bound, r.dominated, r.simulated, r.memory_plans,
      r.rejected_by_memory, r.implied_too_big, r.seconds);
  if (r.memory_limit_bytes <= 0)
    out += "the hardware description states no memory_GiB: every layout counts as fitting\n";
  out += " #  step (s)  TFLOP/s/dev   MFU   bubble  peak (GiB)  layout\n";
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const SearchedLayout& s = r.top[i];
    out += fmt::format("{:>2} {:>9.4g} {:>12.4g} {:>5.1f}% {:>6.1f}% {:>11.2f}  {}\n", i + 1, s.step_time_s,
                       s.model_tflops_per_device, 100 * s.mfu, 100 * s.bubble_fraction,
                       static_cast<double>(s.peak_bytes) / (1 << 30), s.layout);
  }
  return out;
}

std::string search_json(const SearchResult& r, int world_size, const std::string& hardware) {
  std::string layouts;
  for (const SearchedLayout& s : r.top) {
    const ParallelConfig& p = s.config.parallel;
    layouts += fmt::format(
        "{}    {{\"layout\": \"{}\", \"step_time_s\": {:.6g}, \"model_tflops_per_device\": {:.6g}, \"mfu\": "
        "{:.6g}, \"bubble_fraction\": {:.6g}, \"peak_bytes\": {}, \"time_lower_bound_s\": {:.6g}, "
        "\"tensor\": {}, \"sequence_parallel\": {}, \"pipeline\": {}, \"virtual_stages\": {}, \"data\": {}, "
        "\"context\": {}, \"expert\": {}, \"expert_tensor\": {}, \"pipeline_schedule\": \"{}\", "
        "\"sharding\": \"{}\", \"recompute\": \"{}\", \"micro_batch_size\": {}}}",
        layouts.empty() ? "" : ",\n", s.layout, s.step_time_s, s.model_tflops_per_device, s.mfu,
        s.bubble_fraction, s.peak_bytes, s.time_lower_bound_s, p.tensor,
        p.sequence_parallel ? "true" : "false", p.pipeline, p.virtual_stages, p.data, p.context, p.expert,
        p.expert_tensor, pipeline::schedule_name(p.pipeline_schedule),
        sharding_name(s.config.optimizer.sharding), recompute_name(s.config.train.recompute),
        s.config.train.micro_batch_size);
  }
  return fmt::format(
      "{{\n  \"search\": {{\"world_size\": {}, \"hardware\": \"{}\", \"enumerated\": {}, "
      "\"rejected_by_rules\": {}, "
      "\"rejected_by_memory_bound\": {}, \"dominated\": {}, \"simulated\": {}, \"memory_plans\": {}, "
      "\"rejected_by_memory\": {}, \"implied_too_big\": {}, "
      "\"memory_limit_bytes\": {:.0f}, \"seconds\": {:.3f}}},\n  \"layouts\": [\n{}\n  ]\n}}\n",
      world_size, hardware, r.enumerated, r.rejected_by_rules, r.rejected_by_memory_bound, r.dominated,
      r.simulated, r.memory_plans, r.rejected_by_memory, r.implied_too_big, r.memory_limit_bytes, r.seconds,
      layouts);
}

}  // namespace parallel::plan
