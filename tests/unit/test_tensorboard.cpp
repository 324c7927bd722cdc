// TensorBoard event files (include/parallel/tensorboard.hpp, tfrecord.hpp): the bytes against
// protobuf's and TensorFlow's own encoding, every metrics.jsonl scalar in the file, read back by the
// tests' own reader (tests/common/tfevents_reader.hpp), and a full disk that leaves whole records.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/metrics.hpp"
#include "parallel/tensorboard.hpp"
#include "parallel/tfrecord.hpp"
#include "tfevents_reader.hpp"

using namespace parallel;
namespace fs = std::filesystem;
using ::testing::MatchesRegex;

namespace {

std::string hex(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

StepMetrics full_step(int64_t step) {
  StepMetrics s;
  s.step = step;
  s.loss = 4.123456789;
  s.lr = 2.5e-4 * static_cast<double>(step);
  s.grad_norm = 0.8125;
  s.tokens_per_sec = 12345.678;
  s.step_time_ms = 33.3;
  s.mfu = 0.4125;
  s.peak_flops_per_rank = 9.89e14;
  s.loss_scale = 65536;
  s.host_reads = 2;
  s.mem_peak_bytes = 123456789;
  s.skipped = true;
  s.moe_aux_loss = 0.01;
  s.moe_z_loss = 0.002;
  s.moe_tokens_per_expert = {10, 20, 30, 4};
  return s;
}

}  // namespace

// Golden bytes from TensorFlow's own encoders (tensorboard's Python package: its record writer and
// its protobuf classes event_pb2 / summary_pb2), made once and pasted here.
TEST(TfRecord, FramingMatchesTensorFlow) {
  EXPECT_EQ(hex(tfrecord("hello")), "0500000000000000eab2043e68656c6c6fbb1f1c19");
  EXPECT_EQ(hex(tfrecord("")), "000000000000000029039807d8ea82a2");
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xc78ab0e5u);
}

TEST(TensorBoard, EventBytesMatchProtobuf) {
  EXPECT_EQ(hex(tensorboard_file_version_event(1.5)), "09000000000000f83f1a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(tensorboard_session_start_event(1.5, 7)), "09000000000000f83f10073a020801");
  const Scalar scalars[] = {{"loss", 2.0}, {"lr", 3e-4}};
  EXPECT_EQ(hex(tensorboard_scalars_event(1700000000.25, 3, scalars)),
            "0900001040fc54d94110032a180a0b0a046c6f737315000000400a090a026c721552499d39");
}

TEST(TensorBoard, FileNameAsTensorBoardWritesIt) {
  EXPECT_EQ(tensorboard_event_file_name(1700000000, "node7", 4242, 0),
            "events.out.tfevents.1700000000.node7.4242.0");
  EXPECT_EQ(tensorboard_event_file_name(12, "h", 1, 3), "events.out.tfevents.0000000012.h.1.3");
}

// Every scalar of a metrics.jsonl train line has a scalar of the same key and value, and nothing
// else is written: the two lists cannot drift apart.
TEST(TensorBoard, TrainScalarsAreTheMetricsLine) {
  for (bool full : {false, true}) {
    StepMetrics s = full_step(3);
    if (!full) {
      s.loss_scale = 0;
      s.skipped = false;
      s.moe_tokens_per_expert.clear();
    }
    const fs::path dir = scratch("parallel_test_tb_line");
    MetricsWriter(((dir / "metrics.jsonl").string())).write_train(s);
    std::ifstream in(dir / "metrics.jsonl");
    std::string line;
    std::getline(in, line);
    const auto j = nlohmann::json::parse(line);
    std::map<std::string, double> expected;
    for (const auto& [key, value] : j.items()) {
      if (key == "step" || value.is_string()) continue;  // skip_reason: not a scalar
      if (value.is_array()) {
        for (std::size_t e = 0; e < value.size(); ++e)
          expected[key + "/" + std::to_string(e)] = value[e].get<double>();
      } else {
        expected[key] = value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>();
      }
    }
    std::map<std::string, double> got;
    for (const Scalar& sc : train_scalars(s)) EXPECT_TRUE(got.emplace(sc.tag, sc.value).second) << sc.tag;
    EXPECT_EQ(got, expected) << line;
    fs::remove_all(dir);
  }
}

TEST(TensorBoard, WriterFileReadsBack) {
  const fs::path dir = scratch("parallel_test_tb_writer");
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    EXPECT_TRUE(w.write_train(full_step(5)));
    StepMetrics nan_step = full_step(6);
    nan_step.loss = std::numeric_limits<double>::quiet_NaN();
    nan_step.grad_norm = std::numeric_limits<double>::infinity();
    EXPECT_TRUE(w.write_train(nan_step));
    EXPECT_TRUE(w.write_eval(6, 3.75));
    EXPECT_EQ(w.dropped_records(), 0);
  }
  const std::vector<fs::path> files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].string(), path);
  EXPECT_THAT(files[0].filename().string(),
              MatchesRegex("events\\.out\\.tfevents\\.[0-9]{10}\\..+\\.[0-9]+\\.[0-9]+"));
  const tfevents::File f = tfevents::read_file(path);
  EXPECT_EQ(f.truncated_tail, 0u);
  ASSERT_EQ(f.events.size(), 5u);
  EXPECT_EQ(f.events[0].file_version, "brain.Event:2");
  EXPECT_GT(f.events[0].wall_time, 1.6e9);
  EXPECT_EQ(f.events[1].session_status, 1);  // START at the first step written
  EXPECT_EQ(f.events[1].step, 5);
  const std::vector<Scalar> want = train_scalars(full_step(5));
  const tfevents::Event& e = f.events[2];
  EXPECT_EQ(e.step, 5);
  EXPECT_GE(e.wall_time, f.events[0].wall_time);
  ASSERT_EQ(e.scalars.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(e.scalars[i].first, want[i].tag);
    EXPECT_EQ(e.scalars[i].second, static_cast<float>(want[i].value)) << want[i].tag;
  }
  EXPECT_EQ(f.events[3].step, 6);
  EXPECT_TRUE(std::isnan(f.events[3].scalars[0].second));  // loss
  EXPECT_TRUE(std::isinf(f.events[3].scalars[2].second));  // grad_norm
  ASSERT_EQ(f.events[4].scalars.size(), 1u);
  EXPECT_EQ(f.events[4].scalars[0].first, "eval_loss");
  EXPECT_EQ(f.events[4].scalars[0].second, 3.75f);
  fs::remove_all(dir);
}

