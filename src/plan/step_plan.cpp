// plan_step: trace the representatives, replay them, report (step_cost.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/precision.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {

std::vector<int> representative_ranks(const Config& c, int world_size) {
  const auto grid = RankGrid::from_world(world_size, c.parallel.tensor, c.parallel.pipeline,
                                         c.parallel.context, c.parallel.expert, c.parallel.expert_tensor);
  std::vector<int> out;
  for (int s = 0; s < grid.sizes().pipeline; ++s)
    out.push_back(grid.rank(Coord{.tp = 0, .cp = 0, .dp = 0, .pp = s}));
  return out;
}

double model_flops_per_step(const Config& c) {
  const ModelConfig& m = c.model;
  const double h = m.hidden_size, s = m.seq_length, L = m.num_layers;
  const double heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = m.attention_head_dim(), kv = d * groups;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double gated = m.activation == Activation::SwiGLU ? 2 : 1;
  double attention_weights = h * (heads * d + 2 * kv) + heads * d * h;
  // Causal attention per token and layer: half of the score and value products 2 s hq (dqk + dv).
  double attention_core = 2 * s * heads * d;
  if (m.is_mla()) {
    const double dqk = m.qk_nope_head_dim + m.qk_rope_head_dim, dv = m.v_head_dim;
    const double rq = m.q_lora_rank, rkv = m.kv_lora_rank;
    attention_weights = (rq > 0 ? h * rq + rq * heads * dqk : h * heads * dqk) +
                        h * (rkv + m.qk_rope_head_dim) + rkv * heads * (m.qk_nope_head_dim + dv) +
                        heads * dv * h;
    attention_core = s * heads * (dqk + dv);
  }
  const double dense_mlp = gated * h * ffn + ffn * h;
  double layers = 0;
  for (int i = 0; i < m.num_layers; ++i) {
    double mlp = dense_mlp;
    if (m.is_moe_layer(i)) {
      const double eff = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : ffn;
      mlp = m.moe_router_topk * (gated * h * eff + eff * h) + h * m.num_experts;
      if (m.moe_shared_expert_ffn_hidden_size > 0)
        mlp += (gated + 1) * h * m.moe_shared_expert_ffn_hidden_size;
    }
    layers += attention_weights + mlp;
    // Multi-token prediction: each depth a layer of the last one's make-up, eh_proj (2h -> h) and
    // the output layer.
    if (i == m.num_layers - 1)
      layers +=
          m.mtp_num_layers * (attention_weights + mlp + 2 * h * h + static_cast<double>(m.vocab_size) * h);
  }
  // Per token forward: 2 FLOPs per weight element, causal attention 2 s h per layer (half of the
  // 4 s h of the full score and value products); the output layer V h.
  const double forward_per_token =
      2 * (layers + static_cast<double>(m.vocab_size) * h) + attention_core * (L + m.mtp_num_layers);
  const double tokens = static_cast<double>(c.train.global_batch_size) * s;
  return 3 * forward_per_token * tokens;
}

StepPlan plan_step(const Config& c, int world_size, const HardwareDescription& hw, int ranks_per_node,
                   const CostOptions& options) {
  StepPlan p;
  p.world_size = world_size;
  const CostModel cost(hw, world_size, ranks_per_node, options);
  p.ranks_per_node = cost.ranks_per_node();
  p.share = cost.share();
  p.oversubscribed = cost.oversubscribed();
  p.shared_core_slowdown = cost.shared_core_slowdown();
  std::map<int, std::vector<SimEntry>> timelines;
  const int stage_width = world_size / c.parallel.pipeline;  // ranks a representative stands for
  for (int r : representative_ranks(c, world_size)) {
    RankTrace t = trace_step(c, world_size, r);
    p.hardware_flops += t.flops * stage_width;
    p.timeline_entries += t.timeline.size();
    timelines[r] = cost_timeline(t.timeline, cost);
    // The op breakdown, in the expanded timeline's order (expand_timeline's, so the sums are the
    // same to the bit) without copying its entries: each recorded op is costed and looked up once,
    // and a replay adds its range's ops again.
    auto& totals = p.op_breakdown.emplace_back();
    std::vector<double> seconds(t.timeline.size(), 0.0);
    std::vector<StepPlan::OpTotal*> slot(t.timeline.size(), nullptr);
    for (std::size_t i = 0; i < t.timeline.size(); ++i)
      if (const TimelineEntry& e = t.timeline[i]; e.kind == TimelineEntry::Kind::Op) {
        seconds[i] = cost.op_seconds(e.op);
        slot[i] = &totals[e.op.op];
      }
    const auto add = [&](std::size_t i) {
      if (slot[i] == nullptr) return;
      slot[i]->seconds += seconds[i];
      slot[i]->flops += t.timeline[i].op.flops;
      ++slot[i]->count;
    };
    for (std::size_t i = 0; i < t.timeline.size(); ++i) {
      const TimelineEntry& e = t.timeline[i];
      if (e.kind != TimelineEntry::Kind::Replay) {
        add(i);
        continue;
      }
      for (auto j = e.replay_begin; j < e.replay_end; ++j) add(static_cast<std::size_t>(j));
    }
    t.timeline = {};
    p.traces.push_back(std::move(t));
  }
  p.sim = simulate(timelines, cost);
  p.tokens_per_step = static_cast<double>(c.train.global_batch_size) * c.model.seq_length;
  p.model_flops = model_flops_per_step(c);
  const double t = p.sim.step_time_s;
  p.tokens_per_s = t > 0 ? p.tokens_per_step / t : 0;
  const double per_device = t > 0 ? p.model_flops / t / world_size : 0;
  p.model_tflops_per_device = per_device / 1e12;
  // A rank's peak is its share of a device (a CPU rank on 2 cores alone: both).
  const double peak = hw.matmul_flops(compute_dtype(c.train.precision)) * p.share;
  p.mfu = peak > 0 ? per_device / peak : 0;
  return p;
}

