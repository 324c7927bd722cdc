// Megatron's indexed dataset: reader (mmap + up-front validation), atomic writer, and the
// preprocessing pipeline behind examples/preprocess_data. Format: see indexed_dataset.hpp.
#include "parallel/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <type_traits>

#include "io/input_file.hpp"
#include "io/json_unique.hpp"
#include "parallel/error.hpp"
#include "parallel/tokenizer.hpp"

namespace parallel {

// The format is little-endian and we read it with memcpy; a big-endian port would need byte swaps.
static_assert(std::endian::native == std::endian::little, "the indexed dataset reader assumes little-endian");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

bool valid_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

std::string errno_text() { return std::strerror(errno); }

template <typename T>
T load(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// A read-only mapping of a whole file; an empty file maps to nothing (mmap rejects length 0).
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const std::string& path, const std::string& what) {
    std::string reason;
    fd_ = io::open_regular(path, &reason);
    if (fd_ < 0) throw Error(fmt::format("indexed dataset {}: cannot open {}: {}", path, what, reason));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const std::string reason = errno_text();
      ::close(fd_);
      throw Error(fmt::format("indexed dataset {}: cannot stat: {}", path, reason));
    }
    size_ = static_cast<int64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) {
        const std::string reason = errno_text();
        ::close(fd_);
        throw Error(fmt::format("indexed dataset {}: cannot mmap: {}", path, reason));
      }
      data_ = static_cast<const char*>(p);
    }
  }
  ~MappedFile() { reset(); }
  MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(fd_, other.fd_);
      std::swap(data_, other.data_);
      std::swap(size_, other.size_);
    }
    return *this;
  }
  const char* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void reset() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), static_cast<std::size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    fd_ = -1;
    size_ = 0;
  }
  int fd_ = -1;
  const char* data_ = nullptr;
  int64_t size_ = 0;
};

template <typename T>
void convert(const char* src, int64_t count, int32_t* out, const std::string& path, int64_t first) {
  for (int64_t i = 0; i < count; ++i) {
    const T value = load<T>(src + i * static_cast<int64_t>(sizeof(T)));
    if constexpr (std::is_same_v<T, int64_t>) {
      if (value < static_cast<T>(std::numeric_limits<int32_t>::min()) ||
          value > static_cast<T>(std::numeric_limits<int32_t>::max()))
        throw Error(fmt::format("indexed dataset {}: element {} = {} does not fit a 32-bit token id", path,
                                first + i, value));
    }
    out[i] = static_cast<int32_t>(value);
  }
}

void write_all(int fd, const char* data, std::size_t bytes, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("indexed dataset {}: write failed: {}", path, errno_text()));
    }
    data += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void fsync_or_throw(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw Error(fmt::format("indexed dataset {}: fsync failed: {}", path, errno_text()));
}

int open_for_write(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("indexed dataset {}: cannot create: {}", path, errno_text()));
  return fd;
}

}  // namespace

int64_t indexed_dtype_size(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::UInt8:
    case IndexedDType::Int8:
      return 1;
    case IndexedDType::Int16:
    case IndexedDType::UInt16:
      return 2;
    case IndexedDType::Int32:
    case IndexedDType::Float32:
      return 4;
    case IndexedDType::Int64:
    case IndexedDType::Float64:
      return 8;
  }
  PARALLEL_FAIL("unknown indexed dtype code {}", static_cast<int>(dtype));
}

std::string indexed_dtype_name(IndexedDType dtype) {
  switch (dtype) {
    case IndexedDType::UInt8:
      return "uint8";
    case IndexedDType::Int8:
      return "int8";
    case IndexedDType::Int16:
      return "int16";
    case IndexedDType::Int32:
      return "int32";
    case IndexedDType::Int64:
      return "int64";
    case IndexedDType::Float64:
      return "float64";
    case IndexedDType::Float32:
      return "float32";
    case IndexedDType::UInt16:
      return "uint16";
  }
  PARALLEL_FAIL("unknown indexed dtype code {}", static_cast<int>(dtype));
}

IndexedDType indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::UInt16 : IndexedDType::Int32;
}

// ---- reader ----------------------------------------------------------------------------------

