// Checkpoints in one process: box intersection, CRC-32C against published vectors, path
// resolution, keep_last, corruption and truncation detection, crash leftovers, weights-only loads,
// the Parameter helpers and the SIGTERM/SIGINT stop flag. A single-rank stand-in communicator
// drives the collective save/load (the multi-rank layouts are tests/mpi/test_checkpoint.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "parallel/checkpoint.hpp"
#include "parallel/signal_handler.hpp"

namespace parallel {
namespace {

namespace fs = std::filesystem;
using checkpoint::Box;
using checkpoint::ShardedTensor;

// A world of one rank: collectives are copies or no-ops.
class SoloCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "solo"; }
  WorkHandle all_reduce(Tensor&, ReduceOp, bool) override { return completed_work(); }
  WorkHandle reduce_scatter(const Tensor& in, Tensor& out, ReduceOp, bool) override {
    out.copy_(in);
    return completed_work();
  }
  WorkHandle all_gather(const Tensor& in, Tensor& out, bool) override {
    out.copy_(in);
    return completed_work();
  }
  WorkHandle broadcast(Tensor&, int, bool) override { return completed_work(); }
  WorkHandle all_to_all(const Tensor& in, Tensor& out, bool) override {
    out.copy_(in);
    return completed_work();
  }
  WorkHandle send(const Tensor&, int, int) override { PARALLEL_FAIL("solo: no peers"); }
  WorkHandle recv(Tensor&, int, int) override { PARALLEL_FAIL("solo: no peers"); }
  WorkHandle batch_p2p(std::span<const P2POp>) override { PARALLEL_FAIL("solo: no peers"); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { PARALLEL_FAIL("solo: no split"); }
  [[noreturn]] void abort(int code) override { std::abort(); }
};

// A fresh directory per test, removed afterwards.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("parallel_ckpt_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root() const { return root_.string(); }

  fs::path root_;
  SoloCommunicator world_;
};

// Global tensor whose element at linear index i is `base` + i (exact in fp32).
Tensor iota(const Shape& shape, float base) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
  return Tensor::from_vector(v, shape);
}

