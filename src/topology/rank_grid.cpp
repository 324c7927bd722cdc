#include <array>
#include <cstdint>
#include <initializer_list>

#include "parallel/error.hpp"
#include "parallel/parallel_state.hpp"

namespace parallel {
namespace {

// The dense axes in Megatron-Core's order tp-cp-dp-pp: index 0 varies fastest in the rank.
constexpr int kAxes = 4;

std::array<int, kAxes> extents(const ParallelSizes& s) { return {s.tensor, s.context, s.data, s.pipeline}; }

std::array<int, kAxes> as_array(const Coord& c) { return {c.tp, c.cp, c.dp, c.pp}; }

Coord from_array(const std::array<int, kAxes>& a) {
  return Coord{.tp = a[0], .cp = a[1], .dp = a[2], .pp = a[3]};
}

}  // namespace

RankGrid::RankGrid(ParallelSizes sizes) : sizes_(sizes) {
  PARALLEL_CHECK(sizes.tensor >= 1 && sizes.context >= 1 && sizes.expert >= 1 && sizes.expert_tensor >= 1 &&
                     sizes.pipeline >= 1 && sizes.data >= 1,
                 "parallel sizes must be >= 1, got tensor({}) context({}) expert({}) expert_tensor({}) "
                 "pipeline({}) data({})",
                 sizes.tensor, sizes.context, sizes.expert, sizes.expert_tensor, sizes.pipeline, sizes.data);
  const int64_t stage = int64_t{sizes.tensor} * sizes.context * sizes.data;
  PARALLEL_CHECK(stage % (int64_t{sizes.expert} * sizes.expert_tensor) == 0,
                 "expert({}) x expert_tensor({}) must divide tensor({}) x context({}) x data({}) = {}",
                 sizes.expert, sizes.expert_tensor, sizes.tensor, sizes.context, sizes.data, stage);
}

RankGrid RankGrid::from_world(int world_size, int tensor, int pipeline, int context, int expert,
                              int expert_tensor) {
  PARALLEL_CHECK(world_size >= 1, "world size {} must be >= 1", world_size);
  PARALLEL_CHECK(tensor >= 1 && pipeline >= 1 && context >= 1 && expert >= 1 && expert_tensor >= 1,
                 "parallel sizes must be >= 1, got tensor({}) pipeline({}) context({}) expert({}) "
                 "expert_tensor({})",
                 tensor, pipeline, context, expert, expert_tensor);
  // 64-bit so that absurd sizes report a clean error instead of overflowing.
  const int64_t model = int64_t{tensor} * pipeline * context;
  if (world_size % model != 0)
    PARALLEL_FAIL("world size {} is not divisible by tensor({}) x pipeline({}) x context({}) = {}",
                  world_size, tensor, pipeline, context, model);
  return RankGrid(ParallelSizes{.tensor = tensor,
                                .context = context,
                                .pipeline = pipeline,
                                .data = static_cast<int>(world_size / model),
                                .expert = expert,
                                .expert_tensor = expert_tensor});
}

Coord RankGrid::coord(int rank) const {
  PARALLEL_CHECK(rank >= 0 && rank < world_size(), "rank {} outside world of {}", rank, world_size());
  std::array<int, kAxes> c{};
  const auto ext = extents(sizes_);
  for (int axis = 0; axis < kAxes; ++axis) {
    c[axis] = rank % ext[axis];
    rank /= ext[axis];
  }
  Coord out = from_array(c);
  // The expert axes fold onto the same position within the stage.
  const int inner = out.tp + sizes_.tensor * (out.cp + sizes_.context * out.dp);
  out.etp = inner % sizes_.expert_tensor;
  out.ep = inner / sizes_.expert_tensor % sizes_.expert;
  out.edp = inner / (sizes_.expert_tensor * sizes_.expert);
  return out;
}

int RankGrid::rank(const Coord& c) const {
  const auto ext = extents(sizes_);
  const auto a = as_array(c);
  int r = 0;
  for (int axis = kAxes - 1; axis >= 0; --axis) {
    PARALLEL_CHECK(a[axis] >= 0 && a[axis] < ext[axis], "coordinate {} on axis {} outside size {}", a[axis],
                   axis, ext[axis]);
    r = r * ext[axis] + a[axis];
  }
  return r;
}

namespace {

// The ranks sharing `rank`'s coordinates on every axis not in `varying`, enumerated with the first
// varying axis fastest; since each axis keeps its stride in the global rank, that is ascending rank.
std::vector<int> group_of(const RankGrid& grid, int rank, std::initializer_list<int> varying) {
  const auto ext = extents(grid.sizes());
  const auto base = as_array(grid.coord(rank));
  std::vector<int> axes(varying);
  int count = 1;
  for (int axis : axes) count *= ext[axis];
  std::vector<int> members;
  members.reserve(count);
  for (int i = 0; i < count; ++i) {
    auto c = base;
    int rest = i;
    for (int axis : axes) {
      c[axis] = rest % ext[axis];
      rest /= ext[axis];
    }
    members.push_back(grid.rank(from_array(c)));
  }
  return members;
}

// Axis positions in a Coord, Megatron's order.
enum Axis : int { kTp, kCp, kDp, kPp };

// The expert grid's axes: etp, ep, edp within the stage (their product is TP * CP * DP), then pp.
// The ranks sharing `rank`'s expert coordinates except the `varying` ones, in group-rank order.
enum ExpertAxis : int { kEtp, kEp, kEdp, kEpp };
std::vector<int> expert_group_of(const RankGrid& grid, int rank, std::initializer_list<int> varying) {
  const ParallelSizes& s = grid.sizes();
  const std::array<int, 4> ext{s.expert_tensor, s.expert, s.expert_data(), s.pipeline};
  const Coord c = grid.coord(rank);
  const std::array<int, 4> base{c.etp, c.ep, c.edp, c.pp};
  int count = 1;
  for (int axis : varying) count *= ext[axis];
  std::vector<int> members;
  members.reserve(count);
  for (int i = 0; i < count; ++i) {
    auto e = base;
    int rest = i;
    for (int axis : varying) {
      e[axis] = rest % ext[axis];
      rest /= ext[axis];
    }
    const int inner = e[kEtp] + s.expert_tensor * (e[kEp] + s.expert * e[kEdp]);
    members.push_back(inner + s.tensor * s.context * s.data * e[kEpp]);
  }
  return members;
}

}  // namespace

std::vector<int> RankGrid::tensor_group(int rank) const { return group_of(*this, rank, {kTp}); }
std::vector<int> RankGrid::context_group(int rank) const { return group_of(*this, rank, {kCp}); }
std::vector<int> RankGrid::data_group(int rank) const { return group_of(*this, rank, {kDp}); }
std::vector<int> RankGrid::pipeline_group(int rank) const { return group_of(*this, rank, {kPp}); }
std::vector<int> RankGrid::data_context_group(int rank) const { return group_of(*this, rank, {kCp, kDp}); }
std::vector<int> RankGrid::model_group(int rank) const { return group_of(*this, rank, {kTp, kPp}); }
std::vector<int> RankGrid::expert_group(int rank) const { return expert_group_of(*this, rank, {kEp}); }
std::vector<int> RankGrid::expert_tensor_group(int rank) const {
  return expert_group_of(*this, rank, {kEtp});
}
std::vector<int> RankGrid::expert_data_group(int rank) const { return expert_group_of(*this, rank, {kEdp}); }
std::vector<int> RankGrid::expert_model_group(int rank) const {
  return expert_group_of(*this, rank, {kEtp, kEp, kEpp});
}

std::vector<int> RankGrid::embedding_group(int rank) const {
  const auto pipeline = pipeline_group(rank);
  const int stage = coord(rank).pp;
  if (stage != 0 && stage != sizes_.pipeline - 1) return {};
  if (pipeline.size() == 1) return pipeline;
  return {pipeline.front(), pipeline.back()};
}

}  // namespace parallel
