// HFTokenizer (tokenizer.hpp) for the SentencePiece-style BPE of Llama 2 / Mistral / Mixtral and for
// DeepSeek-V3's byte-level BPE, against the `tokenizers` library: ids of encode(text) with and
// without the special tokens, and decode(ids), recorded by tests/reference/make_hf_tokenizer_families.py
// for tokenizer.json files it trained with those families' exact components, on texts with leading
// and repeated spaces, newlines, digits, CJK, emoji and characters outside the vocabulary (byte
// fallback or <unk>), special tokens inside the text and the empty string; then the refusals.
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

const json& recorded() {
  static const json j = load_json(fixtures_dir() + "/hf_tokenizer_families_ids.json");
  return j;
}

// A copy of a fixture edited by `edit` in a temporary file, removed with this object.
struct EditedTokenizer {
  std::string path;
  template <typename F>
  EditedTokenizer(const std::string& kind, F&& edit) {
    json j = load_json(tokenizer_file(kind));
    edit(j);
    static int serial = 0;
    path = (std::filesystem::temp_directory_path() /
            ("test_hf_tokenizer_families_" + std::to_string(::getpid()) + "_" + std::to_string(serial++) +
             ".json"))
               .string();
    std::ofstream(path) << j.dump();
  }
  ~EditedTokenizer() { std::filesystem::remove(path); }
};

// Every recorded case of `cases` (an object of {"text", "ids", "ids_template", "decoded"}).
void expect_cases(const HFTokenizer& tokenizer, const json& cases, const std::string& what) {
  const Tokenizer::SequenceTemplate t = tokenizer.sequence_template();
  for (const auto& [name, c] : cases.items()) {
    if (!c.is_object() || !c.contains("text")) continue;
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tokenizer.encode(text);
    EXPECT_EQ(ids, expected) << what << " / " << name << ": " << text;
    std::vector<int32_t> with_template = t.before;
    with_template.insert(with_template.end(), ids.begin(), ids.end());
    with_template.insert(with_template.end(), t.after.begin(), t.after.end());
    EXPECT_EQ(with_template, c.at("ids_template").get<std::vector<int32_t>>()) << what << " / " << name;
    EXPECT_EQ(tokenizer.decode(expected), c.at("decoded").get<std::string>()) << what << " / " << name;
  }
}

class HfTokenizerFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerFamilies, MatchTheTokenizersLibrary) {
  const std::string kind = GetParam();
  const HFTokenizer tokenizer(tokenizer_file(kind));
  const json& cases = recorded().at(kind);
  ASSERT_GE(cases.size(), 35u);
  expect_cases(tokenizer, cases, kind);
}

INSTANTIATE_TEST_SUITE_P(Kinds, HfTokenizerFamilies,
                         ::testing::Values("llama2", "mistral", "spm_unk", "deepseek_v3"));

// One value changed (fuse_unk off, byte_fallback off, prepend_scheme "never", Metaspace split on, no
// decoder, a Prepend-only normalizer, a legacy Metaspace with add_prefix_space, a Metaspace decoder):
// the library's ids and decodes for the same edit.
TEST(HfTokenizerFamilies, VariantsMatchTheTokenizersLibrary) {
  int variants = 0;
  for (const auto& [name, v] : recorded().items()) {
    if (!v.contains("pointer")) continue;
    const EditedTokenizer edited(v.at("tokenizer").get<std::string>(), [&](json& j) {
      j[json::json_pointer(v.at("pointer").get<std::string>())] = v.at("value");
    });
    expect_cases(HFTokenizer(edited.path), v, name);
    ++variants;
  }
  EXPECT_EQ(variants, 8);
}

TEST(HfTokenizerFamilies, DecodeByteTokensThatAreNotUtf8) {
  const HFTokenizer llama(tokenizer_file("llama2"));
  const json& cases = recorded().at("llama2_decode");
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& [name, c] : cases.items())
    EXPECT_EQ(llama.decode(c.at("ids").get<std::vector<int32_t>>()), c.at("decoded").get<std::string>())
        << name;
  // The two bytes of an incomplete sequence are two U+FFFD, as the library has it.
  EXPECT_EQ(cases.at("invalid_utf8").at("decoded").get<std::string>().substr(0, 6),
            "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(HfTokenizerFamilies, SpecialTokensEodAndTemplate) {
  const HFTokenizer llama(tokenizer_file("llama2"));
  EXPECT_EQ(llama.eod(), 2);                                             // </s>
  EXPECT_EQ(llama.sequence_template().before, std::vector<int32_t>{1});  // <s>
  EXPECT_TRUE(llama.sequence_template().after.empty());
  EXPECT_EQ(llama.vocab_size(), 856);
  // Byte fallback: a character outside the vocabulary is its UTF-8 bytes' <0xNN> tokens (ids 3 + byte).
  const std::vector<int32_t> snowman = llama.encode("\xE2\x98\x83");  // U+2603, not in the vocabulary
  ASSERT_EQ(snowman.size(), 4u);                                      // "▁" then three bytes
  EXPECT_EQ(std::vector<int32_t>(snowman.begin() + 1, snowman.end()),
            (std::vector<int32_t>{3 + 0xE2, 3 + 0x98, 3 + 0x83}));
  const HFTokenizer deepseek(tokenizer_file("deepseek_v3"));
  EXPECT_EQ(deepseek.eod(), 1);                                             // <｜end▁of▁sentence｜>
  EXPECT_EQ(deepseek.sequence_template().before, std::vector<int32_t>{0});  // <｜begin▁of▁sentence｜>
  // Bytes that are not UTF-8 still encode (byte-level) and decode back.
  const std::string bad = "ok \xFF\xFE 12\xC3";
  EXPECT_EQ(deepseek.decode(deepseek.encode(bad)), bad);
  auto t = make_tokenizer("HuggingFace", "", "", tokenizer_file("mistral"));
  EXPECT_EQ(t->name(), "HuggingFace");
  EXPECT_EQ(t->eod(), 2);
}

