// The layout search (layout_search.hpp): enumerate, prune by the rules and lower bounds, simulate
// in order of the time bound, check memory on the layouts that would enter the top k.
#include "parallel/layout_search.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "parallel/error.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
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

// The first and last stage's layer counts to try for pp stages of n layers (virtual stages 1; the
// rules refuse explicit counts with interleaving): (0, 0), the even split, then every (first, last)
// whose middle stages split the rest evenly (>= 1 layer each) and whose first and last stage each
// hold within `shift` layers of a middle stage (pp 2: within 2 shift of each other), as Megatron's
// decoder_first/last_pipeline_num_layers. The first stage also runs the embedding, the last the
// output layer and the loss, so the even split leaves them unbalanced.
std::vector<std::pair<int, int>> stage_splits(int n, int pp, int shift) {
  std::vector<std::pair<int, int>> out{{0, 0}};
  if (pp < 2 || shift <= 0) return out;
  for (int first = 1; first < n; ++first)
    for (int last = 1; first + last < n || (pp == 2 && first + last == n); ++last) {
      const int rest = n - first - last;
      if (pp == 2) {
        if (rest == 0 && first != last && std::abs(first - last) <= 2 * shift) out.emplace_back(first, last);
        continue;
      }
      if (rest < pp - 2 || rest % (pp - 2) != 0) continue;
      const int middle = rest / (pp - 2);
      if (first == middle && last == middle) continue;  // the even split: (0, 0)
      if (std::abs(first - middle) <= shift && std::abs(last - middle) <= shift)
        out.emplace_back(first, last);
    }
  return out;
}

// Each pipeline stage's transformer layers (virtual stages 1: first / last counts as set), or with
// virtual stages each rank's share, num_layers / pp.
std::vector<int> stage_layer_counts(const Config& c) {
  const ParallelConfig& p = c.parallel;
  if (p.virtual_stages == 1) return pipeline::layers_per_stage(pipeline::LayoutParams::of(c));
  return std::vector<int>(static_cast<std::size_t>(p.pipeline), c.model.num_layers / p.pipeline);
}

// Weight elements a rank holds of one transformer layer: the attention and a dense MLP split over
// tp, and a MoE layer's routed experts, num_experts / ep of them, each split over etp (experts are
// not split over tp: layout_rules.hpp). The router and shared experts are left out (a lower bound).
struct LayerWeights {
  double dense = 0, experts = 0;
};
LayerWeights layer_weights(const ModelConfig& m, int layer, const ParallelConfig& p) {
  const double h = m.hidden_size, heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double kv = h / heads * groups;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double gated = m.activation == Activation::SwiGLU ? 2 : 1;
  LayerWeights w;
  w.dense = h * (h + 2 * kv) + h * h;
  if (m.is_moe_layer(layer)) {
    const double eff = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : ffn;
    w.experts = static_cast<double>(m.num_experts) / p.expert * (gated + 1) * h * eff / p.expert_tensor;
  } else {
    w.dense += (gated + 1) * h * ffn;
  }
  w.dense /= p.tensor;
  return w;
}

// Lower bound on a rank's bytes (layout_search.hpp, pruning 2): the fewest layers a stage holds, their
// weights, fp32 gradients and AdamW moments, and the activations the first stage keeps at the peak of its
// schedule: under 1F1B and interleaving it runs min(pp, micro-batches) forwards before its first backward,
// each keeping per layer what kept_activation_bytes_per_layer measured.
}  // namespace

double memory_lower_bound(const Config& c) {
  return memory_lower_bound(c, kept_activation_bytes_per_layer(c));
}

double memory_lower_bound(const Config& c, double kept_per_layer) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  const int stages = p.pipeline;
  // The first stage's layers (it keeps the most micro-batches in flight; with explicit first / last
  // counts its own count).
  const int layers = stage_layer_counts(c).front();
  double dense = 0, experts = 0;
  for (int i = 0; i < layers; ++i) {
    const LayerWeights w = layer_weights(m, i, p);
    dense += w.dense;
    experts += w.experts;
  }
  // Sharded state splits over dp x cp (dense) and over expert-dp, tp x cp x dp / (ep x etp), for the
  // experts; under HSDP the dense over the shard group g, and the experts, keeping the dense
  // replica count dp x cp / g, over expert-dp / (dp x cp / g) (DataParallelOptions::for_experts).
  const int hsdp = c.optimizer.sharding_group_size;
  const double dense_ranks = static_cast<double>(p.data) * p.context;
  const double expert_dp =
      static_cast<double>(p.tensor) * p.context * p.data / (static_cast<double>(p.expert) * p.expert_tensor);
  const double dense_shards = hsdp > 0 ? hsdp : dense_ranks;
  const double expert_shards = hsdp > 0 ? expert_dp / (dense_ranks / hsdp) : expert_dp;
  const auto held = [&](bool sharded) {
    return sharded ? dense / dense_shards + experts / expert_shards : dense + experts;
  };
  const Sharding s = c.optimizer.sharding;
  const double value_bytes = static_cast<double>(dtype_size(compute_dtype(c.train.precision)));
  const double values = held(s == Sharding::OptimGradsParams) * value_bytes;
  const double moments = c.optimizer.type == OptimizerType::AdamW ? held(s != Sharding::None) * 8 : 0.0;
  // Under bf16 / fp16 the optimizer updates fp32 main weights (adamw.cpp), sharded with its state.
  const double main_weights = c.train.precision != Precision::FP32 ? held(s != Sharding::None) * 4 : 0.0;
  const double micro_batches = static_cast<double>(c.train.global_batch_size) /
                               (static_cast<double>(c.train.micro_batch_size) * p.data);
  // The first stage's forwards before its first backward (pipeline/schedules.cpp): pp - 1 warm-up
  // forwards and one more under 1F1B and ZB-H1, more chunk forwards under interleaving, and under
  // ZB-V 2 pp - 1 forwards of its first chunk and one of its second (half the stage's layers
  // each): at least min(pp, micro-batches) micro-batches of the whole stage's layers.
  const bool warms_up = p.pipeline_schedule == PipelineSchedule::OneFOneB ||
                        p.pipeline_schedule == PipelineSchedule::Interleaved ||
                        p.pipeline_schedule == PipelineSchedule::ZeroBubbleH1 ||
                        p.pipeline_schedule == PipelineSchedule::ZeroBubbleV;
  const double in_flight = warms_up ? std::min<double>(stages, micro_batches) : 1.0;
  const double activations = layers * in_flight * kept_per_layer;
  // DataParallel's fp32 gradient buffer (grad_buffer.cpp), sharded with the gradients.
  const bool grads_sharded = s == Sharding::OptimGrads || s == Sharding::OptimGradsParams;
  const double gradients = held(grads_sharded) * 4;
  return values + moments + main_weights + gradients + activations;
}

