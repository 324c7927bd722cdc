// The replay driver: a main() for a fuzz target's LLVMFuzzerTestOneInput when it is built without
// libFuzzer (GCC, the default build), so that ctest replays the committed corpus and crash inputs
// under the ordinary build. Arguments are files or directories (each file directly inside is one
// input, in name order). An argument with no inputs fails: an empty corpus must not pass silently.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::size_t total = 0;
  for (int a = 1; a < argc; ++a) {
    std::vector<fs::path> inputs;
    std::error_code ec;
    if (fs::is_directory(argv[a], ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(argv[a]))
        if (e.is_regular_file()) inputs.push_back(e.path());
      std::sort(inputs.begin(), inputs.end());
    } else if (fs::is_regular_file(argv[a], ec)) {
      inputs.emplace_back(argv[a]);
    }
    if (inputs.empty()) {
      std::fprintf(stderr, "replay: no inputs in %s\n", argv[a]);
      return 1;
    }
    for (const fs::path& path : inputs) {
      std::ifstream in(path, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.eof() && in.fail()) {
        std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
        return 1;
      }
      // A crash or sanitizer report names the input on stderr just above it.
      std::fprintf(stderr, "replay: %s\n", path.c_str());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++total;
    }
  }
  std::printf("replay: %zu inputs, no crash\n", total);
  return 0;
}
