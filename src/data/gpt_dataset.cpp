// The GPT sample stream: document split, epochs, seeded shuffling, and the layout-independent
// slicing of global batches into per-rank micro-batches. See gpt_dataset.hpp for the contract.
#include "parallel/gpt_dataset.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "micro_batch.hpp"
#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/indexed_dataset.hpp"

namespace parallel {
namespace {

// splitmix64's output function. The constants are part of the data order: changing them changes
// which samples a run (or a resumed run) sees.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // Uniform in [0, bound) without modulo bias: reject the lowest 2^64 mod bound raw values.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  uint64_t state_;
};

class IndexedSource final : public TokenSource {
 public:
  explicit IndexedSource(const std::string& prefix) : dataset_(prefix) {}
  int64_t num_documents() const override { return dataset_.num_documents(); }
  int64_t document_offset(int64_t d) const override {
    PARALLEL_CHECK(d >= 0 && d <= num_documents(), "document {} of {}", d, num_documents());
    // Sequences tile the .bin in order (the reader checks it), so documents are consecutive ranges.
    return d < num_documents() ? dataset_.document_begin(d) : dataset_.num_elements();
  }
  void read(int64_t position, int64_t count, int32_t* out) const override {
    dataset_.read(position, count, out);
  }
  std::string describe() const override { return dataset_.prefix(); }

 private:
  IndexedDataset dataset_;
};

// Tokens and their loss mask (preprocess_data's PREFIX_text_document / PREFIX_loss_mask_document).
class SftSource final : public TokenSource {
 public:
  SftSource(const std::string& text_prefix, const std::string& mask_prefix)
      : tokens_(text_prefix), mask_(mask_prefix) {
    const auto refuse = [&](const std::string& why) {
      throw Error(fmt::format("loss mask dataset {} does not match the token dataset {}: {}", mask_prefix,
                              text_prefix, why));
    };
    if (mask_.dtype() != IndexedDType::UInt8)
      refuse(fmt::format("its dtype is {}, a loss mask is uint8", indexed_dtype_name(mask_.dtype())));
    if (mask_.num_documents() != tokens_.num_documents())
      refuse(fmt::format("{} documents, the tokens have {}", mask_.num_documents(), tokens_.num_documents()));
    for (int64_t d = 0; d < tokens_.num_documents(); ++d) {
      const int64_t have = mask_.document_end(d) - mask_.document_begin(d);
      const int64_t want = tokens_.document_end(d) - tokens_.document_begin(d);
      if (have != want) refuse(fmt::format("document {} has {} mask values for {} tokens", d, have, want));
    }
  }
  int64_t num_documents() const override { return tokens_.num_documents(); }
  int64_t document_offset(int64_t d) const override {
    PARALLEL_CHECK(d >= 0 && d <= num_documents(), "document {} of {}", d, num_documents());
    return d < num_documents() ? tokens_.document_begin(d) : tokens_.num_elements();
  }
  void read(int64_t position, int64_t count, int32_t* out) const override {
    tokens_.read(position, count, out);
  }
  std::string describe() const override { return tokens_.prefix(); }
  bool has_loss_mask() const override { return true; }
  void read_loss_mask(int64_t position, int64_t count, uint8_t* out) const override {
    std::vector<int32_t> values(static_cast<std::size_t>(count));
    mask_.read(position, count, values.data());
    for (int64_t i = 0; i < count; ++i) {
      if (values[i] != 0 && values[i] != 1)
        throw Error(fmt::format("loss mask dataset {}: value {} at element {}: a loss mask is 0 or 1",
                                mask_.prefix(), values[i], position + i));
      out[i] = static_cast<uint8_t>(values[i]);
    }
  }

 private:
  IndexedDataset tokens_;
  IndexedDataset mask_;
};

class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(int64_t num_tokens, int64_t vocab_size, uint64_t seed, int64_t document_length)
      : num_tokens_(num_tokens),
        vocab_size_(vocab_size),
        seed_(mix64(seed ^ 0xD1B54A32D192ED03ull)),
        document_length_(document_length) {
    PARALLEL_CHECK(num_tokens > 0, "synthetic data needs tokens, got {}", num_tokens);
    PARALLEL_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 31), "synthetic vocabulary size {}",
                   vocab_size);
    PARALLEL_CHECK(document_length > 0, "synthetic document length {}", document_length);
  }
  int64_t num_documents() const override { return (num_tokens_ + document_length_ - 1) / document_length_; }
  int64_t document_offset(int64_t d) const override {
    PARALLEL_CHECK(d >= 0 && d <= num_documents(), "document {} of {}", d, num_documents());
    return std::min(d * document_length_, num_tokens_);
  }
  void read(int64_t position, int64_t count, int32_t* out) const override {
    PARALLEL_CHECK(position >= 0 && count >= 0 && position <= num_tokens_ - count, "tokens [{}, {}) of {}",
                   position, position + count, num_tokens_);
    // A pure function of (seed, position): any reader, in any order, on any layout, sees the same.
    for (int64_t i = 0; i < count; ++i)
      out[i] = static_cast<int32_t>(mix64(seed_ + static_cast<uint64_t>(position + i)) %
                                    static_cast<uint64_t>(vocab_size_));
  }
  std::string describe() const override {
    return fmt::format("synthetic({} tokens, vocab {})", num_tokens_, vocab_size_);
  }

 private:
  int64_t num_tokens_;
  int64_t vocab_size_;
  uint64_t seed_;
  int64_t document_length_;
};

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

}  // namespace

