// Early checks and strict imports (issue 16, items 3 and 5): writable directories proven at start-up,
// non-finite and FP8 weights refused on HF import naming the tensor, signals named in messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "error_of.hpp"
#include "parallel/error.hpp"
#include "parallel/hf_gpt2.hpp"
#include "parallel/preflight.hpp"
#include "parallel/safetensors.hpp"
#include "parallel/signal_handler.hpp"
#include "paths.hpp"

using namespace parallel;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

using parallel::testing::error_of;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST(Preflight, CreatesTheDirectoryAndLeavesNoProbeBehind) {
  const fs::path dir = scratch("parallel_test_preflight") / "a" / "b";
  check_writable_dir("checkpoint.dir", dir.string(), "rank0");
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir.parent_path().parent_path());
}

TEST(Preflight, AnUnwritableDirectoryNamesTheKeyThePathAndTheErrno) {
  // A path below a regular file can never be created, for root as for anyone (a read-only mode
  // would not stop root).
  const fs::path base = scratch("parallel_test_preflight_bad");
  std::ofstream(base / "file") << "x";
  const std::string dir = (base / "file" / "ckpt").string();
  Config c;
  c.train.output_dir = (base / "out").string();
  c.checkpoint.dir = dir;
  const std::string message = error_of<ConfigError>([&] { check_output_dirs(c, "rank0"); });
  EXPECT_THAT(message, HasSubstr("config: checkpoint.dir = \"" + dir + "\": not writable"));
  EXPECT_THAT(message, HasSubstr("Not a directory"));
  c.train.output_dir = dir;
  EXPECT_THAT(error_of<ConfigError>([&] { check_output_dirs(c, "rank0"); }), HasSubstr("train.output_dir"));
  c.train.output_dir = (base / "out").string();
  c.checkpoint.dir.clear();
  c.train.tensorboard_dir = dir;
  EXPECT_THAT(error_of<ConfigError>([&] { check_output_dirs(c, "rank0"); }),
              HasSubstr("config: train.tensorboard_dir = \"" + dir + "\": not writable"));
  fs::remove_all(base);
}

// data.tokenizer's files are read at start-up: a missing or malformed tokenizer.json and one whose
// vocabulary is larger than the model's end the run with one line naming the key.
TEST(Preflight, TheTokenizerFileMustLoadAndFitTheVocabulary) {
  const std::string gpt2 = parallel::testing::fixtures_dir() + "/hf_tokenizer_gpt2.json";  // 700 ids
  Config c;
  c.data.tokenizer = "HuggingFace";
  c.data.tokenizer_file = gpt2;
  c.model.vocab_size = 700;
  EXPECT_NO_THROW(check_tokenizer(c));
  c.model.vocab_size = 699;
  const std::string larger = error_of<ConfigError>([&] { check_tokenizer(c); });
  EXPECT_THAT(larger, HasSubstr("config: data.tokenizer_file = \"" + gpt2 +
                                "\": the vocabulary (700 ids) is larger than model.vocab_size (699)"));
  EXPECT_EQ(larger.find('\n'), std::string::npos);
  c.model.vocab_size = 1024;
  const fs::path base = scratch("parallel_test_preflight_tokenizer");
  c.data.tokenizer_file = (base / "missing.json").string();
  EXPECT_THAT(error_of<ConfigError>([&] { check_tokenizer(c); }),
              HasSubstr("config: data.tokenizer_file = \"" + c.data.tokenizer_file + "\": "));
  std::ofstream(base / "broken.json") << "{\"model\": ";
  c.data.tokenizer_file = (base / "broken.json").string();
  const std::string broken = error_of<ConfigError>([&] { check_tokenizer(c); });
  EXPECT_THAT(broken, HasSubstr("config: data.tokenizer_file = \"" + c.data.tokenizer_file + "\": "));
  EXPECT_THAT(broken, HasSubstr("not valid JSON"));
  // GPT-2's files are checked when given; ByteLevel and GPT-2 without files read nothing.
  c.data.tokenizer = "GPT2BPETokenizer";
  c.data.tokenizer_file.clear();
  c.data.vocab_file = (base / "missing_encoder.json").string();
  EXPECT_THAT(error_of<ConfigError>([&] { check_tokenizer(c); }),
              HasSubstr("config: data.vocab_file = \"" + c.data.vocab_file + "\", data.merge_file = \"\": "));
  c.data.vocab_file.clear();
  EXPECT_NO_THROW(check_tokenizer(c));
  c.data.tokenizer = "ByteLevel";
  c.model.vocab_size = 100;
  EXPECT_NO_THROW(check_tokenizer(c));
  fs::remove_all(base);
}

TEST(StopSignal, SignalsAreNamed) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(0), "signal 0");
}

class HfImport : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string fixtures = parallel::testing::fixtures_dir();
    config_ = hf_gpt2::config_for_conversion(fixtures + "/hf_gpt2_tiny.yaml").model;
    tensors_ = safetensors::load(fixtures + "/hf_gpt2_tiny.safetensors");
    ASSERT_NO_THROW(hf_gpt2::from_hf(tensors_, config_, "tiny.safetensors"));
  }
  // The name under which `suffix` (e.g. "h.0.ln_1.weight") is stored, with or without prefix.
  std::string name_of(const std::string& suffix) const {
    for (const auto& [name, t] : tensors_)
      if (name == suffix || name == "transformer." + suffix) return name;
    ADD_FAILURE() << "no tensor " << suffix;
    return suffix;
  }
  ModelConfig config_;
  std::map<std::string, Tensor> tensors_;
};

TEST_F(HfImport, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const std::string name = name_of("h.0.mlp.c_fc.bias");
  Tensor t = tensors_.at(name).to(DType::F32).contiguous().clone();
  t.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  t.data<float>()[5] = std::numeric_limits<float>::infinity();
  tensors_[name] = t;
  const std::string message = error_of([&] { hf_gpt2::from_hf(tensors_, config_, "tiny.safetensors"); });
  EXPECT_THAT(message, HasSubstr("tiny.safetensors: tensor '" + name + "' holds 2 non-finite value(s)"));
  EXPECT_THAT(message, HasSubstr("at flat index 3"));
  EXPECT_THAT(message, HasSubstr("--allow-nonfinite"));
  // Asked for explicitly, they are imported as they are.
  const auto params = hf_gpt2::from_hf(tensors_, config_, "tiny.safetensors", /*allow_nonfinite=*/true);
  EXPECT_TRUE(std::isnan(params.at("layers.0.mlp.fc1.bias").data<float>()[3]));
}

TEST_F(HfImport, Fp8WeightsAreRefusedNamingTheTensor) {
  const std::string name = name_of("ln_f.weight");
  const Tensor& t = tensors_.at(name);
  Tensor fp8 = Tensor::empty(t.shape(), DType::F8E4M3);
  std::memset(fp8.data_ptr(), 0, fp8.nbytes());
  tensors_[name] = fp8;
  const std::string message = error_of([&] { hf_gpt2::from_hf(tensors_, config_, "tiny.safetensors"); });
  EXPECT_THAT(message, HasSubstr("'" + name + "' has dtype fp8_e4m3"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("no host arithmetic")));
}