namespace {

// One transformer layer's share of the time bound, per micro-batch: compute-stream seconds of its
// forward and backward, and the seconds of the collectives that block the stream in each.
struct LayerBound {
  double forward = 0, backward = 0, forward_comm = 0, backward_comm = 0;
};

// A MoE layer's experts and dispatch on the last stage's rank, under the meta run's stated
// assumption of balanced routing (moe.cpp: every rank routes alike, each expert receives
// T k / E of a rank's T tokens' k assignments, up to the capacity): after the ep dispatch (and
// etp's gather) each of the rank's E / ep local experts runs its two GEMMs on ep x etp x T k / E
// rows at width F / etp, the backward two per weight; alltoall exchanges the counts and sends the
// rows out and back (all_to_allv, in forward and backward alike), allgather gathers the rows and
// reduce-scatters the results in fp32, and etp > 1 gathers the rows and reduce-scatters the
// outputs over the etp group. T is taken as the micro-batch's tokens over cp and tp (fewer than
// the layer routes without sequence parallelism: still a bound); the router, the permutation and
// shared experts are left out.
template <class GemmOp>
LayerBound moe_layer_bound(const Config& c, const CostModel& cost, const RankGrid& grid,
                           const GemmOp& gemm_op) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const DType dtype = compute_dtype(c.train.precision);
  const double bytes = static_cast<double>(dtype_size(dtype));
  const double h = m.hidden_size, experts = m.num_experts, k = m.moe_router_topk;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4.0 * m.hidden_size;
  const double width = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : ffn;
  const double gated = m.activation == Activation::SwiGLU ? 2 : 1;
  const double tokens =
      std::floor(static_cast<double>(c.train.micro_batch_size) * (m.seq_length / p.context) / p.tensor);
  double per_expert = std::floor(tokens * k / experts);  // rows a rank sends each expert
  if (m.moe_capacity_factor > 0)
    per_expert = std::min(per_expert, std::ceil(m.moe_capacity_factor * tokens * k / experts));
  LayerBound b;
  if (per_expert <= 0) return b;
  const double local = experts / p.expert;
  const double rows = static_cast<double>(p.expert) * p.expert_tensor * per_expert;  // a local expert's
  const double f = width / p.expert_tensor;
  const double gemms = local * (gemm_op(rows, gated * f, h) + gemm_op(rows, h, f));
  b.forward = gemms;
  b.backward = 2 * gemms;
  const int rank = grid.rank(Coord{.pp = p.pipeline - 1});
  const auto collective = [&](const char* kind, const char* group, const std::vector<int>& ranks, double n,
                              DType dt) {
    CommEvent e;
    e.kind = kind;
    e.group = group;
    e.ranks = ranks;
    e.bytes = static_cast<int64_t>(n);
    e.dtype = dt;
    return cost.collective_seconds(e);
  };
  const double sent = experts * per_expert;  // rows this rank sends (and, balanced, receives)
  if (p.expert > 1) {
    const std::vector<int> ep = grid.expert_group(rank);
    if (m.moe_token_dispatcher == MoeDispatcher::AllToAll) {
      const double out_and_back = 2 * collective("all_to_allv", "ep", ep, sent * h * bytes, dtype);
      b.forward_comm += collective("all_to_all", "ep", ep, experts * 8, DType::I64) + out_and_back;
      b.backward_comm += out_and_back;
    } else {
      const double gathered = sent * p.expert * h;  // elements: every rank's rows, padded to the longest
      const double out_and_back = collective("all_gather", "ep", ep, gathered * bytes, dtype) +
                                  collective("reduce_scatter", "ep", ep, gathered * 4, DType::F32);
      b.forward_comm += collective("all_gather", "ep", ep, experts * p.expert * 8, DType::I64) + out_and_back;
      b.backward_comm += out_and_back;
    }
  }
  if (p.expert_tensor > 1) {
    const std::vector<int> etp = grid.expert_tensor_group(rank);
    const double gathered = sent * p.expert_tensor * h;
    const double out_and_back = collective("all_gather", "etp", etp, gathered * bytes, dtype) +
                                collective("reduce_scatter", "etp", etp, gathered * bytes, dtype);
    b.forward_comm +=
        collective("all_gather", "etp", etp, local * p.expert_tensor * 8, DType::I64) + out_and_back;
    b.backward_comm += out_and_back;
  }
  return b;
}

