// Hugging Face tokenizer.json, byte-level BPE (see tokenizer.hpp). What `tokenizers` does for
// encode(text, add_special_tokens=False), in its order:
//   1. added tokens that are special or not normalized are cut out of the raw text (leftmost,
//      longest first; lstrip / rstrip take the white space beside them);
//   2. the rest is normalized (NFC, or nothing) and the normalized added tokens are cut out of it;
//   3. the pieces between are split by the pre-tokenizer's pattern (GPT-2's, Llama 3's or Qwen2's,
//      each a hand-written scanner: std::regex has no \p{L}, and a regex engine is a dependency for
//      three patterns), mapped to byte-level symbols and merged by BPE (a piece that is a whole
//      vocabulary token is taken as it is when the model sets ignore_merges, as Llama 3 does).
#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "byte_level_bpe.hpp"
#include "io/input_file.hpp"
#include "io/json_unique.hpp"
#include "parallel/error.hpp"
#include "parallel/tokenizer.hpp"
#include "unicode_nfc.hpp"

namespace parallel {
namespace {

using json = nlohmann::json;
using byte_level_bpe::decode_utf8;
using byte_level_bpe::kInvalid;

// The pre-tokenizer patterns we implement, exactly as tokenizer.json writes them.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum class Split { Gpt2, Llama3, Qwen2 };

enum class Cls { Letter, Number, Space, Newline, Other };

struct Char {
  Cls cls;
  char32_t cp;
  std::size_t length;
};

Char char_at(std::string_view s, std::size_t i) {
  const byte_level_bpe::Decoded d = decode_utf8(s, i);
  Cls cls = Cls::Other;
  if (d.cp == '\r' || d.cp == '\n')
    cls = Cls::Newline;
  else if (d.cp == kInvalid)
    cls = Cls::Other;
  else if (unicode_is_letter(d.cp))
    cls = Cls::Letter;
  else if (unicode_is_number(d.cp))
    cls = Cls::Number;
  else if (unicode_is_space(d.cp))
    cls = Cls::Space;
  return {cls, d.cp, d.length};
}
bool is_space(Cls c) { return c == Cls::Space || c == Cls::Newline; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at p: the end, or p. Case-insensitive as Oniguruma's Unicode
// folding: 's' also matches U+017F (long s), 'k' is not among the letters.
std::size_t contraction(std::string_view s, std::size_t p) {
  if (s[p] != '\'') return p;
  auto letter = [&](std::size_t i, char want, std::size_t* len) {
    if (i >= s.size()) return false;
    const char c = static_cast<char>(s[i] | 0x20);
    if (static_cast<unsigned char>(s[i]) < 0x80 && c == want &&
        std::isalpha(static_cast<unsigned char>(s[i]))) {
      *len = 1;
      return true;
    }
    if (want == 's' && s.substr(i, 2) == "\xC5\xBF") {  // U+017F
      *len = 2;
      return true;
    }
    return false;
  };
  std::size_t a = 0, b = 0;
  for (char c : {'s', 't', 'm', 'd'})
    if (letter(p + 1, c, &a)) return p + 1 + a;
  for (const char* two : {"re", "ve", "ll"})
    if (letter(p + 1, two[0], &a) && letter(p + 1 + a, two[1], &b)) return p + 1 + a + b;
  return p;
}

// The end of the run of characters whose class satisfies `in` from i.
template <typename F>
std::size_t run(std::string_view s, std::size_t i, F&& in) {
  while (i < s.size()) {
    const Char c = char_at(s, i);
    if (!in(c.cls)) break;
    i += c.length;
  }
  return i;
}

// The white space alternatives shared by the patterns, at p where s[p] is white space:
// Llama 3 / Qwen2 first try \s*[\r\n]+ (up to the run's last newline), then all: \s+(?!\S) (the run
// less its last character when text follows), \s+.
std::size_t whitespace(std::string_view s, std::size_t p, bool newline_alternative) {
  std::size_t end = p, last_start = p, after_newline = p;
  int count = 0;
  while (end < s.size()) {
    const Char c = char_at(s, end);
    if (!is_space(c.cls)) break;
    last_start = end;
    end += c.length;
    if (c.cls == Cls::Newline) after_newline = end;
    ++count;
  }
  if (newline_alternative && after_newline > p) return after_newline;
  if (end == s.size() || count == 1) return end;
  return last_start;
}

std::size_t match_gpt2(std::string_view s, std::size_t p) {
  if (s[p] == '\'' && p + 1 < s.size()) {
    const char c = s[p + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return p + 2;
    const std::string_view two = s.substr(p + 1, 2);
    if (two == "re" || two == "ve" || two == "ll") return p + 3;
  }
  const std::size_t q = s[p] == ' ' ? p + 1 : p;
  if (q < s.size()) {
    const Char c = char_at(s, q);
    if (!is_space(c.cls)) {
      const Cls cls = c.cls;
      return run(s, q + c.length, [&](Cls x) { return x == cls; });
    }
  }
  return whitespace(s, p, false);
}

std::size_t match_llama(std::string_view s, std::size_t p, int max_digits) {
  if (const std::size_t e = contraction(s, p); e > p) return e;
  const Char c0 = char_at(s, p);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0.cls == Cls::Letter) return run(s, p, [](Cls x) { return x == Cls::Letter; });
  if (c0.cls == Cls::Other || c0.cls == Cls::Space) {
    const std::size_t q = p + c0.length;
    if (q < s.size() && char_at(s, q).cls == Cls::Letter)
      return run(s, q, [](Cls x) { return x == Cls::Letter; });
  }
  // \p{N}{1,max}
  if (c0.cls == Cls::Number) {
    std::size_t e = p;
    for (int k = 0; k < max_digits && e < s.size(); ++k) {
      const Char c = char_at(s, e);
      if (c.cls != Cls::Number) break;
      e += c.length;
    }
    return e;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const std::size_t q = s[p] == ' ' ? p + 1 : p;
  if (q < s.size() && char_at(s, q).cls == Cls::Other) {
    const std::size_t e = run(s, q, [](Cls x) { return x == Cls::Other; });
    return run(s, e, [](Cls x) { return x == Cls::Newline; });
  }
  return whitespace(s, p, true);
}

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, lstrip, rstrip, normalized;
};

// Added tokens by their first byte, longest first: a match is tried only where one can start.
struct AddedTokens {
  std::vector<AddedToken> all;
  std::array<std::vector<const AddedToken*>, 256> by_first_byte;
  void index() {
    std::stable_sort(all.begin(), all.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
    for (const AddedToken& t : all) by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(&t);
  }
};

}  // namespace

struct HFTokenizer::Impl {
  std::string file;
  std::vector<std::string> id_to_bytes;  // empty and !valid for ids no token has
  std::vector<bool> valid;
  std::unordered_map<std::string, int32_t> bytes_to_id;  // the model's vocabulary
  std::array<int32_t, 256> byte_ids{};
  byte_level_bpe::MergeTable merges;
  bool ignore_merges = false;
  bool nfc = false;
  bool add_prefix_space = false;
  Split split = Split::Gpt2;
  AddedTokens raw_tokens, normalized_tokens;
  int32_t eod = -1;
  Tokenizer::SequenceTemplate sequence_template;
  std::string post_processor_error;     // set: a post-processor we do not implement (thrown on use)
  void parse(const nlohmann::json& j);  // the whole tokenizer.json
  void parse_post_processor(const nlohmann::json& p);
  void parse_template(const nlohmann::json& p);

  byte_level_bpe::CachedEncoder encoder;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("HF tokenizer: {}: {}", file, what));
  }

