// safetensors: round trips of every dtype, metadata, atomic writes, every kind of corruption the
// loader must detect, and the committed files written by tests/reference/make_fixtures.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "parallel/safetensors.hpp"
#include "paths.hpp"

using namespace parallel;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("parallel_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A tensor of `dtype` whose bytes are 0, 1, 2, ... (any bit pattern is a valid value to store).
Tensor patterned(const Shape& shape, DType dtype, int seed = 0) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(i * 7 + seed);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return a.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), a.nbytes()) == 0;
}

// Splits a safetensors file into its JSON header and its data buffer.
struct RawFile {
  nlohmann::json header;
  std::string data;
};
RawFile split(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}
std::string join(const std::string& header_text, const std::string& data) {
  const uint64_t n = header_text.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header_text + data;
}
std::string join(const RawFile& f) { return join(f.header.dump(), f.data); }

// Runs `fn`, which must throw parallel::Error whose message names `path` and contains `what`.
void expect_error(const std::function<void()>& fn, const std::string& path, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one containing '" << what << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "message lacks '" << what << "': " << msg;
  }
}

using parallel::testing::fixtures_dir;

}  // namespace

TEST_F(Safetensors, RoundTripsEveryDtype) {
  std::map<std::string, Tensor> tensors = {
      {"f32", patterned({3, 5}, DType::F32)},
      {"bf16", patterned({2, 3, 4}, DType::BF16, 1)},
      {"f16", patterned({7}, DType::F16, 2)},
      {"f8_e4m3", patterned({4, 4}, DType::F8E4M3, 3)},
      {"i32", patterned({2, 2}, DType::I32, 4)},
      {"i64", patterned({3}, DType::I64, 5)},
      {"u8", patterned({9}, DType::U8, 6)},
      {"scalar", Tensor::full({}, 3.5, DType::F32)},
      {"empty", Tensor::empty({0, 3}, DType::F32)},
      {"empty_bf16", Tensor::empty({4, 0}, DType::BF16)},
      {"layers.0.attention.query.weight", patterned({8, 2}, DType::F32, 7)},
  };
  const std::string file = path("all.safetensors");
  safetensors::save(file, tensors);
  const auto loaded = safetensors::load(file);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(loaded.count(name)) << name;
    const Tensor& l = loaded.at(name);
    EXPECT_EQ(l.shape(), t.shape()) << name;
    EXPECT_EQ(l.dtype(), t.dtype()) << name;
    EXPECT_TRUE(l.device().is_cpu()) << name;
    EXPECT_TRUE(same_bytes(l, t)) << name;
  }
  EXPECT_EQ(loaded.at("scalar").dim(), 0);
  EXPECT_EQ(loaded.at("scalar").to_float_vector(), std::vector<float>{3.5f});
  EXPECT_TRUE(safetensors::load_metadata(file).empty());
}

TEST_F(Safetensors, WritesTheStandardLayout) {
  const std::string file = path("layout.safetensors");
  safetensors::save(file, {{"a", patterned({3}, DType::U8)}, {"b", patterned({2}, DType::I64)}},
                    {{"k", "v"}});
  const std::string bytes = read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "the data buffer should start 8-byte aligned";
  const RawFile raw = split(bytes);
  EXPECT_EQ(raw.header["__metadata__"]["k"], "v");
  EXPECT_EQ(raw.header["a"]["dtype"], "U8");
  EXPECT_EQ(raw.header["b"]["dtype"], "I64");
  EXPECT_EQ(raw.header["b"]["shape"], nlohmann::json::array({2}));
  // Wider elements first, so each tensor is aligned to its element size.
  EXPECT_EQ(raw.header["b"]["data_offsets"], nlohmann::json::array({0, 16}));
  EXPECT_EQ(raw.header["a"]["data_offsets"], nlohmann::json::array({16, 19}));
  EXPECT_EQ(raw.data.size(), 19u);
}

TEST_F(Safetensors, SavesStridedViewsAsContiguous) {
  std::vector<float> v(24);
  std::iota(v.begin(), v.end(), 0.0f);
  Tensor t = Tensor::from_vector(v, {2, 3, 4});
  Tensor view = t.narrow(2, 1, 2);  // strided
  ASSERT_FALSE(view.is_contiguous());
  const std::string file = path("view.safetensors");
  safetensors::save(file, {{"v", view}});
  EXPECT_EQ(safetensors::load(file).at("v").to_float_vector(), view.to_float_vector());
}

