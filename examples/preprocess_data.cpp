// preprocess_data: text or JSON lines -> a Megatron indexed dataset (OUTPUT_PREFIX_text_document.bin
// / .idx), with Megatron's tools/preprocess_data.py flags. docs/data.md has the details. With
// --prompt-key/--response-key or --messages-key, fine-tuning samples: the tokens and beside them
// OUTPUT_PREFIX_loss_mask_document (1 on the response tokens).
//
//   preprocess_data --input corpus.jsonl --output-prefix data/corpus --tokenizer-type GPT2BPETokenizer \
//       --vocab-file gpt2/encoder.json --merge-file gpt2/vocab.bpe --append-eod --workers 4
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "parallel/error.hpp"
#include "parallel/indexed_dataset.hpp"

int main(int argc, char** argv) {
  parallel::PreprocessOptions options;
  CLI::App app{
      "Tokenise a text or JSON-lines file into a Megatron indexed dataset (PREFIX_KEY_document.bin/.idx)"};
  app.add_option("--input", options.input, "input file: JSON lines (.json/.jsonl) or plain text")->required();
  app.add_option("--input-format", options.input_format,
                 "auto (by extension), jsonl, or text (one document per blank-line separated paragraph)")
      ->check(CLI::IsMember({"auto", "jsonl", "text"}));
  app.add_option("--json-keys", options.json_keys, "JSON keys to extract, one dataset each (default: text)");
  app.add_option("--output-prefix", options.output_prefix, "output path prefix, without suffix")->required();
  app.add_option("--tokenizer-type", options.tokenizer_type,
                 "GPT2BPETokenizer (default), ByteLevel or HuggingFace (a BPE tokenizer.json: byte-level or "
                 "SentencePiece-style)")
      ->check(CLI::IsMember({"GPT2BPETokenizer", "gpt2", "ByteLevel", "HuggingFace"}));
  app.add_option("--vocab-file", options.vocab_file, "GPT-2 encoder.json / vocab.json");
  app.add_option("--merge-file", options.merge_file, "GPT-2 vocab.bpe / merges.txt");
  app.add_option("--tokenizer-file", options.tokenizer_file, "HuggingFace: the tokenizer.json");
  app.add_flag("--append-eod", options.append_eod,
               "append the end-of-document token to every non-empty document");
  app.add_option("--prompt-key", options.prompt_key,
                 "fine-tuning: the JSON key of each line's prompt (with --response-key; docs/data.md)");
  app.add_option("--response-key", options.response_key,
                 "fine-tuning: the JSON key of each line's response (loss on it and the closing eod only)");
  app.add_option("--messages-key", options.messages_key,
                 "fine-tuning: the JSON key of each line's list of {role, content} messages (system, user, "
                 "assistant; loss on the assistant's)");
  bool no_post_processor = false;
  app.add_flag("--no-post-processor", no_post_processor,
               "HuggingFace: leave out the special tokens the tokenizer.json's post_processor puts around "
               "each document (Llama 3's <|begin_of_text|>)");
  // An explicit range: CLI::PositiveNumber's message prints the largest double in full (300 digits).
  app.add_option("--workers", options.workers, "tokenising threads, 1 to 1024 (default 1)")
      ->check(CLI::Range(1, 1024));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, in the same shape as the library's errors.
    std::fprintf(stderr, "preprocess_data: %s (see --help)\n", e.what());
    return 2;
  }
  options.post_processor = !no_post_processor;
  try {
    const parallel::PreprocessResult result = parallel::preprocess_data(options);
    for (const std::string& prefix : result.prefixes)
      std::printf("wrote %s.bin / %s.idx\n", prefix.c_str(), prefix.c_str());
    std::printf("%lld documents, %lld tokens\n", static_cast<long long>(result.documents),
                static_cast<long long>(result.tokens));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
