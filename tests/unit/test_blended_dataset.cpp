// Weighted blends (issue 27, item 1): the flat and YAML list forms with their one-line errors, the
// largest-error index (shares within 1 % of the weights over every window of 1,000 samples, exact
// continuation), the cache file (written, loaded, and a tampered, truncated or foreign file caught
// and rebuilt), per-split blends, and that the micro-batches of every layout read the same stream.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "parallel/blended_dataset.hpp"
#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/indexed_dataset.hpp"

namespace fs = std::filesystem;
using namespace parallel;
using ::testing::HasSubstr;

namespace {

// Documents of 50 tokens; the token at position p is tag * 100000 + p, so a sample says which
// dataset and where it came from.
class TaggedSource final : public TokenSource {
 public:
  TaggedSource(int tag, int64_t tokens) : tag_(tag), tokens_(tokens) {}
  int64_t num_documents() const override { return (tokens_ + 49) / 50; }
  int64_t document_offset(int64_t d) const override { return std::min(d * 50, tokens_); }
  void read(int64_t position, int64_t count, int32_t* out) const override {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(tag_ * 100000 + position + i);
  }
  std::string describe() const override { return "tagged" + std::to_string(tag_); }

 private:
  int tag_;
  int64_t tokens_;
};

std::shared_ptr<const TokenSource> tagged(int tag, int64_t tokens = 5000) {
  return std::make_shared<TaggedSource>(tag, tokens);
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

BlendedDatasetOptions blend_options(int64_t num_samples, const std::string& cache_dir = "",
                                    bool write = true) {
  BlendedDatasetOptions o;
  o.dataset.seq_length = 8;
  o.dataset.global_batch_size = 8;
  o.dataset.micro_batch_size = 2;
  o.dataset.shuffle = true;
  o.dataset.seed = 1234;
  o.dataset.split = "1,0,0";
  o.num_samples = num_samples;
  o.cache_dir = cache_dir;
  o.write_cache = write;
  return o;
}

// The largest |share - weight| of dataset d over all windows of `window` consecutive samples.
double worst_window_deviation(const BlendIndex& index, int64_t d, double weight, int64_t window) {
  const auto n = static_cast<int64_t>(index.dataset.size());
  int64_t in_window = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    in_window += index.dataset[i] == d;
    if (i >= window) in_window -= index.dataset[i - window] == d;
    if (i >= window - 1)
      worst =
          std::max(worst, std::abs(static_cast<double>(in_window) / static_cast<double>(window) - weight));
  }
  return worst;
}

std::vector<char> read_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& file, const std::vector<char>& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(Blend, FlatFormIsMegatrons) {
  auto b = parse_blend("0.7 data/a 0.3 data/b");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].weight, 0.7);
  EXPECT_EQ(b[0].path, "data/a");
  EXPECT_EQ(b[1].weight, 0.3);
  EXPECT_EQ(b[1].path, "data/b");
  EXPECT_EQ(format_blend(b), "0.7 data/a 0.3 data/b");
  // Weights need not be normalised; several spaces, tabs and newlines separate alike.
  b = parse_blend("  7\tx \n 3   y ");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1].path, "y");
  // One path, white space inside it kept; a number alone is a path too.
  b = parse_blend("/data/my corpus");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].path, "/data/my corpus");
  EXPECT_EQ(parse_blend("123")[0].path, "123");
  EXPECT_EQ(parse_blend("synthetic")[0].path, "synthetic");
  EXPECT_EQ(parse_blend("1 synthetic")[0].path, "synthetic");
  // A zero weight is allowed (the dataset is never drawn) as long as the sum is positive.
  EXPECT_EQ(parse_blend("0 a 1 b").size(), 2u);
}

TEST(Blend, FlatFormErrorsAreOneLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "no dataset"},
      {"0.7 a 0.3", "3 items: expected weight/path pairs"},
      {"0.7 a b c", "\"b\" (item 3) is not a number"},
      {"0.7 a -0.3 b", "the weight of \"b\" is -0.3: weights must be >= 0"},
      {"nan a 1 b", "the weight of \"a\" is not a number"},
      {"inf a 1 b", "weights must be finite"},
      {"0 a 0 b", "the weights sum to 0"},
      {"0.5 synthetic 0.5 b", "\"synthetic\" cannot be part of a blend"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string msg = error_of([&] { parse_blend(text); });
    EXPECT_THAT(msg, HasSubstr(expected)) << text;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(BlendIndex, SharesFollowTheWeightsOverEveryWindowOf1000) {
  // Issue 27's "done when": 0.7 / 0.3 within 1 % over every window of 1,000 samples.
  const std::vector<double> weights = {0.7, 0.3};
  const BlendIndex index = build_blend_index(weights, 200000);
  const double worst0 = worst_window_deviation(index, 0, 0.7, 1000);
  const double worst1 = worst_window_deviation(index, 1, 0.3, 1000);
  std::printf(
      "0.7/0.3 over 200,000 samples: largest deviation of a 1,000-sample window's share: %.4f%% / %.4f%%\n",
      100 * worst0, 100 * worst1);
  EXPECT_LE(worst0, 0.01);
  EXPECT_LE(worst1, 0.01);
  // Two datasets: each count stays within one sample of weight * n at every n. So do the shares of
  // weights that are not a ratio of small integers (0.7 / 0.3 repeats every 10 samples).
  const BlendIndex odd = build_blend_index(std::vector<double>{0.6180339887, 0.3819660113}, 200000);
  const double worst_odd = worst_window_deviation(odd, 0, 0.6180339887, 1000);
  std::printf("0.618/0.382: largest deviation %.4f%%\n", 100 * worst_odd);
  EXPECT_LE(worst_odd, 0.002);
  int64_t count0 = 0;
  for (std::size_t i = 0; i < index.dataset.size(); ++i) {
    count0 += index.dataset[i] == 0;
    ASSERT_LT(std::abs(static_cast<double>(count0) - 0.7 * static_cast<double>(i + 1)), 1.0) << i;
  }
  // Other weights, also unnormalised and irrational ones; K datasets: within 2 (K - 1) / 1000.
  for (const std::vector<double>& w : std::vector<std::vector<double>>{
           {0.5, 0.3, 0.2}, {1, 1, 1}, {std::sqrt(2.0), 1.0}, {0.97, 0.01, 0.01, 0.01}, {5, 4, 3, 2, 1}}) {
    const BlendIndex ix = build_blend_index(w, 100000);
    double sum = 0;
    for (double x : w) sum += x;
    for (std::size_t d = 0; d < w.size(); ++d) {
      const double worst = worst_window_deviation(ix, static_cast<int64_t>(d), w[d] / sum, 1000);
      std::printf("%zu datasets, dataset %zu at weight %.4f: largest deviation %.4f%%\n", w.size(), d,
                  w[d] / sum, 100 * worst);
      EXPECT_LE(worst, 0.01) << "dataset " << d << " of " << w.size();
      EXPECT_LT(worst, 2.0 * static_cast<double>(w.size() - 1) / 1000 + 1e-12);
    }
  }
}

TEST(BlendIndex, NumbersEachDatasetsSamplesInOrderAndContinuesExactly) {
  const std::vector<double> weights = {0.5, 0.2, 0.3};
  const BlendIndex full = build_blend_index(weights, 5000);
  std::vector<int64_t> counts(3, 0);
  for (std::size_t i = 0; i < full.dataset.size(); ++i)
    ASSERT_EQ(full.sample[i], counts[full.dataset[i]]++) << i;
  // A shorter index is a prefix; resuming from a prefix's counts continues with the same draws.
  const BlendIndex part = build_blend_index(weights, 1234);
  EXPECT_TRUE(std::equal(part.dataset.begin(), part.dataset.end(), full.dataset.begin()));
  std::vector<int64_t> part_counts(3, 0);
  for (int16_t d : part.dataset) ++part_counts[d];
  BlendIndexBuilder builder(weights);
  builder.resume(part_counts);
  BlendIndex rest;
  builder.extend(rest, 5000 - 1234);
  EXPECT_TRUE(std::equal(rest.dataset.begin(), rest.dataset.end(), full.dataset.begin() + 1234));
  EXPECT_TRUE(std::equal(rest.sample.begin(), rest.sample.end(), full.sample.begin() + 1234));
  // Scaling the weights changes nothing.
  EXPECT_EQ(build_blend_index(std::vector<double>{5, 2, 3}, 5000).dataset, full.dataset);
  // A zero weight is never drawn.
  const BlendIndex zero = build_blend_index(std::vector<double>{1, 0, 1}, 1000);
  EXPECT_EQ(std::count(zero.dataset.begin(), zero.dataset.end(), 1), 0);
}

TEST(BlendedDataset, SamplesComeFromTheirDatasetsAndPastTheIndexToo) {
  BlendedDataset blend({tagged(1), tagged(2)}, {0.7, 0.3}, DataSplit::Train, blend_options(100));
  EXPECT_EQ(blend.num_datasets(), 2);
  EXPECT_DOUBLE_EQ(blend.weight(0), 0.7);
  EXPECT_EQ(blend.cache_status(), "built in memory (no cache directory)");
  const BlendIndex expected = build_blend_index(std::vector<double>{0.7, 0.3}, 1000);
  for (int64_t n = 0; n < 1000; ++n) {  // 100 from the index, 900 continued in memory
    const BlendedDataset::Draw d = blend.draw(n);
    ASSERT_EQ(d.dataset, expected.dataset[n]) << n;
    ASSERT_EQ(d.sample, expected.sample[n]) << n;
    EXPECT_EQ(blend.sample(n), blend.dataset(d.dataset).sample(d.sample)) << n;
    EXPECT_EQ(blend.sample(n)[0] / 100000, d.dataset + 1) << n;
  }
  // One dataset is that dataset: no index.
  BlendedDataset one({tagged(1)}, {2.0}, DataSplit::Train, blend_options(100, "/nonexistent"));
  EXPECT_EQ(one.draw(12345).sample, 12345);
  EXPECT_EQ(one.cache_file(), "");
}

TEST(BlendedDataset, BatchesDoNotDependOnTheLayout) {
  BlendedDatasetOptions o = blend_options(64);
  o.dataset.micro_batch_size = 1;
  BlendedDataset reference({tagged(1), tagged(2), tagged(3)}, {0.5, 0.3, 0.2}, DataSplit::Train, o);
  for (int dp : {1, 2, 4}) {
    for (int64_t mbs : {1, 2}) {
      BlendedDatasetOptions om = blend_options(64);
      om.dataset.micro_batch_size = mbs;
      BlendedDataset ds({tagged(1), tagged(2), tagged(3)}, {0.5, 0.3, 0.2}, DataSplit::Train, om);
      for (int64_t b = 0; b < 12; ++b) {  // past the 64 indexed samples too
        std::vector<int32_t> got;
        for (int r = 0; r < dp; ++r)
          for (int64_t m = 0; m < ds.num_micro_batches(dp); ++m) {
            const MicroBatch mb = ds.micro_batch(b, r, dp, m);
            const int32_t* t = mb.tokens.data<int32_t>();
            got.insert(got.end(), t, t + mb.tokens.numel());
          }
        std::vector<int32_t> want;
        for (int64_t i = 0; i < 8; ++i) {
          const std::vector<int32_t> s = reference.sample(b * 8 + i);
          want.insert(want.end(), s.begin(), s.end() - 1);
        }
        ASSERT_EQ(got, want) << "dp " << dp << " mbs " << mbs << " batch " << b;
      }
    }
  }
}

TEST(BlendedDataset, CacheIsWrittenLoadedAndCheckedAgainstTheBlend) {
  TempDir dir("parallel_blend_cache");
  const std::string cache = (dir.path / "cache").string();
  auto make = [&](bool write, int64_t seq_length = 8) {
    BlendedDatasetOptions o = blend_options(5000, cache, write);
    o.dataset.seq_length = seq_length;
    return BlendedDataset({tagged(1), tagged(2)}, {0.7, 0.3}, DataSplit::Train, o);
  };
  // A reader that is not the writer builds in memory and writes nothing.
  {
    BlendedDataset reader = make(false);
    EXPECT_EQ(reader.cache_status(), "built in memory (another rank writes the file)");
    EXPECT_FALSE(fs::exists(reader.cache_file()));
  }
  BlendedDataset first = make(true);
  EXPECT_EQ(first.cache_status(), "built and written");
  EXPECT_EQ(first.cache_warning(), "");
  const std::string file = first.cache_file();
  EXPECT_EQ(fs::path(file).parent_path(), fs::path(cache));
  EXPECT_EQ(fs::path(file).filename().string().substr(0, 12), "blend_train_");
  ASSERT_TRUE(fs::exists(file));
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(cache)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1);
  const std::vector<char> good = read_bytes(file);
  EXPECT_EQ(good.size(), 8 + 8 + (first.description().size() + 7) / 8 * 8 + 8 + 10 * 5000 + 4);

  BlendedDataset second = make(false);
  EXPECT_EQ(second.cache_status(), "loaded");
  const BlendIndex expected = build_blend_index(std::vector<double>{0.7, 0.3}, 5000);
  for (int64_t n = 0; n < 5000; n += 7) {
    EXPECT_EQ(second.draw(n).dataset, expected.dataset[n]);
    EXPECT_EQ(second.draw(n).sample, expected.sample[n]);
    EXPECT_EQ(first.draw(n).dataset, expected.dataset[n]);  // the writer reads the file it wrote
  }

  // Another sequence length is another blend description: another file, the first one untouched.
  BlendedDataset other = make(true, 4);
  EXPECT_NE(other.cache_file(), file);
  EXPECT_EQ(other.cache_status(), "built and written");

  // A flipped byte in the index: caught by the checksum, rebuilt by the writer with a warning,
  // the rebuilt file identical to the original. (Written in place here, which `first` and `second`,
  // mapping the file, would see: they are not used again. The writer replaces files by rename.)
  std::vector<char> tampered = good;
  tampered[good.size() - 4 - 2 * 100] ^= 1;  // the dataset of entry 4900
  write_bytes(file, tampered);
  {
    BlendedDataset reader = make(false);
    EXPECT_THAT(reader.cache_warning(), HasSubstr("checksum mismatch"));
    EXPECT_EQ(reader.cache_status(), "built in memory (another rank writes the file)");
    EXPECT_EQ(reader.draw(4900).dataset, expected.dataset[4900]);
  }
  BlendedDataset rebuilt = make(true);
  EXPECT_THAT(rebuilt.cache_warning(),
              HasSubstr("blend index " + file + " is not usable: checksum mismatch"));
  EXPECT_EQ(rebuilt.cache_status(), "rebuilt and written");
  EXPECT_EQ(read_bytes(file), good);

  // Truncated, trailing bytes, wrong magic, a description that is not this blend's, an index
  // that breaks the numbering with a valid checksum: each caught with its reason.
  BlendIndex index;
  std::vector<char> truncated(good.begin(), good.end() - 10);
  write_bytes(file, truncated);
  EXPECT_THAT(read_blend_index(file, first.description(), 2, 5000, index),
              HasSubstr("bytes where 5000 samples"));
  std::vector<char> longer = good;
  longer.push_back(0);
  write_bytes(file, longer);
  EXPECT_THAT(read_blend_index(file, first.description(), 2, 5000, index), HasSubstr("bytes where"));
  std::vector<char> magic = good;
  magic[0] = 'X';
  write_bytes(file, magic);
  EXPECT_THAT(read_blend_index(file, first.description(), 2, 5000, index), HasSubstr("wrong magic"));
  write_bytes(file, good);
  std::string foreign = first.description();
  foreign[foreign.size() - 2] ^= 1;
  EXPECT_THAT(read_blend_index(file, foreign, 2, 5000, index), HasSubstr("made for another blend"));
  BlendIndex broken = build_blend_index(std::vector<double>{0.7, 0.3}, 5000);
  broken.sample[10] += 1;
  write_blend_index(file, first.description(), broken);
  EXPECT_THAT(read_blend_index(file, first.description(), 2, 5000, index), HasSubstr("entry 10 is sample"));
  broken = build_blend_index(std::vector<double>{0.7, 0.3}, 5000);
  broken.dataset[3] = 5;
  write_blend_index(file, first.description(), broken);
  EXPECT_THAT(read_blend_index(file, first.description(), 2, 5000, index),
              HasSubstr("entry 3 names dataset 5 of 2"));
  EXPECT_EQ(read_blend_index((dir.path / "absent.idx").string(), first.description(), 2, 5000, index),
            "missing");
  // And the dataset rebuilds over any of them.
  EXPECT_EQ(make(true).cache_status(), "rebuilt and written");
  EXPECT_EQ(read_bytes(file), good);
}

