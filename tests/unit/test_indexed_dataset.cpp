// Megatron's indexed dataset: the exact bytes we write, round trips in every integer dtype, the
// reader's validation of broken files, atomic publication, and the preprocessing pipeline.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/indexed_dataset.hpp"
#include "parallel/tokenizer.hpp"
#include "paths.hpp"

namespace fs = std::filesystem;
using namespace parallel;

namespace {

using parallel::testing::source_dir;

using parallel::testing::gpt2_dir;

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("parallel_indexed_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string prefix(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

template <typename T>
void append(std::string& s, T value) {
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));
  s.append(b, sizeof(T));
}

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

const std::vector<std::vector<int32_t>> kDocs = {{1, 2, 3}, {}, {4}, {5, 6, 7, 8, 9}, {10, 11}};

void build(const std::string& prefix, IndexedDType dtype,
           const std::vector<std::vector<int32_t>>& docs = kDocs) {
  IndexedDatasetBuilder builder(prefix, dtype);
  for (const auto& d : docs) builder.add_document(d);
  builder.finalize();
}

}  // namespace

TEST_F(IndexedDatasetTest, WritesMegatronsExactBytes) {
  build(prefix("exact"), IndexedDType::UInt16);
  // What Megatron's _IndexWriter writes for these documents (one sequence per non-empty document;
  // the document count field is len(document_indices), the documents plus the leading 0).
  std::string idx("MMIDIDX\0\0", 9);
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, 8);
  append<uint64_t>(idx, 4);  // sequences
  append<uint64_t>(idx, 6);  // document index entries = 5 documents + 1
  for (int32_t length : {3, 1, 5, 2}) append<int32_t>(idx, length);
  for (int64_t pointer : {0, 6, 8, 18}) append<int64_t>(idx, pointer);
  for (int64_t d : {0, 1, 1, 2, 3, 4}) append<int64_t>(idx, d);
  EXPECT_EQ(read_bytes(prefix("exact") + ".idx"), idx);
  std::string bin;
  for (int v = 1; v <= 11; ++v) append<uint16_t>(bin, static_cast<uint16_t>(v));
  EXPECT_EQ(read_bytes(prefix("exact") + ".bin"), bin);
}

TEST_F(IndexedDatasetTest, RoundTripsEveryIntegerDtype) {
  for (IndexedDType dtype : {IndexedDType::UInt8, IndexedDType::Int8, IndexedDType::Int16,
                             IndexedDType::UInt16, IndexedDType::Int32, IndexedDType::Int64}) {
    SCOPED_TRACE(indexed_dtype_name(dtype));
    const std::string p = prefix("rt_" + indexed_dtype_name(dtype));
    build(p, dtype);
    IndexedDataset ds(p);
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.prefix(), p);
    EXPECT_EQ(ds.num_documents(), 5);
    EXPECT_EQ(ds.num_sequences(), 4);
    EXPECT_EQ(ds.num_elements(), 11);
    for (int64_t d = 0; d < 5; ++d) EXPECT_EQ(ds.document(d), kDocs[d]) << d;
    EXPECT_EQ(ds.sequence(2), (std::vector<int32_t>{5, 6, 7, 8, 9}));
    EXPECT_EQ(ds.sequence_pointer(3), 9 * indexed_dtype_size(dtype));
    EXPECT_EQ(ds.document_begin(1), 3);
    EXPECT_EQ(ds.document_end(1), 3);
    EXPECT_EQ(ds.document_begin(4), 9);
    EXPECT_EQ(ds.document_end(4), 11);
    std::vector<int32_t> flat(11);
    ds.read(0, 11, flat.data());
    EXPECT_EQ(flat, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
    EXPECT_THROW(ds.read(10, 2, flat.data()), Error);
  }
}

