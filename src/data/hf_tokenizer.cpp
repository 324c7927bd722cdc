// Hugging Face tokenizer.json, BPE (see tokenizer.hpp). What `tokenizers` does for
// encode(text, add_special_tokens=False), in its order:
//   1. added tokens that are special or not normalized are cut out of the raw text (leftmost,
//      longest first; lstrip / rstrip take the white space beside them);
//   2. the rest is normalized (NFC, Prepend, Replace, a Sequence of them, or nothing) and the
//      normalized added tokens are cut out of it;
//   3. byte-level (a ByteLevel pre-tokenizer): the pieces between are split by the pre-tokenizer's
//      patterns (hf_pretokenizer.hpp), mapped to byte-level symbols and merged by BPE (a piece that
//      is a whole vocabulary token is taken as it is when the model sets ignore_merges, as Llama 3
//      does);
//      SentencePiece-style (no pre-tokenizer, or Metaspace): spaces become the replacement "▁" (by
//      the normalizer, or by Metaspace, which also prepends one and may split before each), and each
//      word's characters are its symbols: a character missing from the vocabulary becomes its UTF-8
//      bytes' <0xNN> tokens (byte_fallback) or the unk token (consecutive ones fused with fuse_unk),
//      then BPE merges them.
// decode() follows the decoder for SentencePiece-style files (Replace, ByteFallback, Fuse, Strip,
// Metaspace); byte-level files decode to the tokens' bytes, what their ByteLevel decoder gives.
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
#include "hf_pretokenizer.hpp"
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

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0;;) {
    const std::size_t at = s.find(from, i);
    if (at == std::string_view::npos) {
      out.append(s.substr(i));
      return out;
    }
    out.append(s.substr(i, at - i));
    out.append(to);
    i = at + from.size();
  }
}

// A normalizer of the chain (a Sequence is flattened into it).
struct NormalizerStep {
  enum Kind { Nfc, Prepend, Replace } kind;
  std::string from, to;  // Replace: every `from` by `to`; Prepend: `to` before a non-empty text
};

// A decoder of the chain (SentencePiece-style files), applied to the tokens' strings in turn.
struct DecoderStep {
  enum Kind { Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  std::string from{}, to{};     // Replace; Metaspace: from = the replacement
  char32_t content = 0;         // Strip
  int64_t start = 0, stop = 0;  // Strip
  bool strip_first = false;     // Metaspace: the first token drops its replacements (prepend_scheme)
};

enum class Prepend { Always, First, Never };

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
  // The model's vocabulary: byte-level, a token's bytes; SentencePiece-style, its text.
  std::unordered_map<std::string, int32_t> bytes_to_id;
  std::array<int32_t, 256> byte_ids{};
  byte_level_bpe::MergeTable merges;
  bool ignore_merges = false;
  std::vector<NormalizerStep> normalizers;

  bool byte_level = true;  // a ByteLevel pre-tokenizer; else SentencePiece-style
  // Byte-level.
  bool add_prefix_space = false;
  hf_pretokenizer::Pattern pattern = hf_pretokenizer::Pattern::Gpt2;
  // SentencePiece-style.
  bool metaspace = false;  // a Metaspace pre-tokenizer
  std::string replacement;
  Prepend prepend = Prepend::Always;
  bool metaspace_split = true;
  bool byte_fallback = false, fuse_unk = false;
  int32_t unk_id = -1;                           // none
  std::array<int32_t, 256> byte_fallback_ids{};  // <0xNN>, -1 where missing
  std::vector<DecoderStep> decoders;
  bool join_with_space = false;  // no decoder: the library joins the tokens with spaces
  std::string decoder_error;     // set: a decoder we do not implement (thrown by decode())

  AddedTokens raw_tokens, normalized_tokens;
  int32_t eod = -1;
  Tokenizer::SequenceTemplate sequence_template;
  std::string post_processor_error;     // set: a post-processor we do not implement (thrown on use)
  void parse(const nlohmann::json& j);  // the whole tokenizer.json
  void parse_post_processor(const nlohmann::json& p);
  void parse_template(const nlohmann::json& p);
  void parse_normalizer(const nlohmann::json& n);
  void parse_pre_tokenizer(const nlohmann::json& pre);
  void parse_decoder(const nlohmann::json& d);

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

