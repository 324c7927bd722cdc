// Resharding checkpoints under real ranks: within one run (world size n), save the same global
// tensors in every layout expressible with n ranks and load each save into every layout, as fp32
// and as bf16, comparing against the global tensors generated from their indices. Also: a corrupt
// file or a missing tensor fails the load on every rank, and should_stop agrees across ranks.
//
// Layouts (n = world size): rows (dim 0 split over n), cols (last dim split over n), tp2xdp (last
// dim split over 2, replicated over n / 2, the dp-rank-0 copy writes), blocks (2-d grid a x b = n),
// replicated (every rank holds all; the last rank writes). Shapes are chosen so that splits are
// uneven and some boxes are empty.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/checkpoint.hpp"
#include "parallel/signal_handler.hpp"

namespace parallel {
namespace {

namespace fs = std::filesystem;
using checkpoint::Box;
using checkpoint::ShardedTensor;
using testing::world;

struct Placement {
  Box box;
  bool writer = true;
};

struct Layout {
  std::string name;
  std::function<Placement(const Shape& global, int rank, int n)> place;
};

Box whole_box(const Shape& g) { return {std::vector<int64_t>(g.size(), 0), g}; }

Box split(const Shape& g, std::size_t dim, int parts, int index) {
  Box b = whole_box(g);
  const Chunk c = chunk_of(g[dim], parts, index);
  b.offset[dim] = c.offset;
  b.shape[dim] = c.count;
  return b;
}

std::vector<Layout> layouts() {
  return {
      {"rows",
       [](const Shape& g, int r, int n) {
         return Placement{split(g, 0, n, r), true};
       }},
      {"cols",
       [](const Shape& g, int r, int n) {
         return Placement{split(g, g.size() - 1, n, r), true};
       }},
      {"tp2xdp",
       [](const Shape& g, int r, int n) {
         const int tp = n % 2 == 0 ? 2 : 1;
         return Placement{split(g, g.size() - 1, tp, r % tp), r / tp == 0};
       }},
      {"blocks",
       [](const Shape& g, int r, int n) {
         if (g.size() < 2) return Placement{split(g, 0, n, r), true};
         const int a = n % 2 == 0 ? 2 : 1, b = n / a;
         Box box = split(g, 0, a, r / b);
         const Chunk c = chunk_of(g[1], b, r % b);
         box.offset[1] = c.offset;
         box.shape[1] = c.count;
         return Placement{box, true};
       }},
      {"replicated",
       [](const Shape& g, int r, int n) {
         return Placement{whole_box(g), r == n - 1};
       }},
  };
}

struct GlobalTensor {
  std::string name;
  Shape shape;
  DType saved_dtype;
  float base;
};

const std::vector<GlobalTensor>& globals() {
  static const std::vector<GlobalTensor> g = {
      {"layers.0.mlp.fc1.weight", {7, 10}, DType::F32, 0.0f},
      {"layers.0.mlp.fc1.bias", {3}, DType::F32, 1000.0f},  // fewer elements than ranks at n = 4
      {"embedding.word.weight", {6, 4, 9}, DType::BF16, -200.0f},
      {"optimizer.exp_avg.layers.0.mlp.fc1.weight", {7, 10}, DType::F32, 5000.5f},
  };
  return g;
}

// Element i (row-major) of a global tensor is base + i, rounded to the saved dtype.
Tensor global_value(const GlobalTensor& g) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(g.shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = g.base + static_cast<float>(i);
  return Tensor::from_floats(v, g.shape, g.saved_dtype);
}

Tensor sub(Tensor t, const Box& b) {
  for (std::size_t d = 0; d < b.shape.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), b.offset[d], b.shape[d]);
  return t;
}

// Rank 0 makes a fresh directory; everyone gets its name.
std::string shared_temp_dir() {
  std::string path;
  if (world().rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / "parallel_ckpt_mpi_XXXXXX").string();
    PARALLEL_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path = tmpl;
  }
  Communicator& comm = world();  // the defaults of broadcast() live on the base class
  Tensor len = Tensor::from_vector<int64_t>({static_cast<int64_t>(path.size())}, {1});
  comm.broadcast(len, 0);
  Tensor bytes = Tensor::zeros({len.data<int64_t>()[0]}, DType::U8);
  if (comm.rank() == 0) std::memcpy(bytes.data_ptr(), path.data(), path.size());
  comm.broadcast(bytes, 0);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
}