TEST_F(IndexedDatasetTest, ExtremeValuesSurvive) {
  const std::vector<std::vector<int32_t>> docs = {{0, 65535, 50256}};
  build(prefix("u16"), IndexedDType::UInt16, docs);
  EXPECT_EQ(IndexedDataset(prefix("u16")).document(0), docs[0]);
  const std::vector<std::vector<int32_t>> signed_docs = {{-128, 127, 0}};
  build(prefix("i8"), IndexedDType::Int8, signed_docs);
  EXPECT_EQ(IndexedDataset(prefix("i8")).document(0), signed_docs[0]);
  const std::vector<std::vector<int32_t>> big = {{2147483647, -2147483647 - 1}};
  build(prefix("i64"), IndexedDType::Int64, big);
  EXPECT_EQ(IndexedDataset(prefix("i64")).document(0), big[0]);
}

TEST_F(IndexedDatasetTest, EmptyDatasetIsValid) {
  build(prefix("empty"), IndexedDType::UInt16, {});
  IndexedDataset ds(prefix("empty"));
  EXPECT_EQ(ds.num_documents(), 0);
  EXPECT_EQ(ds.num_sequences(), 0);
  EXPECT_EQ(ds.num_elements(), 0);
}

TEST_F(IndexedDatasetTest, BuilderRejectsValuesOutsideTheDtype) {
  IndexedDatasetBuilder builder(prefix("range"), IndexedDType::UInt16);
  const std::vector<int32_t> bad = {1, 65536};
  const std::string msg = error_of([&] { builder.add_document(bad); });
  EXPECT_NE(msg.find("does not fit uint16"), std::string::npos) << msg;
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(builder.add_document(negative), Error);
  EXPECT_THROW(IndexedDatasetBuilder(prefix("float"), IndexedDType::Float32), Error);
}

