#pragma once
// The GPT training sample stream (docs/data.md).
//
// A token source (an indexed dataset, or "synthetic": seeded random tokens) is a list of documents
// whose concatenation is addressed by token position. data.split "a,b,c" divides the documents,
// in order, into train / valid / test as Megatron does: the weights are normalised, accumulated,
// and split k gets documents [round(lo_k * D), round(hi_k * D)) (round half to even, as Python).
//
// Within a split of T tokens and sequence length s, an epoch has E = floor((T - 1) / s) samples;
// sample i is tokens [i*s, i*s + s + 1) of the split's concatenated documents (input = the first
// s, target = the last s). The n-th sample drawn is sample n mod E of epoch n / E, in order, or
// with shuffling through a seeded permutation of [0, E) that is drawn anew for every epoch. Global
// batch b is drawn samples [b*G, (b+1)*G). None of this depends on the parallel layout: data rank d
// of D takes samples [d*G/D, (d+1)*G/D) of the global batch, in micro-batches of
// micro_batch_size, so every layout trains on the same data in the same order.
//
// A weighted blend of several sources (blended_dataset.hpp) draws from one GPTDataset per source.
//
// Fine-tuning (options.sft): a sample is not a window but a packed sequence of whole documents
// (first fit in document order, see GPTDatasetOptions::sft); E is the number of packed sequences,
// and everything after that (epochs, shuffling, global batches, data ranks) is as above.
//
// The permutation is Fisher-Yates driven by splitmix64, both written out here (std::shuffle and
// uniform_int_distribution are implementation-defined), so runs, restarts and platforms agree.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/tensor.hpp"

namespace parallel {

struct Config;

enum class DataSplit { Train = 0, Valid = 1, Test = 2 };
std::string data_split_name(DataSplit split);  // "train", "valid", "test"

// Documents [begin, end) of one split.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
};
// Megatron's document split (see above). `split` is up to three comma-separated non-negative
// weights with a positive sum ("969,30,1", "1,0,0", "98"); missing weights are 0.
std::array<DocumentRange, 3> split_documents(const std::string& split, int64_t num_documents);

// Documents of tokens. Positions address the concatenation of all documents in order.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t num_documents() const = 0;
  // Document d is positions [document_offset(d), document_offset(d + 1)); d in [0, num_documents()].
  virtual int64_t document_offset(int64_t d) const = 0;
  virtual void read(int64_t position, int64_t count, int32_t* out) const = 0;
  virtual std::string describe() const = 0;  // for messages: the path, or "synthetic(...)"
  // Fine-tuning sources (open_sft_source) carry a loss mask per token, 0 or 1, addressed like the
  // tokens; the others have none (read_loss_mask throws).
  virtual bool has_loss_mask() const { return false; }
  virtual void read_loss_mask(int64_t position, int64_t count, uint8_t* out) const;
};

// PREFIX.bin / PREFIX.idx (indexed_dataset.hpp); documents are the index's documents.
std::shared_ptr<const TokenSource> open_indexed_source(const std::string& prefix);
// Tokens at TEXT_PREFIX with the loss mask dataset at MASK_PREFIX (preprocess_data's
// PREFIX_loss_mask_document: uint8, one 0/1 per token). The mask dataset must have the dtype uint8,
// the same number of documents and the same length for every document as the tokens; anything
// else is refused with one line naming both files. A value other than 0 or 1 fails when read.
std::shared_ptr<const TokenSource> open_sft_source(const std::string& text_prefix,
                                                   const std::string& mask_prefix);
// num_tokens tokens in documents of document_length (the last may be shorter); token j is a hash
// of (seed, j) reduced to [0, vocab_size): computed on demand, nothing is stored.
std::shared_ptr<const TokenSource> make_synthetic_source(int64_t num_tokens, int64_t vocab_size,
                                                         uint64_t seed, int64_t document_length = 1024);

struct GPTDatasetOptions {
  int64_t seq_length = 128;
  int64_t global_batch_size = 8;
  int64_t micro_batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 1234;
  std::string split = "969,30,1";
  // > 0: micro_batch() checks that every token is below it (a dataset tokenised with another
  // vocabulary would otherwise index past the embedding table).
  int64_t vocab_size = 0;
  // Documents (data.reset_position_ids, data.reset_attention_mask, data.eod_mask_loss), split at
  // the end-of-document token `eod`, as Megatron's get_ltor_masks_and_position_ids does: a document
  // ends with (and includes) its eod token.
  int32_t eod = -1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  // Fine-tuning (data.format: sft; docs/data.md, "Fine-tuning data"): the split's documents are
  // whole samples, packed greedily (first fit, in document order) into sequences of seq_length + 1
  // tokens; a sample longer than that is truncated to it. Each sample is its own document (positions
  // restart, attention stays inside it), the rest of a sequence is padding (token 0, a document of
  // its own, loss 0), and the loss of a target is the source's mask of that token, 0 across a sample
  // boundary. Needs a source with a loss mask; eod and the three keys above are not used.
  bool sft = false;
  bool packs_documents() const { return sft || reset_position_ids || reset_attention_mask || eod_mask_loss; }
  // What a micro-batch carries (MicroBatch): document positions, document starts, a loss mask.
  bool resets_positions() const { return sft || reset_position_ids; }
  bool masks_attention() const { return sft || reset_attention_mask; }
  bool masks_loss() const { return sft || eod_mask_loss; }
};