struct IndexedDataset::Impl {
  std::string prefix;
  std::string idx_path;
  std::string bin_path;
  MappedFile idx;
  MappedFile bin;
  IndexedDType dtype = IndexedDType::Int32;
  int64_t item_size = 4;
  int64_t num_sequences = 0;
  int64_t num_index_entries = 0;  // num_documents + 1
  int64_t num_elements = 0;
  // Byte offsets of the three arrays inside the .idx. They are not aligned (the header is 34
  // bytes), so elements are read with memcpy rather than through typed pointers.
  int64_t lengths_offset = 0;
  int64_t pointers_offset = 0;
  int64_t documents_offset = 0;

  void validate();
  [[noreturn]] void fail_idx(const std::string& problem) const {
    throw Error(fmt::format("indexed dataset {}: {}", idx_path, problem));
  }
  int32_t length(int64_t i) const { return load<int32_t>(idx.data() + lengths_offset + 4 * i); }
  int64_t pointer(int64_t i) const { return load<int64_t>(idx.data() + pointers_offset + 8 * i); }
  int64_t document(int64_t i) const { return load<int64_t>(idx.data() + documents_offset + 8 * i); }
};

void IndexedDataset::Impl::validate() {
  const int64_t size = idx.size();
  if (size < kHeaderBytes)
    fail_idx(fmt::format("truncated header: {} bytes, a header has {}", size, kHeaderBytes));
  const char* p = idx.data();
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
    fail_idx("bad magic: not a Megatron indexed dataset (MMIDIDX)");
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1) fail_idx(fmt::format("unsupported version {} (expected 1)", version));
  const uint8_t code = load<uint8_t>(p + 17);
  if (!valid_dtype_code(code)) fail_idx(fmt::format("unknown dtype code {} (expected 1..8)", code));
  dtype = static_cast<IndexedDType>(code);
  item_size = indexed_dtype_size(dtype);
  const uint64_t sequences = load<uint64_t>(p + 18);
  const uint64_t entries = load<uint64_t>(p + 26);
  // Bound the counts by the file size before multiplying, so that garbage cannot overflow.
  const auto body = static_cast<uint64_t>(size - kHeaderBytes);
  if (sequences > body / 12 || entries > body / 8)
    fail_idx(fmt::format("truncated: {} bytes cannot hold {} sequences and {} document index entries", size,
                         sequences, entries));
  if (entries == 0) fail_idx("document index is empty (it needs at least the leading 0)");
  num_sequences = static_cast<int64_t>(sequences);
  num_index_entries = static_cast<int64_t>(entries);
  lengths_offset = kHeaderBytes;
  pointers_offset = lengths_offset + 4 * num_sequences;
  documents_offset = pointers_offset + 8 * num_sequences;
  const int64_t expected = documents_offset + 8 * num_index_entries;
  if (size < expected)
    fail_idx(fmt::format("truncated: {} bytes, the header promises {} ({} sequences, {} documents)", size,
                         expected, num_sequences, num_index_entries - 1));
  // Megatron's multimodal datasets append one int8 mode per sequence; anything else is corruption.
  if (size != expected && size != expected + num_sequences)
    fail_idx(fmt::format("{} unexpected bytes after the document index", size - expected));

  if (document(0) != 0) fail_idx(fmt::format("document index starts at {} (expected 0)", document(0)));
  for (int64_t i = 1; i < num_index_entries; ++i) {
    if (document(i) < document(i - 1))
      fail_idx(
          fmt::format("document index decreases at entry {} ({} after {})", i, document(i), document(i - 1)));
  }
  if (document(num_index_entries - 1) != num_sequences)
    fail_idx(fmt::format("document index ends at {} but there are {} sequences",
                         document(num_index_entries - 1), num_sequences));

  if (bin.size() % item_size != 0)
    throw Error(fmt::format("indexed dataset {}: size {} is not a multiple of the {} element size {}",
                            bin_path, bin.size(), indexed_dtype_name(dtype), item_size));
  // Megatron's writer lays sequences out back to back; requiring exactly that catches a .bin and
  // .idx from different runs, and lets a document's tokens be one contiguous range.
  int64_t offset = 0;
  for (int64_t i = 0; i < num_sequences; ++i) {
    const int64_t length = this->length(i);
    const int64_t pointer = this->pointer(i);
    if (length < 0) fail_idx(fmt::format("sequence {} has negative length {}", i, length));
    if (pointer < 0 || pointer > bin.size() || length > (bin.size() - pointer) / item_size)
      fail_idx(fmt::format("sequence {} (byte {} + {} elements) lies beyond the end of {} ({} bytes)", i,
                           pointer, length, bin_path, bin.size()));
    if (pointer != offset)
      fail_idx(fmt::format("sequence {} starts at byte {}, expected {} (sequences must follow each other)", i,
                           pointer, offset));
    offset += length * item_size;
  }
  if (offset != bin.size())
    fail_idx(fmt::format("sequences cover {} bytes but {} has {} (index and data do not match)", offset,
                         bin_path, bin.size()));
  num_elements = bin.size() / item_size;
}

