// Weighted blends of datasets: the flat blend syntax, the largest-error index, its cache file, and
// the blended sample stream. See blended_dataset.hpp for the contract.
#include "parallel/blended_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "micro_batch.hpp"
#include "parallel/checkpoint.hpp"  // crc32c
#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/tokenizer.hpp"

namespace parallel {
namespace {

constexpr char kMagic[8] = {'P', 'L', 'B', 'L', 'N', 'D', 'X', '1'};
// Weights are scaled to integers of this size: the rule then runs exactly, the same everywhere.
constexpr double kWeightScale = 1099511627776.0;  // 2^40
constexpr int64_t kMaxDatasets = 32767;           // dataset ids are int16 in the index file

bool parse_double(const std::string& text, double& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && ec == std::errc() && ptr == end;
}

std::vector<std::string> split_white(const std::string& text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    std::size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string trim_white(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

void check_weights(const std::vector<BlendEntry>& entries) {
  double sum = 0.0;
  for (const BlendEntry& e : entries) {
    if (std::isnan(e.weight)) throw Error(fmt::format("the weight of \"{}\" is not a number", e.path));
    if (!std::isfinite(e.weight))
      throw Error(fmt::format("the weight of \"{}\" is {}: weights must be finite", e.path, e.weight));
    if (e.weight < 0.0)
      throw Error(fmt::format("the weight of \"{}\" is {}: weights must be >= 0", e.path, e.weight));
    sum += e.weight;
  }
  if (!(sum > 0.0) || !std::isfinite(sum))
    throw Error(fmt::format("the weights sum to {}: they must sum to more than 0", sum));
  if (entries.size() > 1) {
    for (const BlendEntry& e : entries)
      if (e.path == "synthetic")
        throw Error(
            "\"synthetic\" cannot be part of a blend of several datasets (it is a dataset only alone)");
  }
  if (static_cast<int64_t>(entries.size()) > kMaxDatasets)
    throw Error(fmt::format("{} datasets: a blend holds at most {}", entries.size(), kMaxDatasets));
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string errno_text() { return std::strerror(errno); }

// "KEY: what", without the "data: " that dataset messages start with.
std::string keyed(const std::string& key, const std::string& what) {
  if (what.starts_with(key + ":")) return what;
  return fmt::format("{}: {}", key, what.starts_with("data: ") ? what.substr(6) : what);
}

}  // namespace

// ---- the flat form -----------------------------------------------------------------------------

std::vector<BlendEntry> parse_blend(const std::string& text) {
  const std::vector<std::string> items = split_white(text);
  if (items.empty()) throw Error("no dataset: give a path, or weight/path pairs \"W1 P1 W2 P2 ...\"");
  double first = 0.0;
  std::vector<BlendEntry> entries;
  if (items.size() == 1 || !parse_double(items[0], first)) {
    // One dataset; white space inside its path is kept (a path that starts with a number and has
    // white space after it reads as pairs: documented).
    entries.push_back({1.0, trim_white(text)});
  } else {
    if (items.size() % 2 != 0)
      throw Error(fmt::format("{} items: expected weight/path pairs \"W1 P1 W2 P2 ...\"", items.size()));
    for (std::size_t i = 0; i < items.size(); i += 2) {
      double weight = 0.0;
      if (!parse_double(items[i], weight))
        throw Error(fmt::format("\"{}\" (item {}) is not a number: expected a weight before each path",
                                items[i], i + 1));
      entries.push_back({weight, items[i + 1]});
    }
  }
  check_weights(entries);
  return entries;
}

std::string format_blend(const std::vector<BlendEntry>& entries) {
  std::string out;
  for (const BlendEntry& e : entries) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{} {}", e.weight, e.path);
  }
  return out;
}

// ---- the index -------------------------------------------------------------------------------

BlendIndexBuilder::BlendIndexBuilder(std::span<const double> weights) {
  PARALLEL_CHECK(!weights.empty() && static_cast<int64_t>(weights.size()) <= kMaxDatasets,
                 "a blend of {} datasets", weights.size());
  double sum = 0.0;
  for (double w : weights) {
    PARALLEL_CHECK(std::isfinite(w) && w >= 0.0, "blend weight {}", w);
    sum += w;
  }
  PARALLEL_CHECK(sum > 0.0 && std::isfinite(sum), "blend weights sum to {}", sum);
  for (double w : weights) {
    scaled_.push_back(std::llround(w / sum * kWeightScale));
    total_ += scaled_.back();
  }
  PARALLEL_CHECK(total_ > 0, "blend weights too small to scale");
  error_.assign(weights.size(), 0);
  counts_.assign(weights.size(), 0);
}

void BlendIndexBuilder::resume(std::span<const int64_t> counts) {
  PARALLEL_CHECK(counts.size() == counts_.size(), "{} counts for {} datasets", counts.size(), counts_.size());
  int64_t drawn = 0;
  for (int64_t c : counts) drawn += c;
  // error = scaled * drawn - total * count: exact in 64-bit two's complement arithmetic (each term
  // may wrap, the result is bounded by total * datasets, far inside int64).
  for (std::size_t d = 0; d < counts.size(); ++d) {
    const uint64_t e = static_cast<uint64_t>(scaled_[d]) * static_cast<uint64_t>(drawn) -
                       static_cast<uint64_t>(total_) * static_cast<uint64_t>(counts[d]);
    error_[d] = static_cast<int64_t>(e);
    counts_[d] = counts[d];
  }
  drawn_ = drawn;
}

void BlendIndexBuilder::extend(BlendIndex& index, int64_t count) {
  PARALLEL_CHECK(count >= 0, "extend by {}", count);
  index.dataset.reserve(index.dataset.size() + static_cast<std::size_t>(count));
  index.sample.reserve(index.sample.size() + static_cast<std::size_t>(count));
  const std::size_t k = scaled_.size();
  for (int64_t i = 0; i < count; ++i) {
    // Sample drawn_: the targets move to scaled * (drawn_ + 1); the dataset furthest below its
    // target (the first of equals) is drawn.
    std::size_t best = 0;
    for (std::size_t d = 0; d < k; ++d) {
      error_[d] += scaled_[d];
      if (error_[d] > error_[best]) best = d;
    }
    error_[best] -= total_;
    index.dataset.push_back(static_cast<int16_t>(best));
    index.sample.push_back(counts_[best]++);
    ++drawn_;
  }
}

BlendIndex build_blend_index(std::span<const double> weights, int64_t num_samples) {
  BlendIndex index;
  BlendIndexBuilder(weights).extend(index, num_samples);
  return index;
}

// ---- the file ----------------------------------------------------------------------------------

std::string blend_index_file_name(DataSplit split, const std::string& description) {
  return fmt::format("blend_{}_{:016x}.idx", data_split_name(split), fnv1a64(description));
}

namespace {

uint64_t padded(uint64_t bytes) { return (bytes + 7) / 8 * 8; }

// The file's layout for a description of `description_size` bytes and n samples: the int64 array
// starts 8-byte aligned, so a mapped file is read in place.
struct Layout {
  uint64_t samples_at, datasets_at, crc_at, size;
  Layout(uint64_t description_size, uint64_t n) {
    samples_at = sizeof kMagic + 8 + padded(description_size) + 8;
    datasets_at = samples_at + 8 * n;
    crc_at = datasets_at + 2 * n;
    size = crc_at + 4;
  }
};

// A file mapped read-only (empty files map to nothing).
struct Mapping {
  const char* data = nullptr;
  std::size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data) ::munmap(const_cast<char*>(data), size);
  }
};

// Maps `file`; "" on success, else why not ("missing" when it does not exist).
std::string map_file(const std::string& file, Mapping& out) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? "missing" : fmt::format("cannot open it: {}", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = fmt::format("cannot stat it: {}", errno_text());
    ::close(fd);
    return why;
  }
  out.size = static_cast<std::size_t>(st.st_size);
  if (out.size > 0) {
    void* p = ::mmap(nullptr, out.size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = fmt::format("cannot map it: {}", errno_text());
      ::close(fd);
      out.size = 0;
      return why;
    }
    out.data = static_cast<const char*>(p);
  }
  ::close(fd);
  return "";
}

// Checks a whole file's bytes against the blend; "" and the two arrays when usable, else why not.
std::string check_index_bytes(const char* bytes, std::size_t size, const std::string& description,
                              int64_t num_datasets, int64_t num_samples, const int64_t** samples,
                              const int16_t** datasets) {
  const auto n = static_cast<uint64_t>(num_samples);
  const Layout layout(description.size(), n);
  if (size < sizeof kMagic || std::memcmp(bytes, kMagic, sizeof kMagic) != 0)
    return "not a blend index (wrong magic bytes)";
  if (size != layout.size)
    return fmt::format("{} bytes where {} samples of this blend make {}", size, num_samples, layout.size);
  uint64_t description_size = 0, stored_samples = 0;
  std::memcpy(&description_size, bytes + sizeof kMagic, 8);
  if (description_size != description.size() ||
      std::memcmp(bytes + sizeof kMagic + 8, description.data(), description.size()) != 0)
    return "it was made for another blend (its description differs)";
  std::memcpy(&stored_samples, bytes + layout.samples_at - 8, 8);
  if (stored_samples != n) return fmt::format("it holds {} samples, not {}", stored_samples, num_samples);
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes + layout.crc_at, 4);
  const uint32_t crc = checkpoint::crc32c(bytes, layout.crc_at);
  if (crc != stored_crc)
    return fmt::format("checksum mismatch: crc32c {:08x}, the file says {:08x}: changed after it was written",
                       crc, stored_crc);
  const auto* s = reinterpret_cast<const int64_t*>(bytes + layout.samples_at);
  const auto* d = reinterpret_cast<const int16_t*>(bytes + layout.datasets_at);
  // Structure: ids in range, and each dataset's samples numbered 0, 1, 2, ... in order.
  std::vector<int64_t> counts(static_cast<std::size_t>(num_datasets), 0);
  for (uint64_t i = 0; i < n; ++i) {
    if (d[i] < 0 || d[i] >= num_datasets)
      return fmt::format("entry {} names dataset {} of {}", i, d[i], num_datasets);
    int64_t& count = counts[static_cast<std::size_t>(d[i])];
    if (s[i] != count)
      return fmt::format("entry {} is sample {} of dataset {}, expected {}", i, s[i], d[i], count);
    ++count;
  }
  *samples = s;
  *datasets = d;
  return "";
}

}  // namespace

