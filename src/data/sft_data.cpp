// Fine-tuning samples for preprocess_data: JSON lines with prompt/response fields or a messages
// list, rendered by the plain template of indexed_dataset.hpp (render_sft_sample) into tokens and
// a loss mask, written as two indexed datasets of the same shape (docs/data.md, "Fine-tuning data").
#include <fmt/format.h>

#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/json_unique.hpp"
#include "parallel/error.hpp"
#include "parallel/indexed_dataset.hpp"
#include "parallel/tokenizer.hpp"

namespace parallel {
namespace {

void append(SftSample& sample, const std::vector<int32_t>& ids, uint8_t mask) {
  sample.tokens.insert(sample.tokens.end(), ids.begin(), ids.end());
  sample.mask.insert(sample.mask.end(), ids.size(), mask);
}

const std::string& string_field(const nlohmann::json& object, const std::string& key,
                                const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) throw Error(fmt::format("{}no key \"{}\"", where, key));
  if (!it->is_string()) throw Error(fmt::format("{}\"{}\" is not a string", where, key));
  return it->get_ref<const std::string&>();
}

}  // namespace

SftSample render_sft_sample(const PreprocessOptions& options, const Tokenizer& tokenizer,
                            const std::string& json_line) {
  nlohmann::json value;
  io::DuplicateKey duplicate;
  try {
    value = io::parse_unique_keys(json_line, &duplicate);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("invalid JSON: {}", e.what()));
  }
  if (!duplicate.key.empty())
    throw Error(fmt::format("key \"{}\" appears twice in one object", duplicate.key));
  if (!value.is_object()) throw Error("expected a JSON object");
  const Tokenizer::SequenceTemplate around =
      options.post_processor ? tokenizer.sequence_template() : Tokenizer::SequenceTemplate{};

  SftSample sample;
  append(sample, around.before, 0);
  uint8_t last = 0;  // the mask of the closing EOS and eod
  if (options.messages_key.empty()) {
    append(sample, tokenizer.encode(string_field(value, options.prompt_key, "")), 0);
    append(sample, tokenizer.encode(string_field(value, options.response_key, "")), 1);
    last = 1;
  } else {
    auto it = value.find(options.messages_key);
    if (it == value.end()) throw Error(fmt::format("no key \"{}\"", options.messages_key));
    if (!it->is_array() || it->empty())
      throw Error(
          fmt::format("\"{}\" is not a non-empty list of {{role, content}} objects", options.messages_key));
    bool assistant = false;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& message = (*it)[i];
      const std::string where = fmt::format("{}[{}]: ", options.messages_key, i);
      if (!message.is_object()) throw Error(fmt::format("{}expected a {{role, content}} object", where));
      const std::string& role = string_field(message, "role", where);
      const std::string& content = string_field(message, "content", where);
      if (role != "system" && role != "user" && role != "assistant")
        throw Error(fmt::format("{}unknown role \"{}\" (system, user or assistant)", where, role));
      last = role == "assistant" ? 1 : 0;
      assistant = assistant || last == 1;
      append(sample, tokenizer.encode("<|" + role + "|>\n"), 0);
      append(sample, tokenizer.encode(content + "\n"), last);
    }
    if (!assistant)
      throw Error(
          fmt::format("\"{}\" has no assistant message: nothing to learn from", options.messages_key));
  }
  append(sample, around.after, last);
  sample.tokens.push_back(tokenizer.eod());
  sample.mask.push_back(last);
  return sample;
}

PreprocessResult preprocess_sft(const PreprocessOptions& options) {
  if (!options.messages_key.empty() && (!options.prompt_key.empty() || !options.response_key.empty()))
    throw Error("preprocess_data: --messages-key or --prompt-key with --response-key, not both");
  if (options.messages_key.empty() && (options.prompt_key.empty() || options.response_key.empty()))
    throw Error("preprocess_data: --prompt-key and --response-key go together");
  std::ifstream in(options.input, std::ios::binary);
  if (!in) throw Error(fmt::format("preprocess_data: cannot open input '{}'", options.input));
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(options.tokenizer_type, options.vocab_file, options.merge_file, options.tokenizer_file);

  PreprocessResult result;
  result.prefixes = {options.output_prefix + "_text_document", options.output_prefix + "_loss_mask_document"};
  IndexedDatasetBuilder tokens(result.prefixes[0], indexed_dtype_for_vocab(tokenizer->vocab_size()));
  IndexedDatasetBuilder masks(result.prefixes[1], IndexedDType::UInt8);

  // A batch of lines at a time, rendered over the workers, written in input order.
  constexpr std::size_t kBatch = 1024;
  std::vector<std::pair<int64_t, std::string>> lines;  // (line number, text)
  std::vector<SftSample> samples;
  int64_t line_number = 0;
  bool more = true;
  while (more) {
    lines.clear();
    std::string line;
    while (lines.size() < kBatch && (more = static_cast<bool>(std::getline(in, line)))) {
      ++line_number;
      if (line.find_first_not_of(" \t\r\f\v") == std::string::npos) continue;
      lines.emplace_back(line_number, std::move(line));
    }
    if (in.bad()) throw Error(fmt::format("preprocess_data: error reading '{}'", options.input));
    samples.assign(lines.size(), {});
    std::vector<std::exception_ptr> errors(lines.size());
    auto work = [&](std::size_t worker, std::size_t workers) {
      for (std::size_t i = worker; i < lines.size(); i += workers) {
        try {
          samples[i] = render_sft_sample(options, *tokenizer, lines[i].second);
        } catch (const Error& e) {
          errors[i] = std::make_exception_ptr(
              Error(fmt::format("preprocess_data: {}:{}: {}", options.input, lines[i].first, e.what())));
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    };
    const auto workers = std::min<std::size_t>(static_cast<std::size_t>(options.workers), lines.size());
    if (workers <= 1) {
      work(0, 1);
    } else {
      std::vector<std::thread> threads;
      for (std::size_t w = 0; w < workers; ++w) threads.emplace_back(work, w, workers);
      for (auto& t : threads) t.join();
    }
    for (auto& e : errors)  // the first bad line in input order
      if (e) std::rethrow_exception(e);
    for (const SftSample& sample : samples) {
      tokens.add_document(sample.tokens);
      std::vector<int32_t> mask(sample.mask.begin(), sample.mask.end());
      masks.add_document(mask);
      result.tokens += static_cast<int64_t>(sample.tokens.size());
    }
    result.documents += static_cast<int64_t>(samples.size());
  }
  tokens.finalize();
  masks.finalize();
  return result;
}

}  // namespace parallel