class CheckpointMpi : public ::testing::Test {
 protected:
  void SetUp() override { root_ = shared_temp_dir(); }
  void TearDown() override {
    world().barrier();
    if (world().rank() == 0) fs::remove_all(root_);
  }
  std::string root_;
};

// This rank's pieces of every global tensor in `layout`; the locals are non-contiguous views of the
// global tensors, as a Parameter's value may be.
std::vector<ShardedTensor> save_set(const Layout& layout) {
  std::vector<ShardedTensor> out;
  for (const GlobalTensor& g : globals()) {
    const Placement p = layout.place(g.shape, world().rank(), world().size());
    out.push_back({g.name, sub(global_value(g), p.box), g.shape, p.box.offset, p.writer});
  }
  return out;
}

TEST_F(CheckpointMpi, EveryLayoutLoadsIntoEveryLayout) {
  const int rank = world().rank(), n = world().size();
  int step = 0;
  for (const Layout& saved : layouts()) {
    ++step;
    const std::string dir = checkpoint::save(root_, step, save_set(saved),
                                             fmt::format(R"({{"saved_by": "{}"}})", saved.name), world());
    for (const Layout& loaded : layouts()) {
      for (DType dtype : {DType::F32, DType::BF16}) {
        std::vector<ShardedTensor> want;
        std::vector<Box> boxes;
        for (const GlobalTensor& g : globals()) {
          const Placement p = loaded.place(g.shape, rank, n);
          want.push_back({g.name, Tensor::full(p.box.shape, -7.0, dtype), g.shape, p.box.offset, false});
          boxes.push_back(p.box);
        }
        const checkpoint::LoadResult r = checkpoint::load(dir, want, world());
        EXPECT_EQ(r.step, step);
        EXPECT_EQ(r.saved_world_size, n);
        EXPECT_TRUE(r.has_optimizer_state);
        EXPECT_NE(r.extras_json.find(saved.name), std::string::npos);
        for (std::size_t i = 0; i < want.size(); ++i) {
          const Tensor expected = sub(global_value(globals()[i]), boxes[i]).to(DType::F32).to(dtype);
          EXPECT_EQ(want[i].local.to_float_vector(), expected.to_float_vector())
              << globals()[i].name << " saved " << saved.name << " loaded " << loaded.name << " as "
              << dtype_name(dtype) << " on rank " << rank;
        }
      }
    }
  }
  // Every save moved `latest` along.
  EXPECT_EQ(checkpoint::read_info(root_).step, step);
}

TEST_F(CheckpointMpi, WholeTensorOnEveryRankFromRowsSave) {
  const int n = world().size();
  checkpoint::SaveOptions options;
  options.layout_json = fmt::format(R"({{"data": {}}})", n);
  checkpoint::save(root_, 42, save_set(layouts()[0]), "", world(), options);
  std::vector<ShardedTensor> want;
  for (const GlobalTensor& g : globals())
    want.push_back(
        {g.name, Tensor::zeros(g.shape, DType::F32), g.shape, std::vector<int64_t>(g.shape.size(), 0)});
  checkpoint::LoadOptions options_in;
  options_in.weights_only = true;
  options_in.default_root = root_;
  const checkpoint::LoadResult r = checkpoint::load("latest", want, world(), options_in);
  EXPECT_EQ(r.step, 42);
  EXPECT_EQ(r.layout_json, fmt::format(R"({{"data":{}}})", n));
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0], globals()[3].name);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(want[i].local.to_float_vector(), global_value(globals()[i]).to_float_vector())
        << globals()[i].name;
  EXPECT_EQ(want[3].local.to_float_vector(), std::vector<float>(70, 0.0f));  // untouched
}

