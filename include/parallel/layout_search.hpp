#pragma once
// The layout search (issue 26; docs/planner.md "Search"): which layout of a model on N devices
// fits memory and runs fastest, predicted by the planner without launching anything.
//
// Enumerated: tensor (divisors of the world up to a node's devices: tensor parallelism across nodes
// is not considered), pipeline (divisors of the rest that divide the layers), virtual stages (1, 2,
// 4, ... while the chunks divide the layers), context (1, and divisors up to 8 for sequences of
// 8192 and more), expert (MoE only: divisors of the experts), expert-tensor (MoE only: divisors of
// an expert's width up to a node's devices; ep x etp must divide tp x cp x data), data (the rest);
// first and last stage layer counts (without virtual stages: SearchOptions::stage_layer_shift);
// schedule (1F1B and zb-h1 without virtual stages; interleaved, and zb-v at 2 virtual stages, with
// them); sharding (none, optim, optim_grads, optim_grads_params when data x context > 1), each
// sharding mode over all of data x context or, HSDP, within groups of every size g that divides
// data x context, 1 < g < data x context (the rules drop the g MoE's expert-dp does not allow);
// recompute (none, selective, full); micro-batch size (1, 2, 4, 8 dividing the per-rank batch).
// The model, global batch, precision and everything else stay as configured.
//
// Pruned, in order:
//   1. the layout rules: validate_config (the same rules a launch is held to);
//   2. a memory lower bound: a rank holds at least its stage's weights in the compute dtype
//      (sharded over data under optim_grads_params), AdamW's two fp32 moments and (bf16 / fp16)
//      the fp32 main weights (sharded under any sharding) and the fp32 gradient buffer - dense
//      weights split over tp, routed experts over ep x etp and sharded over expert-dp, both over
//      their HSDP shard groups under HSDP - and the activations its in-flight micro-batches keep
//      (kept_activation_bytes_per_layer, measured on the meta device); a layout whose bound
//      exceeds the device's memory (hardware memory_GiB) goes;
//   3. a time lower bound, for branch and bound: the last stage's compute stream (its GEMMs, a MoE
//      layer's experts under balanced routing among them, and attention as the cost model prices
//      them, tensor parallelism's forward collectives and a MoE layer's dispatch, the
//      pipeline's fill and drain, the gradient reduction after the last backward, and under HSDP
//      the replicas' blocking all-reduce of each shard) or the shard group's stream, the larger
//      (docs/planner.md, "Search"). Layouts are simulated in increasing order of that bound, and
//      the search stops when the bound reaches the k-th best predicted step time;
//   4. recompute dominance: more recompute adds compute and no communication, so it is assumed
//      never to make a layout faster; a layout is tried with selective (full) recompute only when
//      the same layout with none (selective) did not fit memory;
//   5. memory: before its simulation a layout's first and last stage are memory-planned
//      (plan_memory_on_meta, the meta run, stopped at the first stage above the limit), and after
//      it, only when it would enter the top k, every stage; it is kept only when its largest rank
//      fits. Memory is assumed monotone in the micro-batch, the recompute and the HSDP group: a
//      layout that did not fit rules out, unplanned and unsimulated, the same layout and sharding
//      with a larger micro-batch, weaker recompute and no larger shard group. (Not in the
//      sharding mode: with one OpenMP thread a zb-v layout fitted under optim, the same with more
//      sharding not.)
// Ranked by the predicted step time of plan_step (the same figure `--plan` reports for the layout).
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/hardware.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {

struct SearchOptions {
  int top_k = 5;
  int ranks_per_node = 0;  // as plan_step
  std::vector<int> micro_batch_sizes{1, 2, 4, 8};
  // Simulate every layout that passes the rules and the memory bound (no time bound, no recompute
  // dominance): the brute force the tests hold the search to.
  bool exhaustive = false;
  CostOptions cost;  // how the planned system's kernels are costed (step_cost.hpp), as plan_step
  // First and last stage layer counts (virtual stages 1, pp >= 2): besides the even split, every
  // split whose first and last stage each hold within this many layers of the middle stages (pp 2:
  // of each other's count, within twice this), the middle stages splitting the rest evenly
  // (parallel.first_stage_layers / last_stage_layers, Megatron's decoder_first/last_pipeline_num_layers:
  // the first stage also runs the embedding, the last the output layer and the loss). 0: the even
  // split only - the default, because 1 costs the slowest SC21 search 1.26 times its CPU time (59 s
  // wall here against 43 s, docs/planner.md "Search") and found nothing faster on those rows.
  int stage_layer_shift = 0;
  // Plan the configured layout first (when it is valid for the world size), so that the time bound
  // prunes against it from the start (branch and bound's warm start).
  bool seed_with_config = true;
  // Threads that plan layouts (memory plans and simulations) at once; 0: the machine's hardware
  // threads. The result (the top k, their order and every count) is the same for any number:
  // layouts are planned ahead on worker threads and taken in the sequential search's order
  // (docs/planner.md, "Search"). Each plan's meta run counts only its own thread's tensors (meta.hpp).
  int threads = 0;
};

struct SearchedLayout {
  Config config;  // validated for the world size
  // "tp8 pp64 v1 dp6 cp1 ep1 1f1b sharding none recompute full mb1"; " etp2" after ep when etp > 1,
  // " hsdp8" after the sharding mode under HSDP, " layers F-L" after pp when the first / last stage
  // layer counts are set (0: not set).
  std::string layout;
  double step_time_s = 0;
  double model_tflops_per_device = 0;
  double mfu = 0;
  double bubble_fraction = 0;
  double time_lower_bound_s = 0;
  int64_t peak_bytes = 0;  // the memory plan's largest rank (device allocator)
};

struct SearchResult {
  std::vector<SearchedLayout> top;  // fastest first
  int enumerated = 0, rejected_by_rules = 0, rejected_by_memory_bound = 0, dominated = 0, simulated = 0,
      rejected_by_memory = 0, implied_too_big = 0,
      memory_plans = 0;  // quick checks (first and last stage) and whole plans
  double seconds = 0;
  double memory_limit_bytes = 0;  // 0: the hardware states none, nothing is rejected for memory
};

SearchResult search_layouts(const Config& base, int world_size, const HardwareDescription& hw,
                            const SearchOptions& options = {});
std::string layout_name(const Config& c);
// Pruning 2's bound on a validated layout's largest rank (bytes, the allocator's peak); the second
// form takes kept_activation_bytes_per_layer(c) (the search caches it per layer shape).
double memory_lower_bound(const Config& c);
double memory_lower_bound(const Config& c, double kept_per_layer);
// The bytes one micro-batch keeps for its backward per transformer layer on a rank of the validated
// layout c, measured, not written down: the model's first layers run forward on the meta device
// (the layout's tp, sp, cp, ep, recompute, micro-batch, precision and dropout) and the meta
// allocator's live bytes after one more layer's forward, less before, are the layer's. Dense and
// MoE layers: the smaller. It depends on the layout only through the layer's shape on a rank
// (tp, sp, cp and its communication, ep, etp, recompute, micro-batch), not pp, dp or sharding.
double kept_activation_bytes_per_layer(const Config& c);
std::string search_table(const SearchResult& r);
std::string search_json(const SearchResult& r, int world_size, const std::string& hardware);

}  // namespace parallel::plan