std::string data_split_name(DataSplit split) {
  switch (split) {
    case DataSplit::Train:
      return "train";
    case DataSplit::Valid:
      return "valid";
    case DataSplit::Test:
      return "test";
  }
  return "?";
}

std::array<DocumentRange, 3> split_documents(const std::string& split, int64_t num_documents) {
  PARALLEL_CHECK(num_documents >= 0, "{} documents", num_documents);
  std::array<double, 3> weights{0.0, 0.0, 0.0};
  std::stringstream stream(split);
  std::string part;
  std::size_t count = 0;
  while (std::getline(stream, part, ',')) {
    if (count == 3)
      throw Error(fmt::format("data.split = \"{}\": at most three weights (train,valid,test)", split));
    const std::string text = trim(part);
    std::size_t used = 0;
    double value = -1.0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (text.empty() || used != text.size() || !(value >= 0.0) || !std::isfinite(value))
      throw Error(fmt::format("data.split = \"{}\": \"{}\" is not a non-negative number", split, text));
    weights[count++] = value;
  }
  const double sum = weights[0] + weights[1] + weights[2];
  if (count == 0 || !(sum > 0.0))
    throw Error(fmt::format("data.split = \"{}\": the weights must sum to more than 0", split));
  // As Megatron: normalise, accumulate, round each bookend (Python's round: half to even).
  std::array<DocumentRange, 3> ranges{};
  double lo = 0.0;
  for (int k = 0; k < 3; ++k) {
    const double hi = lo + weights[k] / sum;
    if (hi > lo) {
      ranges[k].begin = static_cast<int64_t>(std::nearbyint(lo * static_cast<double>(num_documents)));
      ranges[k].end = static_cast<int64_t>(std::nearbyint(hi * static_cast<double>(num_documents)));
      ranges[k].end = std::min(ranges[k].end, num_documents);
    } else {
      // Megatron builds no dataset for a zero weight; an empty range says the same.
      const int64_t at = static_cast<int64_t>(std::nearbyint(lo * static_cast<double>(num_documents)));
      ranges[k] = {std::min(at, num_documents), std::min(at, num_documents)};
    }
    lo = hi;
  }
  return ranges;
}

void TokenSource::read_loss_mask(int64_t, int64_t, uint8_t*) const {
  throw Error(fmt::format("data: {} has no loss mask", describe()));
}

std::shared_ptr<const TokenSource> open_indexed_source(const std::string& prefix) {
  return std::make_shared<IndexedSource>(prefix);
}

std::shared_ptr<const TokenSource> open_sft_source(const std::string& text_prefix,
                                                   const std::string& mask_prefix) {
  return std::make_shared<SftSource>(text_prefix, mask_prefix);
}

