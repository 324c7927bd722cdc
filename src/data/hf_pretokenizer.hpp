#pragma once
// The Split patterns of Hugging Face tokenizer.json pre-tokenizers that HFTokenizer implements, each
// recognised by its exact text and run by a hand-written scanner (std::regex has no \p{L}, and a
// regex engine would be a dependency for a handful of fixed patterns). Internal to the library.
//
//   Gpt2        GPT-2's pattern (ByteLevel with use_regex, or a Split with it)
//   Llama3      Llama 3's: case-insensitive contractions, digits in groups of up to 3
//   Qwen2       Qwen2's (and Qwen3's): Llama 3's with single digits
//   DeepSeekV3  DeepSeek-V3's Sequence of three Isolated Splits, applied in turn to each piece:
//               \p{N}{1,3}; runs of CJK ideographs and kana [U+4E00-U+9FA5 U+3040-U+30FF];
//               [ASCII punctuation][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
//               ' '?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
//
// Bytes that are not valid UTF-8 count as one character of no class (not a letter, number, space,
// mark, punctuation or symbol), so any byte string splits; the pieces concatenate back to the text.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace parallel::hf_pretokenizer {

enum class Pattern { Gpt2, Llama3, Qwen2, DeepSeekV3 };

// The Split regexes of a pre_tokenizer Sequence, in order -> the pattern they spell, or nullopt.
std::optional<Pattern> recognise(const std::vector<std::string>& regexes);

// A readable list of what recognise() accepts, for error messages.
std::string known_patterns();

// Appends the pieces of `text` to `pieces` (leftmost match first; for DeepSeekV3 also the text
// between matches, which an Isolated Split keeps as pieces of their own).
void split(Pattern pattern, std::string_view text, std::vector<std::string_view>& pieces);

}  // namespace parallel::hf_pretokenizer
