// ParallelState under mpirun: every group communicator must hold exactly RankGrid's members, in
// RankGrid's order. Each rank writes its world rank at its group rank and the group sums, which
// gives every member the full member list in group-rank order without trusting split's bookkeeping.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/device.hpp"
#include "parallel/error.hpp"
#include "parallel/local_communicator.hpp"
#include "parallel/mpi_communicator.hpp"
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

// ---- one-rank groups: a LocalCommunicator, no NCCL ----------------------------------------------

std::unique_ptr<Communicator> self_group() {
  auto self = testing::world().split(testing::world().rank(), 0);  // every rank alone
  EXPECT_EQ(self->size(), 1);
  return self;
}

// The factory ParallelState uses for GPU groups: a one-rank group gets a LocalCommunicator without
// touching NCCL or the GPU, so this passes on a machine with neither (make_nccl_communicator would
// throw there: no device, or no CUDA backend).
TEST(DeviceCommunicator, OneRankGroupsNeedNoNccl) {
  auto self = self_group();
  auto* mpi = dynamic_cast<MpiCommunicator*>(self.get());
  ASSERT_NE(mpi, nullptr);
  mpi->set_name("tp");
  std::unique_ptr<Communicator> comm;
  ASSERT_NO_THROW(comm = make_device_communicator(*mpi, Device::cuda(0)));
  EXPECT_EQ(comm->backend(), "local");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->name(), "tp");
  EXPECT_EQ(comm->world_ranks(), std::vector<int>{testing::world().rank()});
  // More than one rank still goes to NCCL, which a machine without a GPU cannot create.
  if (testing::world().size() > 1 && cuda_device_count() == 0)
    EXPECT_THROW(make_device_communicator(testing::world(), Device::cuda(0)), Error);
}

std::vector<float> values(const Tensor& t) { return t.to_float_vector(); }

// Collectives over one rank are the identity (here on CPU tensors; CUDA tensors take the same
// copies, ordered on the communicator's stream).
TEST(DeviceCommunicator, LocalCollectivesAreTheIdentity) {
  auto self = self_group();
  LocalCommunicator comm(*self);
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::from_vector(v, {6});
  comm.all_reduce(t, ReduceOp::Sum, false);
  EXPECT_EQ(values(t), v);
  comm.broadcast(t, 0, false);
  EXPECT_EQ(values(t), v);
  EXPECT_THROW(comm.broadcast(t, 1, false), Error);
  for (int which = 0; which < 3; which++) {
    Tensor out = Tensor::zeros({6}, DType::F32);
    if (which == 0) comm.reduce_scatter(t, out, ReduceOp::Sum, false);
    if (which == 1) comm.all_gather(t, out, false);
    if (which == 2) comm.all_to_all(t, out, false);
    EXPECT_EQ(values(out), v) << which;
  }
  Tensor out = Tensor::zeros({6}, DType::F32);
  const int64_t counts[] = {6};
  comm.all_to_allv(t, counts, out, counts, false);
  EXPECT_EQ(values(out), v);
  Tensor wrong = Tensor::zeros({5}, DType::F32);
  EXPECT_THROW(comm.all_gather(t, wrong, false), Error);
  comm.barrier();
  EXPECT_EQ(comm.split(-1, 0), nullptr);
  auto sub = comm.split(3, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->backend(), "local");
}

TEST(DeviceCommunicator, LocalMessagesToItselfMatchByTag) {
  auto self = self_group();
  LocalCommunicator comm(*self);
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  Tensor b = Tensor::from_vector(std::vector<float>{3, 4}, {2});
  Tensor ra = Tensor::zeros({2}, DType::F32), rb = Tensor::zeros({2}, DType::F32);
  // Receives posted first, sends in the other tag order: matched by tag, not by position.
  WorkHandle wa = comm.recv(ra, 0, /*tag=*/1);
  WorkHandle wb = comm.recv(rb, 0, /*tag=*/2);
  EXPECT_FALSE(wa->is_completed());
  comm.send(b, 0, 2)->wait();
  comm.send(a, 0, 1)->wait();
  wa->wait();
  wb->wait();
  EXPECT_EQ(values(ra), (std::vector<float>{1, 2}));
  EXPECT_EQ(values(rb), (std::vector<float>{3, 4}));
  // A batch exchanging with itself, and a receive nothing will ever match.
  Tensor rc = Tensor::zeros({2}, DType::F32);
  const P2POp ops[] = {{P2POp::Kind::Recv, rc, 0, 0}, {P2POp::Kind::Send, a, 0, 0}};
  comm.batch_p2p(ops)->wait();
  EXPECT_EQ(values(rc), (std::vector<float>{1, 2}));
  EXPECT_THROW(comm.recv(rc, 0, 9)->wait(), Error);
  EXPECT_THROW(comm.send(a, 1, 0), Error);
}

}  // namespace
}  // namespace parallel
