#pragma once
// A line written whole or not at all: the log's stderr sink (log.cpp) and the append-only files
// (line_file.hpp: metrics.jsonl, TensorBoard's event files) both write through it, so that a full
// disk never leaves half a line behind and never stops training. It sits in the core, below the
// log, because the log uses it; LineFile builds its files on it one layer up.
#include <string_view>

namespace parallel {

// Writes `line` (which should end in '\n') to `fd` in as few write() calls as the kernel allows
// (one, unless it is interrupted or the file is a pipe taking the line in parts). Returns 0, or the
// errno of the failure; on a regular file, a line that could not be written whole is truncated away.
int write_whole_line(int fd, std::string_view line);

}  // namespace parallel
