// Fuzz target: Megatron's indexed dataset, PREFIX.idx and PREFIX.bin, opened by IndexedDataset
// (which validates everything up front) and then read back document by document.
// Input layout: a little-endian u16 n, then n bytes of .idx, then the rest as .bin.
#include <cstring>

#include "fuzz_target.hpp"
#include "parallel/indexed_dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  static const std::string prefix = (fuzz::scratch_dir() / "dataset").string();
  if (size < 2) return 0;
  uint16_t idx_size = 0;
  std::memcpy(&idx_size, data, 2);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::size_t n = std::min<std::size_t>(idx_size, rest.size());
  fuzz::write_file(prefix + ".idx", rest.substr(0, n));
  fuzz::write_file(prefix + ".bin", rest.substr(n));
  return fuzz::run_guarded([&] {
    const IndexedDataset ds(prefix);
    int64_t elements = 0;
    for (int64_t d = 0; d < ds.num_documents(); ++d) {
      fuzz::require(ds.document_begin(d) <= ds.document_end(d), "a document ends before it begins");
      try {
        elements += static_cast<int64_t>(ds.document(d).size());
      } catch (const Error&) {  // float dtypes and int64 values outside int32: per read, not per file
      }
    }
    for (int64_t s = 0; s < ds.num_sequences(); ++s)
      fuzz::require(ds.sequence_length(s) >= 0, "negative sequence length accepted");
    fuzz::require(ds.num_elements() * indexed_dtype_size(ds.dtype()) == static_cast<int64_t>(rest.size() - n),
                  "elements do not cover the .bin");
    fuzz::require(elements <= ds.num_elements(), "documents hold more elements than the .bin");
  });
}
