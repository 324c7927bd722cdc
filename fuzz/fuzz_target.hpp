#pragma once
// Shared by the fuzz targets (fuzz/*.cpp). A target feeds one input to a parser and accepts exactly
// one way of failing: parallel::Error, the library's one-line error. Any other exception escapes
// LLVMFuzzerTestOneInput, terminates the process and counts as a finding, as do crashes, sanitizer
// reports, hangs (libFuzzer's -timeout) and large allocations (-malloc_limit_mb).
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "parallel/error.hpp"

namespace parallel::fuzz {

// A private directory for the files a parser must read from disk, made once per process and
// removed at exit (libFuzzer ends with exit(), so static destructors run).
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/parallel-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline const std::filesystem::path& scratch_dir() {
  static ScratchDir dir;
  return dir.path();
}

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::perror(("fuzz: cannot write " + path.string()).c_str());
    std::abort();
  }
}

// A property the parser's result must have (round trip, bounds): its failure is a finding.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: property violated: %s\n", what);
    std::abort();
  }
}

// Runs `parse`, swallowing parallel::Error only. PARALLEL_FUZZ_VERBOSE=1 prints each input's
// outcome (to check that seeds parse, or to read the message a crash input now gets).
template <typename F>
int run_guarded(F&& parse) {
  static const bool verbose = std::getenv("PARALLEL_FUZZ_VERBOSE") != nullptr;
  try {
    parse();
    if (verbose) std::fprintf(stderr, "  accepted\n");
  } catch (const parallel::Error& e) {
    if (verbose) std::fprintf(stderr, "  rejected: %s\n", e.what());
  }
  return 0;
}

}  // namespace parallel::fuzz