ShardedTensor whole(const std::string& name, const Tensor& t) {
  return {name, t, t.shape(), std::vector<int64_t>(t.shape().size(), 0), true};
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ---- boxes ------------------------------------------------------------------------------------

TEST(CheckpointBox, Intersections) {
  Box out;
  ASSERT_TRUE(checkpoint::intersect({{0, 0}, {4, 6}}, {{2, 3}, {4, 6}}, out));
  EXPECT_EQ(out.offset, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(out.shape, (Shape{2, 3}));
  // Contained.
  ASSERT_TRUE(checkpoint::intersect({{0, 0, 0}, {8, 8, 8}}, {{1, 2, 3}, {1, 1, 2}}, out));
  EXPECT_EQ(out.offset, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(out.shape, (Shape{1, 1, 2}));
  // Touching edges share nothing; neither does a box with a zero extent.
  EXPECT_FALSE(checkpoint::intersect({{0, 0}, {4, 6}}, {{4, 0}, {4, 6}}, out));
  EXPECT_FALSE(checkpoint::intersect({{0, 0}, {4, 6}}, {{1, 1}, {0, 2}}, out));
  // Disjoint in one dimension only.
  EXPECT_FALSE(checkpoint::intersect({{0, 0}, {4, 3}}, {{0, 3}, {4, 3}}, out));
  // Scalars (0-d) always overlap themselves.
  ASSERT_TRUE(checkpoint::intersect({{}, {}}, {{}, {}}, out));
  EXPECT_EQ(out.numel(), 1);
  EXPECT_THROW(checkpoint::intersect({{0}, {1}}, {{0, 0}, {1, 1}}, out), Error);
}

// ---- CRC-32C ----------------------------------------------------------------------------------

TEST(CheckpointCrc, KnownVectors) {
  // "123456789" is the standard check value; the 32-byte vectors are RFC 3720, appendix B.4.
  const std::string check = "123456789";
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  for (auto* f : {&checkpoint::crc32c, &checkpoint::crc32c_portable}) {
    EXPECT_EQ(f(check.data(), check.size(), 0), 0xE3069283u);
    EXPECT_EQ(f(zeros.data(), 32, 0), 0x8A9136AAu);
    EXPECT_EQ(f(ones.data(), 32, 0), 0x62A8AB43u);
    EXPECT_EQ(f(up.data(), 32, 0), 0x46DD794Eu);
    EXPECT_EQ(f(down.data(), 32, 0), 0x113FDB5Cu);
    EXPECT_EQ(f(nullptr, 0, 0), 0u);
  }
}

TEST(CheckpointCrc, StreamingAndHardwareAgree) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(4099);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (std::size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 4099}) {
    const uint32_t a = checkpoint::crc32c(data.data(), n);
    EXPECT_EQ(a, checkpoint::crc32c_portable(data.data(), n)) << n;
    for (std::size_t split : {std::size_t{0}, n / 3, n}) {
      const uint32_t first = checkpoint::crc32c(data.data(), split);
      EXPECT_EQ(checkpoint::crc32c(data.data() + split, n - split, first), a) << n << " split " << split;
    }
  }
}

// ---- save / load ------------------------------------------------------------------------------

TEST_F(CheckpointTest, RoundTripSubBoxesAndDtypes) {
  const Tensor w = iota({6, 8}, 0.0f), b = iota({5}, 100.0f);
  const Tensor ids = Tensor::from_vector<int32_t>({1, -2, 3, 40000}, {2, 2});
  const Tensor scalar = Tensor::from_vector<float>({2.5f}, {});
  const std::string dir = checkpoint::save(
      root(), 12, {whole("w", w), whole("b", b.to(DType::BF16)), whole("ids", ids), whole("s", scalar)},
      R"({"config": "model:\n  hidden: 8\n", "data_position": 1234})", world_);
  EXPECT_EQ(fs::path(dir).filename(), "step_00000012");
  EXPECT_EQ(read_file(root_ / "latest"), "step_00000012\n");
  EXPECT_TRUE(fs::exists(root_ / "step_00000012" / "rank_00000.safetensors"));
  EXPECT_TRUE(fs::exists(root_ / "step_00000012" / "index.json"));

  // A box in the middle, as bf16 (saved as fp32), from a non-contiguous view of a larger buffer.
  Tensor buffer = Tensor::zeros({4, 10}, DType::BF16);
  Tensor view = buffer.narrow(1, 2, 5).narrow(0, 1, 3);  // box rows 2..4, cols 1..5
  Tensor bias = Tensor::zeros({2}, DType::F32);
  Tensor ids_row = Tensor::zeros({1, 2}, DType::I32);
  Tensor s = Tensor::zeros({}, DType::F32);
  const checkpoint::LoadResult r = checkpoint::load(root(),
                                                    {{"w", view, {6, 8}, {2, 1}, false},
                                                     {"b", bias, {5}, {3}, false},
                                                     {"ids", ids_row, {2, 2}, {1, 0}, false},
                                                     {"s", s, {}, {}, false}},
                                                    world_);
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.saved_world_size, 1);
  EXPECT_FALSE(r.has_optimizer_state);
  EXPECT_NE(r.extras_json.find("\"data_position\":1234"), std::string::npos) << r.extras_json;
  const std::vector<float> got = view.to_float_vector();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(got[i * 5 + j], static_cast<float>((2 + i) * 8 + 1 + j)) << i << "," << j;
  // Outside the view the buffer is untouched.
  EXPECT_EQ(buffer.to_float_vector()[0], 0.0f);
  EXPECT_EQ(bias.to_float_vector(), (std::vector<float>{103.0f, 104.0f}));
  EXPECT_EQ(ids_row.to_float_vector(), (std::vector<float>{3.0f, 40000.0f}));
  EXPECT_EQ(s.to_float_vector(), (std::vector<float>{2.5f}));

  const checkpoint::CheckpointInfo info = checkpoint::read_info(root());
  EXPECT_EQ(info.step, 12);
  ASSERT_EQ(info.tensors.size(), 4u);
  EXPECT_EQ(info.tensors[3].name, "w");
  EXPECT_EQ(info.tensors[3].global_shape, (Shape{6, 8}));
  EXPECT_NO_THROW(checkpoint::verify(dir));
}