// Lower bound on the step time (layout_search.hpp, pruning 3), for the last pipeline stage (it holds
// num_layers / pp layers, or its own count when the first / last counts are set, and starts after
// the first micro-batch's forward has passed the stages before it; with uneven counts also the
// stage with the most layers, whose stream runs them for every micro-batch). Its compute stream
// runs, per micro-batch and layer, at least:
//   - the GEMMs, each at the rate the cost model gives its size (m n k)^(1/3) at most (a GEMM the
//     model splits further is smaller and slower; the backward's two GEMMs per weight have the
//     forward's size) plus one op's overhead, the forward again under full recompute; in a MoE
//     layer the experts' GEMMs under balanced routing (moe_layer_bound);
//   - attention: the forward and the backward as the cost model prices the ops the trace records
//     (their FLOPs, and for the unfused kernel its passes over the scores), the forward again under
//     full recompute;
//   - tensor parallelism's forward collectives, which block the compute stream (the backward's are
//     asynchronous and not counted): per layer the attention's and the MLP's output all-reduce, or
//     with sequence parallelism their all-gather and reduce-scatter, again under full recompute;
//   - a MoE layer's dispatch, which blocks the stream in forward and backward (moe_layer_bound);
// and after its last backward, without overlap_grad_reduce and with gradients reduced once a step
// (sharding none or optim), the data-parallel reduction of its gradients (at 2 bytes an element:
// no gradient is reduced in less).
double time_lower_bound(const Config& c, const CostModel& cost, int world_size) {
  const HardwareDescription& hw = cost.hardware();
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const DType dtype = compute_dtype(c.train.precision);
  // Ranks that oversubscribe a node share its devices among those that compute (processor
  // sharing, simulate.cpp): the last stage's ranks, computing while the others wait, may get more
  // than the static share - up to min(1, devices / their number).
  const double nodes = std::max(1.0, static_cast<double>(world_size) / cost.ranks_per_node());
  const double stage_ranks = static_cast<double>(world_size) / p.pipeline;
  const double best_share =
      cost.oversubscribed() ? std::min(1.0, hw.devices_per_node * nodes / stage_ranks) : cost.share();
  const double rate = hw.matmul_flops(dtype) * best_share;
  const auto gemm = [&](double mm, double n, double k) {
    return 2 * mm * n * k / (rate * hw.matmul_efficiency_at(std::cbrt(mm * n * k), dtype));
  };
  // A GEMM the trace records as (at least) one op: the cost model adds its per-op overhead.
  const auto gemm_op = [&](double mm, double n, double k) {
    return hw.op_overhead_us * 1e-6 + gemm(mm, n, k);
  };
  const double h = m.hidden_size, heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = h / heads, kv = d * groups;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * h;
  const double gated = m.activation == Activation::SwiGLU ? 2 : 1;
  const double tokens = static_cast<double>(c.train.micro_batch_size) * m.seq_length / p.context;
  const double local_seq = static_cast<double>(m.seq_length) / p.context;
  const bool full = c.train.recompute == Recompute::Full;
  // Attention of this rank's heads over its share of the sequence.
  double attention_forward = 0, attention_backward = 0;
  if (p.context == 1 && !m.is_mla() && m.head_dim == 0 && m.sliding_window == 0 &&
      static_cast<int>(heads) % p.tensor == 0 && static_cast<int>(groups) % p.tensor == 0) {
    const int64_t s = m.seq_length, b = c.train.micro_batch_size, hd = m.hidden_size / m.num_attention_heads;
    const Shape q{s, b, m.num_attention_heads / p.tensor, hd};
    const Shape k{s, b, static_cast<int64_t>(groups) / p.tensor, hd};
    OpEvent f;
    f.op = "attention_forward";
    f.shapes = {q, k, k};
    f.dtypes = {dtype, dtype, dtype};
    f.flops = 2.0 * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(b) *
              static_cast<double>(q[2]) * static_cast<double>(2 * hd) / 2;  // causal
    OpEvent g = f;
    g.op = "attention_backward";
    g.shapes = {q, q, k, k};
    g.dtypes = {dtype, dtype, dtype, dtype};
    g.flops = 2.5 * f.flops;
    attention_forward = cost.op_seconds(f) * cost.share() / best_share;
    attention_backward = cost.op_seconds(g) * cost.share() / best_share;
  } else {
    const double flops =
        2.0 * m.seq_length * m.seq_length * c.train.micro_batch_size * (heads / p.tensor) * d / p.context;
    attention_forward = flops / (rate * hw.matmul_efficiency_at(std::cbrt(local_seq * local_seq * d), dtype));
    attention_backward = 2.5 * attention_forward;
  }
  const auto grid =
      RankGrid::from_world(world_size, p.tensor, p.pipeline, p.context, p.expert, p.expert_tensor);
  double tp_collective = 0;  // one forward output's collectives
  if (p.tensor > 1) {
    CommEvent e;
    e.group = "tp";
    for (int t = 0; t < p.tensor; ++t) e.ranks.push_back(grid.rank(Coord{.tp = t}));
    e.bytes = static_cast<int64_t>(tokens * h) * static_cast<int64_t>(dtype_size(dtype));
    e.dtype = dtype;
    if (p.sequence_parallel) {
      e.kind = "all_gather";
      tp_collective = cost.collective_seconds(e);
      e.kind = "reduce_scatter";
      tp_collective += cost.collective_seconds(e);
    } else {
      e.kind = "all_reduce";
      tp_collective = cost.collective_seconds(e);
    }
  }
  // The last stage's layers (every stage's under the even split), and whether the first and last
  // counts were set (layers_per_stage).
  const std::vector<int> stage_layers = stage_layer_counts(c);
  const int layers = stage_layers.back();
  const bool uneven = std::any_of(stage_layers.begin(), stage_layers.end(),
                                  [&](int count) { return count != stage_layers.front(); });
  // A dense layer's share: its GEMMs (one op each, the backward's two per weight), attention and
  // tensor parallelism's two forward collectives.
  const double attention_gemms =
      gemm_op(tokens, (h + 2 * kv) / p.tensor, h) + gemm_op(tokens, h, h / p.tensor);
  const double mlp_gemms = gemm_op(tokens, gated * ffn / p.tensor, h) + gemm_op(tokens, h, ffn / p.tensor);
  const LayerBound dense{.forward = attention_gemms + mlp_gemms + attention_forward,
                         .backward = 2 * (attention_gemms + mlp_gemms) + attention_backward,
                         .forward_comm = 2 * tp_collective};
  // A MoE layer's: attention as above and one tp collective (the experts are not split over tp),
  // the experts' GEMMs under balanced routing and the dispatch that blocks the stream.
  const LayerBound moe = m.num_experts > 0 ? moe_layer_bound(c, cost, grid, gemm_op) : LayerBound{};
  const LayerBound moe_layer{.forward = attention_gemms + attention_forward + moe.forward,
                             .backward = 2 * attention_gemms + attention_backward + moe.backward,
                             .forward_comm = tp_collective + moe.forward_comm,
                             .backward_comm = moe.backward_comm};
  // Which of the stage's layers are MoE depends on the stage; when the model has both kinds each
  // layer counts the smaller of the two (per term: the bound grows with each).
  bool has_dense = false, has_moe = false;
  for (int j = 0; j < m.num_layers; ++j) (m.is_moe_layer(j) ? has_moe : has_dense) = true;
  const LayerBound layer =
      !has_moe     ? dense
      : !has_dense ? moe_layer
                   : LayerBound{.forward = std::min(dense.forward, moe_layer.forward),
                                .backward = std::min(dense.backward, moe_layer.backward),
                                .forward_comm = std::min(dense.forward_comm, moe_layer.forward_comm),
                                .backward_comm = 0};
  const double forward = layers * layer.forward, backward = layers * layer.backward;
  const double forward_comm = layers * layer.forward_comm, backward_comm = layers * layer.backward_comm;
  double stage_weights = 0;
  // The reductions below are the first and the last stage's: with uneven counts, the fewer of theirs.
  const int weight_layers = uneven ? std::min(stage_layers.front(), stage_layers.back()) : layers;
  for (int i = 0; i < weight_layers; ++i) {
    const LayerWeights w = layer_weights(m, i, p);
    stage_weights += w.dense + w.experts;
  }
  // The output layer's GEMMs (forward, and the backward's two), on the stage that holds the last
  // layer: the one stage, or the last under 1F1B and interleaving (zb-v puts it on the first).
  double output_layer = 0;
  if (p.pipeline == 1 || p.pipeline_schedule == PipelineSchedule::OneFOneB ||
      p.pipeline_schedule == PipelineSchedule::Interleaved)
    output_layer = 3 * gemm_op(tokens, static_cast<double>(m.vocab_size) / p.tensor, h);
  const double recompute = full ? forward + forward_comm : 0.0;
  const double micro_batches = static_cast<double>(c.train.global_batch_size) /
                               (static_cast<double>(c.train.micro_batch_size) * p.data);
  // The last stage starts no work before the first micro-batch's forward has passed the pp - 1
  // stages before it (any schedule): pp - 1 chunks of layers / (pp v) layers each.
  // (With uneven counts, virtual stages 1: the layers of the stages before the last.)
  const double layers_before_last = static_cast<double>(m.num_layers - layers);
  const double fill =
      uneven ? layers_before_last * layer.forward : (p.pipeline - 1) * forward / p.virtual_stages;
  // 1F1B and interleaved: the last stage's last work is the last micro-batch's backward (of its
  // first chunk); the pp - 1 stages before it then each run their backward of it in turn (chunks of
  // layers / (pp v) layers), the first stage last. Zero-bubble schedules defer weight gradients into
  // that drain, so it is counted for the other two only.
  const bool drains = p.pipeline_schedule == PipelineSchedule::OneFOneB ||
                      p.pipeline_schedule == PipelineSchedule::Interleaved;
  const double drain =
      !drains  ? 0.0
      : uneven ? layers_before_last * (layer.backward + (full ? layer.forward + layer.forward_comm : 0.0))
               : (p.pipeline - 1) * (backward + recompute) / p.virtual_stages;
  // The group gradients are reduced over first (and sharded over): dp (x cp), or under HSDP the
  // first sharding_group_size dp ranks (DataParallel's shard group; cp 1 only).
  const int hsdp = c.optimizer.sharding_group_size;
  const bool known_group = hsdp == 0 || p.context == 1;
  const auto shard_group = [&](int stage) {
    std::vector<int> ranks;
    if (hsdp > 0) {
      for (int dp = 0; dp < hsdp; ++dp) ranks.push_back(grid.rank(Coord{.dp = dp, .pp = stage}));
    } else {
      for (int cp = 0; cp < p.context; ++cp)
        for (int dp = 0; dp < p.data; ++dp)
          ranks.push_back(grid.rank(Coord{.cp = cp, .dp = dp, .pp = stage}));
    }
    return ranks;
  };
  double reduction = 0;
  const Sharding sharding = c.optimizer.sharding;
  if (!c.optimizer.overlap_grad_reduce && m.num_experts == 0 && p.data * p.context > 1 && known_group &&
      (sharding == Sharding::None || sharding == Sharding::Optim)) {
    CommEvent e;
    e.group = "dp";
    e.ranks = shard_group(p.pipeline - 1);
    e.bytes = static_cast<int64_t>(stage_weights * 2);
    // The gradient buffer is fp32 (grad_buffer.cpp), so the call runs at fp32's bandwidth (a
    // 16-bit table, where the link has one, is a 16-bit reduction's, slower per byte); half its
    // bytes stays the floor it was.
    e.dtype = DType::F32;
    e.kind = sharding == Sharding::None ? "all_reduce" : "reduce_scatter";
    reduction = cost.collective_seconds(e);
  }
  // HSDP: each shard the shard group reduced is then all-reduced over the replicas (the dp ranks
  // holding the same shard, one per shard group; DataParallel's dp_replica group), fp32, by a call
  // that blocks the rank's compute stream: once a step after the last backward with unsharded
  // gradients (optim), after every micro-batch's backward with sharded ones.
  double replica = 0;
  const int replicas = hsdp > 0 ? p.data / hsdp : 1;
  if (m.num_experts == 0 && p.context == 1 && replicas > 1 && sharding != Sharding::None) {
    CommEvent e;
    e.group = "dp_replica";
    for (int j = 0; j < replicas; ++j)
      e.ranks.push_back(grid.rank(Coord{.dp = j * hsdp, .pp = p.pipeline - 1}));
    e.bytes = static_cast<int64_t>(stage_weights * 4 / hsdp);
    e.dtype = DType::F32;
    e.kind = "all_reduce";
    replica = cost.collective_seconds(e);
  }
  const bool grads_every_micro_batch =
      sharding == Sharding::OptimGrads || sharding == Sharding::OptimGradsParams;
  const double replica_per_micro_batch = grads_every_micro_batch ? replica : 0.0;
  const double replica_per_step = grads_every_micro_batch ? 0.0 : replica;
  // The reduction follows the last backward of the stage that reduces last: the first stage after
  // the drain (1F1B, interleaved: its gradients start reducing after its own last backward), or
  // the last stage.
  double compute_bound = fill +
                         micro_batches * (forward + forward_comm + backward + backward_comm + recompute +
                                          output_layer + replica_per_micro_batch) +
                         drain + reduction + replica_per_step;
  // With uneven counts a stage before the last may hold more layers; its compute stream runs every
  // micro-batch's forward and backward of them too (the step is the latest stage's end).
  if (uneven) {
    const double most = *std::max_element(stage_layers.begin(), stage_layers.end());
    compute_bound = std::max(compute_bound,
                             micro_batches * most *
                                 (layer.forward + layer.forward_comm + layer.backward + layer.backward_comm +
                                  (full ? layer.forward + layer.forward_comm : 0.0)));
  }
  // The shard group's stream runs its calls one after another within the step:
  // with sharded gradients (optim_grads, optim_grads_params) no full-size gradient outlives a
  // micro-batch, so every micro-batch's backward reduce-scatters the stage's fp32 gradients
  // (grad_buffer.cpp), and under optim_grads_params every micro-batch's forward gathers its
  // parameters, and its backward again when they were resharded after the forward (at least one
  // collective of all of them each: splitting one only adds latency).
  double stream_bound = 0;
  if ((sharding == Sharding::OptimGrads || sharding == Sharding::OptimGradsParams) && m.num_experts == 0 &&
      p.data * p.context > 1 && known_group) {
    CommEvent e;
    e.group = "dp";
    e.ranks = shard_group(0);
    e.dtype = DType::F32;
    e.kind = "reduce_scatter";
    e.bytes = static_cast<int64_t>(stage_weights * 4);
    stream_bound = micro_batches * cost.collective_seconds(e);
    if (sharding == Sharding::OptimGradsParams) {
      e.kind = "all_gather";
      e.dtype = dtype;
      e.bytes = static_cast<int64_t>(stage_weights * static_cast<double>(dtype_size(dtype)));
      const double gathers = c.optimizer.reshard_after_forward ? 2 : 1;
      stream_bound += micro_batches * gathers * cost.collective_seconds(e);
    }
  }
  return std::max(compute_bound, stream_bound);
}

}  // namespace

