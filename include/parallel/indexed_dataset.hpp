#pragma once
// Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py), byte for byte, so that
// files made by Megatron's tools/preprocess_data.py load here and ours load there.
//
//   PREFIX.idx (little-endian)
//     9 bytes   magic "MMIDIDX\0\0"
//     u64       version = 1
//     u8        dtype code of the tokens: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//               7 float32, 8 uint16
//     u64       S, the number of sequences
//     u64       D + 1, the number of entries of the document index (D documents)
//     int32[S]  sequence lengths, in elements
//     int64[S]  sequence pointers, byte offsets into PREFIX.bin
//     int64[D+1] document index: document d is sequences [index[d], index[d+1]); index[0] = 0,
//               index[D] = S. A document may hold several sequences (Megatron's sentence split),
//               or none (an empty text).
//     (Megatron's multimodal variant adds int8[S] sequence modes; accepted and ignored.)
//   PREFIX.bin  the sequences' elements back to back, in the dtype above.
//
// The reader maps both files and checks everything up front (magic, version, dtype, sizes, that
// sequences tile the .bin exactly); a problem throws parallel::Error naming the file and what is
// wrong. The writer stages PREFIX.bin.tmp-PID / PREFIX.idx.tmp-PID, fsyncs them and renames them
// into place, so a crash never leaves a half-written dataset under the final names.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace parallel {

class Tokenizer;

enum class IndexedDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};
int64_t indexed_dtype_size(IndexedDType dtype);
std::string indexed_dtype_name(IndexedDType dtype);  // numpy's name: "uint16", ...
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
IndexedDType indexed_dtype_for_vocab(int64_t vocab_size);

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin. Throws parallel::Error on any problem.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const;
  IndexedDType dtype() const;
  int64_t num_sequences() const;
  int64_t num_documents() const;
  int64_t num_elements() const;  // all tokens in the .bin

  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;  // bytes
  int64_t document_index(int64_t i) const;    // i in [0, num_documents()]
  // Document d's elements are [document_begin(d), document_end(d)) of the flat .bin (sequences tile
  // the .bin in order, which the reader checks).
  int64_t document_begin(int64_t d) const;
  int64_t document_end(int64_t d) const;

  // Copies `count` elements of the flat .bin starting at element `first`, converted to int32.
  // Throws for float dtypes and for values outside int32.
  void read(int64_t first, int64_t count, int32_t* out) const;
  std::vector<int32_t> sequence(int64_t i) const;
  std::vector<int32_t> document(int64_t d) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes PREFIX.bin / PREFIX.idx. Documents are kept one sequence each (Megatron's
// preprocess_data without --split-sentences); an empty document has no sequence.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, IndexedDType dtype);
  // Without finalize() (an exception, say) the staged files are removed and nothing is published.
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Throws if a value does not fit the dtype.
  void add_document(std::span<const int32_t> tokens);
  // Writes the index, fsyncs and renames both files into place. Nothing may be added afterwards.
  void finalize();

  int64_t num_documents() const { return static_cast<int64_t>(document_index_.size()) - 1; }
  int64_t num_elements() const { return num_elements_; }

 private:
  void remove_staged() noexcept;

  std::string prefix_;
  IndexedDType dtype_;
  std::string bin_tmp_;
  std::string idx_tmp_;
  int bin_fd_ = -1;
  std::vector<char> buffer_;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> document_index_{0};
  int64_t num_elements_ = 0;
  bool finalized_ = false;
};

// tools/preprocess_data.py as a library call (examples/preprocess_data is its command line).
struct PreprocessOptions {
  std::string input;
  // "auto": a name ending in .json or .jsonl is JSON lines, anything else plain text.
  std::string input_format = "auto";  // auto | text | jsonl
  std::vector<std::string> json_keys = {"text"};
  std::string output_prefix;
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_file;  // HuggingFace: the tokenizer.json
  bool append_eod = false;
  // The tokenizer's sequence template (Tokenizer::sequence_template: Llama 3's <|begin_of_text|>)
  // around the ids of each non-empty document, before the eod.
  bool post_processor = true;
  int workers = 1;  // tokenising threads
  // Fine-tuning samples (docs/data.md, "Fine-tuning data"): prompt_key and response_key (both), or
  // messages_key, read each JSON line as one sample and write OUTPUT_text_document with
  // OUTPUT_loss_mask_document (uint8, 1 on response tokens and the closing eod, 0 elsewhere).
  std::string prompt_key;
  std::string response_key;
  std::string messages_key;
  bool sft() const { return !prompt_key.empty() || !response_key.empty() || !messages_key.empty(); }
};

struct PreprocessResult {
  std::vector<std::string> prefixes;  // one per JSON key: OUTPUT_KEY_document
  int64_t documents = 0;              // per key
  int64_t tokens = 0;                 // summed over keys
};

// JSON lines: one document per line and key (a missing key or a non-string value is an error
// naming the line; blank lines are skipped). An empty text is kept as a document without tokens,
// as Megatron does, so document numbers match input lines. Plain text: one document per
// paragraph, paragraphs separated by blank (or whitespace-only) lines; a paragraph keeps its inner
// newlines and has no trailing newline. Throws parallel::Error (one line) on any problem.
PreprocessResult preprocess_data(const PreprocessOptions& options);

// One fine-tuning sample: its tokens and their loss mask (0 or 1 each), as preprocess_data writes
// them for options.sft(). `json` is one JSON line's object; throws parallel::Error with what is wrong
// (preprocess_data adds file:line). The template (no Jinja):
//   prompt/response: BOS? prompt response EOS? eod          mask 0 on BOS and the prompt, 1 after
//   messages:        BOS? then per message "<|ROLE|>\n" (mask 0) and "CONTENT\n" (mask 1 for the
//                    assistant, else 0), then EOS? eod (mask 1 when the last message is the
//                    assistant's, else 0). Roles: system, user, assistant; at least one assistant.
// BOS / EOS: the tokenizer's sequence template (Llama 3's <|begin_of_text|>) when post_processor.
// Pieces are tokenised separately and concatenated, so a mask boundary is a token boundary.
struct SftSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};
SftSample render_sft_sample(const PreprocessOptions& options, const Tokenizer& tokenizer,
                            const std::string& json_line);

}  // namespace parallel
