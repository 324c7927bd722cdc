#pragma once
// Which layout a job relaunched on fewer (or more) ranks takes: the supervisor's elastic restart
// (examples/train_supervisor.cpp, docs/restart.md). Checkpoints load into any layout
// (docs/checkpoints.md) and the data order does not depend on it (docs/parallelism.md), so a job
// that lost a node can go on on the ranks it still has; this picks the layout.
//
// The rule, in order:
//   1. Data parallelism shrinks first: the model-parallel sizes of the configuration (tensor,
//      context, pipeline) are kept and the data-parallel size is the largest that fits in the ranks
//      available, at least `min_ranks`. The global batch is kept (train.global_batch_size is never
//      changed): each data-parallel rank runs global / (micro_batch_size * data) micro-batches, so a
//      job that halves dp runs twice the micro-batches per rank (gradient accumulation).
//   2. Only when no data-parallel size fits with them do the model-parallel sizes shrink, to
//      divisors of the configured ones: the largest product of tensor * context * pipeline first
//      (the least memory per rank), and among equal products pipeline gives way before context and
//      context before tensor. parallel.expert shrinks (halves) only when the layout refuses it.
//   3. A layout "fits" when validate_config accepts it for that world size (its one-line message is
//      the reason it was refused) and the memory plan's largest rank fits the per-rank memory
//      (check_memory_plan; no check when no limit is known).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/config.hpp"

namespace parallel {

struct ElasticLayout {
  int world_size = 0;
  int tensor = 1, context = 1, pipeline = 1, data = 1, expert = 1;
  int micro_batches = 1;   // per data-parallel rank and step: global / (micro_batch_size * data)
  int64_t peak_bytes = 0;  // the memory plan's largest rank
  Config config;           // the configuration validated for this layout

  // The trainer's overrides that select it: parallel.tensor=, parallel.context=,
  // parallel.pipeline=, parallel.expert= (each always given, so the launch says what it runs).
  std::vector<std::string> overrides() const;
  // "tp2 cp1 pp2 dp1 ep1: 4 ranks, 4 micro-batches of 2 per rank".
  std::string describe() const;
};

// The layout a validated configuration runs on `world_size` ranks as configured.
ElasticLayout layout_of(const Config& config, int world_size);

struct ElasticOptions {
  int min_ranks = 1;  // fewer than this: no layout
  int max_ranks = 0;  // at most this many ranks (the first launch's); 0: no bound
  // Memory per rank for the plan check. When 0, `node_memory_bytes` is shared by the ranks on a
  // node (ceil(world / nodes)); when both are 0 nothing is checked. The scope is the device's
  // (MemoryScope::Device for train.device: cuda, else All).
  int64_t rank_memory_bytes = 0;
  int64_t node_memory_bytes = 0;
  int nodes = 1;
  std::string memory_source;  // where the figure came from, for messages
};

struct ElasticChoice {
  std::optional<ElasticLayout> layout;  // empty: nothing fits
  // Why each layout tried before the chosen one (or all of them) was refused: "tp1 cp1 pp1 dp3: config:
  // train.global_batch_size = 8: must be divisible by ...". In the order tried.
  std::vector<std::string> refused;
};

// The layout for `available_ranks` ranks (at most options.max_ranks) for `config` (validated for
// any world size; its parallel sizes are the starting point). Pure: reads no files, starts nothing.
ElasticChoice choose_elastic_layout(const Config& config, int available_ranks, const ElasticOptions& options);

}  // namespace parallel
