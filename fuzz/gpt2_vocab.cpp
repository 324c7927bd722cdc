// Fuzz target: the GPT-2 tokenizer's files, a vocabulary (JSON token -> id) and a merge list, read
// by the GPT2Tokenizer constructor; a tokenizer that loads must then round-trip text.
// Input layout: vocabulary, NUL, merges, NUL, text (a missing part is empty).
#include <filesystem>

#include "fuzz_target.hpp"
#include "parallel/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  static const std::filesystem::path dir = fuzz::scratch_dir();
  std::string_view parts[3];
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (int i = 0; i < 3; ++i) {
    const std::size_t end = i < 2 ? rest.find('\0') : std::string_view::npos;
    parts[i] = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  fuzz::write_file(dir / "vocab.json", parts[0]);
  fuzz::write_file(dir / "merges.txt", parts[1]);
  return fuzz::run_guarded([&] {
    const GPT2Tokenizer tokenizer((dir / "vocab.json").string(), (dir / "merges.txt").string());
    fuzz::require(tokenizer.vocab_size() >= 257,
                  "a vocabulary without the 256 bytes and <|endoftext|> loaded");
    fuzz::require(tokenizer.token_bytes(tokenizer.eod()) == "<|endoftext|>", "eod is not <|endoftext|>");
    const std::vector<int32_t> ids = tokenizer.encode(parts[2]);
    for (int32_t id : ids) fuzz::require(id >= 0 && id < tokenizer.vocab_size(), "id outside the vocabulary");
    fuzz::require(tokenizer.decode(ids) == parts[2], "decode(encode(text)) != text");
  });
}