TEST_F(Safetensors, MetadataRoundTrips) {
  const std::string file = path("meta.safetensors");
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"step", "1200"},
                                                   {"config", "model:\n  hidden_size: 32\n"},
                                                   {"quote\"d", "\\ \u00e9"}};
  safetensors::save(file, {{"w", patterned({2}, DType::F32)}}, meta);
  EXPECT_EQ(safetensors::load_metadata(file), meta);
  EXPECT_EQ(safetensors::load(file).size(), 1u);
  // Metadata alone, no tensors.
  const std::string only = path("only_meta.safetensors");
  safetensors::save(only, {}, meta);
  EXPECT_TRUE(safetensors::load(only).empty());
  EXPECT_EQ(safetensors::load_metadata(only), meta);
}

TEST_F(Safetensors, SaveIsAtomicAndLeavesNoTemporaries) {
  const std::string file = path("ckpt.safetensors");
  safetensors::save(file, {{"w", Tensor::full({4}, 1.0, DType::F32)}});
  safetensors::save(file,
                    {{"w", Tensor::full({4}, 2.0, DType::F32)}, {"x", Tensor::full({1}, 3.0, DType::F32)}});
  const auto loaded = safetensors::load(file);
  EXPECT_EQ(loaded.at("w").to_float_vector(), std::vector<float>(4, 2.0f));
  EXPECT_EQ(loaded.size(), 2u);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "ckpt.safetensors");
  }
  EXPECT_EQ(entries, 1);
  // A save that cannot even start throws and creates nothing.
  EXPECT_THROW(
      safetensors::save(path("no/such/dir/x.safetensors"), {{"w", Tensor::full({1}, 1.0, DType::F32)}}),
      Error);
  EXPECT_THROW(
      safetensors::save(path("bad.safetensors"), {{"__metadata__", Tensor::full({1}, 1.0, DType::F32)}}),
      Error);
  EXPECT_THROW(safetensors::save(path("bad.safetensors"), {}, {{"k", std::string("\xff\xfe")}}),
               Error);  // not UTF-8
  EXPECT_FALSE(fs::exists(path("bad.safetensors")));
}

TEST_F(Safetensors, MissingFileNamesThePath) {
  expect_error([&] { safetensors::load(path("absent.safetensors")); }, path("absent.safetensors"),
               "cannot open");
}

// ---- corruption ------------------------------------------------------------------------------

class SafetensorsCorruption : public Safetensors {
 protected:
  void SetUp() override {
    Safetensors::SetUp();
    good_ = path("good.safetensors");
    safetensors::save(good_, {{"a", patterned({2, 2}, DType::F32)}, {"b", patterned({3}, DType::F32, 1)}},
                      {{"k", "v"}});
    bytes_ = read_file(good_);
    // Offsets as written: a [0, 16), b [16, 28) (same width: by name).
    raw_ = split(bytes_);
    ASSERT_EQ(raw_.header["a"]["data_offsets"], nlohmann::json::array({0, 16}));
    ASSERT_EQ(raw_.header["b"]["data_offsets"], nlohmann::json::array({16, 28}));
  }
  // Writes `bytes` as bad.safetensors and expects load (and load_metadata) to fail with `what`.
  void expect_corrupt(const std::string& bytes, const std::string& what, bool metadata_too = true) {
    const std::string bad = path("bad.safetensors");
    write_file(bad, bytes);
    expect_error([&] { safetensors::load(bad); }, bad, what);
    if (metadata_too) expect_error([&] { safetensors::load_metadata(bad); }, bad, what);
  }
  std::string good_, bytes_;
  RawFile raw_;
};

TEST_F(SafetensorsCorruption, GoodFileLoads) {
  EXPECT_EQ(safetensors::load(good_).size(), 2u);
  EXPECT_EQ(safetensors::load(path("good.safetensors")).at("b").shape(), (Shape{3}));
}

TEST_F(SafetensorsCorruption, FileShorterThanEightBytes) {
  expect_corrupt("", "shorter than the 8-byte header length");
  expect_corrupt(bytes_.substr(0, 5), "shorter than the 8-byte header length");
}

