#pragma once
// Append-only text files written one whole line at a time (metrics.jsonl; the log writes stderr the
// same way), so that a full disk never leaves half a line behind and never stops training.
//
// Each line goes out in a single write(2) (write_whole_line, whole_line.hpp). If the disk fills up mid-line
// (a short write followed by ENOSPC or EFBIG), the bytes already written are cut off again with ftruncate, so
// a reader only ever sees whole lines. A failed line is dropped, not retried: the next line is tried afresh
// (the disk may have room again by then).
//
// The same file also takes binary records whole (append_record: TensorBoard's event files, whose
// TFRecord framing must never end in half a record).
#include <cstdint>
#include <string>
#include <string_view>

#include "parallel/whole_line.hpp"

namespace parallel {

class LineFile {
 public:
  // Creates the parent directories and opens `path` for appending. Not being able to open it is an
  // error (parallel::Error naming the path and errno): that is caught at start-up, not mid-run.
  // `unit` names what is appended in the warnings ("line", "record").
  explicit LineFile(std::string path, std::string unit = "line");
  ~LineFile();
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;

  // Appends `line` and a '\n'. On failure logs one warning naming the file and the errno text (the
  // first failure only, and once more when writing works again) and returns false; never throws.
  bool append(std::string_view line);
  // Appends `bytes` as they are (no '\n' added), whole or not at all; failures as append().
  bool append_record(std::string_view bytes);

  const std::string& path() const { return path_; }
  int64_t dropped_lines() const { return dropped_; }  // lines (records) lost to write failures so far

 private:
  std::string path_, unit_;
  int fd_ = -1;
  int64_t dropped_ = 0;
  bool failing_ = false;  // the last append failed (a warning has been printed)
};

}  // namespace parallel