TEST_F(CheckpointTest, MissingTensorWrongShapeAndBadBoxesNameTheTensor) {
  checkpoint::save(root(), 1, {whole("w", iota({4, 4}, 0))}, "", world_);
  Tensor t = Tensor::zeros({4, 4}, DType::F32);
  std::string m = message_of([&] { checkpoint::load(root(), {whole("nope", t)}, world_); });
  EXPECT_NE(m.find("'nope' is not in"), std::string::npos) << m;
  m = message_of([&] { checkpoint::load(root(), {{"w", t, {4, 8}, {0, 0}, true}}, world_); });
  EXPECT_NE(m.find("'w' has global shape [4, 4]"), std::string::npos) << m;
  m = message_of([&] { checkpoint::load(root(), {{"w", t, {4, 4}, {1, 0}, true}}, world_); });
  EXPECT_NE(m.find("'w'"), std::string::npos) << m;
  EXPECT_NE(m.find("outside"), std::string::npos) << m;
}

TEST_F(CheckpointTest, SaveRejectsIncompleteTilingAndLeavesNothing) {
  // One rank holding only half of the tensor: the other half would be missing.
  Tensor half = iota({2, 4}, 0);
  std::string m = message_of([&] {
    checkpoint::save(root(), 3, {{"w", half, {4, 4}, {0, 0}, true}}, "", world_);
  });
  EXPECT_NE(m.find("'w'"), std::string::npos) << m;
  EXPECT_NE(m.find("cover 8 of 16"), std::string::npos) << m;
  m = message_of([&] { checkpoint::save(root(), 3, {{"w", half, {2, 4}, {0, 0}, false}}, "", world_); });
  EXPECT_NE(m.find("replica_writer false on every rank"), std::string::npos) << m;
  m = message_of([&] { checkpoint::save(root(), 3, {whole("w", half)}, "[1, 2]", world_); });
  EXPECT_NE(m.find("JSON object"), std::string::npos) << m;
  m = message_of([&] { checkpoint::save(root(), 3, {whole("w", half), whole("w", half)}, "", world_); });
  EXPECT_NE(m.find("given twice"), std::string::npos) << m;
  for (const auto& e : fs::directory_iterator(root_)) ADD_FAILURE() << "left behind: " << e.path();
  EXPECT_TRUE(checkpoint::list_steps(root()).empty());
}

TEST_F(CheckpointTest, CorruptAndTruncatedFilesAreNamed) {
  const std::string dir = checkpoint::save(root(), 5, {whole("w", iota({64, 16}, 0))}, "", world_);
  const fs::path file = fs::path(dir) / "rank_00000.safetensors";
  const auto size = fs::file_size(file);
  Tensor t = Tensor::zeros({64, 16}, DType::F32);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 100));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(size - 100));
    f.write(&c, 1);
  }
  std::string m = message_of([&] { checkpoint::load(root(), {whole("w", t)}, world_); });
  EXPECT_NE(m.find("rank_00000.safetensors is corrupt"), std::string::npos) << m;
  m = message_of([&] { checkpoint::verify(dir); });
  EXPECT_NE(m.find("rank_00000.safetensors is corrupt"), std::string::npos) << m;

  fs::resize_file(file, size - 10);
  m = message_of([&] { checkpoint::load(dir, {whole("w", t)}, world_); });
  EXPECT_NE(m.find("rank_00000.safetensors is " + std::to_string(size - 10) + " bytes"), std::string::npos)
      << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;

  fs::remove(file);
  m = message_of([&] { checkpoint::load(dir, {whole("w", t)}, world_); });
  EXPECT_NE(m.find("rank_00000.safetensors"), std::string::npos) << m;
}