  std::string normalize(std::string_view text) const {
    std::string out(text);
    for (const NormalizerStep& n : normalizers) {
      if (n.kind == NormalizerStep::Nfc)
        out = unicode_nfc(out);
      else if (n.kind == NormalizerStep::Prepend && !out.empty())
        out.insert(0, n.to);
      else if (n.kind == NormalizerStep::Replace)
        out = replace_all(out, n.from, n.to);
    }
    return out;
  }

  // SentencePiece-style BPE of one word, as the library's BPE::merge_word: each character is its
  // vocabulary token, else its bytes' <0xNN> tokens (byte_fallback, when all exist), else the unk
  // token (a run of them one token with fuse_unk; an unk waiting to be fused is written only when a
  // known character follows or the word ends, also after byte tokens, as the library does), else
  // nothing; then the merges. A byte that is not UTF-8 counts as one character (the library only
  // sees valid UTF-8).
  void bpe_characters(std::string_view word, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      const auto it = bytes_to_id.find(std::string(word));
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    bool unk_waiting = false;
    for (std::size_t i = 0; i < word.size();) {
      const std::size_t length = decode_utf8(word, i).length;
      const std::string_view c = word.substr(i, length);
      i += length;
      if (const auto it = bytes_to_id.find(std::string(c)); it != bytes_to_id.end()) {
        if (unk_waiting) symbols.push_back(unk_id), unk_waiting = false;
        symbols.push_back(it->second);
        continue;
      }
      if (byte_fallback && std::all_of(c.begin(), c.end(), [&](char b) {
            return byte_fallback_ids[static_cast<unsigned char>(b)] >= 0;
          })) {
        for (char b : c) symbols.push_back(byte_fallback_ids[static_cast<unsigned char>(b)]);
        continue;
      }
      if (unk_id < 0) continue;
      if (unk_waiting && !fuse_unk) symbols.push_back(unk_id);
      unk_waiting = true;
    }
    if (unk_waiting) symbols.push_back(unk_id);
    byte_level_bpe::merge(merges, symbols);
    out.insert(out.end(), symbols.begin(), symbols.end());
  }

  // The pre-tokenizer and BPE of one normalized piece; `first`: it starts the raw text (Metaspace's
  // prepend_scheme "first" prepends to that piece only).
  void pretokenize_and_bpe(std::string_view text, bool first, std::vector<int32_t>& out) const {
    if (!byte_level) {
      if (!metaspace) return bpe_characters(text, out);
      std::string s = replace_all(text, " ", replacement);
      if ((prepend == Prepend::Always || (prepend == Prepend::First && first)) &&
          s.compare(0, replacement.size(), replacement) != 0)
        s.insert(0, replacement);
      if (!metaspace_split) return bpe_characters(s, out);
      // Split before each replacement (MergedWithNext): "▁a▁▁b" is "▁a", "▁", "▁b".
      std::size_t start = 0,
                  from = s.compare(0, replacement.size(), replacement) == 0 ? replacement.size() : 0;
      for (std::size_t at; (at = s.find(replacement, from)) != std::string::npos;
           from = at + replacement.size()) {
        if (at > start) bpe_characters(std::string_view(s).substr(start, at - start), out);
        start = at;
      }
      if (start < s.size()) bpe_characters(std::string_view(s).substr(start), out);
      return;
    }
    std::string prefixed;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    std::vector<std::string_view> pieces;
    hf_pretokenizer::split(pattern, text, pieces);
    for (std::string_view piece : pieces) bpe(piece, out);
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

// null; NFC; Prepend; Replace with a String pattern; a Sequence of them.
void HFTokenizer::Impl::parse_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = n.is_object() ? n.value("type", std::string()) : std::string();
  if (type == "NFC") {
    normalizers.push_back({NormalizerStep::Nfc, "", ""});
  } else if (type == "Prepend" && n.contains("prepend") && n["prepend"].is_string()) {
    normalizers.push_back({NormalizerStep::Prepend, "", n["prepend"].get<std::string>()});
  } else if (type == "Replace") {
    if (!n.contains("pattern") || !n["pattern"].contains("String") || !n["pattern"]["String"].is_string() ||
        n["pattern"]["String"].get<std::string>().empty() || !n.contains("content") ||
        !n["content"].is_string())
      fail(fmt::format("normalizer Replace {}: not supported (only a non-empty String pattern and a content)",
                       n.dump()));
    normalizers.push_back({NormalizerStep::Replace, n["pattern"]["String"].get<std::string>(),
                           n["content"].get<std::string>()});
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& m : n["normalizers"]) parse_normalizer(m);
  } else {
    fail(
        fmt::format("normalizer.type = {}: not supported (null, NFC, Prepend, Replace with a String pattern "
                    "and a Sequence of them are)",
                    n.is_object() ? n.value("type", json()).dump() : n.dump()));
  }
}