TEST_F(SafetensorsCorruption, HeaderLengthLargerThanTheFile) {
  // Truncated inside the header.
  expect_corrupt(bytes_.substr(0, 20), "exceeds");
  // A corrupted length field.
  std::string b = bytes_;
  b[6] = '\x01';
  expect_corrupt(b, "exceeds");
}

TEST_F(SafetensorsCorruption, InvalidJson) {
  std::string b = bytes_;
  b[8] = '[';  // the header no longer opens an object
  expect_corrupt(b, "not valid JSON");
  b = bytes_;
  b[9] = '\xff';  // not UTF-8 / not a quote
  expect_corrupt(b, "not valid JSON");
  expect_corrupt(join("[1, 2, 3]", ""), "not a JSON object");
  expect_corrupt(join("{\"a\": 5}", ""), "not a JSON object");
}

TEST_F(SafetensorsCorruption, UnknownDtype) {
  RawFile r = raw_;
  r.header["a"]["dtype"] = "F31";
  expect_corrupt(join(r), "unknown dtype \"F31\"");
  r.header["a"]["dtype"] = "F64";  // valid safetensors, not supported here
  expect_corrupt(join(r), "unknown dtype \"F64\"");
  r.header["a"]["dtype"] = 4;
  expect_corrupt(join(r), "unknown dtype");
}

TEST_F(SafetensorsCorruption, MalformedEntries) {
  RawFile r = raw_;
  r.header["a"].erase("shape");
  expect_corrupt(join(r), "missing \"shape\"");
  r = raw_;
  r.header["a"]["shape"] = {2, -2};
  expect_corrupt(join(r), "negative");
  r = raw_;
  r.header["a"]["data_offsets"] = {0};
  expect_corrupt(join(r), "not a [begin, end] pair");
  r = raw_;
  r.header["a"]["data_offsets"] = {16, 0};
  expect_corrupt(join(r), "end before begin");
  r = raw_;
  r.header["__metadata__"]["k"] = 3;
  expect_corrupt(join(r), "is not a string");
}

TEST_F(SafetensorsCorruption, OffsetsOutOfRange) {
  RawFile r = raw_;
  r.header["b"]["data_offsets"] = {16, 40};
  r.header["b"]["shape"] = {6};
  expect_corrupt(join(r), "out of range");
  // A truncated data buffer.
  expect_corrupt(bytes_.substr(0, bytes_.size() - 4), "out of range");
}

TEST_F(SafetensorsCorruption, OverlappingOffsets) {
  RawFile r = raw_;
  r.header["b"]["data_offsets"] = {8, 20};  // overlaps a's [0, 16)
  r.data.resize(20);
  expect_corrupt(join(r), "overlaps");
  r = raw_;
  r.header["b"]["data_offsets"] = {0, 12};  // same start as a
  r.data.resize(16);
  expect_corrupt(join(r), "overlaps");
}

TEST_F(SafetensorsCorruption, OffsetsNotCoveringTheData) {
  RawFile r = raw_;
  r.header["b"]["data_offsets"] = {20, 32};  // a hole at [16, 20)
  r.data.resize(32);
  expect_corrupt(join(r), "belong to no tensor");
  r = raw_;
  r.header["a"]["data_offsets"] = {4, 20};  // a hole at [0, 4) and an overlap after
  expect_corrupt(join(r), "belong to no tensor");
}

TEST_F(SafetensorsCorruption, ByteSizeDoesNotMatchShape) {
  RawFile r = raw_;
  r.header["b"]["shape"] = {2};  // 8 bytes, but the range holds 12
  expect_corrupt(join(r), "needs 8");
  r = raw_;
  r.header["a"]["dtype"] = "BF16";  // 4 elements of 2 bytes in a 16-byte range
  expect_corrupt(join(r), "needs 8");
}

TEST_F(SafetensorsCorruption, TrailingGarbage) {
  expect_corrupt(bytes_ + "junk", "trailing garbage");
  RawFile r = raw_;
  r.header.erase("b");  // b's bytes are now unclaimed
  expect_corrupt(join(r), "trailing garbage");
}