void write_blend_index(const std::string& file, const std::string& description, const BlendIndex& index) {
  PARALLEL_CHECK(index.dataset.size() == index.sample.size(), "blend index of {} / {} entries",
                 index.dataset.size(), index.sample.size());
  const uint64_t n = index.dataset.size();
  const Layout layout(description.size(), n);
  std::vector<char> bytes(layout.size, 0);
  const uint64_t description_size = description.size();
  std::memcpy(bytes.data(), kMagic, sizeof kMagic);
  std::memcpy(bytes.data() + sizeof kMagic, &description_size, 8);
  std::memcpy(bytes.data() + sizeof kMagic + 8, description.data(), description.size());
  std::memcpy(bytes.data() + layout.samples_at - 8, &n, 8);
  std::memcpy(bytes.data() + layout.samples_at, index.sample.data(), 8 * n);
  std::memcpy(bytes.data() + layout.datasets_at, index.dataset.data(), 2 * n);
  const uint32_t crc = checkpoint::crc32c(bytes.data(), layout.crc_at);
  std::memcpy(bytes.data() + layout.crc_at, &crc, 4);

  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string tmp = fmt::format("{}.tmp-{}-{}", file, host, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot create {}: {}", tmp, errno_text()));
  auto fail = [&](const std::string& what) {
    const std::string message = fmt::format("{} {}: {}", what, tmp, errno_text());
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(message);
  };
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t written = ::write(fd, p, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot write");
    }
    p += written;
    left -= static_cast<std::size_t>(written);
  }
  if (::fsync(fd) != 0) fail("cannot fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot close {}: {}", tmp, errno_text()));
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    const std::string message = fmt::format("cannot rename {} to {}: {}", tmp, file, errno_text());
    ::unlink(tmp.c_str());
    throw Error(message);
  }
  std::filesystem::path dir = std::filesystem::path(file).parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