TEST_F(CheckpointTest, PathResolution) {
  EXPECT_THROW(checkpoint::resolve(root()), Error);  // does not exist
  for (int step : {3, 10, 7}) checkpoint::save(root(), step, {whole("w", iota({2}, step))}, "", world_);
  const std::string s7 = (root_ / "step_00000007").string(), s10 = (root_ / "step_00000010").string();
  // `latest` names the last save, even when a higher step exists.
  EXPECT_EQ(checkpoint::resolve(root()), s7);
  EXPECT_EQ(checkpoint::resolve("latest", root()), s7);
  EXPECT_EQ(checkpoint::resolve(s10), s10);
  std::string m = message_of([&] { checkpoint::resolve("latest"); });
  EXPECT_NE(m.find("needs a checkpoint root"), std::string::npos) << m;
  // Without `latest` (or with one naming a missing step): the highest complete step.
  fs::remove(root_ / "latest");
  EXPECT_EQ(checkpoint::resolve(root()), s10);
  std::ofstream(root_ / "latest") << "step_00000099\n";
  EXPECT_EQ(checkpoint::resolve(root()), s10);
  const std::vector<checkpoint::StepDir> steps = checkpoint::list_steps(root());
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].step, 3);
  EXPECT_EQ(steps[2].step, 10);
  // A step directory without its index is incomplete, and an empty root has no checkpoint.
  fs::create_directory(root_ / "step_00000050");
  m = message_of([&] { checkpoint::resolve((root_ / "step_00000050").string()); });
  EXPECT_NE(m.find("incomplete"), std::string::npos) << m;
  fs::create_directory(root_ / "empty");
  m = message_of([&] { checkpoint::resolve((root_ / "empty").string()); });
  EXPECT_NE(m.find("no complete checkpoint"), std::string::npos) << m;
  EXPECT_EQ(checkpoint::step_dir_name(1200), "step_00001200");
  EXPECT_EQ(checkpoint::step_dir_name(123456789), "step_123456789");
}

TEST_F(CheckpointTest, KeepLastPrunesOldestButNeverTheNewSave) {
  checkpoint::SaveOptions keep2;
  keep2.keep_last = 2;
  for (int step = 1; step <= 5; ++step)
    checkpoint::save(root(), step * 10, {whole("w", iota({3}, step))}, "", world_, keep2);
  std::vector<checkpoint::StepDir> steps = checkpoint::list_steps(root());
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 40);
  EXPECT_EQ(steps[1].step, 50);
  // Saving an older step (a resumed run) keeps it and removes the oldest other.
  checkpoint::save(root(), 20, {whole("w", iota({3}, 0))}, "", world_, keep2);
  steps = checkpoint::list_steps(root());
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 20);
  EXPECT_EQ(steps[1].step, 50);
  EXPECT_EQ(read_file(root_ / "latest"), "step_00000020\n");
  // keep_last = 1 keeps just the new one; re-saving the same step replaces it.
  checkpoint::SaveOptions keep1;
  keep1.keep_last = 1;
  checkpoint::save(root(), 20, {whole("w", iota({3}, 7))}, "", world_, keep1);
  steps = checkpoint::list_steps(root());
  ASSERT_EQ(steps.size(), 1u);
  Tensor t = Tensor::zeros({3}, DType::F32);
  checkpoint::load(root(), {whole("w", t)}, world_);
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{7, 8, 9}));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_FALSE(e.path().filename().string().starts_with(".")) << "left behind: " << e.path();
}