std::string step_plan_json(const StepPlan& p) {
  std::string exposed;
  for (const char* d : kDimensions)
    exposed += fmt::format("{}\"{}\": {:.6g}", exposed.empty() ? "" : ", ", d, p.sim.exposed_s.at(d));
  std::string ranks;
  for (const RankTime& r : p.sim.ranks) {
    std::string ex;
    for (const auto& [d, v] : r.exposed_s)
      ex += fmt::format("{}\"{}\": {:.6g}", ex.empty() ? "" : ", ", d, v);
    ranks += fmt::format(
        "{}    {{\"rank\": {}, \"end_s\": {:.6g}, \"compute_s\": {:.6g}, \"bubble_s\": {:.6g}, "
        "\"exposed_communication_s\": {{{}}}, \"blocking_waits\": {}, \"oversubscribed_wait_s\": {:.6g}}}",
        ranks.empty() ? "" : ",\n", r.rank, r.end_s, r.compute_s, r.bubble_s, ex, r.blocking_waits,
        r.oversubscribed_wait_s);
  }
  return fmt::format(
      "{{\n  \"step_time_s\": {:.6g},\n  \"tokens_per_s\": {:.6g},\n  \"mfu\": {:.6g},\n  "
      "\"bubble_fraction\": "
      "{:.6g},\n  \"model_tflops_per_device\": {:.6g},\n  \"model_flops_per_step\": {:.6g},\n  "
      "\"hardware_flops_per_step\": {:.6g},\n  \"exposed_communication_s\": {{{}}},\n  \"ranks_per_node\": "
      "{},\n  "
      "\"oversubscribed\": {},\n  \"oversubscribed_wait_s\": {:.6g},\n  \"shared_core_slowdown\": {:.6g},\n  "
      "\"time_per_stage\": [\n{}\n  ]\n}}\n",
      p.sim.step_time_s, p.tokens_per_s, p.mfu, p.sim.bubble_fraction, p.model_tflops_per_device,
      p.model_flops, p.hardware_flops, exposed, p.ranks_per_node, p.oversubscribed ? "true" : "false",
      p.sim.oversubscribed_wait_s, p.shared_core_slowdown, ranks);
}

std::string step_plan_table(const StepPlan& p) {
  std::string out = fmt::format(
      "step time {:.4g} s, {:.4g} tokens/s, MFU {:.1f} %, {:.3g} model TFLOP/s per device, bubble {:.1f} %\n",
      p.sim.step_time_s, p.tokens_per_s, 100 * p.mfu, p.model_tflops_per_device, 100 * p.sim.bubble_fraction);
  if (p.oversubscribed)
    out += fmt::format(
        "oversubscribed: {} ranks per node share its devices; each rank gets {:.3g} of one, its ops run "
        "up to {:.3g} times their time alone (shared caches), and its blocking waits cost {:.4g} s of the "
        "step "
        "beyond their calls (mean per representative)\n",
        p.ranks_per_node, p.share, p.shared_core_slowdown, p.sim.oversubscribed_wait_s);
  out += "exposed communication (s):";
  for (const char* d : kDimensions) out += fmt::format(" {} {:.4g}", d, p.sim.exposed_s.at(d));
  out += "\n stage rank   end (s)  compute (s)  bubble (s)\n";
  for (std::size_t i = 0; i < p.sim.ranks.size(); ++i) {
    const RankTime& r = p.sim.ranks[i];
    out += fmt::format("{:>6} {:>4} {:>9.4g} {:>12.4g} {:>11.4g}\n", i, r.rank, r.end_s, r.compute_s,
                       r.bubble_s);
  }
  return out;
}

std::string step_plan_breakdown(const StepPlan& p) {
  std::string out;
  for (std::size_t i = 0; i < p.op_breakdown.size(); ++i) {
    std::vector<std::pair<std::string, StepPlan::OpTotal>> rows(p.op_breakdown[i].begin(),
                                                                p.op_breakdown[i].end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (const auto& r : rows) total += r.second.seconds;
    out +=
        fmt::format("predicted compute of stage {} (rank {}): {:.4g} s\n{:>24} {:>8} {:>11} {:>7} {:>10}\n",
                    i, p.traces[i].rank, total, "op", "count", "seconds", "share", "GFLOP/s");
    for (const auto& [name, o] : rows)
      out += fmt::format("{:>24} {:>8} {:>11.4g} {:>6.1f}% {:>10.3g}\n", name, o.count, o.seconds,
                         total > 0 ? 100 * o.seconds / total : 0.0,
                         o.seconds > 0 ? o.flops / o.seconds / 1e9 : 0.0);
  }
  return out;
}

}  // namespace parallel::plan