IndexedDataset::IndexedDataset(const std::string& prefix) : impl_(std::make_unique<Impl>()) {
  impl_->prefix = prefix;
  impl_->idx_path = prefix + ".idx";
  impl_->bin_path = prefix + ".bin";
  impl_->idx = MappedFile(impl_->idx_path, "the index");
  impl_->bin = MappedFile(impl_->bin_path, "the data");
  impl_->validate();
}

IndexedDataset::~IndexedDataset() = default;
IndexedDataset::IndexedDataset(IndexedDataset&&) noexcept = default;
IndexedDataset& IndexedDataset::operator=(IndexedDataset&&) noexcept = default;

const std::string& IndexedDataset::prefix() const { return impl_->prefix; }
IndexedDType IndexedDataset::dtype() const { return impl_->dtype; }
int64_t IndexedDataset::num_sequences() const { return impl_->num_sequences; }
int64_t IndexedDataset::num_documents() const { return impl_->num_index_entries - 1; }
int64_t IndexedDataset::num_elements() const { return impl_->num_elements; }

int32_t IndexedDataset::sequence_length(int64_t i) const {
  PARALLEL_CHECK(i >= 0 && i < impl_->num_sequences, "sequence {} of {}", i, impl_->num_sequences);
  return impl_->length(i);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  PARALLEL_CHECK(i >= 0 && i < impl_->num_sequences, "sequence {} of {}", i, impl_->num_sequences);
  return impl_->pointer(i);
}

int64_t IndexedDataset::document_index(int64_t i) const {
  PARALLEL_CHECK(i >= 0 && i < impl_->num_index_entries, "document index entry {} of {}", i,
                 impl_->num_index_entries);
  return impl_->document(i);
}

int64_t IndexedDataset::document_begin(int64_t d) const {
  PARALLEL_CHECK(d >= 0 && d < num_documents(), "document {} of {}", d, num_documents());
  const int64_t first = impl_->document(d);
  return first < impl_->num_sequences ? impl_->pointer(first) / impl_->item_size : impl_->num_elements;
}

int64_t IndexedDataset::document_end(int64_t d) const {
  PARALLEL_CHECK(d >= 0 && d < num_documents(), "document {} of {}", d, num_documents());
  const int64_t end = impl_->document(d + 1);
  return end < impl_->num_sequences ? impl_->pointer(end) / impl_->item_size : impl_->num_elements;
}

void IndexedDataset::read(int64_t first, int64_t count, int32_t* out) const {
  PARALLEL_CHECK(first >= 0 && count >= 0 && first <= impl_->num_elements - count,
                 "elements [{}, {}) of {} in {}", first, first + count, impl_->num_elements, impl_->bin_path);
  const char* src = impl_->bin.data() + first * impl_->item_size;
  const std::string& path = impl_->bin_path;
  switch (impl_->dtype) {
    case IndexedDType::UInt8:
      return convert<uint8_t>(src, count, out, path, first);
    case IndexedDType::Int8:
      return convert<int8_t>(src, count, out, path, first);
    case IndexedDType::Int16:
      return convert<int16_t>(src, count, out, path, first);
    case IndexedDType::UInt16:
      return convert<uint16_t>(src, count, out, path, first);
    case IndexedDType::Int32:
      return convert<int32_t>(src, count, out, path, first);
    case IndexedDType::Int64:
      return convert<int64_t>(src, count, out, path, first);
    case IndexedDType::Float32:
    case IndexedDType::Float64:
      break;
  }
  throw Error(fmt::format("indexed dataset {}: {} elements cannot be read as token ids", path,
                          indexed_dtype_name(impl_->dtype)));
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  std::vector<int32_t> out(static_cast<std::size_t>(sequence_length(i)));
  read(sequence_pointer(i) / impl_->item_size, static_cast<int64_t>(out.size()), out.data());
  return out;
}

std::vector<int32_t> IndexedDataset::document(int64_t d) const {
  const int64_t begin = document_begin(d);
  std::vector<int32_t> out(static_cast<std::size_t>(document_end(d) - begin));
  read(begin, static_cast<int64_t>(out.size()), out.data());
  return out;
}

