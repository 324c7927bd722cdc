#pragma once
// Tokenizers: text -> token ids for preprocessing (examples/preprocess_data) and ids -> text for
// looking at samples. Three kinds (docs/data.md):
//
//   GPT2BPETokenizer (alias "gpt2")  GPT-2's byte-level BPE, read from encoder.json + vocab.bpe (or
//                                    the same content as HF vocab.json + merges.txt). Produces
//                                    exactly the ids of OpenAI's encoder.py / tiktoken's "gpt2".
//   ByteLevel                        ids are the UTF-8 bytes (0..255), eod = 256, vocab 257. Needs no
//                                    files: for tests and for quick experiments on any text.
//   HuggingFace                      a tokenizer.json with a byte-level or SentencePiece-style BPE
//                                    model (HFTokenizer).
//
// encode() never produces the end-of-document id: "<|endoftext|>" inside a text is ordinary
// characters, as in Megatron's GPT2BPETokenizer. Documents get their eod from --append-eod.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace parallel {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Thread-safe (a GPT-2 tokenizer's BPE cache is guarded by a mutex).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Throws parallel::Error for an id outside [0, vocab_size()). The eod id decodes as "<|endoftext|>".
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // including the eod token
  virtual int32_t eod() const = 0;
  virtual std::string name() const = 0;  // "GPT2BPETokenizer" or "ByteLevel"

  // The special tokens put around one whole sequence (a document), before and after its encode()
  // ids: a Hugging Face post-processor's template for a single sequence (Llama 3's
  // <|begin_of_text|>); none for the other tokenizers. Throws parallel::Error (one line) when the
  // tokenizer has a post-processor we do not implement.
  struct SequenceTemplate {
    std::vector<int32_t> before, after;
  };
  virtual SequenceTemplate sequence_template() const { return {}; }
};

class ByteLevelTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return kEod; }
  std::string name() const override { return "ByteLevel"; }
};

class GPT2Tokenizer final : public Tokenizer {
 public:
  // vocab_file: a JSON object token -> id (encoder.json or vocab.json), tokens written with GPT-2's
  // byte-to-unicode mapping. merge_file: "#version" line, then one "left right" merge per line in
  // rank order (vocab.bpe or merges.txt). Throws parallel::Error naming the file and the problem.
  GPT2Tokenizer(const std::string& vocab_file, const std::string& merge_file);
  ~GPT2Tokenizer() override;
  GPT2Tokenizer(const GPT2Tokenizer&) = delete;
  GPT2Tokenizer& operator=(const GPT2Tokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  std::string name() const override { return "GPT2BPETokenizer"; }

  // The raw bytes of one token (for tests and debugging).
  std::string token_bytes(int32_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A Hugging Face tokenizer.json with a BPE model: ids identical to the `tokenizers` library's
// Tokenizer.encode(text, add_special_tokens=False). Two kinds (docs/data.md):
//   byte-level (GPT-2, Llama 3, Qwen2/Qwen3, DeepSeek-V3): pre_tokenizer ByteLevel (GPT-2's pattern)
//     or Sequence[Split(GPT-2's, Llama 3's or Qwen2's pattern) or DeepSeek-V3's three Splits,
//     ByteLevel(use_regex false)], all Isolated; decode() gives the tokens' bytes.
//   SentencePiece-style (Llama 2, Mistral, Mixtral): no pre_tokenizer (the normalizer
//     Sequence[Prepend("▁"), Replace(" ", "▁")] puts the "▁"), or Metaspace (replacement,
//     prepend_scheme always/first/never, split); each character is a token, else its <0xNN> byte
//     tokens (byte_fallback), else unk_token (fuse_unk); decode() runs the decoder (Replace with a
//     String, ByteFallback, Fuse, Strip, Metaspace, a Sequence of them, or none: tokens joined by
//     spaces); another decoder makes decode() throw (one line) and leaves encode() as it is.
// Both: normalizer null, NFC, Prepend, Replace (String pattern) or a Sequence of them; model BPE
// (merges as "a b" or [a, b], ignore_merges); added tokens (special ones and those not normalized
// matched in the raw text, the others after normalization; lstrip, rstrip). Special tokens written
// inside a text are encoded as themselves, as the library does. Anything else that changes ids
// (another pattern, normalizer, pre-tokenizer or model type, dropout, continuing_subword_prefix,
// byte_fallback with ByteLevel, single_word) is refused with one line naming the key. eod: the
// first special token of <|endoftext|>, <|end_of_text|>, </s>, <eos>, <｜end▁of▁sentence｜>. encode()
// is encode(text, add_special_tokens=False); the post_processor is sequence_template():
// TemplateProcessing's single-sequence template (the special tokens around $A), also inside a
// Sequence; ByteLevel post-processors change offsets only and add nothing. Other post-processors
// (BertProcessing, RobertaProcessing, ...) are refused by sequence_template() only, so a tokenizer
// with one still encodes. preprocess_data puts the template around each document unless told not to.
class HFTokenizer final : public Tokenizer {
 public:
  explicit HFTokenizer(const std::string& tokenizer_file);
  ~HFTokenizer() override;
  HFTokenizer(const HFTokenizer&) = delete;
  HFTokenizer& operator=(const HFTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;  // the highest id + 1
  int32_t eod() const override;
  std::string name() const override { return "HuggingFace"; }
  SequenceTemplate sequence_template() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GPT-2's pre-tokenisation: splits text as the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// would (leftmost alternative first, greedy). The pieces concatenate back to `text` exactly.
// Bytes that are not valid UTF-8 count as one "other" character each (neither letter, number nor
// space), so any byte string is accepted.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// Unicode classes used by gpt2_pretokenize (tables generated from Python's `regex` module).
bool unicode_is_letter(char32_t cp);  // \p{L}
bool unicode_is_number(char32_t cp);  // \p{N}
bool unicode_is_space(char32_t cp);   // \s (Unicode White_Space)

// type: "GPT2BPETokenizer", "gpt2" (alias), "ByteLevel" or "HuggingFace". The vocabulary and merge
// files are required for GPT-2 only, the tokenizer.json for HuggingFace only.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file = "",
                                          const std::string& merge_file = "",
                                          const std::string& tokenizer_file = "");

}  // namespace parallel