// Byte-level: ByteLevel (GPT-2's pattern) or Sequence[Split(pattern)..., ByteLevel(no regex)].
// SentencePiece-style: null or Metaspace.
void HFTokenizer::Impl::parse_pre_tokenizer(const json& pre) {
  const std::string type = pre.is_object() ? pre.value("type", std::string()) : std::string();
  if (pre.is_null()) {
    byte_level = false;
    return;
  }
  if (type == "Metaspace") {
    byte_level = false;
    metaspace = true;
    replacement = pre.value("replacement", std::string());
    if (replacement.empty() || decode_utf8(replacement, 0).length != replacement.size() ||
        decode_utf8(replacement, 0).cp == kInvalid)
      fail(fmt::format("pre_tokenizer (Metaspace): replacement {} must be one character",
                       pre.value("replacement", json()).dump()));
    const std::string scheme = pre.value("prepend_scheme", std::string("always"));
    if (scheme == "always")
      prepend = Prepend::Always;
    else if (scheme == "first")
      prepend = Prepend::First;
    else if (scheme == "never")
      prepend = Prepend::Never;
    else
      fail(fmt::format("pre_tokenizer (Metaspace): prepend_scheme = {}: not one of always, first, never",
                       pre["prepend_scheme"].dump()));
    if (pre.contains("add_prefix_space") && !pre["add_prefix_space"].get<bool>() && prepend != Prepend::Never)
      fail(
          "pre_tokenizer (Metaspace): add_prefix_space = false contradicts prepend_scheme (the library "
          "refuses it too)");
    metaspace_split = pre.value("split", true);
    return;
  }
  auto byte_level_step = [&](const json& p, bool sequence) {
    if (p.value("type", std::string()) != "ByteLevel")
      fail(fmt::format("pre_tokenizer: {} where ByteLevel was expected", p.value("type", json()).dump()));
    add_prefix_space = p.value("add_prefix_space", false);
    if (sequence && (p.value("use_regex", true) || add_prefix_space))
      fail("pre_tokenizer: a ByteLevel after Split must have use_regex and add_prefix_space false");
    if (!sequence && !p.value("use_regex", true))
      fail("pre_tokenizer: ByteLevel without use_regex splits nothing");
  };
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() >= 2) {
    const json& steps = pre["pretokenizers"];
    std::vector<std::string> regexes;
    for (std::size_t i = 0; i + 1 < steps.size(); ++i) {
      const json& s = steps[i];
      if (s.value("type", std::string()) != "Split" || s.value("behavior", std::string()) != "Isolated" ||
          s.value("invert", false) || !s.contains("pattern") || !s["pattern"].contains("Regex"))
        fail(
            fmt::format("pre_tokenizer.pretokenizers[{}]: expected Split with a Regex pattern, behavior "
                        "Isolated, invert false",
                        i));
      regexes.push_back(s["pattern"]["Regex"].get<std::string>());
    }
    const std::optional<hf_pretokenizer::Pattern> known = hf_pretokenizer::recognise(regexes);
    if (!known)
      fail(fmt::format("pre_tokenizer pattern{} {}: not supported ({} are)", regexes.size() == 1 ? "" : "s",
                       regexes.size() == 1 ? json(regexes[0]).dump() : json(regexes).dump(),
                       hf_pretokenizer::known_patterns()));
    pattern = *known;
    byte_level_step(steps.back(), true);
  } else if (type == "ByteLevel") {
    byte_level_step(pre, false);
  } else {
    fail(
        fmt::format("pre_tokenizer.type = {}: expected ByteLevel, Sequence[Split..., ByteLevel], Metaspace "
                    "or null",
                    pre.is_object() ? pre.value("type", json()).dump() : pre.dump()));
  }
}