// ---- writer ----------------------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, IndexedDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  PARALLEL_CHECK(valid_dtype_code(static_cast<uint8_t>(dtype)), "dtype code {}", static_cast<int>(dtype));
  PARALLEL_CHECK(dtype != IndexedDType::Float32 && dtype != IndexedDType::Float64,
                 "token datasets hold integers, not {}", indexed_dtype_name(dtype));
  // The PID keeps two writers of the same prefix (two jobs by mistake) from sharing staging files.
  const std::string suffix = fmt::format(".tmp-{}", ::getpid());
  bin_tmp_ = prefix_ + ".bin" + suffix;
  idx_tmp_ = prefix_ + ".idx" + suffix;
  bin_fd_ = open_for_write(bin_tmp_);
  buffer_.reserve(1 << 20);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finalized_) remove_staged();
}

void IndexedDatasetBuilder::remove_staged() noexcept {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  bin_fd_ = -1;
  ::unlink(bin_tmp_.c_str());
  ::unlink(idx_tmp_.c_str());
}

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens) {
  PARALLEL_CHECK(!finalized_, "{}: add_document after finalize", prefix_);
  PARALLEL_CHECK(tokens.size() <= static_cast<std::size_t>(std::numeric_limits<int32_t>::max()),
                 "{}: a document of {} tokens exceeds the format's int32 sequence length", prefix_,
                 tokens.size());
  const int64_t item = indexed_dtype_size(dtype_);
  int64_t lo = 0;
  int64_t hi = 0;
  switch (dtype_) {
    case IndexedDType::UInt8:
      lo = 0, hi = 255;
      break;
    case IndexedDType::Int8:
      lo = -128, hi = 127;
      break;
    case IndexedDType::Int16:
      lo = -32768, hi = 32767;
      break;
    case IndexedDType::UInt16:
      lo = 0, hi = 65535;
      break;
    default:
      lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      break;
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const int64_t v = tokens[i];
    if (v < lo || v > hi)
      throw Error(fmt::format("indexed dataset {}: token {} does not fit {} (document {}, position {})",
                              prefix_, v, indexed_dtype_name(dtype_), num_documents(), i));
    char bytes[8];
    switch (dtype_) {
      case IndexedDType::UInt8:
      case IndexedDType::Int8:
        bytes[0] = static_cast<char>(static_cast<uint8_t>(v));
        break;
      case IndexedDType::Int16:
      case IndexedDType::UInt16: {
        const auto u = static_cast<uint16_t>(v);
        std::memcpy(bytes, &u, 2);
        break;
      }
      case IndexedDType::Int64: {
        std::memcpy(bytes, &v, 8);
        break;
      }
      default: {
        const auto w = static_cast<int32_t>(v);
        std::memcpy(bytes, &w, 4);
        break;
      }
    }
    buffer_.insert(buffer_.end(), bytes, bytes + item);
  }
  if (buffer_.size() >= (1u << 20)) {
    write_all(bin_fd_, buffer_.data(), buffer_.size(), bin_tmp_);
    buffer_.clear();
  }
  if (!tokens.empty()) sequence_lengths_.push_back(static_cast<int32_t>(tokens.size()));
  document_index_.push_back(static_cast<int64_t>(sequence_lengths_.size()));
  num_elements_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetBuilder::finalize() {
  PARALLEL_CHECK(!finalized_, "{}: finalize called twice", prefix_);
  write_all(bin_fd_, buffer_.data(), buffer_.size(), bin_tmp_);
  buffer_.clear();
  fsync_or_throw(bin_fd_, bin_tmp_);
  if (::close(bin_fd_) != 0) {
    bin_fd_ = -1;
    throw Error(fmt::format("indexed dataset {}: close failed: {}", bin_tmp_, errno_text()));
  }
  bin_fd_ = -1;

  std::vector<char> index;
  auto put = [&index](const void* data, std::size_t bytes) {
    const char* p = static_cast<const char*>(data);
    index.insert(index.end(), p, p + bytes);
  };
  const uint64_t version = 1;
  const auto code = static_cast<uint8_t>(dtype_);
  const auto sequences = static_cast<uint64_t>(sequence_lengths_.size());
  const auto entries = static_cast<uint64_t>(document_index_.size());
  put(kMagic, sizeof kMagic);
  put(&version, 8);
  put(&code, 1);
  put(&sequences, 8);
  put(&entries, 8);
  put(sequence_lengths_.data(), 4 * sequence_lengths_.size());
  int64_t pointer = 0;
  const int64_t item = indexed_dtype_size(dtype_);
  for (int32_t length : sequence_lengths_) {
    put(&pointer, 8);
    pointer += static_cast<int64_t>(length) * item;
  }
  put(document_index_.data(), 8 * document_index_.size());

  const int idx_fd = open_for_write(idx_tmp_);
  try {
    write_all(idx_fd, index.data(), index.size(), idx_tmp_);
    fsync_or_throw(idx_fd, idx_tmp_);
  } catch (...) {
    ::close(idx_fd);
    throw;
  }
  if (::close(idx_fd) != 0)
    throw Error(fmt::format("indexed dataset {}: close failed: {}", idx_tmp_, errno_text()));

  // .bin first: a reader that finds the new .idx then also finds its .bin.
  const std::string bin_path = prefix_ + ".bin";
  const std::string idx_path = prefix_ + ".idx";
  if (std::rename(bin_tmp_.c_str(), bin_path.c_str()) != 0)
    throw Error(
        fmt::format("indexed dataset {}: cannot rename {} into place: {}", bin_path, bin_tmp_, errno_text()));
  if (std::rename(idx_tmp_.c_str(), idx_path.c_str()) != 0)
    throw Error(
        fmt::format("indexed dataset {}: cannot rename {} into place: {}", idx_path, idx_tmp_, errno_text()));
  finalized_ = true;
  // Make the renames themselves durable.
  std::filesystem::path dir = std::filesystem::path(idx_path).parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

// ---- preprocessing ---------------------------------------------------------------------------

namespace {

// One input document: its text per JSON key (each a list of pieces, tokenised separately and
// concatenated, like Megatron's per-sentence lists).
using Document = std::vector<std::vector<std::string>>;

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; });
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class DocumentReader {
 public:
  DocumentReader(const PreprocessOptions& options, bool jsonl) : options_(options), jsonl_(jsonl) {
    in_.open(options.input, std::ios::binary);
    if (!in_) throw Error(fmt::format("preprocess_data: cannot open input '{}'", options.input));
  }

  // False at the end of the input.
  bool next(Document& doc) { return jsonl_ ? next_json(doc) : next_paragraph(doc); }

 private:
  bool next_json(Document& doc) {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_number_;
      if (blank(line)) continue;
      nlohmann::json value;
      io::DuplicateKey duplicate;
      try {
        value = io::parse_unique_keys(line, &duplicate);
      } catch (const nlohmann::json::exception& e) {
        throw Error(
            fmt::format("preprocess_data: {}:{}: invalid JSON: {}", options_.input, line_number_, e.what()));
      }
      // A plain parse keeps the last of two "text" keys: which one was meant is not ours to guess.
      if (!duplicate.key.empty())
        throw Error(fmt::format("preprocess_data: {}:{}: key \"{}\" appears twice in one object",
                                options_.input, line_number_, duplicate.key));
      if (!value.is_object())
        throw Error(
            fmt::format("preprocess_data: {}:{}: expected a JSON object", options_.input, line_number_));
      doc.assign(options_.json_keys.size(), {});
      for (std::size_t k = 0; k < options_.json_keys.size(); ++k) {
        const std::string& key = options_.json_keys[k];
        auto it = value.find(key);
        if (it == value.end())
          throw Error(
              fmt::format("preprocess_data: {}:{}: no key \"{}\"", options_.input, line_number_, key));
        if (it->is_string()) {
          doc[k].push_back(it->get<std::string>());
        } else if (it->is_array() &&
                   std::all_of(it->begin(), it->end(), [](const auto& v) { return v.is_string(); })) {
          for (const auto& piece : *it) doc[k].push_back(piece.get<std::string>());
        } else {
          throw Error(fmt::format("preprocess_data: {}:{}: \"{}\" is not a string or a list of strings",
                                  options_.input, line_number_, key));
        }
      }
      return true;
    }
    check_stream();
    return false;
  }

  bool next_paragraph(Document& doc) {
    std::string line;
    std::string paragraph;
    bool have = false;
    while (std::getline(in_, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (blank(line)) {
        if (have) break;
        continue;
      }
      if (have) paragraph += '\n';
      paragraph += line;
      have = true;
    }
    if (!have) {
      check_stream();
      return false;
    }
    doc.assign(1, {std::move(paragraph)});
    return true;
  }

  void check_stream() {
    if (in_.bad()) throw Error(fmt::format("preprocess_data: error reading '{}'", options_.input));
  }

  const PreprocessOptions& options_;
  bool jsonl_;
  std::ifstream in_;
  int64_t line_number_ = 0;
};

}  // namespace