TEST_F(CheckpointTest, CrashLeftoversAreIgnoredThenCleaned) {
  checkpoint::save(root(), 1, {whole("w", iota({3}, 1))}, "", world_);
  // A save of step 2 that died before its rename: complete-looking content, hidden name.
  fs::copy(root_ / "step_00000001", root_ / ".tmp_step_00000002");
  fs::create_directory(root_ / ".trash_step_00000000");
  EXPECT_EQ(checkpoint::resolve(root()), (root_ / "step_00000001").string());
  ASSERT_EQ(checkpoint::list_steps(root()).size(), 1u);
  std::string m = message_of([&] { checkpoint::resolve((root_ / ".tmp_step_00000002").string()); });
  EXPECT_NE(m.find("incomplete"), std::string::npos) << m;
  Tensor t = Tensor::zeros({3}, DType::F32);
  EXPECT_EQ(checkpoint::load(root(), {whole("w", t)}, world_).step, 1);

  checkpoint::save(root(), 3, {whole("w", iota({3}, 3))}, "", world_);
  EXPECT_FALSE(fs::exists(root_ / ".tmp_step_00000002"));
  EXPECT_FALSE(fs::exists(root_ / ".trash_step_00000000"));
  // `latest` only ever names a complete step.
  const std::string latest = read_file(root_ / "latest");
  EXPECT_EQ(latest, "step_00000003\n");
  EXPECT_TRUE(fs::exists(root_ / latest.substr(0, latest.size() - 1) / "index.json"));
}

TEST_F(CheckpointTest, WeightsOnlyLeavesOptimizerStateAlone) {
  Parameter p;
  p.name = "layers.0.mlp.fc1.weight";
  p.global_shape = {4, 6};
  p.value = iota({4, 6}, 0);  // one rank: the whole tensor is its slice
  const Tensor moment = iota({4, 6}, 500);
  checkpoint::save(
      root(), 8,
      {checkpoint::from_parameter(p, true), checkpoint::optimizer_state(p, "exp_avg", moment, true)},
      R"({"optimizer_step": 8})", world_);
  EXPECT_TRUE(checkpoint::read_info(root()).has_optimizer_state);

  Parameter q = p;
  q.value = Tensor::zeros({4, 6}, DType::F32);
  Tensor fresh = Tensor::full({4, 6}, -1.0, DType::F32);
  checkpoint::LoadOptions weights_only;
  weights_only.weights_only = true;
  const checkpoint::LoadResult r = checkpoint::load(
      root(), {checkpoint::from_parameter(q, true), checkpoint::optimizer_state(q, "exp_avg", fresh, true)},
      world_, weights_only);
  EXPECT_TRUE(r.has_optimizer_state);
  EXPECT_EQ(r.skipped, (std::vector<std::string>{"optimizer.exp_avg.layers.0.mlp.fc1.weight"}));
  EXPECT_EQ(q.value.to_float_vector(), p.value.to_float_vector());
  EXPECT_EQ(fresh.to_float_vector(), std::vector<float>(24, -1.0f));
  // And a full load restores the moment.
  checkpoint::load(root(), {checkpoint::optimizer_state(q, "exp_avg", fresh, true)}, world_);
  EXPECT_EQ(fresh.to_float_vector(), moment.to_float_vector());
}

TEST(CheckpointParameter, BoxesNamesAndWriters) {
  Parameter p;
  p.name = "layers.1.attention.proj.weight";
  p.global_shape = {8, 16};
  p.value = Tensor::zeros({8, 4}, DType::F32);
  p.partition_dim = 1;
  p.partition_offset = 12;
  const ShardedTensor t = checkpoint::from_parameter(p, true);
  EXPECT_EQ(t.name, p.name);
  EXPECT_EQ(t.global_offset, (std::vector<int64_t>{0, 12}));
  EXPECT_EQ(t.global_shape, (Shape{8, 16}));
  const ShardedTensor s =
      checkpoint::optimizer_state(p, "exp_avg_sq", Tensor::zeros({8, 4}, DType::F32), false);
  EXPECT_EQ(s.name, "optimizer.exp_avg_sq.layers.1.attention.proj.weight");
  EXPECT_FALSE(s.replica_writer);
  EXPECT_TRUE(checkpoint::is_optimizer_state(s.name));
  EXPECT_FALSE(checkpoint::is_optimizer_state(t.name));
  EXPECT_THROW(checkpoint::optimizer_state(p, "m", Tensor::zeros({8, 5}, DType::F32), true), Error);

  Coord c;
  EXPECT_TRUE(checkpoint::is_replica_writer(p, c));
  c.tp = 3;
  EXPECT_TRUE(checkpoint::is_replica_writer(p, c));  // a different piece
  c.dp = 1;
  EXPECT_FALSE(checkpoint::is_replica_writer(p, c));  // a copy of dp 0's piece
  Parameter norm;
  norm.partition_dim = -1;
  EXPECT_FALSE(checkpoint::is_replica_writer(norm, Coord{.tp = 1}));
  EXPECT_TRUE(checkpoint::is_replica_writer(norm, Coord{.tp = 0, .pp = 2}));
  Parameter tied = p;
  tied.shared_across_pipeline = true;
  EXPECT_TRUE(checkpoint::is_replica_writer(tied, Coord{.tp = 1, .pp = 0}));
  EXPECT_FALSE(checkpoint::is_replica_writer(tied, Coord{.tp = 1, .pp = 3}));
}

