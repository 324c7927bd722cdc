// The pre-tokenizer scanners of hf_pretokenizer.hpp. Each follows its regex alternative by
// alternative, leftmost alternative first, greedy, as Oniguruma (the `tokenizers` library's engine)
// matches it.
#include "hf_pretokenizer.hpp"

#include <cctype>

#include "byte_level_bpe.hpp"
#include "parallel/tokenizer.hpp"
#include "unicode_classes.hpp"

namespace parallel::hf_pretokenizer {
namespace {

using byte_level_bpe::decode_utf8;
using byte_level_bpe::kInvalid;

// The patterns, exactly as tokenizer.json writes them.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek-V3's three Splits. The JSON string holds U+3040 as the character (and CR, LF as the
// characters), not as escapes.
constexpr std::string_view kDeepSeekDigits = R"(\p{N}{1,3})";
constexpr std::string_view kDeepSeekCjk = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr std::string_view kDeepSeekRest =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

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

// ---- DeepSeek-V3 ----

bool is_letter_or_mark(char32_t cp) {
  return cp != kInvalid && (unicode_is_letter(cp) || unicode_is_mark(cp));
}
bool is_punct_or_symbol(char32_t cp) {
  return cp != kInvalid && (unicode_is_punctuation(cp) || unicode_is_symbol(cp));
}
bool is_number(char32_t cp) { return cp != kInvalid && unicode_is_number(cp); }
bool is_ws(char32_t cp) { return cp != kInvalid && unicode_is_space(cp); }
bool is_cjk(char32_t cp) { return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF); }
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]: every ASCII punctuation character and symbol.
bool is_ascii_punct(unsigned char c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
         (c >= 0x7B && c <= 0x7E);
}
bool is_ascii_letter(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// The end of the run of characters satisfying `in` from i.
template <typename F>
std::size_t run_cp(std::string_view s, std::size_t i, F&& in) {
  while (i < s.size()) {
    const byte_level_bpe::Decoded d = decode_utf8(s, i);
    if (!in(d.cp)) break;
    i += d.length;
  }
  return i;
}

// An Isolated Split by a pattern whose match at p is match(s, p) (p when none): the matches and the
// runs between them are the pieces.
template <typename M, typename F>
void isolated(std::string_view s, M&& match, F&& piece) {
  std::size_t gap = 0;
  for (std::size_t p = 0; p < s.size();) {
    const std::size_t end = match(s, p);
    if (end == p) {
      p += decode_utf8(s, p).length;
      continue;
    }
    if (gap < p) piece(s.substr(gap, p - gap));
    piece(s.substr(p, end - p));
    gap = p = end;
  }
  if (gap < s.size()) piece(s.substr(gap));
}

std::size_t match_deepseek_digits(std::string_view s, std::size_t p) {
  std::size_t e = p;
  for (int k = 0; k < 3 && e < s.size(); ++k) {
    const byte_level_bpe::Decoded d = decode_utf8(s, e);
    if (!is_number(d.cp)) break;
    e += d.length;
  }
  return e;
}

std::size_t match_deepseek_cjk(std::string_view s, std::size_t p) { return run_cp(s, p, is_cjk); }

std::size_t match_deepseek_rest(std::string_view s, std::size_t p) {
  const byte_level_bpe::Decoded c0 = decode_utf8(s, p);
  const std::size_t p1 = p + c0.length;
  // [ASCII punctuation][A-Za-z]+
  if (is_ascii_punct(static_cast<unsigned char>(s[p])) && p1 < s.size() &&
      is_ascii_letter(static_cast<unsigned char>(s[p1])))
    return run_cp(s, p1,
                  [](char32_t c) { return c < 0x80 && is_ascii_letter(static_cast<unsigned char>(c)); });
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+: a letter or mark starts a run of them; any other character
  // outside the excluded classes (space, digit, control, format, an invalid byte) may lead one.
  if (is_letter_or_mark(c0.cp)) return run_cp(s, p, is_letter_or_mark);
  const bool may_lead = c0.cp != '\r' && c0.cp != '\n' && !is_punct_or_symbol(c0.cp);
  if (may_lead && p1 < s.size() && is_letter_or_mark(decode_utf8(s, p1).cp))
    return run_cp(s, p1, is_letter_or_mark);
  //  ?[\p{P}\p{S}]+[\r\n]*
  const std::size_t q = s[p] == ' ' ? p1 : p;
  if (q < s.size() && is_punct_or_symbol(decode_utf8(s, q).cp)) {
    const std::size_t e = run_cp(s, q, is_punct_or_symbol);
    return run_cp(s, e, [](char32_t c) { return c == '\r' || c == '\n'; });
  }
  // \s*[\r\n]+ | \s+(?!\S) | \s+
  if (is_ws(c0.cp)) return whitespace(s, p, true);
  return p;
}

}  // namespace

std::optional<Pattern> recognise(const std::vector<std::string>& regexes) {
  if (regexes.size() == 1) {
    if (regexes[0] == kGpt2Pattern) return Pattern::Gpt2;
    if (regexes[0] == kLlama3Pattern) return Pattern::Llama3;
    if (regexes[0] == kQwen2Pattern) return Pattern::Qwen2;
  }
  if (regexes.size() == 3 && regexes[0] == kDeepSeekDigits && regexes[1] == kDeepSeekCjk &&
      regexes[2] == kDeepSeekRest)
    return Pattern::DeepSeekV3;
  return std::nullopt;
}

std::string known_patterns() { return "GPT-2's, Llama 3's and Qwen2's, or DeepSeek-V3's three"; }

void split(Pattern pattern, std::string_view text, std::vector<std::string_view>& pieces) {
  if (pattern == Pattern::DeepSeekV3) {
    isolated(text, match_deepseek_digits, [&](std::string_view a) {
      isolated(a, match_deepseek_cjk, [&](std::string_view b) {
        isolated(b, match_deepseek_rest, [&](std::string_view c) { pieces.push_back(c); });
      });
    });
    return;
  }
  for (std::size_t p = 0; p < text.size();) {
    const std::size_t end = pattern == Pattern::Gpt2     ? match_gpt2(text, p)
                            : pattern == Pattern::Llama3 ? match_llama(text, p, 3)
                                                         : match_llama(text, p, 1);
    pieces.push_back(text.substr(p, end - p));
    p = end;
  }
}

}  // namespace parallel::hf_pretokenizer
