#pragma once
// The memory plan: every rank's peak bytes, before anything is allocated (docs/memory.md), read
// off the meta device: the trainer's own step (TrainStep) runs as that rank on Device::meta() over a
// MetaCommunicator, so every layer's allocations are counted by running it, not by a copy of it.
//
// A rank's peak is the sum of
//   parameters      the DDP parameter buffer (fp32, or the 16-bit copy under bf16/fp16), padded as
//                   ParamAndGradBuffer pads it, or this rank's shards (ZeRO-3), plus the frozen
//                   parameters outside it (LoRA's base weights, docs/lora.md)
//   gradients       the fp32 gradient buffer, or its shards
//   optimizer       what else lives between steps: exp_avg, exp_avg_sq (+ fp32 main weights under
//                   bf16/fp16), or Muon's momentum, whole or sharded
//   activations     the step's peak above that: what the micro-batches in flight keep for their
//                   backward, pipeline messages and the kernels' workspaces, at the peak moment
//   packed_weights  CPU, 16-bit, several micro-batches: the WeightPackingScope copies (an upper
//                   bound, from the layout arithmetic: the meta run does not pack)
//   schedule        the executors' action lists and message orders (host memory, outside the
//                   tensor allocator; grows with the number of micro-batches)
//   checkpoint      what a checkpoint save (checkpoint.dir set) needs beyond the training peak: a
//                   sharded optimizer gathers the full fp32 state on every rank, ZeRO-3 every
//                   parameter (layout arithmetic); 0 when the save fits under the training peak
//
// The test memory_plan checks it against the allocator's measured peak on every rank of tp, pp,
// interleaved, dp with each sharding mode, cp, MoE, recompute and bf16 layouts (within 10 %).
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/device.hpp"

namespace parallel {

struct MemoryTerm {
  std::string name;  // parameters, gradients, optimizer, activations, communication, workspace,
                     // schedule, checkpoint
  int64_t bytes = 0;
  std::string keys;  // the configuration keys that drive it, for messages
};

struct RankMemoryPlan {
  int rank = 0;  // world rank
  int tp = 0, cp = 0, pp = 0, dp = 0;
  std::vector<MemoryTerm> terms;
  int64_t peak_bytes = 0;  // sum of the terms
  // Bytes that come from the device's tensor allocator (everything but `schedule`): what
  // memory_stats().peak_allocated measures.
  int64_t allocator_bytes = 0;
  const MemoryTerm& biggest() const;
};

struct MemoryPlan {
  std::vector<RankMemoryPlan> ranks;  // by world rank
  bool complete = true;  // false: stages left out (MetaPlanOptions::stop_above_allocator_bytes, max_stages)
  const RankMemoryPlan& largest() const;
};

// The plan of every rank of a job of `world_size` ranks; `config` must be validated for it.
// plan_memory_on_meta with its default options: no real tensor is allocated, and it is fast for
// any config that validates (at most 4 * pipeline micro-batches, long chunks extrapolated).
MemoryPlan plan_memory(const Config& config, int world_size);

// The same plan from the meta device (meta.hpp, train_step.hpp; docs/planner.md): each pipeline
// stage's first rank runs the trainer's first two steps (TrainStep on Device::meta() over a
// MetaCommunicator standing for that rank), and the meta allocator's high-water mark, model
// construction included, is the rank's allocator peak; the other ranks of a stage are taken to be
// equal (they hold equal shares). Terms read at phase boundaries: parameters and gradients (live
// after construction), optimizer (what the first step leaves), activations (the step's peak above
// that: activations, pipeline messages and workspaces are one term here); schedule and checkpoint
// from the layout arithmetic. Assumptions of the meta run: balanced MoE routing,
// finite gradients, no packed 16-bit weights (WeightPackingScope is a CPU kernel's).
struct MetaPlanOptions {
  // Micro-batches per step of the run (0: 4 * pipeline, past the warm-up of every schedule, where
  // the in-flight pattern repeats); the schedule term counts the configured ones.
  int max_micro_batches = 0;
  // Chunks of more identical layers than this (no first/last_stage_layers) are run twice with
  // 2 and 4 layers (periods of the MoE pattern) and every figure is extrapolated linearly to the
  // configured count (0: always run every layer).
  int max_layers = 16;
  // > 0: whether the layout fits, not its whole plan (the layout search's question). Stages are
  // planned in the order first, last, then the rest, and the plan stops at the first stage whose
  // allocator bytes exceed this: its ranks are then the ones of the stages planned so far
  // (`complete` false; the largest of them exceeds the limit). A plan where every stage stays at or
  // under it is complete and the same as without it.
  double stop_above_allocator_bytes = 0;
  // > 0: plan at most this many stages, in that order (the search's quick check: the first and
  // last stage); `complete` is false when stages were left out.
  int max_stages = 0;
};
MemoryPlan plan_memory_on_meta(const Config& config, int world_size, const MetaPlanOptions& options = {});

// The plan as JSON: {"world_size": N, "largest_rank": r, "ranks": [{"rank": 0, "tp": .., "pp": ..,
// "dp": .., "parameters": bytes, ..., "peak_bytes": bytes}, ...]}.
std::string memory_plan_json(const MemoryPlan& plan);
// One line per distinct pipeline rank (ranks of one pipeline stage have the same plan) with every
// term in MiB and the peak.
std::string memory_plan_table(const MemoryPlan& plan);

// What this rank may use. Host: the smaller of MemAvailable (/proc/meminfo) and the cgroup's room
// (v2 memory.max - memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes), divided by
// `ranks_on_node`. GPU (`cuda`): the device's free memory. `source` says where the figure came from.
struct MemoryLimit {
  int64_t bytes = 0;  // <= 0: unknown (no check)
  std::string source;
};
MemoryLimit host_memory_limit(int ranks_on_node);
// A GPU: its free memory (device_memory_info) plus what this process's caching allocator holds
// unused (it hands those blocks out again before asking the driver).
MemoryLimit device_memory_limit(Device device);

// Which of a rank's terms live in the memory a limit describes: all of them on a CPU rank; on a
// GPU rank the tensor allocator's (everything but `schedule`) in device memory and `schedule` on
// the host.
enum class MemoryScope { All, Device, Host };

// Throws ConfigError with one line when `plan`'s largest rank needs more than `limit` in `scope`:
//   memory plan: rank 3 needs 81.20 GiB at its peak, more than the 3.52 GiB it can use (14.08 GiB
//   MemAvailable shared by 4 ranks); biggest term: activations 80.10 GiB (model.seq_length, ...);
//   see pretrain_gpt --plan
void check_memory_plan(const MemoryPlan& plan, const MemoryLimit& limit,
                       MemoryScope scope = MemoryScope::All);

}  // namespace parallel