  // Cuts `tokens` out of `text`: calls piece(text) for the text between, token(id) for each match.
  template <typename P, typename T>
  void cut(std::string_view text, const AddedTokens& tokens, P&& piece, T&& token) const {
    std::size_t done = 0, i = 0;
    while (i < text.size()) {
      const AddedToken* found = nullptr;
      for (const AddedToken* t : tokens.by_first_byte[static_cast<unsigned char>(text[i])])
        if (text.compare(i, t->content.size(), t->content) == 0) {
          found = t;  // longest first
          break;
        }
      if (found == nullptr) {
        ++i;
        continue;
      }
      std::size_t start = i, end = i + found->content.size();
      auto space_before = [&](std::size_t at, std::size_t* len) {
        for (std::size_t l = 1; l <= 4 && l <= at - done; ++l) {
          const byte_level_bpe::Decoded d = decode_utf8(text, at - l);
          if (d.length == l && d.cp != kInvalid) {
            *len = l;
            return unicode_is_space(d.cp);
          }
        }
        return false;
      };
      std::size_t len = 0;
      if (found->lstrip)
        while (start > done && space_before(start, &len)) start -= len;
      if (found->rstrip)
        while (end < text.size()) {
          const byte_level_bpe::Decoded d = decode_utf8(text, end);
          if (d.cp == kInvalid || !unicode_is_space(d.cp)) break;
          end += d.length;
        }
      if (start > done) piece(text.substr(done, start - done));
      token(found->id);
      done = i = end;
    }
    if (done < text.size()) piece(text.substr(done));
  }

  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      const auto it = bytes_to_id.find(std::string(piece));
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    encoder.encode(piece, byte_ids, merges, out);
  }