// SentencePiece-style decoders: Replace (String), ByteFallback, Fuse, Strip, Metaspace, a Sequence
// of them, or none. What else is found is an error of decode() only: encoding does not depend on it.
void HFTokenizer::Impl::parse_decoder(const json& d) {
  if (byte_level || !decoder_error.empty()) return;  // byte-level: the tokens' bytes
  const std::string type = d.is_object() ? d.value("type", std::string()) : std::string();
  const auto unsupported = [&](const std::string& why) {
    decoder_error = fmt::format("HF tokenizer: {}: decoder {}: not supported ({})", file, d.dump(), why);
  };
  if (d.is_null()) {
    join_with_space = true;
  } else if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    for (const json& e : d["decoders"]) parse_decoder(e);
  } else if (type == "Replace") {
    if (!d.contains("pattern") || !d["pattern"].contains("String") || !d["pattern"]["String"].is_string() ||
        d["pattern"]["String"].get<std::string>().empty() || !d.contains("content") ||
        !d["content"].is_string())
      return unsupported("only a non-empty String pattern");
    decoders.push_back(
        {DecoderStep::Replace, d["pattern"]["String"].get<std::string>(), d["content"].get<std::string>()});
  } else if (type == "ByteFallback") {
    decoders.push_back({DecoderStep::ByteFallback});
  } else if (type == "Fuse") {
    decoders.push_back({DecoderStep::Fuse});
  } else if (type == "Strip") {
    const std::string content = d.value("content", std::string());
    if (content.empty() || decode_utf8(content, 0).length != content.size())
      return unsupported("content must be one character");
    DecoderStep step{DecoderStep::Strip};
    step.content = decode_utf8(content, 0).cp;
    step.start = d.value("start", int64_t{0});
    step.stop = d.value("stop", int64_t{0});
    decoders.push_back(step);
  } else if (type == "Metaspace") {
    DecoderStep step{DecoderStep::Metaspace, d.value("replacement", std::string())};
    step.strip_first = d.value("prepend_scheme", std::string("always")) != "never";
    if (step.from.empty()) return unsupported("no replacement");
    decoders.push_back(step);
  } else {
    unsupported("Replace, ByteFallback, Fuse, Strip, Metaspace and a Sequence of them are");
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
      im.fail(
          fmt::format("model.{} = {}: not supported (the BPE of byte-level and SentencePiece-style "
                      "tokenizers has none)",
                      key, model[key].dump()));
  if (model.contains("dropout") && !model["dropout"].is_null())
    im.fail(
        fmt::format("model.dropout = {}: not supported (it makes encoding random)", model["dropout"].dump()));
  im.ignore_merges = model.value("ignore_merges", false);
  im.parse_normalizer(j.value("normalizer", json()));
  im.parse_pre_tokenizer(j.value("pre_tokenizer", json()));
  im.byte_fallback = model.value("byte_fallback", false);
  im.fuse_unk = model.value("fuse_unk", false);
  if (im.byte_level && im.byte_fallback)
    im.fail(
        "model.byte_fallback = true: not supported with a ByteLevel pre-tokenizer (every byte is a token)");

  // Vocabulary: byte-level, tokens in GPT-2's byte alphabet (added tokens may be written raw);
  // SentencePiece-style, tokens are their text.
  const std::array<char32_t, 256> b2u = byte_level_bpe::byte_to_unicode();
  std::unordered_map<char32_t, unsigned char> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<unsigned char>(b);
  auto unmap = [&](std::string_view token, std::string* bytes) {
    if (!im.byte_level) {
      bytes->assign(token);
      return true;
    }
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
  for (int b = 0; b < 256 && im.byte_level; ++b) {
    const auto it = im.bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == im.bytes_to_id.end())
      im.fail(fmt::format("byte 0x{:02X} has no token (not a byte-level vocabulary)", b));
    im.byte_ids[b] = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = im.bytes_to_id.find(fmt::format("<0x{:02X}>", b));
    im.byte_fallback_ids[b] = it == im.bytes_to_id.end() ? -1 : it->second;
  }
  // Only SentencePiece-style words can meet a character without a token (byte-level has all bytes).
  if (!im.byte_level && model.contains("unk_token") && !model["unk_token"].is_null()) {
    const std::string unk = model["unk_token"].get<std::string>();
    const auto it = im.bytes_to_id.find(unk);
    if (it == im.bytes_to_id.end())
      im.fail(fmt::format("model.unk_token = {}: not in model.vocab", model["unk_token"].dump()));
    im.unk_id = it->second;
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
      im.fail(fmt::format("merge {}: outside the byte alphabet", m.dump()));  // byte-level only
    const auto a = im.bytes_to_id.find(left), b = im.bytes_to_id.find(right),
               c = im.bytes_to_id.find(left + right);
    if (a == im.bytes_to_id.end() || b == im.bytes_to_id.end() || c == im.bytes_to_id.end())
      im.fail(fmt::format("merge {} uses or makes a token missing from model.vocab", m.dump()));
    im.merges.emplace(byte_level_bpe::pair_key(a->second, b->second), byte_level_bpe::Merge{rank, c->second});
    ++rank;
  }

  if (j.contains("post_processor")) im.parse_post_processor(j["post_processor"]);
  im.parse_decoder(j.value("decoder", json()));

  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>"})
    if (const auto it = added.find(name); it != added.end() && it->second.special) {
      im.eod = it->second.id;
      break;
    }
  if (im.eod < 0)
    im.fail(
        "no end-of-document token: none of the special tokens <|endoftext|>, <|end_of_text|>, </s>, <eos>, "
        "<｜end▁of▁sentence｜>");
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
        const bool at_start = piece.data() == text.data();
        const std::string normalized = im.normalize(piece);
        im.cut(
            normalized, im.normalized_tokens,
            [&](std::string_view rest) {
              im.pretokenize_and_bpe(rest, at_start && rest.data() == normalized.data(), ids);
            },
            token);
      },
      token);
  return ids;
}

