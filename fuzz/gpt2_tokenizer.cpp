// Fuzz target: GPT-2 byte-level BPE, encode then decode, which must give the input back byte for
// byte (any byte string: invalid UTF-8 included) with every id inside the vocabulary.
// The vocabulary: $PARALLEL_FUZZ_GPT2_DIR (encoder.json + vocab.bpe or vocab.json + merges.txt), else the
// real GPT-2 files in ../shared/data/gpt2 beside the checkout, else the small committed fixture
// fuzz/gpt2_tiny (the first merges of GPT-2's).
#include <filesystem>
#include <memory>

#include "fuzz_target.hpp"
#include "parallel/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

std::unique_ptr<parallel::GPT2Tokenizer> make() {
  const fs::path source = PARALLEL_FUZZ_SOURCE_DIR;
  std::vector<std::pair<fs::path, fs::path>> candidates;
  if (const char* dir = std::getenv("PARALLEL_FUZZ_GPT2_DIR")) {
    candidates.emplace_back(fs::path(dir) / "encoder.json", fs::path(dir) / "vocab.bpe");
    candidates.emplace_back(fs::path(dir) / "vocab.json", fs::path(dir) / "merges.txt");
  }
  candidates.emplace_back(source / ".." / "shared" / "data" / "gpt2" / "encoder.json",
                          source / ".." / "shared" / "data" / "gpt2" / "vocab.bpe");
  candidates.emplace_back(source / "fuzz" / "gpt2_tiny" / "vocab.json",
                          source / "fuzz" / "gpt2_tiny" / "merges.txt");
  for (const auto& [vocab, merges] : candidates) {
    std::error_code ec;
    if (fs::exists(vocab, ec) && fs::exists(merges, ec)) {
      std::fprintf(stderr, "gpt2_tokenizer: vocabulary %s\n", vocab.c_str());
      return std::make_unique<parallel::GPT2Tokenizer>(vocab.string(), merges.string());
    }
  }
  std::fprintf(stderr, "gpt2_tokenizer: no vocabulary found (not even the fixture fuzz/gpt2_tiny)\n");
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  static const std::unique_ptr<GPT2Tokenizer> tokenizer = make();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  return fuzz::run_guarded([&] {
    const std::vector<int32_t> ids = tokenizer->encode(text);
    fuzz::require(ids.size() <= text.size(), "more tokens than bytes");
    for (int32_t id : ids)
      fuzz::require(id >= 0 && id < tokenizer->vocab_size() && id != tokenizer->eod(),
                    "id outside the vocabulary");
    fuzz::require(tokenizer->decode(ids) == text, "decode(encode(text)) != text");
  });
}
