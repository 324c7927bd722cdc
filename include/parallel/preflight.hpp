#pragma once
// Checks the trainer runs before it builds anything, so that a problem that would otherwise show up
// only after minutes or hours of compute (an unwritable checkpoint directory found at the first
// save) ends the run at start-up with one line.
#include <string>

#include "parallel/config.hpp"

namespace parallel {

// Creates `dir` (with parents) and proves it writable: a probe file is created, written, fsynced,
// closed and removed. Throws ConfigError naming `key`, the path and the errno text, e.g.
//   config: checkpoint.dir = "/ckpt": not writable: cannot create /ckpt/.write_probe...: Permission denied
// `tag` makes the probe's name unique among processes sharing the directory (e.g. the rank).
void check_writable_dir(const std::string& key, const std::string& dir, const std::string& tag);

// A checkpoint root's `latest`, if it exists, must be a regular file (the saves rename a new one
// over it): a directory or a FIFO there throws ConfigError naming `key`, the root and what it is.
void check_checkpoint_root(const std::string& key, const std::string& dir);

// The tokenizer the trainer reads (data.tokenizer; the end-of-document id for document packing):
// with a file to read (HuggingFace's data.tokenizer_file, GPT2BPETokenizer's data.vocab_file and
// data.merge_file) it must load, and its vocabulary (the highest id + 1) must fit model.vocab_size,
// or the data's ids could index past the embedding. Throws ConfigError naming the key, e.g.
//   config: data.tokenizer_file = "t.json": the vocabulary (700 ids) is larger than model.vocab_size (512)
// ByteLevel and GPT2BPETokenizer without files read nothing and pass.
void check_tokenizer(const Config& config);

// train.output_dir and, when set, checkpoint.dir (writable, and check_checkpoint_root) and
// train.tensorboard_dir.
void check_output_dirs(const Config& config, const std::string& tag);

}  // namespace parallel
