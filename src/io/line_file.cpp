// Whole-line appends that survive a full disk (include/parallel/line_file.hpp).
#include "parallel/line_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "parallel/error.hpp"
#include "parallel/log.hpp"

namespace parallel {

LineFile::LineFile(std::string path, std::string unit) : path_(std::move(path)), unit_(std::move(unit)) {
  const auto parent = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) PARALLEL_FAIL("cannot create directory {} for {}: {}", parent.string(), path_, ec.message());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) PARALLEL_FAIL("cannot open {} for appending: {}", path_, std::strerror(errno));
}

LineFile::~LineFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool LineFile::append(std::string_view line) {
  std::string text;
  text.reserve(line.size() + 1);
  text.append(line).push_back('\n');
  return append_record(text);
}

bool LineFile::append_record(std::string_view bytes) {
  const int err = write_whole_line(fd_, bytes);
  if (err != 0) {
    ++dropped_;
    // Logs must never end a run: warn once, keep training, keep trying with later lines.
    if (!failing_)
      logger().warn("cannot write to {}: {}; training goes on, {}s are dropped until writing works again",
                    path_, std::strerror(err), unit_);
    failing_ = true;
    return false;
  }
  if (failing_) logger().warn("writing to {} works again; {} {}(s) were dropped", path_, dropped_, unit_);
  failing_ = false;
  return true;
}

}  // namespace parallel