std::string read_blend_index(const std::string& file, const std::string& description, int64_t num_datasets,
                             int64_t num_samples, BlendIndex& index) {
  Mapping mapping;
  if (std::string why = map_file(file, mapping); !why.empty()) return why;
  const int64_t* samples = nullptr;
  const int16_t* datasets = nullptr;
  std::string why = check_index_bytes(mapping.data, mapping.size, description, num_datasets, num_samples,
                                      &samples, &datasets);
  if (!why.empty()) return why;
  index.sample.assign(samples, samples + num_samples);
  index.dataset.assign(datasets, datasets + num_samples);
  return "";
}

// ---- the blended stream ----------------------------------------------------------------------

// Draws past the index's first num_samples, continued on demand from its end.
struct BlendedDataset::Extension {
  std::mutex mutex;
  std::unique_ptr<BlendIndexBuilder> builder;
  BlendIndex index;
};

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const TokenSource>> sources,
                               std::vector<double> weights, DataSplit split, BlendedDatasetOptions options)
    : split_(split), options_(std::move(options)), extension_(std::make_unique<Extension>()) {
  PARALLEL_CHECK(!sources.empty() && sources.size() == weights.size(), "a blend of {} sources and {} weights",
                 sources.size(), weights.size());
  PARALLEL_CHECK(options_.num_samples >= 0, "num_samples {}", options_.num_samples);
  std::vector<BlendEntry> entries;
  for (std::size_t d = 0; d < sources.size(); ++d) {
    PARALLEL_CHECK(sources[d] != nullptr, "no token source");
    entries.push_back({weights[d], sources[d]->describe()});
  }
  try {
    check_weights(entries);
  } catch (const Error& e) {
    throw Error(keyed(options_.key, e.what()));
  }
  double sum = 0.0;
  for (double w : weights) sum += w;
  for (std::size_t d = 0; d < sources.size(); ++d) {
    weights_.push_back(weights[d] / sum);
    paths_.push_back(sources[d]->describe());
    try {
      datasets_.emplace_back(sources[d], split, options_.dataset);
    } catch (const Error& e) {
      throw Error(keyed(options_.key, e.what()));
    }
  }
  if (datasets_.size() == 1) return;  // the dataset itself: no index

  const GPTDatasetOptions& o = options_.dataset;
  description_ = fmt::format(
      "libparallel blend index 1\nsplit {}\nnum_samples {}\nseed {}\nseq_length {}\nshuffle {}\n"
      "data.split \"{}\"\n",
      data_split_name(split), options_.num_samples, o.seed, o.seq_length, o.shuffle ? "true" : "false",
      o.split);
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    const GPTDataset& ds = datasets_[d];
    description_ +=
        fmt::format("dataset {} weight {} path {} documents [{}, {}) of {} tokens {} samples_per_epoch {}\n",
                    d, weights_[d], paths_[d], ds.documents().begin, ds.documents().end,
                    sources[d]->num_documents(), ds.num_tokens(), ds.samples_per_epoch());
  }

  const auto k = static_cast<int64_t>(datasets_.size());
  std::string reason = "no cache directory";
  if (!options_.cache_dir.empty()) {
    cache_file_ =
        (std::filesystem::path(options_.cache_dir) / blend_index_file_name(split, description_)).string();
    reason = load(k);
    if (reason.empty()) {
      cache_status_ = "loaded";
      return;
    }
  }
  index_ = build_blend_index(weights_, options_.num_samples);
  ids_ = index_.dataset.data();
  samples_ = index_.sample.data();
  const bool found = !cache_file_.empty() && reason != "missing";
  if (found) cache_warning_ = fmt::format("blend index {} is not usable: {}", cache_file_, reason);
  if (cache_file_.empty()) {
    cache_status_ = "built in memory (no cache directory)";
  } else if (!options_.write_cache) {
    cache_status_ = "built in memory (another rank writes the file)";
  } else {
    try {
      std::error_code ec;
      std::filesystem::create_directories(options_.cache_dir, ec);
      if (ec) throw Error(fmt::format("cannot create {}: {}", options_.cache_dir, ec.message()));
      write_blend_index(cache_file_, description_, index_);
      cache_status_ = found ? "rebuilt and written" : "built and written";
      // Read from the file from now on: its pages are shared by the ranks of a node.
      if (load(k).empty()) index_ = BlendIndex{};
    } catch (const Error& e) {
      cache_status_ = "built in memory (the file could not be written)";
      cache_warning_ +=
          fmt::format("{}blend index {} not written: {}", found ? "; " : "", cache_file_, e.what());
    }
  }
}

