// The layout of an elastic relaunch (elastic_layout.hpp): data parallelism shrinks first, then the
// model-parallel sizes, each candidate checked by validate_config and the memory plan.
#include "parallel/elastic_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "parallel/error.hpp"
#include "parallel/memory_plan.hpp"

namespace parallel {
namespace {

std::vector<int> divisors_descending(int n) {
  std::vector<int> out;
  for (int d = n; d >= 1; --d)
    if (n % d == 0) out.push_back(d);
  return out;
}

struct ModelSizes {
  int tensor, context, pipeline;
  int product() const { return tensor * context * pipeline; }
};

// The configured sizes first, then every divisor combination: the largest product first, and
// among equal products the larger tensor, then the larger context (pipeline gives way first).
std::vector<ModelSizes> model_candidates(const ParallelConfig& p) {
  std::vector<ModelSizes> out;
  for (int t : divisors_descending(p.tensor))
    for (int c : divisors_descending(p.context))
      for (int q : divisors_descending(p.pipeline))
        if (t != p.tensor || c != p.context || q != p.pipeline) out.push_back({t, c, q});
  std::stable_sort(out.begin(), out.end(), [](const ModelSizes& a, const ModelSizes& b) {
    return std::make_tuple(a.product(), a.tensor, a.context) >
           std::make_tuple(b.product(), b.tensor, b.context);
  });
  out.insert(out.begin(), {p.tensor, p.context, p.pipeline});
  return out;
}

std::string sizes_name(const ModelSizes& s, int world, int expert) {
  return fmt::format("tp{} cp{} pp{} dp{} ep{}", s.tensor, s.context, s.pipeline, world / s.product(),
                     expert);
}

}  // namespace

std::vector<std::string> ElasticLayout::overrides() const {
  return {fmt::format("parallel.tensor={}", tensor), fmt::format("parallel.context={}", context),
          fmt::format("parallel.pipeline={}", pipeline), fmt::format("parallel.expert={}", expert)};
}

std::string ElasticLayout::describe() const {
  return fmt::format("tp{} cp{} pp{} dp{} ep{}: {} rank{}, {} micro-batch{} of {} per rank", tensor, context,
                     pipeline, data, expert, world_size, world_size == 1 ? "" : "s", micro_batches,
                     micro_batches == 1 ? "" : "es", config.train.micro_batch_size);
}

ElasticLayout layout_of(const Config& config, int world_size) {
  ElasticLayout l;
  l.config = config;
  validate_config(l.config, world_size);
  const ParallelConfig& p = l.config.parallel;
  l.world_size = world_size;
  l.tensor = p.tensor;
  l.context = p.context;
  l.pipeline = p.pipeline;
  l.data = p.data;
  l.expert = p.expert;
  l.micro_batches = l.config.train.global_batch_size / (l.config.train.micro_batch_size * p.data);
  return l;
}

ElasticChoice choose_elastic_layout(const Config& config, int available_ranks,
                                    const ElasticOptions& options) {
  ElasticChoice choice;
  const int top = options.max_ranks > 0 ? std::min(available_ranks, options.max_ranks) : available_ranks;
  const int min_ranks = std::max(1, options.min_ranks);
  if (top < min_ranks) {
    choice.refused.push_back(
        fmt::format("{} rank{} available, fewer than the minimum {}", top, top == 1 ? "" : "s", min_ranks));
    return choice;
  }
  const MemoryScope scope = config.train.device == DeviceKind::CUDA ? MemoryScope::Device : MemoryScope::All;
  for (const ModelSizes& sizes : model_candidates(config.parallel)) {
    for (int world = top / sizes.product() * sizes.product(); world >= min_ranks && world > 0;
         world -= sizes.product()) {
      // Expert parallelism folds onto tensor * context * data: the configured size, halved while
      // the layout refuses it.
      for (int expert = config.parallel.expert; expert >= 1; expert /= 2) {
        Config c = config;
        c.parallel.tensor = sizes.tensor;
        c.parallel.context = sizes.context;
        c.parallel.pipeline = sizes.pipeline;
        c.parallel.expert = expert;
        c.parallel.data = 0;
        ElasticLayout layout;
        try {
          layout = layout_of(c, world);
        } catch (const ConfigError& e) {
          choice.refused.push_back(sizes_name(sizes, world, expert) + ": " + e.what());
          if (expert % 2 != 0) break;
          continue;
        }
        try {
          const MemoryPlan plan = plan_memory(layout.config, world);
          layout.peak_bytes = plan.largest().peak_bytes;
          MemoryLimit limit{options.rank_memory_bytes, options.memory_source};
          if (limit.bytes <= 0 && options.node_memory_bytes > 0) {
            const int nodes = std::max(1, options.nodes);
            const int per_node = (world + nodes - 1) / nodes;
            limit.bytes = options.node_memory_bytes / per_node;
            limit.source = fmt::format("{} shared by {} rank{}", options.memory_source, per_node,
                                       per_node == 1 ? "" : "s");
          }
          check_memory_plan(plan, limit, scope);
        } catch (const ConfigError& e) {
          choice.refused.push_back(sizes_name(sizes, world, expert) + ": " + e.what());
          break;  // a smaller expert size holds more experts per rank: no better
        }
        choice.layout = std::move(layout);
        return choice;
      }
    }
  }
  if (choice.refused.empty())
    choice.refused.push_back(fmt::format(
        "no layout of the configured model-parallel sizes has between {} and {} ranks", min_ranks, top));
  return choice;
}

}  // namespace parallel
