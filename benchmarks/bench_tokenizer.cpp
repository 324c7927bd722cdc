// GPT-2 BPE encode time against input length: long runs without white space (one pre-tokenizer
// piece each, the case that made the old merge loop quadratic) and ordinary text.
//
//   ./bench_tokenizer [benchmark flags]
//   PARALLEL_GPT2_DIR=/path/to/gpt2 ./bench_tokenizer     (default: ../shared/data/gpt2 beside the checkout)
//
// Kinds: letters (random a-z A-Z), digits (random 0-9), punct (random ASCII punctuation), mixed
// (random letters of several scripts, 1-4 byte UTF-8, still one \p{L} run), text (tests/data/sample.txt
// repeated: English with white space, mostly BPE-cache hits). Each iteration encodes a freshly
// generated text (generation not timed), so a whole-piece cache can't answer the long runs.
// Time is wall clock per encode; bytes/s counts input bytes.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "parallel/tokenizer.hpp"

using namespace parallel;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() { return fs::path(__FILE__).parent_path().parent_path(); }

fs::path gpt2_dir() {
  if (const char* dir = std::getenv("PARALLEL_GPT2_DIR")) return dir;
  return source_dir() / ".." / "shared" / "data" / "gpt2";
}

const GPT2Tokenizer* tokenizer() {
  static std::unique_ptr<GPT2Tokenizer> t = [] {
    const fs::path dir = gpt2_dir();
    if (!fs::exists(dir / "encoder.json") || !fs::exists(dir / "vocab.bpe"))
      return std::unique_ptr<GPT2Tokenizer>();
    return std::make_unique<GPT2Tokenizer>((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
  }();
  return t.get();
}

enum Kind { kLetters, kDigits, kPunct, kMixed, kText };

std::string make_text(Kind kind, std::size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out;
  out.reserve(bytes + 4);
  static const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  static const std::string punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  static const std::vector<std::string> scripts = {"a", "e", "t", "é", "ß", "Ω", "ж", "中", "文", "한", "𝔸"};
  static const std::string sample = [] {
    std::ifstream in(source_dir() / "tests" / "data" / "sample.txt", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  switch (kind) {
    case kLetters:
      while (out.size() < bytes) out += letters[rng() % letters.size()];
      break;
    case kDigits:
      while (out.size() < bytes) out += static_cast<char>('0' + rng() % 10);
      break;
    case kPunct:
      while (out.size() < bytes) out += punct[rng() % punct.size()];
      break;
    case kMixed:
      while (out.size() < bytes) out += scripts[rng() % scripts.size()];
      break;
    case kText:
      if (sample.empty()) return std::string(bytes, 'x');
      while (out.size() < bytes) out += sample;
      out.resize(bytes);
      break;
  }
  return out;
}

void BM_Encode(benchmark::State& state) {
  const GPT2Tokenizer* t = tokenizer();
  if (t == nullptr) {
    state.SkipWithError("no GPT-2 files (encoder.json, vocab.bpe); set PARALLEL_GPT2_DIR");
    return;
  }
  const auto kind = static_cast<Kind>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1)) * 1000;
  uint32_t seed = 1;
  std::size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::string text = make_text(kind, bytes, seed++);
    state.ResumeTiming();
    const std::vector<int32_t> ids = t->encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["tokens"] = static_cast<double>(tokens);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int kind : {kLetters, kDigits, kPunct, kMixed, kText})
    for (int kb : {100, 200, 400, 800}) b->Args({kind, kb});
  b->ArgNames({"kind", "kb"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_Encode)->Apply(Args);

BENCHMARK_MAIN();
