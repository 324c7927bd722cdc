#pragma once
// What GPT-2's tokenizer (gpt2_tokenizer.cpp) and Hugging Face's byte-level BPE
// (hf_tokenizer.cpp) share: UTF-8 decoding, GPT-2's byte-to-unicode alphabet and the merge loop.
// Internal to the library.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace parallel::byte_level_bpe {

// A marker for a byte that does not start a valid UTF-8 sequence.
inline constexpr char32_t kInvalid = 0xFFFFFFFF;

struct Decoded {
  char32_t cp;
  std::size_t length;
};

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF); anything else is one invalid byte.
Decoded decode_utf8(std::string_view s, std::size_t i);

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100 onwards in byte order, so that every token is printable text in the vocabulary files.
std::array<char32_t, 256> byte_to_unicode();

struct Merge {
  int32_t rank;
  int32_t merged;
};
inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
using MergeTable = std::unordered_map<uint64_t, Merge>;  // pair_key(left, right) -> rank, result

// Single-byte token ids -> BPE ids, in place: the lowest-ranked pair first, leftmost first among
// equals, until no pair has a rank (encoder.py's loop, and Hugging Face's word merge).
void merge(const MergeTable& merges, std::vector<int32_t>& word);

// One pre-tokenized piece's BPE ids (its bytes through byte_ids, then merge()), with the results
// of short pieces cached. Pieces repeat a lot in natural text (" the", ","). The cache is dropped
// when it grows past kMaxCache entries rather than managed as an LRU: simpler, and a corpus's
// frequent pieces come back within a few documents. Only pieces of at most kMaxCachedPiece bytes
// are kept, which bounds the cache's memory (about 2^20 x (64 bytes + ids + overheads)) however
// long the runs without white space in the input: such runs rarely repeat, and merge() is
// O(n log n) on them anyway. Thread-safe.
class CachedEncoder {
 public:
  // Appends the ids of `piece` to out.
  void encode(std::string_view piece, const std::array<int32_t, 256>& byte_ids, const MergeTable& merges,
              std::vector<int32_t>& out) const;

 private:
  static constexpr std::size_t kMaxCache = 1 << 20, kMaxCachedPiece = 64;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace parallel::byte_level_bpe
