// index.json as untrusted input: read_info refuses each malformed index the fuzz target
// (fuzz/checkpoint_index.cpp) turned up with a one-line error naming the file and the field, where
// it used to hit undefined behaviour (float-to-int casts, signed overflow) or accept nonsense.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/checkpoint.hpp"

namespace parallel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CheckpointIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    step_dir_ = fs::temp_directory_path() / ("ckpt_index_" + std::to_string(::getpid())) / "step_00000001";
    fs::create_directories(step_dir_);
  }
  void TearDown() override { fs::remove_all(step_dir_.parent_path()); }

  // A valid index of one file and one tensor split in two shards.
  static json good() {
    return {
        {"format", "libparallel-checkpoint"},
        {"version", 1},
        {"step", 7},
        {"world_size", 2},
        {"layout", json::object()},
        {"extras", json::object()},
        {"files",
         {{"rank_00000.safetensors", {{"rank", 0}, {"bytes", 64}, {"crc32c", "0badc0de"}}},
          {"rank_00001.safetensors", {{"rank", 1}, {"bytes", 64}, {"crc32c", "12345678"}}}}},
        {"tensors",
         {{"w",
           {{"global_shape", {4, 2}},
            {"shards",
             {{{"file", "rank_00000.safetensors"}, {"dtype", "F32"}, {"offset", {0, 0}}, {"shape", {2, 2}}},
              {{"file", "rank_00001.safetensors"},
               {"dtype", "F32"},
               {"offset", {2, 0}},
               {"shape", {2, 2}}}}}}}}}};
  }
  void write(const std::string& text) { std::ofstream(step_dir_ / "index.json") << text; }
  // read_info must throw parallel::Error naming index.json and containing `what`.
  void expect_refused(const std::string& text, const std::string& what) {
    write(text);
    try {
      checkpoint::read_info(step_dir_.string(), "");
      ADD_FAILURE() << "accepted; expected an error containing '" << what << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("index.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }
  void expect_refused(const json& j, const std::string& what) { expect_refused(j.dump(), what); }

  fs::path step_dir_;
};

TEST_F(CheckpointIndex, GoodIndexReads) {
  write(good().dump());
  const checkpoint::CheckpointInfo info = checkpoint::read_info(step_dir_.string(), "");
  EXPECT_EQ(info.step, 7);
  EXPECT_EQ(info.saved_world_size, 2);
  ASSERT_EQ(info.tensors.size(), 1u);
}

TEST_F(CheckpointIndex, NumbersOutsideTheirFieldsRangeAreRefused) {
  std::string text = good().dump();
  text.replace(text.find("\"version\":1"), 11, "\"version\":1e300");  // was a float-to-int cast (UB)
  expect_refused(text, "format version 1e+300");
  json j = good();
  j["world_size"] = -1e300;
  expect_refused(j, "world_size is not a 64-bit integer");
  j = good();
  j["step"] = -3;
  expect_refused(j, "step = -3 is outside");
  j = good();
  j["files"]["rank_00000.safetensors"]["bytes"] = -8;  // was wrapped to 2^64 - 8
  expect_refused(j, "files['rank_00000.safetensors'].bytes = -8 is outside");
  j = good();
  j["files"]["rank_00001.safetensors"]["rank"] = 5;
  expect_refused(j, "files['rank_00001.safetensors'].rank = 5 is outside [0, 1]");
  j = good();
  j["tensors"]["w"]["shards"][0]["offset"] = {0.5, 0};
  expect_refused(j, "shard offset entry is not a 64-bit integer: 0.5");
}

TEST_F(CheckpointIndex, ShapesThatOverflowAreRefused) {
  json j = good();
  // offset + shape passed INT64_MAX (signed overflow) before it was compared with the global shape.
  j["tensors"]["w"]["shards"][1]["offset"] = {INT64_MAX, 0};
  expect_refused(j, "lies outside global shape");
  j = good();
  const json huge = {4294967296, 4294967296, 4294967296};
  j["tensors"] = {{"w", {{"global_shape", huge}, {"shards", json::array()}}}};
  expect_refused(j, "tensor 'w': shape [4294967296, 4294967296, 4294967296] overflows");
  // Empty, yet its strides would overflow.
  j["tensors"]["w"]["global_shape"] = {0, 1ull << 62, 1ull << 62};
  expect_refused(j, "overflows a 64-bit element count");
}

TEST_F(CheckpointIndex, FileNamesStayInsideTheStepDirectory) {
  for (const char* name : {"../../etc/passwd", "sub/rank_00000.safetensors", "..", ""}) {
    json j = good();
    j["files"][name] = {{"rank", 0}, {"bytes", 8}, {"crc32c", "00000000"}};
    expect_refused(j, "is not a plain file name in the step directory");
  }
}

}  // namespace
}  // namespace parallel
