// Fuzz target: a whole .safetensors file (8-byte header length, JSON header, data buffer) read by
// safetensors::load, which validates the header before it allocates or reads any tensor.
#include "fuzz_target.hpp"
#include "parallel/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  static const std::string path = (fuzz::scratch_dir() / "input.safetensors").string();
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  return fuzz::run_guarded([&] {
    const auto tensors = safetensors::load(path);
    // Every byte after the header belongs to exactly one tensor, so they cannot hold more than the file.
    uint64_t bytes = 0;
    for (const auto& [name, t] : tensors) bytes += t.nbytes();
    fuzz::require(bytes <= size, "tensors hold more bytes than the file");
  });
}
