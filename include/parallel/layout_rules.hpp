#pragma once
// The rules a parallel layout must satisfy for a model shape, in one place: validate_config checks
// them for the configured sizes, and a model chunk (GPTModel) for the sizes of the communicators it
// is actually given, so a model built directly, without a validated config, refuses a bad layout
// with the same one-line message that names the keys:
//   config: model.num_attention_heads = 6: must be divisible by parallel.tensor (4)
// A rule about a new parallel dimension, or a new layer's need of one, goes here.
#include "parallel/config.hpp"

namespace parallel {

// Checks `model` against the parallel sizes in `parallel`; throws ConfigError naming the key, its
// value and the rule. Reads tensor, sequence_parallel, context, context_comm, expert, expert_tensor
// and data; data 0 means "not known here" (a model chunk does not see dp) and skips the rules that
// need it. The model's 0-defaults (num_query_groups, ffn_hidden_size, moe_ffn_hidden_size) are
// read as validate_config fills them.
void check_layout(const ModelConfig& model, const ParallelConfig& parallel);

}  // namespace parallel
