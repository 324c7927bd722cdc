// Regular files only (src/io/input_file.hpp), and JSON without repeated keys (src/io/json_unique.hpp).
#include "io/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "io/json_unique.hpp"
#include "parallel/error.hpp"

namespace parallel::io {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory, not a regular file";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(mode)) return "a socket, not a regular file";
  if (S_ISCHR(mode)) return "a character device, not a regular file";
  if (S_ISBLK(mode)) return "a block device, not a regular file";
  return "not a regular file";
}

// Builds the document with nlohmann's own DOM builder and keeps the keys of every open object.
class UniqueKeys {
 public:
  using json = nlohmann::json;
  UniqueKeys(json& result, DuplicateKey* duplicate) : dom_(result), duplicate_(duplicate) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second) {
      duplicate_->key = k;
      duplicate_->depth = static_cast<int>(keys_.size());
      return false;
    }
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  template <typename Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);
  }

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<std::unordered_set<std::string>> keys_;  // one set per object being read
  DuplicateKey* duplicate_;
};

}  // namespace

int open_regular(const std::string& path, std::string* reason) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *reason = std::strerror(errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *reason = std::string("cannot stat: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    *reason = kind_of(st.st_mode);
    ::close(fd);
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular(const std::string& path, std::string_view who) {
  std::string reason;
  const int fd = open_regular(path, &reason);
  if (fd < 0) throw Error(fmt::format("{}: cannot open {}: {}", who, path, reason));
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) text.reserve(static_cast<std::size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    const std::string err = std::strerror(errno);
    ::close(fd);
    throw Error(fmt::format("{}: cannot read {}: {}", who, path, err));
  }
  ::close(fd);
  return text;
}

nlohmann::json parse_unique_keys(std::string_view text, DuplicateKey* duplicate) {
  nlohmann::json result;
  UniqueKeys sax(result, duplicate);
  *duplicate = {};
  if (!nlohmann::json::sax_parse(text, &sax)) return nullptr;
  return result;
}

}  // namespace parallel::io