// One rank's micro-batch: CPU int32 tensors of shape [micro_batch_size, seq_length].
struct MicroBatch {
  Tensor tokens;
  Tensor targets;  // tokens shifted by one: targets[i][j] is the token after tokens[i][j]
  // Only when the options pack documents (else undefined), [micro_batch_size, seq_length] each:
  // (Default initialisers: MicroBatch{tokens, targets} stays warning-free.)
  Tensor positions = {};  // int32: reset_position_ids: the distance from the token's document start; else j
  Tensor doc_start = {};  // int32: reset_attention_mask: where the token's document starts; else 0
  Tensor loss_mask = {};  // fp32: eod_mask_loss: 0 where the input token is eod (its target starts
                          // the next document), else 1; sft: the target token's mask within its sample
};

// Fills positions, doc_start and loss_mask of `batch` from its tokens (Megatron's semantics).
void document_masks(const GPTDatasetOptions& options, MicroBatch& batch);

class GPTDataset {
 public:
  // Throws parallel::Error when the split has no full sample (fewer than seq_length + 1 tokens).
  GPTDataset(std::shared_ptr<const TokenSource> source, DataSplit split, GPTDatasetOptions options);
  ~GPTDataset();
  GPTDataset(GPTDataset&&) noexcept;
  GPTDataset& operator=(GPTDataset&&) noexcept;

  DataSplit split() const { return split_; }
  const GPTDatasetOptions& options() const { return options_; }
  const TokenSource& source() const { return *source_; }
  DocumentRange documents() const { return documents_; }
  int64_t num_tokens() const { return end_ - begin_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  // sft: the split's samples (documents of at least two tokens) packed into samples_per_epoch()
  // sequences, and how many of them were truncated to seq_length + 1 tokens.
  int64_t packed_samples() const;
  int64_t truncated_samples() const;

  // Which sample of its epoch the n-th drawn sample is (n counts over all epochs).
  int64_t sample_in_epoch(int64_t n) const;
  // The n-th drawn sample: seq_length + 1 tokens.
  void sample(int64_t n, int32_t* out) const;
  std::vector<int32_t> sample(int64_t n) const;
  // sft: also, for each of the seq_length + 1 tokens, where its segment (sample or padding) starts
  // in the sequence and its loss mask (0 on padding).
  void packed_sample(int64_t n, int32_t* out, int32_t* segment_start, float* token_mask) const;

  // Micro-batches per data rank per global batch: global_batch_size / dp_size / micro_batch_size.
  int64_t num_micro_batches(int dp_size) const;
  // Micro-batch `micro_batch` of data rank `dp_rank` (of `dp_size`) in global batch `global_batch`:
  // drawn samples global_batch * G + dp_rank * G / dp_size + micro_batch * mbs + [0, mbs).
  MicroBatch micro_batch(int64_t global_batch, int dp_rank, int dp_size, int64_t micro_batch) const;

 private:
  struct PermutationCache;
  struct Packing;

  std::shared_ptr<const TokenSource> source_;
  DataSplit split_;
  GPTDatasetOptions options_;
  DocumentRange documents_;
  int64_t begin_ = 0;  // token positions of the split in the source
  int64_t end_ = 0;
  int64_t samples_per_epoch_ = 0;
  std::unique_ptr<PermutationCache> permutations_;
  std::unique_ptr<Packing> packing_;  // sft only
};

// The split's dataset from the config when its blend (blended_dataset.hpp: data.SPLIT_path, else
// data.path) is one dataset; a blend of several is refused (make_blended_dataset reads those).
// "synthetic" -> a synthetic source of max(2^24, 2048 * (seq_length + 1)) tokens with
// model.vocab_size and train.seed; otherwise the indexed dataset at that path. The options come
// from model.seq_length, train.{global,micro}_batch_size, train.seed, data.{split,shuffle}.
GPTDataset make_gpt_dataset(const Config& config, DataSplit split);
// The seeded permutation of [0, n) for (seed, split, epoch); exposed for tests.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, DataSplit split, int64_t epoch);

}  // namespace parallel