namespace {

// ByteFallback's "<0xNN>" (Rust's u8::from_str_radix takes a '+' before one hex digit too).
int byte_of_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  const int hi = t[3] == '+' ? 0 : hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); i += decode_utf8(s, i).length)
    if (decode_utf8(s, i).cp == kInvalid) return false;
  return true;
}

void apply(const DecoderStep& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case DecoderStep::Replace:
      for (std::string& t : tokens) t = replace_all(t, step.from, step.to);
      return;
    case DecoderStep::ByteFallback: {
      // Runs of byte tokens become their bytes when those are UTF-8, else one U+FFFD per byte.
      std::vector<std::string> out;
      std::string bytes;
      auto flush = [&] {
        if (bytes.empty()) return;
        if (valid_utf8(bytes))
          out.push_back(bytes);
        else
          for (std::size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
        bytes.clear();
      };
      for (std::string& t : tokens) {
        if (const int b = byte_of_token(t); b >= 0) {
          bytes.push_back(static_cast<char>(b));
          continue;
        }
        flush();
        out.push_back(std::move(t));
      }
      flush();
      tokens = std::move(out);
      return;
    }
    case DecoderStep::Fuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case DecoderStep::Strip:
      // Up to `start` leading and `stop` trailing `content` characters of each token.
      for (std::string& t : tokens) {
        std::vector<std::size_t> starts;  // character boundaries
        for (std::size_t i = 0; i < t.size(); i += decode_utf8(t, i).length) starts.push_back(i);
        const std::size_t n = starts.size();
        std::size_t first = 0, last = n;
        while (first < n && static_cast<int64_t>(first) < step.start &&
               decode_utf8(t, starts[first]).cp == step.content)
          ++first;
        for (int64_t k = 0; k < step.stop && last > 0 && decode_utf8(t, starts[last - 1]).cp == step.content;
             ++k)
          --last;
        if (last < first) last = first;
        const std::size_t from = first < n ? starts[first] : t.size(),
                          to = last < n ? starts[last] : t.size();
        t = t.substr(from, to - from);
      }
      return;
    case DecoderStep::Metaspace:
      // The replacement is a space again; in the first token it goes (prepend_scheme not "never").
      for (std::size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = replace_all(tokens[i], step.from, i == 0 && step.strip_first ? "" : " ");
      return;
  }
}

}  // namespace

std::string HFTokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !im.valid[id])
      throw Error(fmt::format("HF tokenizer: id {} is not a token of {}", id, im.file));
    tokens.push_back(im.id_to_bytes[id]);
  }
  if (!im.decoder_error.empty()) throw Error(im.decoder_error);
  if (!im.byte_level)
    for (const DecoderStep& step : im.decoders) apply(step, tokens);
  std::string text;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 && im.join_with_space) text += ' ';
    text += tokens[i];
  }
  return text;
}

int64_t HFTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_bytes.size()); }

int32_t HFTokenizer::eod() const { return impl_->eod; }

}  // namespace parallel