TEST_F(SafetensorsCorruption, FlippedHeaderBytesAreAlwaysDetectedOrHarmless) {
  // Every single-byte corruption of the header either fails cleanly with parallel::Error or still
  // yields a structurally valid file (e.g. a changed digit in a name); it never crashes.
  uint64_t n = 0;
  std::memcpy(&n, bytes_.data(), 8);
  const std::string bad = path("flip.safetensors");
  for (uint64_t i = 0; i < 8 + n; ++i) {
    std::string b = bytes_;
    b[i] = static_cast<char>(b[i] ^ 0x5a);
    write_file(bad, b);
    try {
      const auto t = safetensors::load(bad);
      size_t total = 0;
      for (const auto& [name, tensor] : t) total += tensor.nbytes();
      EXPECT_EQ(total, 28u) << "byte " << i;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// ---- files written by PyTorch-side code ------------------------------------------------------

TEST(SafetensorsFixtures, PythonWrittenFilesLoad) {
  const std::string dir = fixtures_dir();
  ASSERT_TRUE(fs::is_directory(dir)) << "fixtures missing at " << dir << " (they are committed)";
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    const auto t = safetensors::load(e.path().string());
    EXPECT_FALSE(t.empty()) << e.path();
    for (const auto& [name, tensor] : t)
      EXPECT_TRUE(tensor.dtype() == DType::F32 || tensor.dtype() == DType::I32 ||
                  tensor.dtype() == DType::BF16)
          << e.path() << " " << name;
  }
  EXPECT_GE(files, 12);

  const std::string gpt = dir + "/gpt_a.safetensors";
  const auto t = safetensors::load(gpt);
  EXPECT_EQ(t.at("tokens").dtype(), DType::I32);
  EXPECT_EQ(t.at("tokens").shape(), (Shape{2, 8}));
  EXPECT_EQ(t.at("loss").dim(), 0);
  EXPECT_EQ(t.at("logits").shape(), (Shape{8, 2, 100}));
  EXPECT_EQ(t.at("embedding.word.weight").shape(), (Shape{100, 32}));
  EXPECT_EQ(t.at("grad.layers.1.mlp.fc1.weight").shape(), (Shape{64, 32}));
  const auto meta = safetensors::load_metadata(gpt);
  EXPECT_EQ(meta.at("hidden_size"), "32");
  EXPECT_EQ(meta.at("normalization"), "layernorm");
  EXPECT_TRUE(safetensors::load_metadata(dir + "/linear.safetensors").empty());

  // Re-saving what was loaded reproduces the same tensors.
  const std::string copy =
      (fs::temp_directory_path() / ("gpt_a_copy_" + std::to_string(::getpid()))).string();
  safetensors::save(copy, t, meta);
  const auto again = safetensors::load(copy);
  EXPECT_EQ(safetensors::load_metadata(copy), meta);
  fs::remove(copy);
  ASSERT_EQ(again.size(), t.size());
  for (const auto& [name, tensor] : t) EXPECT_TRUE(same_bytes(again.at(name), tensor)) << name;
}

TEST_F(SafetensorsCorruption, DuplicateTensorNameIsRefused) {
  // JSON parsers keep the last of two equal keys; the format forbids them, so the file is refused.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("a":{"dtype":"F32","shape":[3],"data_offsets":[16,28]}})";
  expect_corrupt(join(header, raw_.data), "tensor 'a' appears twice");
}

TEST_F(SafetensorsCorruption, ShapeWhoseStridesOverflowIsRefusedEvenWhenEmpty) {
  // UBSan under the fuzz target (fuzz/corpus/safetensors_header/crash-shape-zero-times-huge-strides):
  // a zero dimension makes the tensor empty, so its byte count checked out, but the strides of
  // [0, 2^62, 2^62] overflow int64 when the tensor is made.
  RawFile r = raw_;
  r.header["z"] = {{"dtype", "F32"}, {"shape", {0, 1ull << 62, 1ull << 62}}, {"data_offsets", {28, 28}}};
  expect_corrupt(join(r), "tensor 'z': shape [0,4611686018427387904,4611686018427387904] overflows");
  // A zero next to the largest dimension is fine: every stride fits.
  r.header["z"]["shape"] = {INT64_MAX, 0};
  const std::string ok = path("ok.safetensors");
  write_file(ok, join(r));
  EXPECT_EQ(safetensors::load(ok).at("z").shape(), (Shape{INT64_MAX, 0}));
}
