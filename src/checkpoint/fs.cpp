// Durable file-system steps for checkpoints: atomic small files, directory fsyncs, safe removal,
// read-only mappings.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/internal.hpp"
#include "io/input_file.hpp"
#include "parallel/log.hpp"

namespace parallel::checkpoint::detail {
namespace {

std::string errno_str() { return std::strerror(errno); }

void write_all(int fd, const std::string& path, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      PARALLEL_FAIL("checkpoint: write to {} failed: {}", path, errno_str());
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

std::string read_text_file(const std::string& path) { return io::read_regular(path, "checkpoint"); }

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) PARALLEL_FAIL("checkpoint: cannot open directory {} to fsync: {}", dir, errno_str());
  const int rc = ::fsync(fd);
  const std::string err = errno_str();
  ::close(fd);
  if (rc != 0) PARALLEL_FAIL("checkpoint: fsync of directory {} failed: {}", dir, err);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) PARALLEL_FAIL("checkpoint: cannot create {}: {}", tmp, errno_str());
  try {
    write_all(fd, tmp, text.data(), text.size());
    if (::fsync(fd) != 0) PARALLEL_FAIL("checkpoint: fsync of {} failed: {}", tmp, errno_str());
    const int rc = ::close(fd);
    if (rc != 0) PARALLEL_FAIL("checkpoint: close of {} failed: {}", tmp, errno_str());
  } catch (...) {
    ::close(fd);  // may fail after a close that already failed; harmless
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_str();
    ::unlink(tmp.c_str());
    PARALLEL_FAIL("checkpoint: cannot rename {} to {}: {}", tmp, path, err);
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_directory(dir.empty() ? "." : dir);
}

void remove_directory_safely(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path p(dir);
  const fs::path hidden = p.parent_path() / (".trash_" + p.filename().string());
  std::error_code ec;
  fs::remove_all(hidden, ec);  // a leftover from an earlier crash
  fs::rename(p, hidden, ec);
  if (ec) {
    logger().warn("checkpoint: cannot move {} aside for removal: {}", dir, ec.message());
    return;
  }
  fs::remove_all(hidden, ec);
  if (ec) logger().warn("checkpoint: cannot remove {}: {}", hidden.string(), ec.message());
}

MappedFile::MappedFile(const std::string& path) {
  std::string reason;
  const int fd = io::open_regular(path, &reason);
  if (fd < 0) PARALLEL_FAIL("checkpoint: cannot open {}: {}", path, reason);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = errno_str();
    ::close(fd);
    PARALLEL_FAIL("checkpoint: cannot stat {}: {}", path, err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string err = errno_str();
      ::close(fd);
      PARALLEL_FAIL("checkpoint: cannot map {}: {}", path, err);
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace parallel::checkpoint::detail