TEST_F(IndexedDatasetTest, PublishesAtomically) {
  const std::string p = prefix("atomic");
  {
    IndexedDatasetBuilder builder(p, IndexedDType::Int32);
    const std::vector<int32_t> doc = {1, 2, 3};
    builder.add_document(doc);
    // Before finalize only staging files exist, never the final names.
    EXPECT_FALSE(fs::exists(p + ".bin"));
    EXPECT_FALSE(fs::exists(p + ".idx"));
    // Abandoned (as by an exception): the staging files go too.
  }
  EXPECT_FALSE(fs::exists(p + ".bin"));
  EXPECT_FALSE(fs::exists(p + ".idx"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);

  build(p, IndexedDType::Int32);
  EXPECT_TRUE(fs::exists(p + ".bin"));
  EXPECT_TRUE(fs::exists(p + ".idx"));
  // Nothing but the two files is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

TEST_F(IndexedDatasetTest, AcceptsMultimodalModes) {
  const std::string p = prefix("modes");
  build(p, IndexedDType::Int32);
  std::string idx = read_bytes(p + ".idx");
  idx.append(4, '\0');  // one int8 mode per sequence
  write_bytes(p + ".idx", idx);
  EXPECT_EQ(IndexedDataset(p).document(3), kDocs[3]);
}

TEST_F(IndexedDatasetTest, RejectsFloatTokens) {
  // Megatron can store float datasets; they load, but are not token ids.
  const std::string p = prefix("float");
  std::string idx("MMIDIDX\0\0", 9);
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, 7);
  append<uint64_t>(idx, 1);
  append<uint64_t>(idx, 2);
  append<int32_t>(idx, 2);
  append<int64_t>(idx, 0);
  append<int64_t>(idx, 0);
  append<int64_t>(idx, 1);
  write_bytes(p + ".idx", idx);
  std::string bin;
  append<float>(bin, 1.0f);
  append<float>(bin, 2.0f);
  write_bytes(p + ".bin", bin);
  IndexedDataset ds(p);
  EXPECT_EQ(ds.dtype(), IndexedDType::Float32);
  const std::string msg = error_of([&] { ds.document(0); });
  EXPECT_NE(msg.find("float32 elements cannot be read as token ids"), std::string::npos) << msg;
}

// Each corruption must fail with a message that names the file and the problem.
TEST_F(IndexedDatasetTest, ValidatesBrokenFiles) {
  const std::string good = prefix("good");
  build(good, IndexedDType::UInt16);
  const std::string idx = read_bytes(good + ".idx");
  const std::string bin = read_bytes(good + ".bin");

  struct Case {
    std::string name;
    std::function<void(std::string& idx, std::string& bin)> corrupt;
    std::string file;  // ".idx" or ".bin"
    std::string problem;
  };
  const std::vector<Case> cases = {
      {"magic", [](std::string& i, std::string&) { i[0] = 'X'; }, ".idx", "bad magic"},
      {"version", [](std::string& i, std::string&) { i[9] = 2; }, ".idx", "unsupported version 2"},
      {"dtype", [](std::string& i, std::string&) { i[17] = 9; }, ".idx", "unknown dtype code 9"},
      {"dtype0", [](std::string& i, std::string&) { i[17] = 0; }, ".idx", "unknown dtype code 0"},
      {"short_header", [](std::string& i, std::string&) { i.resize(20); }, ".idx", "truncated header"},
      {"truncated", [](std::string& i, std::string&) { i.resize(i.size() - 3); }, ".idx", "truncated"},
      {"huge_count", [](std::string& i, std::string&) { i[25] = 0x7f; }, ".idx", "truncated"},
      {"trailing", [](std::string& i, std::string&) { i.append(3, '\0'); }, ".idx", "unexpected bytes"},
      {"no_documents", [](std::string& i, std::string&) { std::memset(&i[26], 0, 8); }, ".idx",
       "document index is empty"},
      {"doc_start", [](std::string& i, std::string&) { i[34 + 4 * 4 + 8 * 4] = 1; }, ".idx",
       "document index starts at 1"},
      {"doc_end", [](std::string& i, std::string&) { i[34 + 4 * 4 + 8 * 4 + 8 * 5] = 3; }, ".idx",
       "document index ends at 3 but there are 4 sequences"},
      {"doc_decreasing", [](std::string& i, std::string&) { i[34 + 4 * 4 + 8 * 4 + 8 * 2] = 0; }, ".idx",
       "document index decreases at entry 2"},
      {"negative_length", [](std::string& i, std::string&) { std::memset(&i[34 + 4], 0xff, 4); }, ".idx",
       "negative length"},
      {"pointer_beyond_bin", [](std::string& i, std::string&) { i[34 + 4 * 4 + 8 * 3] = 100; }, ".idx",
       "beyond the end"},
      {"pointer_gap", [](std::string& i, std::string&) { i[34 + 4 * 4 + 8 * 1] = 4; }, ".idx",
       "starts at byte 4, expected 6"},
      {"bin_truncated", [](std::string&, std::string& b) { b.resize(b.size() - 2); }, ".idx",
       "beyond the end"},
      {"bin_longer", [](std::string&, std::string& b) { b.append(2, '\0'); }, ".idx", "do not match"},
      {"bin_odd", [](std::string&, std::string& b) { b.append(1, '\0'); }, ".bin", "not a multiple"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string i = idx;
    std::string b = bin;
    c.corrupt(i, b);
    const std::string p = prefix("bad_" + c.name);
    write_bytes(p + ".idx", i);
    write_bytes(p + ".bin", b);
    const std::string msg = error_of([&] { IndexedDataset ds(p); });
    EXPECT_NE(msg.find(p + c.file), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.problem), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }

  const std::string missing = prefix("missing");
  write_bytes(missing + ".idx", idx);
  const std::string msg = error_of([&] { IndexedDataset ds(missing); });
  EXPECT_NE(msg.find(missing + ".bin: cannot open"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { IndexedDataset ds(prefix("nothing")); }).find("nothing.idx: cannot open"),
            std::string::npos);
}

TEST(IndexedDType, OptimalDtypeAsMegatron) {
  EXPECT_EQ(indexed_dtype_for_vocab(257), IndexedDType::UInt16);
  EXPECT_EQ(indexed_dtype_for_vocab(50257), IndexedDType::UInt16);
  EXPECT_EQ(indexed_dtype_for_vocab(65499), IndexedDType::UInt16);
  EXPECT_EQ(indexed_dtype_for_vocab(65500), IndexedDType::Int32);
  EXPECT_EQ(indexed_dtype_for_vocab(128256), IndexedDType::Int32);
  EXPECT_EQ(indexed_dtype_size(IndexedDType::UInt16), 2);
  EXPECT_EQ(indexed_dtype_size(IndexedDType::Float64), 8);
}

// ---- preprocessing -------------------------------------------------------------------------

namespace {

// The paragraphs of a text file, split here independently of the library.
std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string line;
  std::string current;
  bool have = false;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (have) out.push_back(current);
      current.clear();
      have = false;
      continue;
    }
    current += (have ? "\n" : "") + line;
    have = true;
  }
  if (have) out.push_back(current);
  return out;
}

}  // namespace

