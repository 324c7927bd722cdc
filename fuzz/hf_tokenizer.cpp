// Fuzz target: HFTokenizer (src/data/hf_tokenizer.cpp, hf_pretokenizer.cpp) encoding any bytes with
// each committed tokenizer.json fixture. The first byte picks the fixture (byte % 7), the rest is the
// text. Every id must be inside the vocabulary and decode() must not fail; the byte-level fixtures
// without a normalizer (GPT-2's, Llama 3's and DeepSeek-V3's layouts) must give the text back byte
// for byte (invalid UTF-8 included). SentencePiece-style decoding is not an inverse (the legacy
// normalizer's extra "▁", <0xNN> written as text, U+FFFD for bytes that are not UTF-8), so those
// fixtures only check the ids and that decoding succeeds.
#include <array>
#include <filesystem>
#include <memory>

#include "fuzz_target.hpp"
#include "parallel/tokenizer.hpp"

namespace {

constexpr std::array<const char*, 7> kFixtures = {"gpt2",   "llama3",  "deepseek_v3", "qwen2",
                                                  "llama2", "mistral", "spm_unk"};
constexpr std::size_t kRoundTrip = 3;  // the first three: byte-level, no normalizer

const parallel::HFTokenizer& tokenizer(std::size_t i) {
  static const std::array<std::unique_ptr<parallel::HFTokenizer>, kFixtures.size()> all = [] {
    std::array<std::unique_ptr<parallel::HFTokenizer>, kFixtures.size()> t;
    const std::filesystem::path dir =
        std::filesystem::path(PARALLEL_FUZZ_SOURCE_DIR) / "tests" / "reference" / "fixtures";
    for (std::size_t k = 0; k < kFixtures.size(); ++k)
      t[k] = std::make_unique<parallel::HFTokenizer>(
          (dir / (std::string("hf_tokenizer_") + kFixtures[k] + ".json")).string());
    return t;
  }();
  return *all[i];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  if (size == 0) return 0;
  const std::size_t which = data[0] % kFixtures.size();
  const HFTokenizer& t = tokenizer(which);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  return fuzz::run_guarded([&] {
    const std::vector<int32_t> ids = t.encode(text);
    for (int32_t id : ids) fuzz::require(id >= 0 && id < t.vocab_size(), "id outside the vocabulary");
    const std::string decoded = t.decode(ids);
    if (which < kRoundTrip) fuzz::require(decoded == text, "decode(encode(text)) != text");
  });
}