// preprocess_data puts <s> before each non-empty document and </s> after it, as for Llama 3.
TEST(HfTokenizerFamilies, PreprocessDataWritesTheLibrarysIds) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("test_hf_tokenizer_families_pp_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const json& cases = recorded().at("llama2");
  {
    std::ofstream out(dir / "in.jsonl");
    for (const auto& [name, c] : cases.items()) out << json{{"text", c.at("text")}}.dump() << "\n";
  }
  PreprocessOptions options;
  options.input = (dir / "in.jsonl").string();
  options.output_prefix = (dir / "out").string();
  options.tokenizer_type = "HuggingFace";
  options.tokenizer_file = tokenizer_file("llama2");
  options.append_eod = true;
  options.workers = 2;
  const IndexedDataset data(preprocess_data(options).prefixes.at(0));
  ASSERT_EQ(data.num_documents(), static_cast<int64_t>(cases.size()));
  int64_t d = 0;
  for (const auto& [name, c] : cases.items()) {
    std::vector<int32_t> expected;
    if (!c.at("ids").empty()) {
      expected = c.at("ids_template").get<std::vector<int32_t>>();  // the library's <s> + ids
      expected.push_back(2);                                        // </s>
    }
    EXPECT_EQ(data.document(d++), expected) << name;
  }
  std::filesystem::remove_all(dir);
}

// The one-line error of reading a copy of fixture `kind` edited by `edit`.
template <typename F>
std::string error_for(const std::string& kind, F&& edit) {
  const EditedTokenizer edited(kind, edit);
  try {
    HFTokenizer t(edited.path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  return "";
}

TEST(HfTokenizerFamilies, RefusesWhatItDoesNotImplement) {
  EXPECT_THAT(
      error_for("llama2",
                [](json& j) {
                  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
                }),
      HasSubstr("normalizer Replace {\"content\":\"▁\",\"pattern\":{\"Regex\":\" +\"},\"type\":\"Replace\"}: "
                "not supported"));
  EXPECT_THAT(error_for("llama2",
                        [](json& j) {
                          j["normalizer"]["normalizers"][0] = {{"type", "Lowercase"}};
                        }),
              HasSubstr("normalizer.type = \"Lowercase\": not supported"));
  EXPECT_THAT(error_for("mistral", [](json& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; }),
              HasSubstr("prepend_scheme = \"sometimes\": not one of always, first, never"));
  EXPECT_THAT(error_for("mistral", [](json& j) { j["pre_tokenizer"]["replacement"] = "ab"; }),
              HasSubstr("replacement \"ab\" must be one character"));
  EXPECT_THAT(error_for("mistral",
                        [](json& j) {
                          j["pre_tokenizer"] = {{"type", "Whitespace"}};
                        }),
              HasSubstr("pre_tokenizer.type = \"Whitespace\": expected ByteLevel"));
  EXPECT_THAT(error_for("mistral", [](json& j) { j["model"]["unk_token"] = "<oov>"; }),
              HasSubstr("model.unk_token = \"<oov>\": not in model.vocab"));
  EXPECT_THAT(error_for("mistral", [](json& j) { j["model"]["dropout"] = 0.1; }),
              HasSubstr("model.dropout = 0.1"));
  EXPECT_THAT(error_for("mistral", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
              HasSubstr("model.continuing_subword_prefix = \"##\": not supported"));
  EXPECT_THAT(error_for("deepseek_v3", [](json& j) { j["model"]["byte_fallback"] = true; }),
              HasSubstr("model.byte_fallback = true: not supported with a ByteLevel pre-tokenizer"));
  // DeepSeek-V3's three patterns only as they are, in their order.
  EXPECT_THAT(
      error_for("deepseek_v3",
                [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}"; }),
      HasSubstr("pre_tokenizer patterns [\"\\\\p{N}\","));
  EXPECT_THAT(error_for("deepseek_v3",
                        [](json& j) {
                          std::swap(j["pre_tokenizer"]["pretokenizers"][0],
                                    j["pre_tokenizer"]["pretokenizers"][1]);
                        }),
              HasSubstr("not supported (GPT-2's, Llama 3's and Qwen2's, or DeepSeek-V3's three are)"));
  EXPECT_THAT(
      error_for("deepseek_v3",
                [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["behavior"] = "Removed"; }),
      HasSubstr("pre_tokenizer.pretokenizers[1]: expected Split with a Regex pattern, behavior Isolated"));
  EXPECT_THAT(error_for("deepseek_v3", [](json& j) { j["added_tokens"][1]["special"] = false; }),
              HasSubstr("no end-of-document token"));
}

// A decoder we do not implement does not change ids: the tokenizer encodes, decode() is the error.
TEST(HfTokenizerFamilies, AnUnknownDecoderIsAnErrorOfDecodeOnly) {
  const EditedTokenizer edited("llama2", [](json& j) { j["decoder"]["decoders"][3] = {{"type", "CTC"}}; });
  const HFTokenizer llama(edited.path);
  const std::vector<int32_t> ids = llama.encode("Hello world");
  EXPECT_EQ(ids, HFTokenizer(tokenizer_file("llama2")).encode("Hello world"));
  try {
    llama.decode(ids);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("decoder {\"type\":\"CTC\"}: not supported"));
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace parallel