TEST_F(IndexedDatasetTest, PreprocessesPlainTextByParagraph) {
  const std::string input = (source_dir() / "tests" / "data" / "sample.txt").string();
  const std::string text = read_bytes(input);
  ASSERT_GT(text.size(), 2000u);
  const std::vector<std::string> expected = paragraphs(text);
  ASSERT_GE(expected.size(), 5u);

  PreprocessOptions options;
  options.input = input;
  options.output_prefix = prefix("sample");
  options.tokenizer_type = "ByteLevel";
  options.append_eod = true;
  const PreprocessResult result = preprocess_data(options);
  ASSERT_EQ(result.prefixes, std::vector<std::string>{prefix("sample") + "_text_document"});
  EXPECT_EQ(result.documents, static_cast<int64_t>(expected.size()));

  IndexedDataset ds(result.prefixes[0]);
  EXPECT_EQ(ds.dtype(), IndexedDType::UInt16);
  ASSERT_EQ(ds.num_documents(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(ds.num_elements(), result.tokens);
  ByteLevelTokenizer tokenizer;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    std::vector<int32_t> ids = ds.document(d);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), ByteLevelTokenizer::kEod);
    ids.pop_back();
    EXPECT_EQ(tokenizer.decode(ids), expected[d]) << d;
  }

  // More workers, same bytes.
  options.workers = 3;
  options.output_prefix = prefix("sample3");
  preprocess_data(options);
  EXPECT_EQ(read_bytes(prefix("sample3") + "_text_document.bin"),
            read_bytes(prefix("sample") + "_text_document.bin"));
  EXPECT_EQ(read_bytes(prefix("sample3") + "_text_document.idx"),
            read_bytes(prefix("sample") + "_text_document.idx"));
}

