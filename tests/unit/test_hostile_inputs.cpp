// Issue 24, item 6: what the hostile probe found in the input paths, each seen by its one-line message.
//  - A FIFO (or any non-regular file) named where a file is read used to block forever (a Hugging Face
//    index naming a FIFO shard hung the import): every reader refuses it at once.
//  - A safetensors header of 200k empty tensors took over 120 s (quadratic): it parses in seconds.
//  - Duplicate keys in JSON objects (safetensors headers, checkpoint indexes, JSONL documents) were
//    kept silently (the last won).
//  - checkpoint.dir/latest being a directory was found at the first save: now at start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "error_of.hpp"
#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/hf_model.hpp"
#include "parallel/indexed_dataset.hpp"
#include "parallel/preflight.hpp"
#include "parallel/safetensors.hpp"
#include "parallel/tokenizer.hpp"

using namespace parallel;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

using parallel::testing::error_of;

class HostileInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("test_hostile_inputs_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A reader that blocks on a FIFO would hang this test: end it with SIGALRM instead.
    ::alarm(120);
  }
  void TearDown() override {
    ::alarm(0);
    fs::remove_all(dir_);
  }
  std::string fifo(const std::string& name) {
    const std::string path = (dir_ / name).string();
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
    return path;
  }
  void write(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
  fs::path dir_;
};

constexpr const char* kFifo = "a FIFO (named pipe), not a regular file";

TEST_F(HostileInputs, AFifoIsRefusedByEveryReader) {
  EXPECT_THAT(error_of([&] { safetensors::load(fifo("model.safetensors")); }),
              HasSubstr("safetensors: cannot open " + (dir_ / "model.safetensors").string() + ": " + kFifo));

  // The probe's case: a Hugging Face folder whose index names a FIFO in the folder.
  const fs::path folder = dir_ / "hf";
  fs::create_directories(folder);
  write(folder / "model.safetensors.index.json",
        R"({"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}})");
  ASSERT_EQ(::mkfifo((folder / "model-00001-of-00001.safetensors").c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { hf::load_folder(folder.string()); }), HasSubstr(kFifo));
  // The index itself, and config.json, as FIFOs.
  fs::remove(folder / "model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((folder / "model.safetensors.index.json").c_str(), 0600), 0);
  EXPECT_THAT(
      error_of([&] { hf::load_folder(folder.string()); }),
      HasSubstr("hf: cannot open " + (folder / "model.safetensors.index.json").string() + ": " + kFifo));

  EXPECT_THAT(error_of([&] { HFTokenizer t(fifo("tokenizer.json")); }),
              HasSubstr("HF tokenizer: cannot open " + (dir_ / "tokenizer.json").string() + ": " + kFifo));
  const std::string merges = (dir_ / "merges.txt").string();
  write(merges, "#version: 0.2\n");
  EXPECT_THAT(error_of([&] { GPT2Tokenizer t(fifo("vocab.json"), merges); }),
              HasSubstr("GPT-2 tokenizer: vocabulary file: cannot open " + (dir_ / "vocab.json").string() +
                        ": " + kFifo));
  EXPECT_THAT(error_of<ConfigError>([&] { load_config(fifo("run.yaml"), {}, 1); }),
              HasSubstr("config: cannot read \"" + (dir_ / "run.yaml").string() + "\": " + kFifo));
  fifo("data.idx");
  write(dir_ / "data.bin", "");
  EXPECT_THAT(error_of([&] { IndexedDataset d((dir_ / "data").string()); }), HasSubstr(kFifo));
  // A directory where a file is expected is named as one, too.
  fs::create_directories(dir_ / "adir.safetensors");
  EXPECT_THAT(error_of([&] { safetensors::load((dir_ / "adir.safetensors").string()); }),
              HasSubstr("a directory, not a regular file"));
}

TEST_F(HostileInputs, ASafetensorsHeaderOf200kEmptyTensorsParsesInLinearTime) {
  // It ran past 120 s: the duplicate-name check rescanned the whole header object after every entry,
  // so the cost grew with the square of the tensor count. Timed at 25k and 200k tensors: 8x the
  // entries must cost about 8x (64x when quadratic), with room for a loaded machine.
  const fs::path path = dir_ / "empty.safetensors";
  const auto seconds_to_load = [&](int count) {
    std::string header = "{";
    for (int i = 0; i < count; ++i) {
      if (i > 0) header += ',';
      header += "\"t" + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
    }
    header += '}';
    header.append((8 - header.size() % 8) % 8, ' ');
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      const uint64_t n = header.size();
      out.write(reinterpret_cast<const char*>(&n), 8);
      out << header;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto tensors = safetensors::load(path.string());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(tensors.size(), static_cast<std::size_t>(count));
    return seconds;
  };
  const double small = seconds_to_load(25000), large = seconds_to_load(200000);
  EXPECT_LT(large, 24 * small + 1.0) << "25k tensors: " << small << " s, 200k: " << large << " s";
  EXPECT_LT(large, 60.0);

  // The same name twice is still refused, at the top level and inside an entry.
  const auto write_header = [&](const std::string& text) {
    std::string h = text;
    h.append((8 - h.size() % 8) % 8, ' ');
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << h;
  };
  write_header(
      R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})");
  EXPECT_THAT(error_of([&] { safetensors::load(path.string()); }),
              HasSubstr("tensor 'a' appears twice in the header (names must be unique)"));
  write_header(R"({"a":{"dtype":"F32","dtype":"I32","shape":[0],"data_offsets":[0,0]}})");
  EXPECT_THAT(error_of([&] { safetensors::load(path.string()); }),
              HasSubstr("key 'dtype' appears twice in one object of the header"));
}

TEST_F(HostileInputs, DuplicateJsonlKeysNameTheLine) {
  // {"text": "a", "text": "b"} kept "b" silently.
  const std::string input = (dir_ / "docs.jsonl").string();
  write(input, "{\"text\": \"ok\"}\n{\"text\": \"a\", \"text\": \"b\"}\n");
  PreprocessOptions options;
  options.input = input;
  options.output_prefix = (dir_ / "out").string();
  options.tokenizer_type = "ByteLevel";
  EXPECT_THAT(error_of([&] { preprocess_data(options); }),
              HasSubstr("preprocess_data: " + input + ":2: key \"text\" appears twice in one object"));
}

TEST_F(HostileInputs, ALatestThatIsADirectoryIsFoundAtStartUp) {
  const fs::path root = dir_ / "ckpt";
  fs::create_directories(root / "latest");
  EXPECT_EQ(error_of<ConfigError>([&] { check_checkpoint_root("checkpoint.dir", root.string()); }),
            "config: checkpoint.dir = \"" + root.string() + "\": " + (root / "latest").string() +
                " is a directory; it must be the file naming the latest checkpoint (remove or rename it)");
  Config c;
  c.train.output_dir = (dir_ / "out").string();
  c.checkpoint.dir = root.string();
  EXPECT_THAT(error_of<ConfigError>([&] { check_output_dirs(c, "test"); }), HasSubstr("is a directory"));
  // A regular `latest`, or none, is fine.
  fs::remove(root / "latest");
  EXPECT_NO_THROW(check_checkpoint_root("checkpoint.dir", root.string()));
  write(root / "latest", "step_00000002\n");
  EXPECT_NO_THROW(check_checkpoint_root("checkpoint.dir", root.string()));
}

}  // namespace