std::shared_ptr<const TokenSource> make_synthetic_source(int64_t num_tokens, int64_t vocab_size,
                                                         uint64_t seed, int64_t document_length) {
  return std::make_shared<SyntheticSource>(num_tokens, vocab_size, seed, document_length);
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, DataSplit split, int64_t epoch) {
  PARALLEL_CHECK(n >= 0 && epoch >= 0, "permutation of {} for epoch {}", n, epoch);
  std::vector<int64_t> p(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  // Every (seed, split, epoch) has its own stream: valid and test never mirror train's order.
  SplitMix64 rng(mix64(mix64(mix64(seed) + static_cast<uint64_t>(split)) + static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

// The last two epochs' permutations: a global batch can straddle one epoch boundary, and ranks
// walk forward in step, so two are enough to never recompute in steady state.
struct GPTDataset::PermutationCache {
  std::mutex mutex;
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>> entries;

  std::shared_ptr<const std::vector<int64_t>> get(const GPTDataset& dataset, int64_t epoch) {
    std::lock_guard lock(mutex);
    for (const auto& [e, p] : entries)
      if (e == epoch) return p;
    auto p = std::make_shared<const std::vector<int64_t>>(
        epoch_permutation(dataset.samples_per_epoch_, dataset.options_.seed, dataset.split_, epoch));
    if (entries.size() == 2) entries.erase(entries.begin());
    entries.emplace_back(epoch, p);
    return p;
  }
};

// sft: whole samples packed into sequences of `capacity` tokens, first fit in document order. Bin b
// holds the documents items[first[b] .. first[b + 1]), in document order; each takes
// min(length, capacity) tokens.
struct GPTDataset::Packing {
  int64_t capacity = 0;
  std::vector<int64_t> first;
  std::vector<int64_t> items;
  int64_t truncated = 0;

  Packing(const TokenSource& source, DocumentRange documents, int64_t capacity_) : capacity(capacity_) {
    std::vector<int64_t> docs, lengths;
    for (int64_t d = documents.begin; d < documents.end; ++d) {
      const int64_t length = source.document_offset(d + 1) - source.document_offset(d);
      if (length < 2) continue;  // no prediction in it
      if (length > capacity) ++truncated;
      docs.push_back(d);
      lengths.push_back(std::min(length, capacity));
    }
    // First fit: the lowest-numbered bin with room, found in a max-tree of the bins' free space
    // (unopened bins are empty, so a sample that fits nowhere opens the next one). O(n log n).
    int64_t leaves = 1;
    while (leaves < static_cast<int64_t>(docs.size())) leaves *= 2;
    std::vector<int64_t> tree(static_cast<std::size_t>(2 * leaves), capacity);
    std::vector<int64_t> bin_of(docs.size());
    int64_t bins = 0;
    for (std::size_t i = 0; i < docs.size(); ++i) {
      int64_t node = 1;
      while (node < leaves) node = tree[2 * node] >= lengths[i] ? 2 * node : 2 * node + 1;
      bin_of[i] = node - leaves;
      bins = std::max(bins, bin_of[i] + 1);
      tree[node] -= lengths[i];
      for (node /= 2; node >= 1; node /= 2) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
    }
    first.assign(static_cast<std::size_t>(bins + 1), 0);
    for (int64_t b : bin_of) ++first[b + 1];
    for (int64_t b = 0; b < bins; ++b) first[b + 1] += first[b];
    items.resize(docs.size());
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (std::size_t i = 0; i < docs.size(); ++i) items[next[bin_of[i]]++] = docs[i];
  }
  int64_t bins() const { return static_cast<int64_t>(first.size()) - 1; }
};

GPTDataset::GPTDataset(std::shared_ptr<const TokenSource> source, DataSplit split, GPTDatasetOptions options)
    : source_(std::move(source)),
      split_(split),
      options_(std::move(options)),
      permutations_(std::make_unique<PermutationCache>()) {
  PARALLEL_CHECK(source_ != nullptr, "no token source");
  PARALLEL_CHECK(options_.seq_length >= 1, "seq_length {}", options_.seq_length);
  PARALLEL_CHECK(options_.global_batch_size >= 1 && options_.micro_batch_size >= 1, "batch sizes {} / {}",
                 options_.global_batch_size, options_.micro_batch_size);
  documents_ = split_documents(options_.split, source_->num_documents())[static_cast<int>(split)];
  begin_ = source_->document_offset(documents_.begin);
  end_ = source_->document_offset(documents_.end);
  const int64_t tokens = end_ - begin_;
  samples_per_epoch_ = tokens > 0 ? (tokens - 1) / options_.seq_length : 0;
  if (options_.sft) {
    if (!source_->has_loss_mask())
      throw Error(fmt::format("data: {} has no loss mask dataset (data.format: sft)", source_->describe()));
    packing_ = std::make_unique<Packing>(*source_, documents_, options_.seq_length + 1);
    samples_per_epoch_ = packing_->bins();
    if (samples_per_epoch_ < 1)
      throw Error(
          fmt::format("data: the {} split of {} (documents [{}, {}) of {}, data.split \"{}\") has no "
                      "sample of two tokens or more to fine-tune on",
                      data_split_name(split), source_->describe(), documents_.begin, documents_.end,
                      source_->num_documents(), options_.split));
  }
  if (samples_per_epoch_ < 1)
    throw Error(
        fmt::format("data: the {} split of {} (documents [{}, {}) of {}, data.split \"{}\") has {} tokens; "
                    "a sample needs seq_length + 1 = {}",
                    data_split_name(split), source_->describe(), documents_.begin, documents_.end,
                    source_->num_documents(), options_.split, tokens, options_.seq_length + 1));
}

GPTDataset::~GPTDataset() = default;
GPTDataset::GPTDataset(GPTDataset&&) noexcept = default;
GPTDataset& GPTDataset::operator=(GPTDataset&&) noexcept = default;

int64_t GPTDataset::sample_in_epoch(int64_t n) const {
  PARALLEL_CHECK(n >= 0, "sample {}", n);
  const int64_t epoch = n / samples_per_epoch_;
  const int64_t i = n % samples_per_epoch_;
  if (!options_.shuffle) return i;
  return (*permutations_->get(*this, epoch))[static_cast<std::size_t>(i)];
}

int64_t GPTDataset::packed_samples() const {
  return packing_ ? static_cast<int64_t>(packing_->items.size()) : 0;
}
int64_t GPTDataset::truncated_samples() const { return packing_ ? packing_->truncated : 0; }

void GPTDataset::sample(int64_t n, int32_t* out) const {
  if (packing_) return packed_sample(n, out, nullptr, nullptr);
  const int64_t s = options_.seq_length;
  source_->read(begin_ + sample_in_epoch(n) * s, s + 1, out);
}

void GPTDataset::packed_sample(int64_t n, int32_t* out, int32_t* segment_start, float* token_mask) const {
  PARALLEL_CHECK(packing_ != nullptr, "packed_sample needs data.format sft");
  const Packing& p = *packing_;
  const int64_t bin = sample_in_epoch(n);
  std::vector<uint8_t> mask(static_cast<std::size_t>(p.capacity));
  int64_t at = 0;
  for (int64_t i = p.first[bin]; i < p.first[bin + 1]; ++i) {
    const int64_t d = p.items[i];
    const int64_t begin = source_->document_offset(d);
    const int64_t length = std::min(source_->document_offset(d + 1) - begin, p.capacity);
    source_->read(begin, length, out + at);
    if (segment_start || token_mask) source_->read_loss_mask(begin, length, mask.data() + at);
    for (int64_t j = at; j < at + length; ++j) {
      if (segment_start) segment_start[j] = static_cast<int32_t>(at);
      if (token_mask) token_mask[j] = mask[j];
    }
    at += length;
  }
  // Padding: one segment of its own, token 0 (in every vocabulary), no loss.
  for (int64_t j = at; j < p.capacity; ++j) {
    out[j] = 0;
    if (segment_start) segment_start[j] = static_cast<int32_t>(at);
    if (token_mask) token_mask[j] = 0.0f;
  }
}

std::vector<int32_t> GPTDataset::sample(int64_t n) const {
  std::vector<int32_t> out(static_cast<std::size_t>(options_.seq_length + 1));
  sample(n, out.data());
  return out;
}

int64_t GPTDataset::num_micro_batches(int dp_size) const {
  const int64_t g = options_.global_batch_size;
  const int64_t mbs = options_.micro_batch_size;
  PARALLEL_CHECK(dp_size >= 1 && g % dp_size == 0 && (g / dp_size) % mbs == 0,
                 "global batch {} does not split into {} data ranks of micro-batches of {}", g, dp_size, mbs);
  return g / dp_size / mbs;
}

MicroBatch GPTDataset::micro_batch(int64_t global_batch, int dp_rank, int dp_size,
                                   int64_t micro_batch) const {
  return data::cut_micro_batch(
      options_, num_micro_batches(dp_size), global_batch, dp_rank, dp_size, micro_batch,
      [&](int64_t n, int32_t* row, int32_t* starts, float* mask) {
        if (options_.sft) return packed_sample(n, row, starts, mask);
        sample(n, row);
      },
      [&](int64_t n) {
        return std::pair{source_->describe(), fmt::format("sample {}", n)};
      });
}

// Megatron's get_ltor_masks_and_position_ids on the input tokens: for every eod at index i, the
// tokens after it neither see [0, i] (reset_attention_mask) nor continue its positions
// (reset_position_ids); the eod belongs to the document it ends. eod_mask_loss zeroes the loss where
// the input is eod, i.e. the prediction of the next document's first token from the previous one.
void document_masks(const GPTDatasetOptions& o, MicroBatch& batch) {
  PARALLEL_CHECK(o.eod >= 0, "data: documents need the end-of-document token (data.eod_token)");
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
  batch.positions = Tensor::empty({b, s}, DType::I32);
  batch.doc_start = Tensor::empty({b, s}, DType::I32);
  batch.loss_mask = Tensor::empty({b, s}, DType::F32);
  const int32_t* tokens = batch.tokens.data<int32_t>();
  int32_t* positions = batch.positions.data<int32_t>();
  int32_t* doc_start = batch.doc_start.data<int32_t>();
  float* loss_mask = batch.loss_mask.data<float>();
  for (int64_t k = 0; k < b; ++k) {
    int32_t start = 0;  // the current document's first index
    for (int64_t j = 0; j < s; ++j) {
      const int64_t at = k * s + j;
      positions[at] = static_cast<int32_t>(o.reset_position_ids ? j - start : j);
      doc_start[at] = o.reset_attention_mask ? start : 0;
      loss_mask[at] = o.eod_mask_loss && tokens[at] == o.eod ? 0.0f : 1.0f;
      if (tokens[at] == o.eod) start = static_cast<int32_t>(j + 1);
    }
  }
}

}  // namespace parallel
