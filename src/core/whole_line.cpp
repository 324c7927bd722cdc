// One line, one write(2), whole or not at all (include/parallel/whole_line.hpp).
#include "parallel/whole_line.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace parallel {

int write_whole_line(int fd, std::string_view line) {
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = n < 0 ? errno : EIO;  // write() returning 0 for a non-empty buffer: treat as EIO
    if (done > 0) {
      // Part of the line reached a regular file: cut it off so that the file ends in a whole line.
      // After an appending write the offset is just past our bytes, so the line began `done` before.
      struct stat st {};
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        const off_t end = ::lseek(fd, 0, SEEK_CUR);
        if (end >= static_cast<off_t>(done)) {
          // Nothing more can be done if this fails too; the caller reports the write error.
          [[maybe_unused]] const int rc = ::ftruncate(fd, end - static_cast<off_t>(done));
        }
      }
    }
    return err;
  }
  return 0;
}

}  // namespace parallel