// ---- stop flag --------------------------------------------------------------------------------

// Signals reach a StopFlag on the library's signal thread (guard_signals()), not on the thread
// that sent them: kill the process, then wait until the signal has been delivered (no longer
// pending) or the flag shows it.
bool wait_until(const std::function<bool()>& done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    ::usleep(1000);
  }
  return false;
}
bool pending(int sig) {
  sigset_t set;
  sigpending(&set);
  return sigismember(&set, sig) == 1;
}
void deliver(int sig) {
  ASSERT_EQ(::kill(::getpid(), sig), 0);
  ASSERT_TRUE(wait_until([&] { return !pending(sig); })) << strsignal(sig) << " never delivered";
}

TEST(StopFlag, SigtermSetsTheFlagAndEveryRankAgrees) {
  SoloCommunicator world;
  StopFlag stop;
  EXPECT_FALSE(stop.requested());
  EXPECT_FALSE(should_stop(stop, world));
  deliver(SIGTERM);  // the process survives: the handler only sets the flag
  ASSERT_TRUE(wait_until([&] { return stop.requested(); }));
  EXPECT_EQ(stop.signal(), SIGTERM);
  EXPECT_TRUE(should_stop(stop, world));
  deliver(SIGTERM);  // a second SIGTERM does not escalate
  EXPECT_EQ(stop.signal(), SIGTERM);
  stop.clear();
  EXPECT_FALSE(stop.requested());
  deliver(SIGINT);
  ASSERT_TRUE(wait_until([&] { return stop.requested(); }));
  EXPECT_EQ(stop.signal(), SIGINT);
  EXPECT_THROW(StopFlag another, Error);
}

// Slurm's early warning (sbatch --signal=USR1@120) is a stop request too, and never escalates.
TEST(StopFlag, Sigusr1IsAStopRequest) {
  SoloCommunicator world;
  StopFlag stop;
  deliver(SIGUSR1);
  ASSERT_TRUE(wait_until([&] { return stop.requested(); }));
  deliver(SIGUSR1);
  EXPECT_EQ(stop.signal(), SIGUSR1);
  EXPECT_EQ(signal_name(agreed_stop_signal(stop, world)), "SIGUSR1");
  stop.clear();
}

TEST(StopFlag, RestoresPreviousHandlersAndRequestWorks) {
  struct sigaction before[3]{};
  const int sigs[3] = {SIGTERM, SIGINT, SIGUSR1};
  for (int i = 0; i < 3; ++i) ::sigaction(sigs[i], nullptr, &before[i]);
  {
    StopFlag stop;
    stop.request();  // a stop from code: no signal
    EXPECT_EQ(stop.signal(), SIGTERM);
  }
  for (int i = 0; i < 3; ++i) {
    struct sigaction now {};
    ::sigaction(sigs[i], nullptr, &now);
    EXPECT_EQ(now.sa_handler, before[i].sa_handler) << strsignal(sigs[i]);
  }
  StopFlag again;  // the first one is gone
  EXPECT_FALSE(again.requested());
}