std::string BlendedDataset::load(int64_t num_datasets) {
  auto mapping = std::make_shared<Mapping>();
  if (std::string why = map_file(cache_file_, *mapping); !why.empty()) return why;
  const int64_t* samples = nullptr;
  const int16_t* datasets = nullptr;
  std::string why = check_index_bytes(mapping->data, mapping->size, description_, num_datasets,
                                      options_.num_samples, &samples, &datasets);
  if (!why.empty()) return why;
  mapping_ = std::move(mapping);
  samples_ = samples;
  ids_ = datasets;
  return "";
}

BlendedDataset::~BlendedDataset() = default;
BlendedDataset::BlendedDataset(BlendedDataset&&) noexcept = default;
BlendedDataset& BlendedDataset::operator=(BlendedDataset&&) noexcept = default;

BlendedDataset::Draw BlendedDataset::draw(int64_t n) const {
  PARALLEL_CHECK(n >= 0, "sample {}", n);
  if (datasets_.size() == 1) return {0, n};
  const int64_t size = options_.num_samples;
  if (n < size) return {ids_[n], samples_[n]};
  std::lock_guard lock(extension_->mutex);
  Extension& x = *extension_;
  if (!x.builder) {
    x.builder = std::make_unique<BlendIndexBuilder>(weights_);
    std::vector<int64_t> counts(datasets_.size(), 0);
    for (int64_t i = 0; i < size; ++i) ++counts[static_cast<std::size_t>(ids_[i])];
    x.builder->resume(counts);
  }
  const int64_t have = static_cast<int64_t>(x.index.dataset.size());
  if (n - size >= have) x.builder->extend(x.index, std::max<int64_t>(n - size + 1 - have, 4096));
  const auto at = static_cast<std::size_t>(n - size);
  return {x.index.dataset[at], x.index.sample[at]};
}