namespace {
// parallel.context_comm's spelling (config.cpp).
const char* context_comm_name(ContextComm comm) {
  switch (comm) {
    case ContextComm::P2P:
      return "p2p";
    case ContextComm::A2A:
      return "a2a";
    case ContextComm::AllGather:
      return "allgather";
  }
  return "?";
}
}  // namespace

std::string layout_name(const Config& c) {
  const ParallelConfig& p = c.parallel;
  return fmt::format(
      "tp{}{} pp{}{} v{} dp{} cp{}{} ep{}{} {} sharding {}{} recompute {} mb{}", p.tensor,
      p.sequence_parallel ? "+sp" : "", p.pipeline,
      p.first_stage_layers > 0 || p.last_stage_layers > 0
          ? fmt::format(" layers {}-{}", p.first_stage_layers, p.last_stage_layers)
          : "",
      p.virtual_stages, p.data, p.context,
      p.context > 1 ? fmt::format(" {}", context_comm_name(p.context_comm)) : "", p.expert,
      p.expert_tensor > 1 ? fmt::format(" etp{}", p.expert_tensor) : "",
      pipeline::schedule_name(p.pipeline_schedule), sharding_name(c.optimizer.sharding),
      c.optimizer.sharding_group_size > 0 ? fmt::format(" hsdp{}", c.optimizer.sharding_group_size) : "",
      recompute_name(c.train.recompute), c.train.micro_batch_size);
}

