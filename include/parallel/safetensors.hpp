#pragma once
// The safetensors file format (https://github.com/huggingface/safetensors), read and written
// without any other dependency:
//
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data buffer]
//
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin,
// end]} (byte offsets into the data buffer), plus an optional "__metadata__" map of strings. The
// tensors' byte ranges must tile the data buffer exactly: no gaps, no overlaps, nothing after.
//
// Supported dtypes: F32, BF16, F16, F8_E4M3, I32, I64, U8. Tensors are loaded onto the CPU.
#include <map>
#include <string>

#include "parallel/tensor.hpp"

namespace parallel::safetensors {

// The format's dtype names: "F32", "BF16", "F16", "F8_E4M3", "I32", "I64", "U8".
const char* format_name(DType t);
bool parse_format_name(const std::string& name, DType& out);  // false: not one of them

// Reads every tensor of the file. Any malformation (a file too short for its header, invalid JSON,
// an unknown dtype, a byte range that does not match the shape, ranges that overlap, leave holes or
// run past the end, bytes after the last tensor) throws parallel::Error naming the file and the
// problem.
std::map<std::string, Tensor> load(const std::string& path);

// Only the "__metadata__" map (empty when absent); validates the header like load().
std::map<std::string, std::string> load_metadata(const std::string& path);

// Writes the tensors (any device, any strides: they are copied to contiguous CPU memory) and the
// metadata. Atomic: the file is written to PATH.tmp.<pid>, fsynced, renamed over PATH, and the
// directory is fsynced, so a reader sees the old file or the whole new one, never a partial one.
void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          const std::map<std::string, std::string>& metadata = {});

}  // namespace parallel::safetensors