void BlendedDataset::sample(int64_t n, int32_t* out) const {
  const Draw d = draw(n);
  datasets_[static_cast<std::size_t>(d.dataset)].sample(d.sample, out);
}

std::vector<int32_t> BlendedDataset::sample(int64_t n) const {
  std::vector<int32_t> out(static_cast<std::size_t>(options_.dataset.seq_length + 1));
  sample(n, out.data());
  return out;
}

int64_t BlendedDataset::num_micro_batches(int dp_size) const {
  return datasets_[0].num_micro_batches(dp_size);
}

MicroBatch BlendedDataset::micro_batch(int64_t global_batch, int dp_rank, int dp_size,
                                       int64_t micro_batch) const {
  return data::cut_micro_batch(
      options_.dataset, num_micro_batches(dp_size), global_batch, dp_rank, dp_size, micro_batch,
      [&](int64_t n, int32_t* row, int32_t* starts, float* mask) {
        const Draw d = draw(n);
        const GPTDataset& dataset = datasets_[static_cast<std::size_t>(d.dataset)];
        if (options_.dataset.sft) return dataset.packed_sample(d.sample, row, starts, mask);
        dataset.sample(d.sample, row);
      },
      [&](int64_t n) {
        const Draw d = draw(n);
        return std::pair{paths_[static_cast<std::size_t>(d.dataset)],
                         fmt::format("its sample {}, blend sample {}", d.sample, n)};
      });
}

// ---- from the config ----------------------------------------------------------------------------

std::vector<BlendEntry> blend_of(const Config& config, DataSplit split, std::string* key) {
  const std::string* split_path = split == DataSplit::Train   ? &config.data.train_path
                                  : split == DataSplit::Valid ? &config.data.valid_path
                                                              : &config.data.test_path;
  const std::string name =
      split_path->empty() ? "data.path" : fmt::format("data.{}_path", data_split_name(split));
  if (key) *key = name;
  try {
    return parse_blend(split_path->empty() ? config.data.path : *split_path);
  } catch (const Error& e) {
    throw Error(keyed(name, e.what()));
  }
}