TEST(BlendedDataset, AnUnwritableCacheDirectoryIsAWarningNotAFailure) {
  TempDir dir("parallel_blend_ro");
  // The cache "directory" is a file: it cannot be created, whoever runs the test (root included).
  const fs::path blocked = dir.path / "blocked";
  write_bytes(blocked.string(), {'x'});
  BlendedDataset ds({tagged(1), tagged(2)}, {0.7, 0.3}, DataSplit::Train,
                    blend_options(100, (blocked / "cache").string(), true));
  EXPECT_EQ(ds.cache_status(), "built in memory (the file could not be written)");
  EXPECT_THAT(ds.cache_warning(), HasSubstr("not written: cannot create"));
  EXPECT_EQ(ds.draw(99).dataset, build_blend_index(std::vector<double>{0.7, 0.3}, 100).dataset[99]);
}

namespace {

// Writes an indexed dataset of `documents` documents of 40 tokens, token values tag * 1000 + i % 1000.
std::string write_dataset(const fs::path& dir, const std::string& name, int tag, int documents = 50) {
  const std::string prefix = (dir / name).string();
  IndexedDatasetBuilder builder(prefix, IndexedDType::Int32);
  int32_t next = 0;
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < 40; ++i) doc.push_back(tag * 1000 + (next++ % 1000));
    builder.add_document(doc);
  }
  builder.finalize();
  return prefix;
}