  void pretokenize_and_bpe(std::string_view text, std::vector<int32_t>& out) const {
    std::string prefixed;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    for (std::size_t p = 0; p < text.size();) {
      const std::size_t end = split == Split::Gpt2     ? match_gpt2(text, p)
                              : split == Split::Llama3 ? match_llama(text, p, 3)
                                                       : match_llama(text, p, 1);
      bpe(text.substr(p, end - p), out);
      p = end;
    }
  }
};

// TemplateProcessing's "single": [{"SpecialToken": {"id": NAME}} | {"Sequence": {"id": "A"}}, ...],
// NAME's ids in "special_tokens": {NAME: {"ids": [...]}}.
void HFTokenizer::Impl::parse_template(const json& p) {
  const auto bad = [&](const std::string& what) {
    fail(fmt::format("post_processor (TemplateProcessing): {}", what));
  };
  if (!p.contains("single") || !p["single"].is_array()) bad("missing key 'single'");
  const json specials = p.value("special_tokens", json::object());
  bool seen_a = false;
  for (const json& item : p["single"]) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", std::string()) != "A" || seen_a)
        bad(fmt::format("single = {}: expected one sequence $A", p["single"].dump()));
      seen_a = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", std::string());
      if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        bad(fmt::format("special token '{}' has no ids in special_tokens", name));
      for (const json& id : specials[name]["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= static_cast<int64_t>(id_to_bytes.size()) || !valid[id.get<int64_t>()])
          bad(fmt::format("special token '{}': id {} is not in the vocabulary", name, id.dump()));
        (seen_a ? sequence_template.after : sequence_template.before).push_back(id.get<int32_t>());
      }
    } else {
      bad(fmt::format("single item {}: expected SpecialToken or Sequence", item.dump()));
    }
  }
  if (!seen_a) bad(fmt::format("single = {}: expected one sequence $A", p["single"].dump()));
}

void HFTokenizer::Impl::parse_post_processor(const json& p) {
  if (p.is_null()) return;
  const std::string type = p.is_object() ? p.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") return parse_template(p);
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const json& q : p["processors"]) parse_post_processor(q);
    return;
  }
  post_processor_error = fmt::format(
      "HF tokenizer: {}: post_processor.type = {}: not supported (TemplateProcessing, ByteLevel and a "
      "Sequence of them are; preprocess_data --no-post-processor leaves it out)",
      file, json(type).dump());
}

HFTokenizer::HFTokenizer(const std::string& tokenizer_file) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.file = tokenizer_file;
  if (tokenizer_file.empty()) throw Error("HF tokenizer: needs a tokenizer.json (--tokenizer-file)");
  json j;
  try {
    io::DuplicateKey duplicate;
    j = io::parse_unique_keys(io::read_regular(tokenizer_file, "HF tokenizer"), &duplicate);
    if (!duplicate.key.empty())
      im.fail(
          fmt::format("key '{}' appears twice in one object (at depth {})", duplicate.key, duplicate.depth));
  } catch (const json::exception& e) {
    im.fail(fmt::format("not valid JSON: {}", e.what()));
  }
  try {
    im.parse(j);
  } catch (const json::exception& e) {  // a value of the wrong type where the format has one
    im.fail(fmt::format("unexpected value: {}", e.what()));
  }
}

