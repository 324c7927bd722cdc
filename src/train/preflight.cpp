// Start-up checks of the trainer (include/parallel/preflight.hpp).
#include "parallel/preflight.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "parallel/error.hpp"
#include "parallel/tokenizer.hpp"

namespace parallel {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void not_writable(const std::string& key, const std::string& dir, const std::string& what) {
  throw ConfigError(fmt::format("config: {} = \"{}\": not writable: {}", key, dir, what));
}

}  // namespace

void check_writable_dir(const std::string& key, const std::string& dir, const std::string& tag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) not_writable(key, dir, fmt::format("cannot create the directory: {}", ec.message()));
  if (!fs::is_directory(dir, ec)) not_writable(key, dir, "exists and is not a directory");

  // A real file, written and fsynced: access(W_OK) would say yes on a read-only mount for root, and
  // an empty file would not find a full disk or a quota.
  const std::string probe =
      (fs::path(dir) / fmt::format(".write_probe.{}.{}", tag, static_cast<long>(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) not_writable(key, dir, fmt::format("cannot create {}: {}", probe, std::strerror(errno)));
  const char text[] = "libparallel write probe\n";
  std::string failure;
  const ssize_t n = ::write(fd, text, sizeof(text) - 1);
  if (n < 0)
    failure = fmt::format("cannot write {}: {}", probe, std::strerror(errno));
  else if (n != static_cast<ssize_t>(sizeof(text) - 1))
    failure = fmt::format("cannot write {}: short write ({} of {} bytes)", probe, n, sizeof(text) - 1);
  else if (::fsync(fd) != 0)
    failure = fmt::format("cannot fsync {}: {}", probe, std::strerror(errno));
  if (::close(fd) != 0 && failure.empty())
    failure = fmt::format("cannot close {}: {}", probe, std::strerror(errno));
  if (::unlink(probe.c_str()) != 0 && failure.empty())
    failure = fmt::format("cannot remove {}: {}", probe, std::strerror(errno));
  if (!failure.empty()) not_writable(key, dir, failure);
}

void check_checkpoint_root(const std::string& key, const std::string& dir) {
  // Every save ends by renaming a new `latest` file over the old one, which fails on a directory:
  // found at the first save, that was after save_interval steps of compute.
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  const fs::file_status st = fs::status(latest, ec);
  if (!fs::exists(st) || fs::is_regular_file(st)) return;
  const char* kind = fs::is_directory(st) ? "a directory" : fs::is_fifo(st) ? "a FIFO" : "not a regular file";
  throw ConfigError(fmt::format(
      "config: {} = \"{}\": {} is {}; it must be the file naming the latest checkpoint (remove or rename it)",
      key, dir, latest.string(), kind));
}

void check_tokenizer(const Config& config) {
  const DataConfig& d = config.data;
  const bool hf = d.tokenizer == "HuggingFace";
  if (!hf && (d.tokenizer == "ByteLevel" || d.vocab_file.empty())) return;
  // GPT-2's two files load together, so its errors name both keys (the message names the file).
  const std::string key = hf ? "data.tokenizer_file" : "data.vocab_file";
  const std::string& file = hf ? d.tokenizer_file : d.vocab_file;
  const std::string setting =
      hf ? fmt::format("data.tokenizer_file = \"{}\"", d.tokenizer_file)
         : fmt::format("data.vocab_file = \"{}\", data.merge_file = \"{}\"", d.vocab_file, d.merge_file);
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = make_tokenizer(d.tokenizer, d.vocab_file, d.merge_file, d.tokenizer_file);
  } catch (const Error& e) {
    throw ConfigError(fmt::format("config: {}: {}", setting, e.what()));
  }
  if (tokenizer->vocab_size() > config.model.vocab_size)
    throw ConfigError(fmt::format(
        "config: {} = \"{}\": the vocabulary ({} ids) is larger than model.vocab_size ({}); the model must "
        "have an embedding row for every id the tokenizer can produce",
        key, file, tokenizer->vocab_size(), config.model.vocab_size));
}

void check_output_dirs(const Config& config, const std::string& tag) {
  check_writable_dir("train.output_dir", config.train.output_dir, tag);
  if (!config.checkpoint.dir.empty()) {
    check_writable_dir("checkpoint.dir", config.checkpoint.dir, tag);
    check_checkpoint_root("checkpoint.dir", config.checkpoint.dir);
  }
  if (!config.train.tensorboard_dir.empty())
    check_writable_dir("train.tensorboard_dir", config.train.tensorboard_dir, tag);
}

}  // namespace parallel
