#pragma once
// Reading the files a run is given (configs, tokenizers, safetensors, checkpoint indexes and shards,
// datasets), internal to the library: only regular files are opened, so a FIFO or a device named
// where a file is expected is refused at once instead of blocking the run forever. JSON without
// repeated keys: io/json_unique.hpp.
#include <string>
#include <string_view>

namespace parallel::io {

// Opens `path` read-only (close-on-exec) if it is a regular file (symbolic links followed). The open
// itself is non-blocking, so a FIFO without a writer returns at once; fstat then says what the path
// is. Returns the descriptor (blocking again), or -1 with `*reason` set: the errno text of the
// open, or e.g. "a FIFO (named pipe), not a regular file".
int open_regular(const std::string& path, std::string* reason);

// The whole of `path` (a regular file); throws parallel::Error "WHO: cannot open PATH: REASON" (or
// "cannot read" when reading fails).
std::string read_regular(const std::string& path, std::string_view who);

}  // namespace parallel::io
