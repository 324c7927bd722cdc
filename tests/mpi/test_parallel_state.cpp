// ParallelState under mpirun: every group communicator must hold exactly RankGrid's members, in
// RankGrid's order. Each rank writes its world rank at its group rank and the group sums, which
// gives every member the full member list in group-rank order without trusting split's bookkeeping.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/error.hpp"
#include "parallel/parallel_state.hpp"

namespace parallel {
namespace {

struct Layout {
  int tp, pp, dp, cp = 1;
};

std::string describe(const Layout& l) {
  return "tp" + std::to_string(l.tp) + " pp" + std::to_string(l.pp) + " dp" + std::to_string(l.dp) + " cp" +
         std::to_string(l.cp);
}

// Every layout of 1, 4 or 8 ranks worth covering; those not matching the world are skipped.
const std::vector<Layout> kLayouts = {
    // world 1
    {1, 1, 1},
    // world 4
    {2, 2, 1},
    {1, 2, 2},
    {4, 1, 1},
    {1, 1, 4},
    {2, 1, 2},
    {1, 4, 1},
    {1, 1, 2, /*cp=*/2},
    // world 8
    {2, 2, 2},
    {8, 1, 1},
    {1, 8, 1},
    {1, 1, 8},
    {2, 4, 1},
    {4, 1, 2},
    {1, 4, 2},
    {4, 2, 1},
    {2, 1, 2, /*cp=*/2},
    {1, 2, 1, /*cp=*/4},
};

std::vector<int> members_of(Communicator& comm) {
  Tensor t = Tensor::zeros({comm.size()}, DType::F32);
  t.data<float>()[comm.rank()] = static_cast<float>(testing::world().rank());
  comm.all_reduce(t, ReduceOp::Sum, /*async=*/false);
  std::vector<int> out;
  for (float v : t.to_float_vector()) out.push_back(static_cast<int>(v));
  return out;
}

void expect_group(Communicator& comm, const std::vector<int>& expected, const char* name) {
  SCOPED_TRACE(name);
  const int me = testing::world().rank();
  ASSERT_EQ(comm.size(), static_cast<int>(expected.size()));
  int position = 0;
  while (position < static_cast<int>(expected.size()) && expected[position] != me) ++position;
  EXPECT_EQ(comm.rank(), position);
  EXPECT_EQ(members_of(comm), expected);
  // The watchdog's message names the group and its members in world numbering.
  EXPECT_EQ(comm.name(), name);
  EXPECT_EQ(comm.world_ranks(), expected);
}

TEST(ParallelState, GroupsMatchRankGrid) {
  auto& world = testing::world();
  const int me = world.rank();
  int tested = 0;
  for (const Layout& l : kLayouts) {
    if (l.tp * l.pp * l.dp * l.cp != world.size()) continue;
    SCOPED_TRACE(describe(l));
    RankGrid grid(ParallelSizes{.tensor = l.tp, .context = l.cp, .pipeline = l.pp, .data = l.dp});
    ParallelState ps(world, grid);
    ++tested;

    EXPECT_EQ(ps.rank(), me);
    EXPECT_EQ(ps.coord(), grid.coord(me));
    EXPECT_EQ(&ps.world(), &world);
    EXPECT_EQ(world.name(), "world");
    EXPECT_EQ(ps.is_first_stage(), grid.coord(me).pp == 0);
    EXPECT_EQ(ps.is_last_stage(), grid.coord(me).pp == l.pp - 1);

    expect_group(ps.tp(), grid.tensor_group(me), "tp");
    expect_group(ps.cp(), grid.context_group(me), "cp");
    expect_group(ps.dp(), grid.data_group(me), "dp");
    expect_group(ps.dp_cp(), grid.data_context_group(me), "dp_cp");
    expect_group(ps.pp(), grid.pipeline_group(me), "pp");
    expect_group(ps.model(), grid.model_group(me), "model");

    const auto embedding = grid.embedding_group(me);
    if (embedding.empty()) {
      EXPECT_EQ(ps.embedding(), nullptr);
    } else {
      ASSERT_NE(ps.embedding(), nullptr);
      expect_group(*ps.embedding(), embedding, "embedding");
    }
    // Groups are built before the next layout's splits start; keeps failures attributable.
    world.barrier();
  }
  EXPECT_GT(tested, 0) << "no layout for world size " << world.size();
}

TEST(ParallelState, RejectsWorldSizeMismatch) {
  auto& world = testing::world();
  RankGrid grid(ParallelSizes{.tensor = 1, .pipeline = 1, .data = world.size() + 1});
  try {
    ParallelState ps(world, grid);
    FAIL() << "expected parallel::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("world size " + std::to_string(world.size())), std::string::npos) << what;
    EXPECT_NE(what.find("= " + std::to_string(world.size() + 1)), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace parallel
