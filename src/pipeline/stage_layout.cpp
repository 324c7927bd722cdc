// Which transformer layers each pipeline stage holds (Megatron's layer assignment, including the
// interleaved one and decoder_first/last_pipeline_num_layers).
#include "parallel/error.hpp"
#include "parallel/pipeline.hpp"

namespace parallel::pipeline {

std::vector<int> layers_per_stage(const LayoutParams& s) {
  const int p = s.pipeline_size, v = s.virtual_stages, n = s.num_layers;
  if (p < 1) PARALLEL_FAIL("pipeline ({}) must be >= 1", p);
  if (v < 1) PARALLEL_FAIL("virtual_stages ({}) must be >= 1", v);
  if (n < 1) PARALLEL_FAIL("num_layers ({}) must be >= 1", n);
  if (s.first_stage_layers < 0 || s.last_stage_layers < 0)
    PARALLEL_FAIL("parallel.first_stage_layers ({}) and last_stage_layers ({}) must be >= 0 (0: even split)",
                  s.first_stage_layers, s.last_stage_layers);
  const int stages = p * v;
  const bool explicit_counts = s.first_stage_layers > 0 || s.last_stage_layers > 0;

  if (!explicit_counts) {
    if (n % stages != 0)
      PARALLEL_FAIL(
          "num_layers ({}) must be divisible by pipeline ({}) x virtual_stages ({}) = {}; or set "
          "parallel.first_stage_layers/last_stage_layers",
          n, p, v, stages);
    return std::vector<int>(static_cast<std::size_t>(stages), n / stages);
  }

  // Uneven stages plus interleaving would make the chunk sizes of one rank differ, which Megatron
  // does not support either; refusing beats guessing which chunk gets the odd layers.
  if (v > 1)
    PARALLEL_FAIL("parallel.first_stage_layers/last_stage_layers need virtual_stages = 1 (got {})", v);
  if (p < 2) PARALLEL_FAIL("parallel.first_stage_layers/last_stage_layers need pipeline > 1 (got {})", p);

  // The stages without an explicit count share what is left.
  std::vector<int> layers(static_cast<std::size_t>(p), 0);
  int rest = n, shared = p;
  if (s.first_stage_layers > 0) {
    layers.front() = s.first_stage_layers;
    rest -= s.first_stage_layers;
    --shared;
  }
  if (s.last_stage_layers > 0) {
    layers.back() = s.last_stage_layers;
    rest -= s.last_stage_layers;
    --shared;
  }
  if (rest < 0 || (shared == 0 && rest != 0))
    PARALLEL_FAIL(
        "parallel.first_stage_layers ({}) + last_stage_layers ({}) must {} num_layers ({}) with pipeline "
        "({})",
        s.first_stage_layers, s.last_stage_layers, shared == 0 ? "equal" : "be less than", n, p);
  if (shared > 0 && (rest % shared != 0 || rest / shared < 1))
    PARALLEL_FAIL(
        "num_layers ({}) minus first_stage_layers ({}) and last_stage_layers ({}) leaves {} layers, which "
        "must "
        "split evenly (>= 1 each) over the other {} stages",
        n, s.first_stage_layers, s.last_stage_layers, rest, shared);
  for (int& count : layers)
    if (count == 0) count = rest / shared;
  return layers;
}

LayoutParams LayoutParams::of(const Config& c) {
  return {.num_layers = c.model.num_layers,
          .pipeline_size = c.parallel.pipeline,
          .virtual_stages = c.parallel.virtual_stages,
          .first_stage_layers = c.parallel.first_stage_layers,
          .last_stage_layers = c.parallel.last_stage_layers,
          .placement = placement_of(c.parallel.pipeline_schedule)};
}

std::vector<ChunkSpec> stage_layout(const LayoutParams& s, int rank) {
  const std::vector<int> layers = layers_per_stage(s);
  const int p = s.pipeline_size, stages = static_cast<int>(layers.size());
  if (rank < 0 || rank >= p) PARALLEL_FAIL("pipeline rank ({}) must be in [0, pipeline ({}))", rank, p);
  std::vector<ChunkSpec> chunks;
  if (s.placement == Placement::V && s.virtual_stages != 2)
    PARALLEL_FAIL("the V placement needs virtual_stages = 2 (got {})", s.virtual_stages);
  for (int c = 0; c < s.virtual_stages; ++c) {
    const int g = global_stage(p, rank, c, s.placement);
    int first = 0;
    for (int i = 0; i < g; ++i) first += layers[static_cast<std::size_t>(i)];
    chunks.push_back({.first_layer = first,
                      .num_layers = layers[static_cast<std::size_t>(g)],
                      .pre_process = g == 0,
                      .post_process = g == stages - 1});
  }
  return chunks;
}

}  // namespace parallel::pipeline