void HFTokenizer::Impl::parse(const json& j) {
  Impl& im = *this;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) im.fail("missing key 'model'");
  const json& model = j["model"];
  if (model.value("type", std::string()) != "BPE")
    im.fail(fmt::format("model.type = {}: only BPE is implemented", model.value("type", json()).dump()));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      im.fail(fmt::format("model.{} = {}: not supported (byte-level BPE has none)", key, model[key].dump()));
  if (model.contains("dropout") && !model["dropout"].is_null())
    im.fail(
        fmt::format("model.dropout = {}: not supported (it makes encoding random)", model["dropout"].dump()));
  if (model.value("byte_fallback", false)) im.fail("model.byte_fallback = true: not supported");
  im.ignore_merges = model.value("ignore_merges", false);

  // The normalizer: none or NFC.
  const json normalizer = j.value("normalizer", json());
  if (!normalizer.is_null()) {
    if (normalizer.value("type", std::string()) != "NFC")
      im.fail(fmt::format("normalizer.type = {}: not supported (only null or NFC)",
                          normalizer.value("type", json()).dump()));
    im.nfc = true;
  }

  // The pre-tokenizer: ByteLevel (GPT-2's pattern) or Sequence[Split(pattern), ByteLevel(no regex)].
  const json pre = j.value("pre_tokenizer", json());
  auto byte_level = [&](const json& p, bool sequence) {
    if (p.value("type", std::string()) != "ByteLevel")
      im.fail(fmt::format("pre_tokenizer: {} where ByteLevel was expected", p.value("type", json()).dump()));
    im.add_prefix_space = p.value("add_prefix_space", false);
    if (sequence && (p.value("use_regex", true) || im.add_prefix_space))
      im.fail("pre_tokenizer: a ByteLevel after Split must have use_regex and add_prefix_space false");
    if (!sequence && !p.value("use_regex", true))
      im.fail("pre_tokenizer: ByteLevel without use_regex splits nothing");
  };
  if (pre.is_object() && pre.value("type", std::string()) == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2) {
    const json& s = pre["pretokenizers"][0];
    if (s.value("type", std::string()) != "Split" || s.value("behavior", std::string()) != "Isolated" ||
        s.value("invert", false) || !s.contains("pattern") || !s["pattern"].contains("Regex"))
      im.fail("pre_tokenizer: expected Split with a Regex pattern, behavior Isolated, invert false");
    const std::string pattern = s["pattern"]["Regex"].get<std::string>();
    if (pattern == kLlama3Pattern)
      im.split = Split::Llama3;
    else if (pattern == kQwen2Pattern)
      im.split = Split::Qwen2;
    else if (pattern == kGpt2Pattern)
      im.split = Split::Gpt2;
    else
      im.fail(fmt::format("pre_tokenizer pattern {}: not supported (GPT-2's, Llama 3's and Qwen2's are)",
                          json(pattern).dump()));
    byte_level(pre["pretokenizers"][1], true);
  } else if (pre.is_object()) {
    byte_level(pre, false);
  } else {
    im.fail("pre_tokenizer: expected ByteLevel or Sequence[Split, ByteLevel]");
  }

  // Vocabulary: tokens in GPT-2's byte alphabet; added tokens may be written raw.
  const std::array<char32_t, 256> b2u = byte_level_bpe::byte_to_unicode();
  std::unordered_map<char32_t, unsigned char> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<unsigned char>(b);
  auto unmap = [&](std::string_view token, std::string* bytes) {
    bytes->clear();
    for (std::size_t i = 0; i < token.size();) {
      const byte_level_bpe::Decoded d = decode_utf8(token, i);
      const auto it = d.cp == kInvalid ? u2b.end() : u2b.find(d.cp);
      if (it == u2b.end()) return false;
      bytes->push_back(static_cast<char>(it->second));
      i += d.length;
    }
    return true;
  };
  if (!model.contains("vocab") || !model["vocab"].is_object()) im.fail("missing key 'model.vocab'");
  // Ids index a table of every token: a real vocabulary numbers its tokens densely from 0 (the added
  // tokens after or among them), so an id beyond twice the number of tokens is a corrupt or hostile
  // file, never a table of billions of empty rows (an id of 2^31 - 1 was a crash, 2^40 a bare
  // std::bad_alloc).
  const json empty_list = json::array();
  const json& added_list =
      j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : empty_list;
  const int64_t tokens = static_cast<int64_t>(model["vocab"].size() + added_list.size());
  const int64_t id_limit = std::max<int64_t>(2 * tokens, 256);
  const auto check_id = [&](const std::string& where, const json& id) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      im.fail(fmt::format("{} = {}: not an id (a non-negative integer)", where, id.dump()));
    if (id.is_number_unsigned() ? id.get<uint64_t>() >= static_cast<uint64_t>(id_limit)
                                : id.get<int64_t>() >= id_limit)
      im.fail(fmt::format(
          "{} = {}: out of range: ids must be < {} (twice the {} tokens of model.vocab and added_tokens)",
          where, id.dump(), id_limit, tokens));
    return static_cast<int32_t>(id.get<int64_t>());
  };
  std::map<std::string, AddedToken> added;
  for (std::size_t i = 0; i < added_list.size(); ++i) {
    const json& t = added_list[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    if (!t.is_object() || !t.contains("id") || !t.contains("content") || !t["content"].is_string() ||
        t["content"].get<std::string>().empty())
      im.fail(fmt::format("{} {}: needs an id and content", where, t.dump()));
    AddedToken a{check_id(where + ".id", t["id"]), t["content"].get<std::string>(),
                 t.value("special", false),        t.value("lstrip", false),
                 t.value("rstrip", false),         t.value("normalized", true)};
    if (t.value("single_word", false))
      im.fail(fmt::format("added token '{}': single_word = true is not supported", a.content));
    added[a.content] = a;
  }
  int64_t size = 0;
  for (const auto& [token, id] : model["vocab"].items())
    size = std::max<int64_t>(size, check_id(fmt::format("model.vocab['{}']", token), id) + 1);
  for (const auto& [content, a] : added) size = std::max<int64_t>(size, int64_t{a.id} + 1);
  im.id_to_bytes.resize(static_cast<std::size_t>(size));
  im.valid.assign(static_cast<std::size_t>(size), false);
  std::string bytes;
  for (const auto& [token, value] : model["vocab"].items()) {
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (im.valid[id]) im.fail(fmt::format("model.vocab: id {} appears twice", id));
    if (!unmap(token, &bytes)) {
      if (!added.count(token))
        im.fail(
            fmt::format("model.vocab: token '{}' has a character outside the byte-level alphabet", token));
      bytes = token;
    } else {
      im.bytes_to_id.emplace(bytes, id);
    }
    im.id_to_bytes[id] = bytes;
    im.valid[id] = true;
  }
  for (const auto& [content, a] : added) {
    im.id_to_bytes[a.id] = content;
    im.valid[a.id] = true;
    (a.special || !a.normalized ? im.raw_tokens : im.normalized_tokens).all.push_back(a);
  }
  im.raw_tokens.index();
  im.normalized_tokens.index();
  for (int b = 0; b < 256; ++b) {
    const auto it = im.bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == im.bytes_to_id.end())
      im.fail(fmt::format("byte 0x{:02X} has no token (not a byte-level vocabulary)", b));
    im.byte_ids[b] = it->second;
  }

  // Merges, in rank order: "left right" strings or [left, right] pairs.
  if (!model.contains("merges") || !model["merges"].is_array()) im.fail("missing key 'model.merges'");
  int32_t rank = 0;
  std::string left, right;
  for (const json& m : model["merges"]) {
    std::string l, r;
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const std::size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        im.fail(fmt::format("merge {}: expected 'left right'", m.dump()));
      l = text.substr(0, space), r = text.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      l = m[0].get<std::string>(), r = m[1].get<std::string>();
    } else {
      im.fail(fmt::format("merge {}: expected 'left right' or [left, right]", m.dump()));
    }
    if (!unmap(l, &left) || !unmap(r, &right))
      im.fail(fmt::format("merge {}: outside the byte alphabet", m.dump()));
    const auto a = im.bytes_to_id.find(left), b = im.bytes_to_id.find(right),
               c = im.bytes_to_id.find(left + right);
    if (a == im.bytes_to_id.end() || b == im.bytes_to_id.end() || c == im.bytes_to_id.end())
      im.fail(fmt::format("merge {} uses or makes a token missing from model.vocab", m.dump()));
    im.merges.emplace(byte_level_bpe::pair_key(a->second, b->second), byte_level_bpe::Merge{rank, c->second});
    ++rank;
  }

  if (j.contains("post_processor")) im.parse_post_processor(j["post_processor"]);

  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (const auto it = added.find(name); it != added.end() && it->second.special) {
      im.eod = it->second.id;
      break;
    }
  if (im.eod < 0)
    im.fail(
        "no end-of-document token: none of the special tokens <|endoftext|>, <|end_of_text|>, </s>, <eos>");
}

HFTokenizer::~HFTokenizer() = default;

Tokenizer::SequenceTemplate HFTokenizer::sequence_template() const {
  if (!impl_->post_processor_error.empty()) throw Error(impl_->post_processor_error);
  return impl_->sequence_template;
}

std::vector<int32_t> HFTokenizer::encode(std::string_view text) const {
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  auto token = [&](int32_t id) { ids.push_back(id); };
  im.cut(
      text, im.raw_tokens,
      [&](std::string_view piece) {
        const std::string normalized = im.nfc ? unicode_nfc(piece) : std::string(piece);
        im.cut(
            normalized, im.normalized_tokens,
            [&](std::string_view rest) { im.pretokenize_and_bpe(rest, ids); }, token);
      },
      token);
  return ids;
}

std::string HFTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !impl_->valid[id])
      throw Error(fmt::format("HF tokenizer: id {} is not a token of {}", id, impl_->file));
    text += impl_->id_to_bytes[id];
  }
  return text;
}

int64_t HFTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_bytes.size()); }

int32_t HFTokenizer::eod() const { return impl_->eod; }

}  // namespace parallel
