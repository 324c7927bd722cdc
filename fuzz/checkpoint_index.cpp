// Fuzz target: a checkpoint step directory's index.json, read by checkpoint::read_info (parse, then
// validate_index: files, dtypes, shard boxes inside their tensor, no overlap, full coverage).
#include <filesystem>

#include "fuzz_target.hpp"
#include "parallel/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  static const std::filesystem::path step_dir = [] {
    std::filesystem::path dir = fuzz::scratch_dir() / "step_00000001";
    std::filesystem::create_directories(dir);
    return dir;
  }();
  fuzz::write_file(step_dir / "index.json", {reinterpret_cast<const char*>(data), size});
  return fuzz::run_guarded([&] {
    const checkpoint::CheckpointInfo info = checkpoint::read_info(step_dir.string(), "");
    fuzz::require(info.step_dir == step_dir.string(), "read_info resolved another directory");
  });
}
