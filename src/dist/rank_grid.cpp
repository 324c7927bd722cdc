#include <array>
#include <cstdint>
#include <initializer_list>

#include "parallel/error.hpp"
#include "parallel/parallel_state.hpp"

namespace parallel {
namespace {

// The axes in Megatron-Core's order tp-cp-ep-dp-pp: index 0 varies fastest in the rank.
constexpr int kAxes = 5;

std::array<int, kAxes> extents(const ParallelSizes& s) {
  return {s.tensor, s.context, s.expert, s.data, s.pipeline};
}

std::array<int, kAxes> as_array(const Coord& c) { return {c.tp, c.cp, c.ep, c.dp, c.pp}; }

Coord from_array(const std::array<int, kAxes>& a) { return Coord{a[0], a[1], a[2], a[3], a[4]}; }

}  // namespace

RankGrid::RankGrid(ParallelSizes sizes) : sizes_(sizes) {
  PARALLEL_CHECK(
      sizes.tensor >= 1 && sizes.context >= 1 && sizes.expert >= 1 && sizes.pipeline >= 1 && sizes.data >= 1,
      "parallel sizes must be >= 1, got tensor({}) context({}) expert({}) pipeline({}) data({})",
      sizes.tensor, sizes.context, sizes.expert, sizes.pipeline, sizes.data);
}

RankGrid RankGrid::from_world(int world_size, int tensor, int pipeline, int context, int expert) {
  PARALLEL_CHECK(world_size >= 1, "world size {} must be >= 1", world_size);
  PARALLEL_CHECK(tensor >= 1 && pipeline >= 1 && context >= 1 && expert >= 1,
                 "parallel sizes must be >= 1, got tensor({}) pipeline({}) context({}) expert({})", tensor,
                 pipeline, context, expert);
  // 64-bit so that absurd sizes report a clean error instead of overflowing.
  const int64_t model = int64_t{tensor} * pipeline * context * expert;
  if (world_size % model != 0)
    PARALLEL_FAIL(
        "world size {} is not divisible by tensor({}) x pipeline({}) x context({}) x expert({}) = {}",
        world_size, tensor, pipeline, context, expert, model);
  return RankGrid(ParallelSizes{.tensor = tensor,
                                .context = context,
                                .expert = expert,
                                .pipeline = pipeline,
                                .data = static_cast<int>(world_size / model)});
}

Coord RankGrid::coord(int rank) const {
  PARALLEL_CHECK(rank >= 0 && rank < world_size(), "rank {} outside world of {}", rank, world_size());
  std::array<int, kAxes> c{};
  const auto ext = extents(sizes_);
  for (int axis = 0; axis < kAxes; ++axis) {
    c[axis] = rank % ext[axis];
    rank /= ext[axis];
  }
  return from_array(c);
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

// Axis positions in a Coord, Megatron's order. An enum, not ints, because kEp has no group of its own
// yet and an unused constant is a warning under Clang.
enum Axis : int { kTp, kCp, kEp, kDp, kPp };

}  // namespace

std::vector<int> RankGrid::tensor_group(int rank) const { return group_of(*this, rank, {kTp}); }
std::vector<int> RankGrid::context_group(int rank) const { return group_of(*this, rank, {kCp}); }
std::vector<int> RankGrid::data_group(int rank) const { return group_of(*this, rank, {kDp}); }
std::vector<int> RankGrid::pipeline_group(int rank) const { return group_of(*this, rank, {kPp}); }
std::vector<int> RankGrid::data_context_group(int rank) const { return group_of(*this, rank, {kCp, kDp}); }
std::vector<int> RankGrid::model_group(int rank) const { return group_of(*this, rank, {kTp, kPp}); }

std::vector<int> RankGrid::embedding_group(int rank) const {
  const auto pipeline = pipeline_group(rank);
  const int stage = coord(rank).pp;
  if (stage != 0 && stage != sizes_.pipeline - 1) return {};
  if (pipeline.size() == 1) return pipeline;
  return {pipeline.front(), pipeline.back()};
}

}  // namespace parallel
