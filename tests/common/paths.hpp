#pragma once
// Where tests find the checkout: $PARALLEL_SOURCE_DIR (ctest sets it), else this header's location.
#include <cstdlib>
#include <filesystem>
#include <string>

namespace parallel::testing {

inline std::filesystem::path source_dir() {
  if (const char* dir = std::getenv("PARALLEL_SOURCE_DIR")) return dir;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();  // tests/common/..
}

// The committed PyTorch fixtures: a missing file is a failure, never a skip.
inline std::string fixtures_dir() { return (source_dir() / "tests" / "reference" / "fixtures").string(); }

// The real GPT-2 tokenizer files in ../shared beside the checkout; absent in a fresh clone, where
// the tests that need them skip.
inline std::filesystem::path gpt2_dir() { return source_dir() / ".." / "shared" / "data" / "gpt2"; }

}  // namespace parallel::testing