TEST(TensorBoard, ReaderChecksTheCrcsAndToleratesATruncatedTail) {
  const fs::path dir = scratch("parallel_test_tb_reader");
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.write_train(full_step(1));
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto write = [&](const std::string& b) { std::ofstream(path, std::ios::binary | std::ios::trunc) << b; };
  write(bytes.substr(0, bytes.size() - 7));  // a record cut short: the whole ones before it read
  tfevents::File f = tfevents::read_file(path);
  EXPECT_EQ(f.events.size(), 2u);
  EXPECT_GT(f.truncated_tail, 0u);
  std::string flipped = bytes;
  flipped[flipped.size() - 6] ^= 1;  // a bit of the last record's data
  write(flipped);
  EXPECT_THROW(tfevents::read_file(path), std::runtime_error);
  fs::remove_all(dir);
}

TEST(TensorBoard, AFullDiskIsAWarningAndLeavesWholeRecords) {
  const fs::path dir = scratch("parallel_test_tb_full");
  TensorBoardWriter w(dir.string());
  int written = 0, failed = 0;
  {
    // As test_line_file's FileSizeLimit: RLIMIT_FSIZE with SIGXFSZ ignored, writes fail with EFBIG.
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit lowered = old;
    lowered.rlim_cur = 1500;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lowered), 0);
    for (int step = 1; step <= 20; ++step)
      EXPECT_NO_THROW((w.write_train(full_step(step)) ? written : failed) += 1);
    setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
  }
  EXPECT_GT(written, 0);
  EXPECT_GT(failed, 0);
  EXPECT_EQ(w.dropped_records(), failed);
  const tfevents::File f = tfevents::read_file(w.path());
  EXPECT_EQ(f.truncated_tail, 0u) << "half a record left behind";
  EXPECT_EQ(static_cast<int>(f.events.size()), 2 + written);
  EXPECT_TRUE(w.write_train(full_step(21)));  // room again: writing goes on
  EXPECT_EQ(tfevents::read_file(w.path()).events.back().step, 21);
  fs::remove_all(dir);
}