Config blend_config(const std::string& path) {
  Config c;
  c.model.seq_length = 16;
  c.model.vocab_size = 100000;
  c.train.global_batch_size = 4;
  c.train.micro_batch_size = 2;
  c.train.steps = 10;
  c.train.eval_steps = 2;
  c.data.path = path;
  return c;
}

Config parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parse_config(yaml, overrides, 1);
}

std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse(yaml, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(BlendConfig, ListFormsAndTheFlatStringAreOneBlend) {
  const std::string flat = "0.7 data/a 0.3 data/b";
  EXPECT_EQ(parse("data:\n  path: [{weight: 0.7, path: data/a}, {weight: 0.3, path: data/b}]\n").data.path,
            flat);
  EXPECT_EQ(
      parse("data:\n  path:\n    - weight: 0.7\n      path: data/a\n    - {path: data/b, weight: 0.3}\n")
          .data.path,
      flat);
  EXPECT_EQ(parse("data:\n  path: [0.7, data/a, 0.3, data/b]\n").data.path, flat);
  EXPECT_EQ(parse("data:\n  path: \"0.7 data/a 0.3 data/b\"\n").data.path, flat);
  EXPECT_EQ(parse("", {"data.path=[{weight: 0.7, path: data/a}, {weight: 0.3, path: data/b}]"}).data.path,
            flat);
  // Per-split keys take the same forms.
  const Config c =
      parse("data:\n  train_path: [{weight: 2, path: t1}, {weight: 1, path: t2}]\n  valid_path: v\n");
  EXPECT_EQ(c.data.train_path, "2 t1 1 t2");
  EXPECT_EQ(c.data.valid_path, "v");
  EXPECT_EQ(c.data.test_path, "");
  // The YAML written into run directories and checkpoints reads back as the same blend.
  const Config back = parse(config_to_yaml(c));
  EXPECT_EQ(back.data.train_path, c.data.train_path);
  EXPECT_EQ(back.data.valid_path, "v");
  EXPECT_NE(config_reference().find("data.train_path"), std::string::npos);
  EXPECT_NE(config_reference().find("data.cache_path"), std::string::npos);
}

TEST(BlendConfig, InvalidBlendsAreOneLineNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"data:\n  path: \"0.7 a -0.3 b\"\n",
       "config: data.path = \"0.7 a -0.3 b\": the weight of \"b\" is -0.3"},
      {"data:\n  path: [{weight: -1, path: a}, {weight: 2, path: b}]\n",
       "data.path = \"-1 a 2 b\": the weight of \"a\" is -1: weights must be >= 0"},
      {"data:\n  path: [{weight: 0, path: a}, {weight: 0, path: b}]\n",
       "data.path = \"0 a 0 b\": the weights sum to 0"},
      {"data:\n  path: [{weight: .nan, path: a}, {weight: 1, path: b}]\n",
       "data.path[0]: weight \".nan\": expected a number"},
      {"data:\n  path: \"nan a 1 b\"\n", "data.path = \"nan a 1 b\": the weight of \"a\" is not a number"},
      {"data:\n  valid_path: \"0.5 a 0.5\"\n", "data.valid_path = \"0.5 a 0.5\": 3 items"},
      {"data:\n  path: [{weight: 1, pth: a}]\n", "data.path[0]: unknown key \"pth\""},
      {"data:\n  path: [{weight: 1}]\n", "data.path[0]: needs both weight and path"},
      {"data:\n  path: [0.5, a, 0.5]\n", "data.path: 3 items: expected weights and paths alternating"},
      {"data:\n  path: [{weight: 1, path: my corpus}, {weight: 1, path: b}]\n",
       "data.path[0]: path \"my corpus\": a path in a blend cannot hold white space"},
      {"data:\n  test_path: []\n", "data.test_path = []: an empty blend"},
      {"data:\n  train_path: [0.5, synthetic, 0.5, b]\n", "\"synthetic\" cannot be part of a blend"},
  };
  for (const auto& [yaml, expected] : cases) {
    const std::string msg = config_error(yaml);
    EXPECT_THAT(msg, HasSubstr(expected)) << yaml;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(BlendConfig, MakesTheSplitsBlendsFromIndexedDatasets) {
  TempDir dir("parallel_blend_config");
  const std::string a = write_dataset(dir.path, "a", 1);
  const std::string b = write_dataset(dir.path, "b", 2);
  const std::string v = write_dataset(dir.path, "v", 3, 10);
  Config c = blend_config(fmt::format("0.7 {} 0.3 {}", a, b));
  c.data.split = "80,20,0";
  BlendedDataset train = make_blended_dataset(c, DataSplit::Train, true);
  EXPECT_EQ(train.num_datasets(), 2);
  EXPECT_EQ(train.options().num_samples, 40);  // steps * global batch
  EXPECT_EQ(train.cache_status(), "built and written");
  EXPECT_EQ(fs::path(train.cache_file()).parent_path(), dir.path / "cache");  // beside the data
  // Each dataset is split by data.split: the train split has the first 40 of 50 documents.
  EXPECT_EQ(train.dataset(0).documents().end, 40);
  BlendedDataset valid = make_blended_dataset(c, DataSplit::Valid, true);
  EXPECT_EQ(valid.options().num_samples, 8);  // eval_steps * global batch
  EXPECT_EQ(valid.dataset(1).documents().begin, 40);
  EXPECT_NE(valid.cache_file(), train.cache_file());
  // A second process (another rank) loads what the first wrote.
  EXPECT_EQ(make_blended_dataset(c, DataSplit::Train, false).cache_status(), "loaded");
  // Tokens come from the right files.
  for (int64_t n = 0; n < 40; ++n) {
    const BlendedDataset::Draw d = train.draw(n);
    EXPECT_EQ(train.sample(n)[0] / 1000, d.dataset + 1) << n;
  }

  // data.valid_path: the validation split's own blend, every document of it; data.cache_path.
  c.data.valid_path = v;
  c.data.cache_path = (dir.path / "elsewhere").string();
  BlendedDataset own = make_blended_dataset(c, DataSplit::Valid, true);
  EXPECT_EQ(own.num_datasets(), 1);
  EXPECT_EQ(own.dataset(0).documents().begin, 0);
  EXPECT_EQ(own.dataset(0).documents().end, 10);
  EXPECT_EQ(own.sample(0)[0] / 1000, 3);
  c.data.train_path = fmt::format("1 {} 1 {}", b, v);
  BlendedDataset own_train = make_blended_dataset(c, DataSplit::Train, true);
  EXPECT_EQ(fs::path(own_train.cache_file()).parent_path(), dir.path / "elsewhere");
  EXPECT_EQ(own_train.dataset(0).documents().end, 50);

  // A missing file: one line naming the key and the file.
  c.data.train_path = fmt::format("0.5 {} 0.5 {}/missing", a, dir.path.string());
  std::string msg = error_of([&] { make_blended_dataset(c, DataSplit::Train, true); });
  EXPECT_THAT(msg, HasSubstr("data.train_path: indexed dataset " + dir.path.string() + "/missing"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  // A split with no sample: named by the key.
  c.data.train_path = "";
  c.data.split = "100,0,0";
  c.data.valid_path = "";
  msg = error_of([&] { make_blended_dataset(c, DataSplit::Valid, true); });
  EXPECT_THAT(msg, HasSubstr("data.path: the valid split of"));
  // make_gpt_dataset reads one dataset, not a blend.
  msg = error_of([&] { make_gpt_dataset(c, DataSplit::Train); });
  EXPECT_THAT(msg, HasSubstr("data.path: a blend of 2 datasets is read by make_blended_dataset"));
}
