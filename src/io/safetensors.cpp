// The safetensors format: see include/parallel/safetensors.hpp.
#include "parallel/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "io/input_file.hpp"
#include "io/json_unique.hpp"
#include "parallel/error.hpp"

namespace parallel::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

// The reference implementation's limit: a header this large is a corrupt length, not a header.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string errno_str() { return std::strerror(errno); }

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void read_exact(int fd, const std::string& path, void* dst, uint64_t bytes, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, std::min<uint64_t>(bytes, 1ull << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      PARALLEL_FAIL("safetensors: {}: read failed at byte {}: {}", path, offset, errno_str());
    }
    if (n == 0) PARALLEL_FAIL("safetensors: {}: unexpected end of file at byte {}", path, offset);
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void write_exact(int fd, const std::string& path, const void* src, uint64_t bytes) {
  const auto* p = static_cast<const char*>(src);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<uint64_t>(bytes, 1ull << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      PARALLEL_FAIL("safetensors: {}: write failed: {}", path, errno_str());
    }
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
}

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
};

// A parsed and fully validated header.
struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data buffer
};

uint64_t json_uint(const nlohmann::json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer())
    PARALLEL_FAIL("safetensors: {}: {} is not an integer: {}", path, what, v.dump());
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  const int64_t s = v.get<int64_t>();
  if (s < 0) PARALLEL_FAIL("safetensors: {}: {} is negative: {}", path, what, s);
  return static_cast<uint64_t>(s);
}

Header read_header(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) PARALLEL_FAIL("safetensors: {}: cannot stat: {}", path, errno_str());
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    PARALLEL_FAIL("safetensors: {}: file is {} bytes, shorter than the 8-byte header length", path,
                  file_size);
  uint64_t header_len = 0;
  read_exact(fd, path, &header_len, 8, 0);  // little-endian host (static_assert above)
  if (header_len > file_size - 8)
    PARALLEL_FAIL(
        "safetensors: {}: header length {} exceeds the {} bytes after the length field (truncated "
        "or corrupt file)",
        path, header_len, file_size - 8);
  if (header_len > kMaxHeaderBytes)
    PARALLEL_FAIL("safetensors: {}: header length {} exceeds the {}-byte limit", path, header_len,
                  kMaxHeaderBytes);
  std::string text(header_len, '\0');
  read_exact(fd, path, text.data(), header_len, 8);

  nlohmann::json json;
  try {
    // The format forbids two entries with one name; a plain parse would keep the last silently.
    // Linear in the header (a header of 200k empty tensors parses in well under a second).
    io::DuplicateKey duplicate;
    json = io::parse_unique_keys(text, &duplicate);
    if (!duplicate.key.empty() && duplicate.depth == 1)
      PARALLEL_FAIL("safetensors: {}: tensor '{}' appears twice in the header (names must be unique)", path,
                    duplicate.key);
    if (!duplicate.key.empty())
      PARALLEL_FAIL("safetensors: {}: key '{}' appears twice in one object of the header", path,
                    duplicate.key);
  } catch (const nlohmann::json::exception& e) {
    PARALLEL_FAIL("safetensors: {}: header is not valid JSON: {}", path, e.what());
  }
  if (!json.is_object()) PARALLEL_FAIL("safetensors: {}: header is not a JSON object", path);

  Header h;
  h.data_start = 8 + header_len;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [name, info] : json.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) PARALLEL_FAIL("safetensors: {}: __metadata__ is not a JSON object", path);
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string())
          PARALLEL_FAIL("safetensors: {}: __metadata__[\"{}\"] is not a string: {}", path, key, value.dump());
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!info.is_object())
      PARALLEL_FAIL("safetensors: {}: tensor '{}': entry is not a JSON object", path, name);
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!info.contains(key)) PARALLEL_FAIL("safetensors: {}: tensor '{}': missing \"{}\"", path, name, key);
    Entry e;
    e.name = name;
    const auto& dtype = info["dtype"];
    if (!dtype.is_string() || !parse_format_name(dtype.get<std::string>(), e.dtype))
      PARALLEL_FAIL(
          "safetensors: {}: tensor '{}': unknown dtype {} (supported: F32, BF16, F16, F8_E4M3, I32, "
          "I64, U8)",
          path, name, dtype.dump());
    const auto& shape = info["shape"];
    if (!shape.is_array()) PARALLEL_FAIL("safetensors: {}: tensor '{}': shape is not an array", path, name);
    // The product of the non-zero dimensions must fit int64 even when a zero makes the tensor
    // empty: the tensor's strides are such products ([0, 2^62, 2^62] has a stride of 2^124).
    uint64_t numel = 1;
    uint64_t extent = 1;
    for (const auto& d : shape) {
      const uint64_t n = json_uint(d, path, "tensor '" + name + "' shape entry");
      if (n != 0 && (__builtin_mul_overflow(extent, n, &extent) || extent > static_cast<uint64_t>(INT64_MAX)))
        PARALLEL_FAIL("safetensors: {}: tensor '{}': shape {} overflows a 64-bit element count", path, name,
                      shape.dump());
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const auto& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      PARALLEL_FAIL("safetensors: {}: tensor '{}': data_offsets is not a [begin, end] pair: {}", path, name,
                    offsets.dump());
    e.begin = json_uint(offsets[0], path, "tensor '" + name + "' data_offsets[0]");
    e.end = json_uint(offsets[1], path, "tensor '" + name + "' data_offsets[1]");
    if (e.end < e.begin)
      PARALLEL_FAIL("safetensors: {}: tensor '{}': data_offsets [{}, {}] end before begin", path, name,
                    e.begin, e.end);
    if (e.end > data_size)
      PARALLEL_FAIL(
          "safetensors: {}: tensor '{}': data_offsets [{}, {}] out of range: the data buffer has {} "
          "bytes (truncated file?)",
          path, name, e.begin, e.end, data_size);
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &bytes) ||
        bytes != e.end - e.begin)
      PARALLEL_FAIL(
          "safetensors: {}: tensor '{}': {} bytes in data_offsets [{}, {}], but shape {} of {} needs "
          "{}",
          path, name, e.end - e.begin, e.begin, e.end, shape.dump(), format_name(e.dtype),
          numel * dtype_size(e.dtype));
    h.entries.push_back(std::move(e));
  }

  // The byte ranges must tile [0, data_size) exactly.
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < pos)
      PARALLEL_FAIL("safetensors: {}: tensor '{}' (bytes [{}, {}]) overlaps tensor '{}' (bytes [{}, {}])",
                    path, e.name, e.begin, e.end, prev->name, prev->begin, prev->end);
    if (e.begin > pos)
      PARALLEL_FAIL(
          "safetensors: {}: bytes [{}, {}) of the data buffer belong to no tensor (hole before '{}')", path,
          pos, e.begin, e.name);
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size)
    PARALLEL_FAIL(
        "safetensors: {}: {} bytes of trailing garbage after the last tensor (data buffer is {} bytes, "
        "tensors cover {})",
        path, data_size - pos, data_size, pos);
  return h;
}