SearchResult search_layouts(const Config& base, int world_size, const HardwareDescription& hw,
                            const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult result;
  result.memory_limit_bytes = hw.memory_GiB * 1024.0 * 1024.0 * 1024.0;
  const CostModel cost(hw, world_size, options.ranks_per_node, options.cost);
  const ModelConfig& m = base.model;
  const int node = std::min(world_size, hw.devices_per_node);

  struct Candidate {
    Config config;
    double bound = 0;
  };
  std::vector<Candidate> candidates;
  // The measured activations per layer, by the layer's shape on a rank (everything else is the
  // base's): a few dozen meta runs per search instead of one per layout.
  std::map<std::string, double> kept_cache;
  const auto kept_per_layer = [&](const Config& c) {
    const ParallelConfig& p = c.parallel;
    const std::string key =
        fmt::format("tp{} sp{} cp{} {} ep{} etp{} {} mb{}", p.tensor, p.sequence_parallel, p.context,
                    context_comm_name(p.context_comm), p.expert, p.expert_tensor,
                    recompute_name(c.train.recompute), c.train.micro_batch_size);
    auto at = kept_cache.find(key);
    if (at == kept_cache.end()) {
      at = kept_cache.emplace(key, kept_activation_bytes_per_layer(c)).first;
      if (std::getenv("PARALLEL_SEARCH_TRACE"))
        fmt::print(stderr, "search: {} keeps {:.4g} MiB per layer and micro-batch (measured on meta)\n", key,
                   at->second / 1048576.0);
    }
    return at->second;
  };
  std::vector<int> contexts{1};
  if (m.seq_length >= 8192)
    for (int cp : {2, 4, 8}) contexts.push_back(cp);
  // Expert (MoE only: divisors of the experts) by expert-tensor parallelism (MoE only: divisors of
  // an expert's width up to a node's devices, as tensor parallelism: not across nodes). The rules
  // keep the pairs whose ep x etp divides the stage's tp x cp x dp ranks.
  std::vector<std::pair<int, int>> expert_grids{{1, 1}};
  if (m.num_experts > 0) {
    const int width = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size
                      : m.ffn_hidden_size > 0   ? m.ffn_hidden_size
                                                : 4 * m.hidden_size;
    expert_grids.clear();
    for (int ep : divisors(m.num_experts))
      for (int etp : divisors(node))
        if (width % etp == 0) expert_grids.emplace_back(ep, etp);
  }
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
          // Each schedule with each first / last stage layer count (virtual stages 1).
          struct StageChoice {
            PipelineSchedule schedule;
            int first_layers, last_layers;
          };
          std::vector<StageChoice> choices;
          for (const auto& [first, last] : v == 1 ? stage_splits(m.num_layers, pp, options.stage_layer_shift)
                                                  : std::vector<std::pair<int, int>>{{0, 0}})
            for (PipelineSchedule schedule : schedules) choices.push_back({schedule, first, last});
          for (const auto& [schedule, first_layers, last_layers] : choices)
            for (const auto& [ep, etp] : expert_grids)
              for (Sharding sharding :
                   {Sharding::None, Sharding::Optim, Sharding::OptimGrads, Sharding::OptimGradsParams}) {
                if (dp * cp == 1 && sharding != Sharding::None) continue;
                // HSDP: shard within groups of g of the dp x cp ranks, replicate across the groups,
                // for every g dividing dp x cp from 2 to all of them but one (0: shard over all; g 1
                // shards nothing: the layout without sharding, with more calls). The rules keep the g
                // that MoE's expert-dp allows.
                std::vector<int> shard_groups{0};
                if (sharding != Sharding::None)
                  for (int g : divisors(dp * cp))
                    if (g >= 2 && g < dp * cp) shard_groups.push_back(g);
                const std::vector<ContextComm> context_comms =
                    cp > 1
                        ? std::vector<ContextComm>{ContextComm::P2P, ContextComm::A2A, ContextComm::AllGather}
                        : std::vector<ContextComm>{base.parallel.context_comm};
                for (int shard_group : shard_groups)
                  for (ContextComm context_comm : context_comms)
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
                        p.expert_tensor = etp;
                        p.first_stage_layers = first_layers;
                        p.last_stage_layers = last_layers;
                        p.data = 0;
                        c.optimizer.sharding = sharding;
                        c.optimizer.distributed = sharding != Sharding::None;
                        c.optimizer.sharding_group_size = shard_group;
                        p.context_comm = context_comm;
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
                        if (result.memory_limit_bytes > 0 &&
                            memory_lower_bound(c, kept_per_layer(c)) > result.memory_limit_bytes) {
                          ++result.rejected_by_memory_bound;
                          continue;
                        }
                        const double bound = time_lower_bound(c, cost, world_size);
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
    k.optimizer.sharding_group_size = 0;
    return layout_name(k);
  };
  // The ranks the state is sharded over: an HSDP shard group, or all of dp x cp. A smaller group
  // leaves each rank a larger share of the same state (and the same activations), so HSDP's group
  // size is taken as monotone too: a layout that did not fit rules out its smaller groups.
  const auto shard_ranks = [](const Config& c) {
    return c.optimizer.sharding_group_size > 0 ? c.optimizer.sharding_group_size
                                               : c.parallel.data * c.parallel.context;
  };
  const auto known_too_big = [&](const Config& c) {
    for (const Config& y : too_big[frame(c)])
      if (y.train.micro_batch_size <= c.train.micro_batch_size &&
          y.optimizer.sharding == c.optimizer.sharding && y.train.recompute >= c.train.recompute &&
          shard_ranks(y) >= shard_ranks(c))
        return true;
    return false;
  };
  // Plans one layout: memory first, as a quick check of the first and last stage (they hold the
  // embedding and the output layer, and the first the most micro-batches in flight), stopped at
  // the first above the limit: a layout that does not fit usually costs one stage's meta run and
  // no simulation (at scale most layouts the bounds leave do not fit). Then the simulation, and
  // only for a layout that would enter the top k, the whole memory plan (every stage).
  //
  // Both cores: the planning of a layout (`plan`, a pure function of the layout and of the k-th
  // step when it started) runs on worker threads, ahead of the sequential search, for the next
  // candidates the search's state so far would plan; its result is taken (`commit`) in the
  // sequential order, with the state the sequential search has there. Every pruning decision is
  // monotone (the k-th step only falls; layouts ruled dominated, planned or too big stay so), so a
  // candidate the search reaches was planned ahead unless a later decision skips it, and a plan
  // made ahead holds everything its commit reads (a whole plan is needed only below the k-th step,
  // which was no lower when the plan started). Counts, the top k and their order are those of one
  // thread; what a thread planned for a candidate the search then skipped is dropped.
  struct Planned {
    bool quick_done = false, quick_complete = false, simulated = false, whole_done = false;
    int64_t quick_largest = 0, whole_largest = 0;
    double step_time_s = 0, model_tflops_per_device = 0, mfu = 0, bubble_fraction = 0;
    double memory_seconds = 0, simulate_seconds = 0;
    std::exception_ptr error;  // thrown where the next step (quick, simulation, whole) would be
  };
  const double limit = result.memory_limit_bytes;
  const auto above_limit = [limit](int64_t bytes) { return limit > 0 && static_cast<double>(bytes) > limit; };
  const auto plan = [&, limit](const Config& c, double kth_then) {
    Planned out;
    try {
      const auto memory = [&](int max_stages, bool& complete) {
        const auto t0 = std::chrono::steady_clock::now();
        const MemoryPlan mem = plan_memory_on_meta(
            c, world_size, {.stop_above_allocator_bytes = limit, .max_stages = max_stages});
        out.memory_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        int64_t largest = 0;
        for (const RankMemoryPlan& r : mem.ranks) largest = std::max(largest, r.allocator_bytes);
        complete = mem.complete;
        return largest;
      };
      if (!options.exhaustive) {
        out.quick_largest = memory(2, out.quick_complete);
        out.quick_done = true;
        if (above_limit(out.quick_largest)) return out;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const StepPlan p = plan_step(c, world_size, hw, options.ranks_per_node, options.cost);
      out.simulate_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out.simulated = true;
      out.step_time_s = p.sim.step_time_s;
      out.model_tflops_per_device = p.model_tflops_per_device;
      out.mfu = p.mfu;
      out.bubble_fraction = p.sim.bubble_fraction;
      if ((options.exhaustive || out.step_time_s < kth_then) && !out.quick_complete) {
        bool complete = false;
        out.whole_largest = memory(0, complete);
        out.whole_done = true;
      }
    } catch (...) {
      out.error = std::current_exception();
    }
    return out;
  };
  // The sequential search's step for one layout, from its plan. Returns false when it does not
  // fit, true when it fits or its step is no better than the k-th (a stronger recompute of it can
  // be no faster).
  std::set<std::string> planned;
  double memory_seconds = 0, simulate_seconds = 0;  // for PARALLEL_SEARCH_TRACE
  const bool trace = std::getenv("PARALLEL_SEARCH_TRACE") != nullptr;
  const auto commit = [&](Config c, double bound, Planned done) {
    const std::string name = layout_name(c);
    planned.insert(name);
    const auto rethrow_unless = [&](bool reached) {
      if (!reached && done.error) std::rethrow_exception(done.error);
    };
    memory_seconds += done.memory_seconds;
    simulate_seconds += done.simulate_seconds;
    const auto does_not_fit = [&](int64_t largest) {
      if (trace)
        fmt::print(stderr, "search: bound {:.4g} s, does not fit: {:.4g} GiB (memory bound {:.4g} GiB), {}\n",
                   bound, static_cast<double>(largest) / (1 << 30),
                   memory_lower_bound(c, kept_per_layer(c)) / (1 << 30), name);
      ++result.rejected_by_memory;
      return false;
    };
    int64_t peak = -1;  // the whole plan's largest rank, once planned
    if (!options.exhaustive) {
      rethrow_unless(done.quick_done);
      ++result.memory_plans;
      if (done.quick_complete) peak = done.quick_largest;
      if (above_limit(done.quick_largest)) return does_not_fit(done.quick_largest);
    }
    rethrow_unless(done.simulated);
    ++result.simulated;
    if (trace)
      fmt::print(stderr, "search: bound {:.4g} s, step {:.4g} s ({:.3f} x), {}\n", bound, done.step_time_s,
                 done.step_time_s / bound, name);
    if (done.step_time_s >= kth() && !options.exhaustive) return true;
    if (peak < 0) {
      if (!done.whole_done) {  // not planned ahead (it cannot happen: kth() only falls); plan it now
        const Planned again = plan(c, kth());
        if (again.error) std::rethrow_exception(again.error);
        done.whole_done = again.whole_done;
        done.whole_largest = again.whole_largest;
      }
      rethrow_unless(done.whole_done);
      ++result.memory_plans;
      peak = done.whole_largest;
      if (above_limit(peak)) return does_not_fit(peak);
    }
    SearchedLayout s;
    s.layout = name;
    s.config = std::move(c);
    s.step_time_s = done.step_time_s;
    s.model_tflops_per_device = done.model_tflops_per_device;
    s.mfu = done.mfu;
    s.bubble_fraction = done.bubble_fraction;
    s.time_lower_bound_s = bound;
    s.peak_bytes = peak;
    const auto at = std::upper_bound(result.top.begin(), result.top.end(), s.step_time_s,
                                     [](double t, const SearchedLayout& x) { return t < x.step_time_s; });
    result.top.insert(at, std::move(s));
    if (static_cast<int>(result.top.size()) > options.top_k) result.top.pop_back();
    return true;
  };
  // Plans on worker threads (SearchOptions::threads; one: on this thread, as it is reached). Each
  // worker runs with this thread's OpenMP thread count (a kernel's workspace on meta depends on it).
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int omp_threads = omp_get_max_threads();
  std::map<std::size_t, std::future<Planned>> ahead;  // candidate index -> its plan, started
  int dropped = 0;                                    // planned ahead, then skipped (for the trace)
  // Each candidate's name and pruning keys, made once (the look-ahead asks often).
  struct Keys {
    std::string name, sibling, frame;
  };
  std::vector<std::optional<Keys>> keys(candidates.size());
  const auto keys_of = [&](std::size_t i) -> const Keys& {
    if (!keys[i]) {
      const Config& c = candidates[i].config;
      keys[i] = Keys{layout_name(c), sibling(c), frame(c)};
    }
    return *keys[i];
  };
  // Whether the search, in its state now, would plan candidate i (a layout it would skip now it
  // skips later too).
  const auto would_plan = [&](std::size_t i) {
    const Candidate& cand = candidates[i];
    const Keys& k = keys_of(i);
    if (!options.exhaustive) {
      if (cand.bound >= kth()) return false;
      const auto settled = weaker_settled.find(k.sibling);
      if (settled != weaker_settled.end() && settled->second) return false;
      if (known_too_big(cand.config)) return false;
    }
    return planned.count(k.name) == 0;
  };
  // Whether the outcome of candidate i, planned but not yet taken, may rule out a later j: j is
  // i with more recompute (dominated if i fits), or i would imply j does not fit (pruning 5).
  // Such a j is not planned ahead while i is open: at scale most layouts do not fit, and
  // planning their implied siblings ahead would be work thrown away.
  const auto may_rule_out = [&](std::size_t i, std::size_t j) {
    if (options.exhaustive) return false;
    const Keys &a = keys_of(i), &b = keys_of(j);
    if (a.sibling == b.sibling) return true;
    const Config &x = candidates[i].config, &y = candidates[j].config;
    return a.frame == b.frame && x.train.micro_batch_size <= y.train.micro_batch_size &&
           x.optimizer.sharding == y.optimizer.sharding && x.train.recompute >= y.train.recompute &&
           shard_ranks(x) >= shard_ranks(y);
  };
  // Starts plans ahead while fewer than `threads` run: the first candidates from `from` (the one
  // the search reached) within a window that the search would plan now and no open earlier
  // candidate may rule out. Plans of candidates before `from` (the search skipped them) are
  // dropped once they finish. A scan that found nothing is not repeated until something changed.
  constexpr std::size_t kWindow = 512;
  int64_t changes = 0, fruitless_at = -1;  // commits and finished plans; the last empty scan's
  const auto start_ahead = [&](std::size_t from) {
    if (threads <= 1) return;
    int running = 0, ready_count = 0;
    for (auto at = ahead.begin(); at != ahead.end();) {
      const bool ready = at->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      if (ready && at->first < from) {
        at = ahead.erase(at);
        ++dropped;
        continue;
      }
      running += ready ? 0 : 1;
      ready_count += ready ? 1 : 0;
      ++at;
    }
    if (running >= threads || changes + ready_count == fruitless_at) return;
    bool started = false;
    for (std::size_t j = from; j < std::min(candidates.size(), from + kWindow) && running < threads; ++j) {
      if (ahead.count(j) || !would_plan(j)) continue;
      bool open_before = false;
      for (auto at = ahead.lower_bound(from); at != ahead.end() && at->first < j && !open_before; ++at)
        open_before = may_rule_out(at->first, j);
      if (open_before) continue;
      const double kth_then = kth();
      ahead.emplace(j, std::async(std::launch::async, [&plan, &candidates, j, kth_then, omp_threads] {
                      omp_set_num_threads(omp_threads);
                      return plan(candidates[j].config, kth_then);
                    }));
      ++running;
      started = true;
    }
    fruitless_at = started ? -1 : changes + ready_count;
  };
  // The plan of candidate i, which the search has reached: the one started ahead, or made here.
  const auto planned_for = [&](std::size_t i) {
    ++changes;
    start_ahead(i);
    auto at = ahead.find(i);
    if (at == ahead.end()) return plan(candidates[i].config, kth());
    // While it runs, keep the other threads busy with the next candidates.
    while (at->second.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready) start_ahead(i);
    Planned out = at->second.get();
    ahead.erase(at);
    return out;
  };
  // Warm start: the configured layout, when it is valid for this world and passes the memory bound,
  // is planned first, so that the bound prunes from the start.
  if (options.seed_with_config && !options.exhaustive) {
    Config c = base;
    bool valid = true;
    try {
      validate_config(c, world_size);
    } catch (const Error&) {
      valid = false;
    }
    if (valid && (result.memory_limit_bytes <= 0 ||
                  memory_lower_bound(c, kept_per_layer(c)) <= result.memory_limit_bytes)) {
      const double bound = time_lower_bound(c, cost, world_size);
      const Config seed = c;
      commit(std::move(c), bound, plan(seed, kth()));
    }
  }
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    Candidate& cand = candidates[i];
    if (!options.exhaustive && cand.bound >= kth()) break;  // every later one is bounded as high
    const Keys k = keys_of(i);
    if (planned.count(k.name)) continue;
    if (!options.exhaustive && weaker_settled[k.sibling]) {
      ++result.dominated;
      continue;
    }
    if (!options.exhaustive && known_too_big(cand.config)) {
      weaker_settled[k.sibling] = false;
      ++result.implied_too_big;
      continue;
    }
    const Config config = cand.config;
    const bool fit = commit(std::move(cand.config), cand.bound, planned_for(i));
    weaker_settled[k.sibling] = fit;  // a layout that does not fit leaves a stronger recompute to try
    if (!fit) too_big[k.frame].push_back(config);
    ++changes;
    start_ahead(i + 1);
  }
  // Plans started ahead for candidates the search then skipped or did not reach: wait for them
  // (they read `candidates` and `plan`), and drop them.
  for (auto& [i, f] : ahead) {
    f.wait();
    ++dropped;
  }
  ahead.clear();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (std::getenv("PARALLEL_SEARCH_TRACE"))
    fmt::print(stderr,
               "search: {:.1f} s, of which {:.1f} s memory plans, {:.1f} s simulations (thread seconds, "
               "{} threads); {} planned ahead and dropped\n",
               result.seconds, memory_seconds, simulate_seconds, threads, dropped);
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
        "\"sharding\": \"{}\", \"sharding_group_size\": {}, \"context_comm\": \"{}\", \"recompute\": \"{}\", "
        "\"micro_batch_size\": {}}}",
        layouts.empty() ? "" : ",\n", s.layout, s.step_time_s, s.model_tflops_per_device, s.mfu,
        s.bubble_fraction, s.peak_bytes, s.time_lower_bound_s, p.tensor,
        p.sequence_parallel ? "true" : "false", p.pipeline, p.virtual_stages, p.data, p.context, p.expert,
        p.expert_tensor, pipeline::schedule_name(p.pipeline_schedule),
        sharding_name(s.config.optimizer.sharding), s.config.optimizer.sharding_group_size,
        context_comm_name(p.context_comm), recompute_name(s.config.train.recompute),
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
