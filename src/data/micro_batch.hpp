#pragma once
// How a micro-batch is cut from a stream of drawn samples, shared by GPTDataset and
// BlendedDataset so that both follow the one layout gpt_dataset.hpp states: data rank `dp_rank`'s
// micro-batch `micro_batch` of global batch `global_batch` holds the drawn samples
// global_batch * G + dp_rank * G / dp_size + micro_batch * mbs + [0, mbs).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/gpt_dataset.hpp"

namespace parallel::data {

// fill(n, row, starts, mask) writes drawn sample n's seq_length + 1 tokens into row and, with
// options.sft, each token's segment start and loss mask into starts and mask. describe(n) names the
// sample in the message about a token outside the vocabulary: {source, which sample}; it is called
// only then.
template <typename Fill, typename Describe>
MicroBatch cut_micro_batch(const GPTDatasetOptions& o, int64_t count, int64_t global_batch, int dp_rank,
                           int dp_size, int64_t micro_batch, Fill fill, Describe describe) {
  PARALLEL_CHECK(global_batch >= 0, "global batch {}", global_batch);
  PARALLEL_CHECK(dp_rank >= 0 && dp_rank < dp_size, "data rank {} of {}", dp_rank, dp_size);
  PARALLEL_CHECK(micro_batch >= 0 && micro_batch < count, "micro-batch {} of {}", micro_batch, count);
  const int64_t s = o.seq_length;
  const int64_t mbs = o.micro_batch_size;
  const int64_t g = o.global_batch_size;
  const int64_t first = global_batch * g + dp_rank * (g / dp_size) + micro_batch * mbs;

  MicroBatch batch;
  batch.tokens = Tensor::empty({mbs, s}, DType::I32);
  batch.targets = Tensor::empty({mbs, s}, DType::I32);
  int32_t* tokens = batch.tokens.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  std::vector<int32_t> row(static_cast<std::size_t>(s + 1));
  std::vector<int32_t> starts(o.sft ? static_cast<std::size_t>(s + 1) : 0);
  std::vector<float> mask(o.sft ? static_cast<std::size_t>(s + 1) : 0);
  if (o.sft) {
    batch.positions = Tensor::empty({mbs, s}, DType::I32);
    batch.doc_start = Tensor::empty({mbs, s}, DType::I32);
    batch.loss_mask = Tensor::empty({mbs, s}, DType::F32);
  }
  for (int64_t k = 0; k < mbs; ++k) {
    fill(first + k, row.data(), starts.data(), mask.data());
    if (o.vocab_size > 0) {
      for (int64_t j = 0; j <= s; ++j) {
        if (row[j] < 0 || row[j] >= o.vocab_size) {
          const auto [source, which] = describe(first + k);
          throw Error(fmt::format("data: {} has token {} ({}, position {}) outside the vocabulary [0, {})",
                                  source, row[j], which, j, o.vocab_size));
        }
      }
    }
    std::copy(row.begin(), row.begin() + s, tokens + k * s);
    std::copy(row.begin() + 1, row.end(), targets + k * s);
    if (o.sft) {
      // Each sample (and the padding) is a document: positions restart at its start, attention
      // stays inside it, and the target j + 1 counts with its own mask when it is in the same sample
      // as the input j (never the first token of the next sample, predicted from the last one's eod).
      int32_t* positions = batch.positions.data<int32_t>() + k * s;
      int32_t* doc_start = batch.doc_start.data<int32_t>() + k * s;
      float* loss_mask = batch.loss_mask.data<float>() + k * s;
      for (int64_t j = 0; j < s; ++j) {
        positions[j] = static_cast<int32_t>(j - starts[j]);
        doc_start[j] = starts[j];
        loss_mask[j] = starts[j + 1] == starts[j] ? mask[j + 1] : 0.0f;
      }
    }
  }
  if (o.packs_documents() && !o.sft) document_masks(o, batch);
  return batch;
}

}  // namespace parallel::data
