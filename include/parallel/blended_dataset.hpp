#pragma once
// Weighted blends of datasets (docs/data.md, "Blends"): Megatron's `--data-path 0.7 a 0.3 b`.
//
// A blend is a list of (weight, dataset) pairs. Each dataset is a GPTDataset of its own (the same
// split, sequence length, seed and shuffling; its own epochs). The n-th sample drawn from the blend
// is the k-th sample drawn from dataset d, where (d, k) comes from the blend index: at each global
// sample i, the dataset whose count so far is furthest below weight * (i + 1) is drawn (the
// "largest error" rule of Megatron's helpers.cpp build_blending_indices; ties go to the lower
// dataset), and k is how many samples that dataset gave before. Each dataset's count stays within
// K - 1 samples of weight * n at every n (K datasets), so its share of any window of w samples is
// within 2 (K - 1) / w of its weight.
//
// The rule runs on integers (weights scaled to 2^40), so the index is the same on every machine and
// in every process. It depends only on the weights: the seed enters through each dataset's own
// shuffling, and nothing depends on the parallel layout (global batches slice the sample stream
// exactly as GPTDataset's do).
//
// The first num_samples entries are cached in a file (blend_SPLIT_HASH.idx in the cache directory),
// HASH being a hash of a description of the blend: weights, paths, each dataset's documents, tokens
// and samples, seed, sequence length, shuffling, split and num_samples. A file whose description,
// size, structure or checksum does not match is not used: it is rebuilt (by the writer) with a
// warning. Only the process told to write (rank 0) writes, to a temporary name renamed into
// place; the others read the file if it is there and build the same index in memory if not. A
// usable file is mapped (the ranks of a node share its pages), not copied.
// Samples past num_samples continue the same rule in memory.
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "parallel/gpt_dataset.hpp"

namespace parallel {

struct BlendEntry {
  double weight = 1.0;
  std::string path;
};

// Megatron's flat form: one path ("PATH", weight 1; white space inside it is kept), or weight/path
// pairs "W1 P1 W2 P2 ..." (white space separated; recognised by a first item that is a number).
// Weights are finite, non-negative, with a positive sum; "synthetic" is a dataset only alone.
// Throws parallel::Error with one line saying what is wrong (callers prefix the key).
std::vector<BlendEntry> parse_blend(const std::string& text);
// The flat form of `entries`: "W1 P1 W2 P2 ..." (weights in their shortest exact text).
std::string format_blend(const std::vector<BlendEntry>& entries);

// The blend index: global sample i is sample `sample[i]` of dataset `dataset[i]`.
struct BlendIndex {
  std::vector<int16_t> dataset;
  std::vector<int64_t> sample;
};

// The largest-error rule over weights (any positive scale; normalised here) for num_samples draws.
class BlendIndexBuilder {
 public:
  explicit BlendIndexBuilder(std::span<const double> weights);
  // Resumes after `counts[d]` draws of each dataset (the counts of an existing index prefix).
  void resume(std::span<const int64_t> counts);
  // Appends draws until the index holds `size` entries.
  void extend(BlendIndex& index, int64_t size);
  int64_t drawn() const { return drawn_; }

 private:
  std::vector<int64_t> scaled_;  // weights * 2^40, rounded
  int64_t total_ = 0;            // sum of scaled_
  std::vector<int64_t> error_;   // scaled_[d] * drawn - total * counts[d] (exact; bounded)
  std::vector<int64_t> counts_;
  int64_t drawn_ = 0;
};
BlendIndex build_blend_index(std::span<const double> weights, int64_t num_samples);

struct BlendedDatasetOptions {
  GPTDatasetOptions dataset;      // for every dataset of the blend (data.split applies to each)
  int64_t num_samples = 0;        // entries of the index built up front (and cached)
  std::string cache_dir;          // where the index file lives; empty: no file, the index is built in memory
  bool write_cache = false;       // this process writes (rebuilds) the file; others only read it
  std::string key = "data.path";  // the config key named in messages
};

class BlendedDataset {
 public:
  // One dataset per entry of `sources`, weighted by `weights` (same length; finite, >= 0, positive
  // sum). A blend of one dataset is that dataset: no index, no file.
  BlendedDataset(std::vector<std::shared_ptr<const TokenSource>> sources, std::vector<double> weights,
                 DataSplit split, BlendedDatasetOptions options);
  ~BlendedDataset();
  BlendedDataset(BlendedDataset&&) noexcept;
  BlendedDataset& operator=(BlendedDataset&&) noexcept;

