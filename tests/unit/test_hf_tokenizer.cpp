// HFTokenizer (tokenizer.hpp) against the `tokenizers` library: ids recorded by
// tests/reference/make_hf_tokenizers.py for Llama-3-, Qwen2- and GPT-2-shaped tokenizer.json files
// it trained, on texts with code, non-Latin scripts, emoji, white space runs, special tokens and
// combining marks; then the refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallel/error.hpp"
#include "parallel/indexed_dataset.hpp"
#include "parallel/tokenizer.hpp"
#include "paths.hpp"

namespace parallel {
namespace {

using json = nlohmann::json;
using parallel::testing::fixtures_dir;
using ::testing::HasSubstr;

json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;  // committed fixtures: missing is a failure
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

std::string tokenizer_file(const std::string& kind) {
  return fixtures_dir() + "/hf_tokenizer_" + kind + ".json";
}

class HfTokenizerIds : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerIds, MatchTheTokenizersLibrary) {
  const std::string kind = GetParam();
  const HFTokenizer tokenizer(tokenizer_file(kind));
  const json cases = load_json(fixtures_dir() + "/hf_tokenizer_ids.json").at(kind);
  ASSERT_GE(cases.size(), 20u);
  int64_t tokens = 0;
  for (const auto& [name, c] : cases.items()) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tokenizer.encode(text);
    EXPECT_EQ(ids, expected) << kind << " / " << name << ": " << text;
    tokens += static_cast<int64_t>(ids.size());
    // Decoding gives the text back (Qwen2's: its NFC form, which the encoding saw).
    if (kind != "qwen2") EXPECT_EQ(tokenizer.decode(ids), text) << kind << " / " << name;
  }
  EXPECT_GT(tokens, 500);
}

INSTANTIATE_TEST_SUITE_P(Kinds, HfTokenizerIds, ::testing::Values("llama3", "qwen2", "gpt2"));

TEST(HfTokenizer, SpecialTokensAndEod) {
  const HFTokenizer llama(tokenizer_file("llama3"));
  EXPECT_EQ(llama.eod(), 1);  // <|end_of_text|>
  EXPECT_EQ(llama.encode("<|begin_of_text|>"), std::vector<int32_t>{0});
  EXPECT_EQ(llama.decode(llama.encode("<|eot_id|><tool>")), "<|eot_id|><tool>");
  EXPECT_EQ(llama.vocab_size(), 702);
  EXPECT_EQ(llama.name(), "HuggingFace");
  const HFTokenizer qwen(tokenizer_file("qwen2"));
  EXPECT_EQ(qwen.eod(), 0);  // <|endoftext|>
  // NFC before BPE: a decomposed e + acute encodes as the composed character.
  EXPECT_EQ(qwen.encode("cafe\xCC\x81"), qwen.encode("caf\xC3\xA9"));
  EXPECT_EQ(qwen.decode(qwen.encode("cafe\xCC\x81")), "caf\xC3\xA9");
  // Bytes that are not UTF-8 still encode (byte-level) and decode back.
  const std::string bad = "ok \xFF\xFE x\xC3";
  EXPECT_EQ(llama.decode(llama.encode(bad)), bad);
  EXPECT_EQ(qwen.decode(qwen.encode(bad)), bad);
  auto t = make_tokenizer("HuggingFace", "", "", tokenizer_file("gpt2"));
  EXPECT_EQ(t->name(), "HuggingFace");
}

TEST(HfTokenizer, PreprocessDataWritesItsIds) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("test_hf_tokenizer_pp_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const json cases = load_json(fixtures_dir() + "/hf_tokenizer_ids.json").at("qwen2");
  std::vector<std::string> texts;
  {
    std::ofstream out(dir / "in.jsonl");
    for (const auto& [name, c] : cases.items()) {
      texts.push_back(c.at("text").get<std::string>());
      out << json{{"text", texts.back()}}.dump() << "\n";
    }
  }
  PreprocessOptions options;
  options.input = (dir / "in.jsonl").string();
  options.output_prefix = (dir / "out").string();
  options.tokenizer_type = "HuggingFace";
  options.tokenizer_file = tokenizer_file("qwen2");
  options.append_eod = true;
  options.workers = 2;
  const PreprocessResult result = preprocess_data(options);
  const IndexedDataset data(result.prefixes.at(0));
  ASSERT_EQ(data.num_documents(), static_cast<int64_t>(texts.size()));
  std::size_t d = 0;
  for (const auto& [name, c] : cases.items()) {
    std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
    if (!expected.empty()) expected.push_back(0);  // <|endoftext|>, after every non-empty document
    const std::vector<int32_t> got = data.document(static_cast<int64_t>(d));
    EXPECT_EQ(got, expected) << name;
    ++d;
  }
  std::filesystem::remove_all(dir);
}

// The error of constructing from a copy of the llama3 fixture edited by `edit`.
template <typename F>
std::string error_for(F&& edit) {
  json j = load_json(tokenizer_file("llama3"));
  edit(j);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("test_hf_tokenizer_" + std::to_string(::getpid()) + ".json"))
          .string();
  std::ofstream(path) << j.dump();
  std::string what;
  try {
    HFTokenizer t(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  std::filesystem::remove(path);
  return what;
}

TEST(HfTokenizer, RefusesWhatItDoesNotImplement) {
  EXPECT_THAT(error_for([](json& j) { j["model"]["type"] = "Unigram"; }),
              HasSubstr("model.type = \"Unigram\": only BPE"));
  EXPECT_THAT(error_for([](json& j) {
                j["normalizer"] = {{"type", "NFKC"}};
              }),
              HasSubstr("normalizer.type = \"NFKC\": not implemented"));
  EXPECT_THAT(error_for([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; }),
              HasSubstr("pre_tokenizer pattern \"\\\\w+\": not implemented"));
  EXPECT_THAT(error_for([](json& j) { j["model"]["dropout"] = 0.1; }), HasSubstr("model.dropout = 0.1"));
  EXPECT_THAT(error_for([](json& j) { j["model"]["byte_fallback"] = true; }), HasSubstr("byte_fallback"));
  EXPECT_THAT(error_for([](json& j) { j["added_tokens"][0]["single_word"] = true; }),
              HasSubstr("added token '<|begin_of_text|>': single_word = true is not implemented"));
  EXPECT_THAT(error_for([](json& j) { j["added_tokens"][1]["special"] = false; }),
              HasSubstr("no end-of-document token"));
  EXPECT_THAT(error_for([](json& j) {
                j["model"]["merges"].push_back(json::array({"zz", "q"}));
              }),
              HasSubstr("uses or makes a token missing from model.vocab"));
  EXPECT_THAT(error_for([](json& j) { j["model"]["vocab"].erase("A"); }),
              HasSubstr("byte 0x41 has no token"));
}

}  // namespace
}  // namespace parallel