PreprocessResult preprocess_sft(const PreprocessOptions& options);  // sft_data.cpp

PreprocessResult preprocess_data(const PreprocessOptions& options) {
  if (options.input.empty()) throw Error("preprocess_data: --input is required");
  if (options.output_prefix.empty()) throw Error("preprocess_data: --output-prefix is required");
  if (options.workers < 1)
    throw Error(fmt::format("preprocess_data: --workers = {}: must be >= 1", options.workers));
  if (options.sft()) return preprocess_sft(options);
  bool jsonl = false;
  if (options.input_format == "jsonl") {
    jsonl = true;
  } else if (options.input_format == "auto") {
    jsonl = ends_with(options.input, ".jsonl") || ends_with(options.input, ".json");
  } else if (options.input_format != "text") {
    throw Error(fmt::format("preprocess_data: --input-format = {}: must be auto, text or jsonl",
                            options.input_format));
  }
  const std::vector<std::string> keys = jsonl ? options.json_keys : std::vector<std::string>{"text"};
  if (keys.empty()) throw Error("preprocess_data: --json-keys needs at least one key");
  PreprocessOptions effective = options;
  effective.json_keys = keys;

  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(options.tokenizer_type, options.vocab_file, options.merge_file, options.tokenizer_file);
  const IndexedDType dtype = indexed_dtype_for_vocab(tokenizer->vocab_size());
  const Tokenizer::SequenceTemplate around =
      options.post_processor ? tokenizer->sequence_template() : Tokenizer::SequenceTemplate{};

  PreprocessResult result;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : keys) {
    result.prefixes.push_back(fmt::format("{}_{}_document", options.output_prefix, key));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(result.prefixes.back(), dtype));
  }

  DocumentReader reader(effective, jsonl);
  // Documents are tokenised a batch at a time, split over the workers, and written in input order.
  constexpr std::size_t kBatch = 1024;
  std::vector<Document> batch;
  std::vector<std::vector<std::vector<int32_t>>> ids;  // [document][key]
  bool more = true;
  while (more) {
    batch.clear();
    Document doc;
    while (batch.size() < kBatch && (more = reader.next(doc))) batch.push_back(std::move(doc));
    ids.assign(batch.size(), std::vector<std::vector<int32_t>>(keys.size()));
    auto work = [&](std::size_t worker, std::size_t workers) {
      for (std::size_t d = worker; d < batch.size(); d += workers) {
        for (std::size_t k = 0; k < keys.size(); ++k) {
          for (const std::string& piece : batch[d][k]) {
            std::vector<int32_t> piece_ids = tokenizer->encode(piece);
            ids[d][k].insert(ids[d][k].end(), piece_ids.begin(), piece_ids.end());
          }
          std::vector<int32_t>& doc_ids = ids[d][k];
          // A document without text tokens stays empty (no template, no eod), as Megatron keeps it.
          if (!doc_ids.empty() && !(around.before.empty() && around.after.empty())) {
            doc_ids.insert(doc_ids.begin(), around.before.begin(), around.before.end());
            doc_ids.insert(doc_ids.end(), around.after.begin(), around.after.end());
          }
          if (options.append_eod && !doc_ids.empty()) doc_ids.push_back(tokenizer->eod());
        }
      }
    };
    const auto workers = std::min<std::size_t>(static_cast<std::size_t>(options.workers), batch.size());
    if (workers <= 1) {
      work(0, 1);
    } else {
      // Exceptions from workers are rethrown here rather than terminating the process.
      std::vector<std::exception_ptr> errors(workers);
      std::vector<std::thread> threads;
      for (std::size_t w = 0; w < workers; ++w) {
        threads.emplace_back([&, w] {
          try {
            work(w, workers);
          } catch (...) {
            errors[w] = std::current_exception();
          }
        });
      }
      for (auto& t : threads) t.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    }
    for (std::size_t d = 0; d < batch.size(); ++d) {
      for (std::size_t k = 0; k < keys.size(); ++k) {
        builders[k]->add_document(ids[d][k]);
        result.tokens += static_cast<int64_t>(ids[d][k].size());
      }
    }
    result.documents += static_cast<int64_t>(batch.size());
  }
  for (auto& builder : builders) builder->finalize();
  return result;
}

}  // namespace parallel