namespace {

GPTDatasetOptions dataset_options(const Config& config, DataSplit split, const std::string& key) {
  GPTDatasetOptions o;
  o.seq_length = config.model.seq_length;
  o.global_batch_size = config.train.global_batch_size;
  o.micro_batch_size = config.train.micro_batch_size;
  o.shuffle = config.data.shuffle;
  o.seed = config.train.seed;
  o.vocab_size = config.model.vocab_size;
  o.reset_position_ids = config.data.reset_position_ids;
  o.reset_attention_mask = config.data.reset_attention_mask;
  o.eod_mask_loss = config.data.eod_mask_loss;
  o.sft = config.data.format == "sft";
  if (o.packs_documents() && !o.sft) {
    o.eod = config.data.eod_token >= 0 ? config.data.eod_token
                                       : make_tokenizer(config.data.tokenizer, config.data.vocab_file,
                                                        config.data.merge_file, config.data.tokenizer_file)
                                             ->eod();
  }
  // A split's own blend uses every document of its datasets (Megatron's --train-data-path).
  o.split = key == "data.path"          ? config.data.split
            : split == DataSplit::Train ? "1,0,0"
            : split == DataSplit::Valid ? "0,1,0"
                                        : "0,0,1";
  return o;
}

std::shared_ptr<const TokenSource> open_source(const Config& config, const std::string& path,
                                               const std::string& key) {
  if (path == "synthetic") {
    const int64_t tokens = std::max<int64_t>(int64_t{1} << 24, 2048 * (int64_t{config.model.seq_length} + 1));
    return make_synthetic_source(tokens, config.model.vocab_size, config.train.seed);
  }
  try {
    if (config.data.format == "sft") {
      // data.loss_mask_path names data.path's mask (the config check allows it for one dataset only).
      std::string mask = key == "data.path" ? config.data.loss_mask_path : "";
      const std::string suffix = "_text_document";
      if (mask.empty()) {
        if (path.size() < suffix.size() ||
            path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
          throw Error(
              fmt::format("data.format = sft: \"{}\" does not end in {}, so its loss mask dataset is "
                          "unknown: set data.loss_mask_path",
                          path, suffix));
        mask = path.substr(0, path.size() - suffix.size()) + "_loss_mask_document";
      }
      return open_sft_source(path, mask);
    }
    return open_indexed_source(path);
  } catch (const Error& err) {
    throw Error(keyed(key, err.what()));
  }
}

}  // namespace

GPTDataset make_gpt_dataset(const Config& config, DataSplit split) {
  std::string key;
  const std::vector<BlendEntry> blend = blend_of(config, split, &key);
  if (blend.size() != 1)
    throw Error(fmt::format("{}: a blend of {} datasets is read by make_blended_dataset", key, blend.size()));
  try {
    return GPTDataset(open_source(config, blend[0].path, key), split, dataset_options(config, split, key));
  } catch (const Error& e) {
    throw Error(keyed(key, e.what()));
  }
}

BlendedDataset make_blended_dataset(const Config& config, DataSplit split, bool write_cache) {
  std::string key;
  const std::vector<BlendEntry> blend = blend_of(config, split, &key);
  BlendedDatasetOptions options;
  options.key = key;
  options.write_cache = write_cache;
  options.dataset = dataset_options(config, split, key);
  const int64_t batches = split == DataSplit::Train ? config.train.steps : config.train.eval_steps;
  options.num_samples = std::max<int64_t>(batches, 0) * config.train.global_batch_size;

  std::vector<std::shared_ptr<const TokenSource>> sources;
  std::vector<double> weights;
  for (const BlendEntry& e : blend) {
    weights.push_back(e.weight);
    sources.push_back(open_source(config, e.path, key));
  }
  if (blend.size() > 1) {
    if (!config.data.cache_path.empty()) {
      options.cache_dir = config.data.cache_path;
    } else {
      std::filesystem::path dir = std::filesystem::path(blend[0].path).parent_path();
      options.cache_dir = (dir.empty() ? std::filesystem::path("cache") : dir / "cache").string();
    }
  }
  return BlendedDataset(std::move(sources), std::move(weights), split, std::move(options));
}

}  // namespace parallel