Fd open_for_reading(const std::string& path) {
  // A FIFO named where a shard is expected (a hostile model folder) must not block the run.
  std::string reason;
  Fd fd(io::open_regular(path, &reason));
  if (fd.get() < 0) PARALLEL_FAIL("safetensors: cannot open {}: {}", path, reason);
  return fd;
}

}  // namespace

const char* format_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::F8E4M3:
      return "F8_E4M3";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  PARALLEL_FAIL("safetensors: no format name for dtype {}", static_cast<int>(t));
}

bool parse_format_name(const std::string& s, DType& out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16}, {"F8_E4M3", DType::F8E4M3},
      {"I32", DType::I32}, {"I64", DType::I64},   {"U8", DType::U8}};
  for (const auto& [name, dtype] : kTable) {
    if (s == name) {
      out = dtype;
      return true;
    }
  }
  return false;
}

std::map<std::string, Tensor> load(const std::string& path) {
  Fd fd = open_for_reading(path);
  const Header h = read_header(fd.get(), path);
  std::map<std::string, Tensor> out;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) read_exact(fd.get(), path, t.data_ptr(), e.end - e.begin, h.data_start + e.begin);
    out.emplace(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, std::string> load_metadata(const std::string& path) {
  Fd fd = open_for_reading(path);
  return read_header(fd.get(), path).metadata;
}

void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          const std::map<std::string, std::string>& metadata) {
  // Host copies, packed.
  std::vector<std::pair<std::string, Tensor>> items;
  items.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    PARALLEL_CHECK(name != "__metadata__", "safetensors: {}: '__metadata__' is reserved, not a tensor name",
                   path);
    PARALLEL_CHECK(t.defined(), "safetensors: {}: tensor '{}' is undefined", path, name);
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    items.emplace_back(name, host.contiguous());
  }
  // As the reference writer: larger elements first (keeps every tensor aligned to its element
  // size), then by name.
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second.dtype()) > dtype_size(b.second.dtype());
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : items) {
    const uint64_t bytes = t.nbytes();
    header[name] = {
        {"dtype", format_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name or metadata value that is not UTF-8
    PARALLEL_FAIL("safetensors: {}: cannot encode the header: {}", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-aligned
  const uint64_t header_len = text.size();

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) PARALLEL_FAIL("safetensors: cannot create {}: {}", tmp, errno_str());
  try {
    write_exact(fd.get(), tmp, &header_len, 8);
    write_exact(fd.get(), tmp, text.data(), text.size());
    for (const auto& [name, t] : items)
      if (t.nbytes() > 0) write_exact(fd.get(), tmp, t.data_ptr(), t.nbytes());
    if (::fsync(fd.get()) != 0) PARALLEL_FAIL("safetensors: {}: fsync failed: {}", tmp, errno_str());
    if (::close(fd.release()) != 0) PARALLEL_FAIL("safetensors: {}: close failed: {}", tmp, errno_str());
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      PARALLEL_FAIL("safetensors: cannot rename {} to {}: {}", tmp, path, errno_str());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) PARALLEL_FAIL("safetensors: cannot open directory {} to fsync: {}", dir, errno_str());
  if (::fsync(dfd.get()) != 0)
    PARALLEL_FAIL("safetensors: fsync of directory {} failed: {}", dir, errno_str());
}

}  // namespace parallel::safetensors