// After a stop signal the program saves and exits; a launcher repeating SIGTERM meanwhile must not
// end it with status 143, also once the StopFlag is gone. SIGINT gets its old action back.
TEST(StopFlag, AfterAStopSignalSigtermStaysAbsorbed) {
  {
    StopFlag stop;
    deliver(SIGTERM);
    ASSERT_TRUE(wait_until([&] { return stop.requested(); }));
  }
  for (int sig : {SIGTERM, SIGUSR1}) {
    struct sigaction now {};
    ::sigaction(sig, nullptr, &now);
    EXPECT_NE(now.sa_handler, SIG_DFL) << strsignal(sig);
  }
  struct sigaction on_int {};
  ::sigaction(SIGINT, nullptr, &on_int);
  EXPECT_EQ(on_int.sa_handler, SIG_DFL);
  deliver(SIGTERM);  // survives
}

TEST(StopFlagDeathTest, SecondSigintEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopFlag stop;
        ::kill(::getpid(), SIGINT);
        // Two SIGINTs pending at once merge into one: the second goes once the first has landed.
        if (!wait_until([&] { return stop.requested(); })) std::exit(1);
        ::kill(::getpid(), SIGINT);
        wait_until([] { return false; });
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
}

}  // namespace
}  // namespace parallel

namespace parallel {

// Vocabulary padding depends on the layout (a multiple of 128 * tp), so checkpoints keep only the
// real rows: a tp=2 slice [256, 512) of a 300-row vocabulary saves rows [256, 300).
TEST(CheckpointLayout, VocabularyPaddingRowsAreNotSaved) {
  Parameter p;
  p.name = "embedding.word.weight";
  p.value = Tensor::zeros({256, 4}, DType::F32);
  p.global_shape = {512, 4};
  p.partition_dim = 0;
  p.partition_offset = 256;
  p.unpadded_rows = 300;
  const checkpoint::ShardedTensor t = checkpoint::from_parameter(p, true);
  EXPECT_EQ(t.global_shape, (Shape{300, 4}));
  EXPECT_EQ(t.global_offset, (std::vector<int64_t>{256, 0}));
  EXPECT_EQ(t.local.shape(), (Shape{44, 4}));
  EXPECT_EQ(t.local.data_ptr(), p.value.data_ptr());
  const checkpoint::ShardedTensor s =
      checkpoint::optimizer_state(p, "exp_avg", Tensor::zeros({256, 4}, DType::F32), true);
  EXPECT_EQ(s.local.shape(), (Shape{44, 4}));

  p.partition_offset = 384;  // a slice that is all padding (tp = 4 of a 512-row table): empty box
  const checkpoint::ShardedTensor e = checkpoint::from_parameter(p, true);
  EXPECT_EQ(e.local.size(0), 0);
  EXPECT_EQ(e.global_offset[0], 300);
}

}  // namespace parallel

namespace parallel {
namespace {

// ---- messages that say where (issue 16) --------------------------------------------------------

TEST_F(CheckpointTest, Fp8TensorLoadedAsFloatNamesFileAndTensor) {
  Tensor fp8 = Tensor::empty({4}, DType::F8E4M3);
  std::memset(fp8.data_ptr(), 0, fp8.nbytes());
  checkpoint::save(root(), 1, {whole("layers.0.scale", fp8)}, "{}", world_);
  Tensor target = Tensor::empty({4}, DType::F32);
  const std::string message =
      message_of([&] { checkpoint::load(root(), {whole("layers.0.scale", target)}, world_); });
  EXPECT_NE(message.find("tensor 'layers.0.scale' is stored as F8_E4M3 but requested as"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("no host arithmetic"), std::string::npos) << message;
}

TEST(StopFlag, TheAgreedSignalIsNamed) {
  SoloCommunicator world;
  StopFlag stop;
  EXPECT_EQ(agreed_stop_signal(stop, world), 0);
  stop.request();  // SIGTERM's value, without a signal
  EXPECT_EQ(signal_name(agreed_stop_signal(stop, world)), "SIGTERM");
  stop.clear();
}

}  // namespace
}  // namespace parallel