  DataSplit split() const { return split_; }
  const BlendedDatasetOptions& options() const { return options_; }
  int64_t num_datasets() const { return static_cast<int64_t>(datasets_.size()); }
  const GPTDataset& dataset(int64_t d) const { return datasets_.at(static_cast<std::size_t>(d)); }
  double weight(int64_t d) const { return weights_.at(static_cast<std::size_t>(d)); }  // normalised

  struct Draw {
    int64_t dataset = 0;
    int64_t sample = 0;  // the dataset's n-th drawn sample (GPTDataset::sample's n)
  };
  // Which dataset, and which of its drawn samples, the blend's n-th sample is.
  Draw draw(int64_t n) const;
  // The n-th drawn sample: seq_length + 1 tokens.
  void sample(int64_t n, int32_t* out) const;
  std::vector<int32_t> sample(int64_t n) const;

  int64_t num_micro_batches(int dp_size) const;
  // As GPTDataset::micro_batch: drawn samples global_batch * G + dp_rank * G / dp_size +
  // micro_batch * mbs + [0, mbs), whatever the layout.
  MicroBatch micro_batch(int64_t global_batch, int dp_rank, int dp_size, int64_t micro_batch) const;

  // The cache file ("" without one) and what happened to it: "loaded", "written", "in memory
  // (...)", or "rebuilt (...)" when a file was found unusable. `warning` is set when a file was
  // found and not used, saying why.
  const std::string& cache_file() const { return cache_file_; }
  const std::string& cache_status() const { return cache_status_; }
  const std::string& cache_warning() const { return cache_warning_; }
  // The text whose hash names the cache file.
  const std::string& description() const { return description_; }

 private:
  struct Extension;

  DataSplit split_;
  BlendedDatasetOptions options_;
  std::vector<GPTDataset> datasets_;
  std::vector<double> weights_;
  std::vector<std::string> paths_;
  // Maps cache_file_ and points ids_ / samples_ into it when it is usable; else says why not.
  std::string load(int64_t num_datasets);

  // The first options_.num_samples draws: in the mapped file, or in index_ when built here.
  BlendIndex index_;
  std::shared_ptr<const void> mapping_;
  const int16_t* ids_ = nullptr;
  const int64_t* samples_ = nullptr;
  std::unique_ptr<Extension> extension_;  // draws past them, built on demand
  std::string description_;
  std::string cache_file_;
  std::string cache_status_;
  std::string cache_warning_;
};

// The blend index file (see above) for `description` and `index`: write atomically (a temporary
// name, fsync, rename, fsync of the directory), read back with every check. read_blend_index
// returns "" and fills `index` when the file is usable, or says why not ("missing" when absent).
void write_blend_index(const std::string& file, const std::string& description, const BlendIndex& index);
std::string read_blend_index(const std::string& file, const std::string& description, int64_t num_datasets,
                             int64_t num_samples, BlendIndex& index);
// blend_SPLIT_HASH16.idx for a description.
std::string blend_index_file_name(DataSplit split, const std::string& description);

// The blend a split reads: data.SPLIT_path when set (each dataset whole: data.split does not apply),
// else data.path split by data.split. `key` is set to the config key it came from.
std::vector<BlendEntry> blend_of(const Config& config, DataSplit split, std::string* key = nullptr);
// The split's blended dataset from the config. Index length: train.steps * global_batch_size for
// train, train.eval_steps * global_batch_size for valid and test. Cache directory: data.cache_path,
// or `cache` beside the blend's first dataset. write_cache: this process writes the index file.
// Errors (a missing file, a split without samples) are one line naming the key.
BlendedDataset make_blended_dataset(const Config& config, DataSplit split, bool write_cache);

}  // namespace parallel