TEST_F(CheckpointMpi, CorruptFileOrMissingTensorFailsOnEveryRank) {
  const int n = world().size();
  const std::string dir = checkpoint::save(root_, 1, save_set(layouts()[0]), "", world());
  // Missing tensor: every rank throws, naming it.
  {
    std::vector<ShardedTensor> want = {{"no.such.tensor", Tensor::zeros({2}, DType::F32), {2}, {0}, false}};
    try {
      checkpoint::load(dir, want, world());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'no.such.tensor'"), std::string::npos) << e.what();
    }
  }
  // Rank 0 corrupts the last rank's file; a whole-tensor load reads it on every rank.
  world().barrier();
  const std::string victim = fmt::format("rank_{:05d}.safetensors", n - 1);
  if (world().rank() == 0) {
    std::fstream f(fs::path(dir) / victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  world().barrier();
  const GlobalTensor& g = globals()[0];
  std::vector<ShardedTensor> want = {{g.name, Tensor::zeros(g.shape, DType::F32), g.shape, {0, 0}, false}};
  try {
    checkpoint::load(dir, want, world());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
}

// checkpoint.async's building block: the files hold the tensors as they were at start(), though
// they change right after; nothing is visible before finish(); the bytes are a synchronous save's.
TEST_F(CheckpointMpi, AsyncSaveWritesTheStateAtStartAndPublishesOnFinish) {
  const std::vector<ShardedTensor> tensors = save_set(layouts()[2]);  // tp2xdp: writers and replicas
  checkpoint::save(root_ + "/sync", 5, tensors, R"({"k": 1})", world());
  checkpoint::AsyncSave saving;
  EXPECT_FALSE(saving.pending());
  saving.start(root_, 5, tensors, R"({"k": 1})", world());
  EXPECT_TRUE(saving.pending());
  EXPECT_EQ(saving.step(), 5);
  for (const ShardedTensor& t : tensors) Tensor(t.local).fill_(-1.0);  // training goes on
  EXPECT_TRUE(checkpoint::list_steps(root_).empty());                  // not published yet
  EXPECT_FALSE(fs::exists(fs::path(root_) / "latest"));
  while (!saving.all_written(world())) ::usleep(1000);
  const std::string dir = saving.finish(world());
  EXPECT_FALSE(saving.pending());
  EXPECT_EQ(checkpoint::resolve(root_), dir);
  std::vector<ShardedTensor> want;
  for (const GlobalTensor& g : globals())
    want.push_back(
        {g.name, Tensor::zeros(g.shape, DType::F32), g.shape, std::vector<int64_t>(g.shape.size(), 0)});
  checkpoint::load(dir, want, world());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(want[i].local.to_float_vector(), global_value(globals()[i]).to_float_vector())
        << globals()[i].name;
  world().barrier();
  if (world().rank() == 0)
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const auto bytes = [](const fs::path& p) {
        std::ifstream in(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
      };
      EXPECT_EQ(bytes(e.path()),
                bytes(fs::path(root_) / "sync" / checkpoint::step_dir_name(5) / e.path().filename()))
          << e.path().filename();
    }
}

// A failed background write (injected on the last rank) throws on every rank naming it, publishes
// nothing and leaves `latest` alone; the next save works.
TEST_F(CheckpointMpi, AsyncSaveFailureKeepsLatest) {
  const int n = world().size();
  const std::vector<ShardedTensor> tensors = save_set(layouts()[0]);
  checkpoint::save(root_, 1, tensors, "", world());
  checkpoint::AsyncSave saving;
  ::setenv("PARALLEL_INJECT_CHECKPOINT_FAIL", fmt::format("2:{}", n - 1).c_str(), 1);
  saving.start(root_, 2, tensors, "", world());
  ::unsetenv("PARALLEL_INJECT_CHECKPOINT_FAIL");
  try {
    saving.finish(world());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(fmt::format("the background write of step 2 failed on rank {}: ", n - 1)),
        std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(saving.pending());
  world().barrier();
  EXPECT_EQ(checkpoint::read_info(root_).step, 1);
  EXPECT_FALSE(fs::exists(fs::path(root_) / ".tmp_step_00000002"));
  EXPECT_FALSE(fs::exists(fs::path(root_) / "step_00000002"));
  saving.start(root_, 3, tensors, "", world());
  EXPECT_EQ(saving.finish(world()), (fs::path(root_) / "step_00000003").string());
  EXPECT_EQ(checkpoint::read_info(root_).step, 3);
}

TEST(CheckpointStop, ShouldStopAgreesAcrossRanks) {
  StopFlag stop;
  EXPECT_FALSE(should_stop(stop, world()));
  if (world().rank() == world().size() - 1) {
    // Delivered on the library's signal thread: the flag is set a moment after kill() returns.
    ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
    for (int i = 0; i < 10000 && !stop.requested(); ++i) ::usleep(1000);
  }
  EXPECT_TRUE(should_stop(stop, world()));
  EXPECT_EQ(stop.requested(), world().rank() == world().size() - 1);
}

}  // namespace
}  // namespace parallel