TEST_F(IndexedDatasetTest, PreprocessesJsonLines) {
  const std::string input = (dir_ / "docs.jsonl").string();
  write_bytes(input,
              "{\"text\": \"hello\", \"title\": \"A\"}\n"
              "\n"
              "{\"text\": \"\", \"title\": \"B\"}\n"
              "{\"text\": [\"ab\", \"cd\"], \"title\": \"C\", \"other\": 1}\n");
  PreprocessOptions options;
  options.input = input;
  options.output_prefix = prefix("json");
  options.tokenizer_type = "ByteLevel";
  options.json_keys = {"text", "title"};
  options.append_eod = true;
  const PreprocessResult result = preprocess_data(options);
  ASSERT_EQ(result.prefixes.size(), 2u);
  EXPECT_EQ(result.documents, 3);
  IndexedDataset text(prefix("json") + "_text_document");
  ASSERT_EQ(text.num_documents(), 3);
  EXPECT_EQ(text.document(0), (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o', 256}));
  // An empty text stays a document, without tokens and without eod (as Megatron).
  EXPECT_TRUE(text.document(1).empty());
  EXPECT_EQ(text.document(2), (std::vector<int32_t>{'a', 'b', 'c', 'd', 256}));
  IndexedDataset title(prefix("json") + "_title_document");
  EXPECT_EQ(title.document(2), (std::vector<int32_t>{'C', 256}));

  // Problems name the line.
  write_bytes(input, "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  options.json_keys = {"text"};
  std::string msg = error_of([&] { preprocess_data(options); });
  EXPECT_NE(msg.find(input + ":2: no key \"text\""), std::string::npos) << msg;
  write_bytes(input, "{\"text\": \"ok\"\n");
  msg = error_of([&] { preprocess_data(options); });
  EXPECT_NE(msg.find(input + ":1: invalid JSON"), std::string::npos) << msg;
  write_bytes(input, "{\"text\": 5}\n");
  msg = error_of([&] { preprocess_data(options); });
  EXPECT_NE(msg.find("is not a string"), std::string::npos) << msg;
  // A failed run publishes nothing new and leaves no staging files.
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();

  options.input = (dir_ / "absent.jsonl").string();
  msg = error_of([&] { preprocess_data(options); });
  EXPECT_NE(msg.find("cannot open input"), std::string::npos) << msg;
}

TEST_F(IndexedDatasetTest, PreprocessesWithGpt2) {
  if (!fs::exists(gpt2_dir() / "encoder.json")) GTEST_SKIP() << "no GPT-2 files in " << gpt2_dir();
  const std::string input = (dir_ / "docs.jsonl").string();
  write_bytes(input, "{\"text\": \"Hello world\"}\n{\"text\": \"It's 2024 — café!\"}\n");
  PreprocessOptions options;
  options.input = input;
  options.output_prefix = prefix("gpt2");
  options.vocab_file = (gpt2_dir() / "encoder.json").string();
  options.merge_file = (gpt2_dir() / "vocab.bpe").string();
  options.append_eod = true;
  preprocess_data(options);
  IndexedDataset ds(prefix("gpt2") + "_text_document");
  EXPECT_EQ(ds.dtype(), IndexedDType::UInt16);  // 50257 < 65500, as Megatron
  GPT2Tokenizer t(options.vocab_file, options.merge_file);
  std::vector<int32_t> expected = t.encode("Hello world");
  EXPECT_EQ(expected, (std::vector<int32_t>{15496, 995}));
  expected.push_back(50256);
  EXPECT_EQ(ds.document(0), expected);
}

// Fine-tuning samples: the template of indexed_dataset.hpp (render_sft_sample), byte-level ids.
TEST_F(IndexedDatasetTest, RendersFineTuningSamples) {
  const ByteLevelTokenizer bytes;
  const auto ids = [](const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); };
  const auto cat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  PreprocessOptions pr;
  pr.prompt_key = "q";
  pr.response_key = "a";
  SftSample s = render_sft_sample(pr, bytes, R"({"q": "ab", "a": "c", "other": 1})");
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{'a', 'b', 'c', 256}));
  EXPECT_EQ(s.mask, (std::vector<uint8_t>{0, 0, 1, 1}));

  PreprocessOptions m;
  m.messages_key = "messages";
  s = render_sft_sample(
      m, bytes,
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},)"
      R"( {"role": "assistant", "content": "A"}, {"role": "user", "content": "v"}]})");
  EXPECT_EQ(s.tokens, cat({ids("<|system|>\ns\n<|user|>\nu\n<|assistant|>\nA\n<|user|>\nv\n"), {256}}));
  std::vector<uint8_t> mask(s.tokens.size(), 0);
  const std::size_t answer = std::string("<|system|>\ns\n<|user|>\nu\n<|assistant|>\n").size();
  mask[answer] = mask[answer + 1] = 1;  // "A\n"; the eod follows a user turn: 0
  EXPECT_EQ(s.mask, mask);

  const auto error = [&](const PreprocessOptions& o, const std::string& line) {
    return error_of([&] { render_sft_sample(o, bytes, line); });
  };
  EXPECT_EQ(error(pr, R"({"q": "x"})"), "no key \"a\"");
  EXPECT_EQ(error(pr, R"({"q": "x", "a": 3})"), "\"a\" is not a string");
  EXPECT_EQ(error(pr, R"(["q"])"), "expected a JSON object");
  EXPECT_EQ(error(pr, R"({"q": "x", "a": "y", "a": "z"})"), "key \"a\" appears twice in one object");
  EXPECT_EQ(error(m, R"({"messages": []})"),
            "\"messages\" is not a non-empty list of {role, content} objects");
  EXPECT_EQ(error(m, R"({"messages": [{"role": "tool", "content": "x"}]})"),
            "messages[0]: unknown role \"tool\" (system, user or assistant)");
  EXPECT_EQ(error(m, R"({"messages": [{"role": "user", "content": "x"}]})"),
            "\"messages\" has no assistant message: nothing to learn from");
  EXPECT_EQ(error(m, R"({"messages": [{"role": "assistant", "content": ["x"]}]})"),
            "messages[0]: \"content\" is not a string");
  EXPECT_EQ(error(m, R"({"messages": [3]})"), "messages[0]: expected a {role, content} object");
}
