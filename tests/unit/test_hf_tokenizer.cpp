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

#include "parallel/error.hpp"
#include "parallel/indexed_dataset.hpp"
#include "parallel/tokenizer.hpp"
#include "paths.hpp"
#include "tokenizer_fixtures.hpp"

namespace parallel {
namespace {

using json = nlohmann::json;
using parallel::testing::fixtures_dir;
using ::testing::HasSubstr;

using testing::load_json;
using testing::tokenizer_file;

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

// Llama 3's post_processor (Sequence[ByteLevel, TemplateProcessing "<|begin_of_text|> $A"], in the
// llama3 fixture as Meta's tokenizer.json has it): preprocess_data puts <|begin_of_text|> (id 0)
// before each non-empty document, and leaves it out with post_processor = false. The expected ids
// are built by hand from the template (the `tokenizers` library was not installed to record
// encode(text, add_special_tokens=True)): [0] + the recorded add_special_tokens=False ids + eod.
TEST(HfTokenizer, PreprocessDataPutsThePostProcessorsTemplateAroundDocuments) {
  const HFTokenizer llama(tokenizer_file("llama3"));
  EXPECT_EQ(llama.sequence_template().before, std::vector<int32_t>{0});
  EXPECT_TRUE(llama.sequence_template().after.empty());
  EXPECT_TRUE(HFTokenizer(tokenizer_file("qwen2")).sequence_template().before.empty());  // ByteLevel: none
  EXPECT_TRUE(HFTokenizer(tokenizer_file("gpt2")).sequence_template().before.empty());

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("test_hf_tokenizer_bos_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const json cases = load_json(fixtures_dir() + "/hf_tokenizer_ids.json").at("llama3");
  {
    std::ofstream out(dir / "in.jsonl");
    for (const auto& [name, c] : cases.items()) out << json{{"text", c.at("text")}}.dump() << "\n";
  }
  for (const bool template_on : {true, false}) {
    PreprocessOptions options;
    options.input = (dir / "in.jsonl").string();
    options.output_prefix = (dir / (template_on ? "on" : "off")).string();
    options.tokenizer_type = "HuggingFace";
    options.tokenizer_file = tokenizer_file("llama3");
    options.append_eod = true;
    options.post_processor = template_on;
    options.workers = 2;
    const IndexedDataset data(preprocess_data(options).prefixes.at(0));
    ASSERT_EQ(data.num_documents(), static_cast<int64_t>(cases.size()));
    int64_t d = 0;
    for (const auto& [name, c] : cases.items()) {
      std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
      if (!expected.empty()) {
        if (template_on) expected.insert(expected.begin(), 0);  // <|begin_of_text|>
        expected.push_back(1);                                  // <|end_of_text|>
      }
      EXPECT_EQ(data.document(d++), expected) << name << (template_on ? "" : " (post_processor off)");
    }
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

// The sequence template of a copy of the llama3 fixture whose post_processor is `p`.
Tokenizer::SequenceTemplate template_for(const json& p) {
  json j = load_json(tokenizer_file("llama3"));
  j["post_processor"] = p;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("test_hf_tokenizer_tp_" + std::to_string(::getpid()) + ".json"))
                               .string();
  std::ofstream(path) << j.dump();
  struct Remove {
    std::string path;
    ~Remove() { std::filesystem::remove(path); }
  } remove{path};
  return HFTokenizer(path).sequence_template();
}

std::string error_of_template(const json& p) {
  try {
    template_for(p);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(HfTokenizer, TemplateProcessingBeforeAndAfterTheSequence) {
  const json eos = {{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}};
  const json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  const json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json specials = {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {0}}}},
                         {"<|end_of_text|>", {{"id", "<|end_of_text|>"}, {"ids", {1}}}}};
  const Tokenizer::SequenceTemplate t = template_for(
      {{"type", "TemplateProcessing"}, {"single", {bos, a, eos, eos}}, {"special_tokens", specials}});
  EXPECT_EQ(t.before, std::vector<int32_t>{0});
  EXPECT_EQ(t.after, (std::vector<int32_t>{1, 1}));
  EXPECT_TRUE(template_for(nullptr).before.empty());
  EXPECT_THAT(
      error_of_template({{"type", "TemplateProcessing"}, {"single", {bos}}, {"special_tokens", specials}}),
      HasSubstr("expected one sequence $A"));
  EXPECT_THAT(error_of_template({{"type", "TemplateProcessing"}, {"single", {bos, a}}}),
              HasSubstr("special token '<|begin_of_text|>' has no ids"));
  // Another post-processor: the tokenizer still encodes; asking for its template is the error.
  EXPECT_THAT(error_of_template({{"type", "RobertaProcessing"}}),
              HasSubstr("post_processor.type = \"RobertaProcessing\": not supported"));
}

// Issue 24's probe: an added token with id 2^31 - 1 crashed the constructor (SIGSEGV), and vocab ids
// of 2^31 - 1 or 2^40 were a bare std::bad_alloc naming neither file nor key. Ids index a table of
// every token, so one far beyond the number of tokens is refused, naming the file and the key.
TEST(HfTokenizer, RefusesIdsFarBeyondItsTokens) {
  std::string e = error_for([](json& j) { j["added_tokens"][0]["id"] = 2147483647; });
  EXPECT_THAT(e, HasSubstr("added_tokens[0].id = 2147483647: out of range: ids must be < "));
  EXPECT_THAT(e, HasSubstr("HF tokenizer: "));
  EXPECT_THAT(e, HasSubstr(".json: "));
  e = error_for([](json& j) { j["model"]["vocab"]["!"] = 2147483647; });
  EXPECT_THAT(e, HasSubstr("model.vocab['!'] = 2147483647: out of range: ids must be < "));
  e = error_for([](json& j) { j["model"]["vocab"]["!"] = int64_t{1} << 40; });
  EXPECT_THAT(e, HasSubstr("model.vocab['!'] = 1099511627776: out of range"));
  e = error_for([](json& j) { j["added_tokens"][0]["id"] = "7"; });
  EXPECT_THAT(e, HasSubstr("added_tokens[0].id = \"7\": not an id"));
  e = error_for([](json& j) { j["added_tokens"][0]["content"] = 7; });
  EXPECT_THAT(e, HasSubstr("added_tokens[0] "));
  // A value of the wrong type anywhere else is one line naming the file, not a bare json exception.
  e = error_for([](json& j) { j["model"]["ignore_merges"] = "yes"; });
  EXPECT_THAT(e, HasSubstr("HF tokenizer: "));
}

TEST(HfTokenizer, RefusesWhatItDoesNotImplement) {
  EXPECT_THAT(error_for([](json& j) { j["model"]["type"] = "Unigram"; }),
              HasSubstr("model.type = \"Unigram\": only BPE"));
  EXPECT_THAT(error_for([](json& j) {
                j["normalizer"] = {{"type", "NFKC"}};
              }),
              HasSubstr("normalizer.type = \"NFKC\": not supported"));
  EXPECT_THAT(error_for([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; }),
              HasSubstr("pre_tokenizer pattern \"\\\\w+\": not supported"));
  EXPECT_THAT(error_for([](json& j) { j["model"]["dropout"] = 0.1; }), HasSubstr("model.dropout = 0.1"));
  EXPECT_THAT(error_for([](json& j) { j["model"]["byte_fallback"] = true; }), HasSubstr("byte_fallback"));
  EXPECT_THAT(error_for([](json& j) { j["added_tokens"][0]["single_word"] = true; }),
              HasSubstr("added token '<|begin_of_text|>': single_word = true is not supported"));
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
