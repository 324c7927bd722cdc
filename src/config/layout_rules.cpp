// The layout rules (layout_rules.hpp), written against a Config assembled from the model and the
// sizes so that detail::Rules names every field by its key, exactly as validate_config does.
#include "parallel/layout_rules.hpp"

#include <fmt/format.h>

#include <initializer_list>
#include <limits>

#include "rules.hpp"

namespace parallel {

void check_layout(const ModelConfig& model, const ParallelConfig& parallel) {
  Config c;
  c.model = model;
  c.parallel = parallel;
  const detail::Rules rules(c);
  ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;

  // The divisors below; validate_config has checked them already, a model chunk may not have.
  for (const int* count :
       std::initializer_list<const int*>{&m.hidden_size, &m.num_attention_heads, &m.seq_length, &p.tensor,
                                         &p.context, &p.expert, &p.expert_tensor})
    rules.at_least(*count, 1);
  if (m.num_query_groups == 0) m.num_query_groups = m.num_attention_heads;
  if (m.ffn_hidden_size == 0 && m.hidden_size <= std::numeric_limits<int>::max() / 4)
    m.ffn_hidden_size = 4 * m.hidden_size;
  if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = m.ffn_hidden_size;
  rules.at_least(m.num_query_groups, 1);

  // Mixture of experts.
  if (m.num_experts > 0) {
    rules.at_least(m.moe_router_topk, 1);
    rules.require(m.moe_router_topk <= m.num_experts, m.moe_router_topk,
                  fmt::format("must be <= {} ({})", rules.key(m.num_experts), m.num_experts));
    rules.divisible(m.num_experts, {rules.term(p.expert)});
    rules.divisible(m.moe_ffn_hidden_size, {rules.term(p.expert_tensor)});  // each etp rank's slice
    rules.divisible(m.moe_shared_expert_ffn_hidden_size, {rules.term(p.tensor)});
    // Experts are not split over tp: each tp rank routes its own sequence shard (Megatron's rule).
    rules.require(
        p.tensor == 1 || p.sequence_parallel, p.tensor,
        fmt::format("MoE layers with tensor parallelism need {} = true", rules.key(p.sequence_parallel)));
  }

  // Model shape against tensor parallelism.
  // An explicit head_dim frees hidden_size from the heads (Qwen3: 32 heads of 128 on hidden 2560...).
  if (m.head_dim == 0) rules.divisible(m.hidden_size, {rules.term(m.num_attention_heads)});
  rules.divisible(m.num_attention_heads, {rules.term(m.num_query_groups)});
  rules.divisible(m.num_attention_heads, {rules.term(p.tensor)});
  rules.divisible(m.num_query_groups, {rules.term(p.tensor)});
  rules.divisible(m.ffn_hidden_size, {rules.term(p.tensor)});

  // Experts fold onto the dense ranks: ep * etp of the tp * cp * dp ranks of a stage split them.
  for (const int* split : {&p.expert, &p.expert_tensor})
    if (*split > 1)
      rules.require(m.num_experts > 0, *split, fmt::format("needs {} > 0", rules.key(m.num_experts)));
  if (p.expert > 1 || p.expert_tensor > 1) {
    const long long stage = 1LL * p.tensor * p.context * p.data;
    if (p.data > 0)
      rules.require(stage % (1LL * p.expert * p.expert_tensor) == 0,
                    p.expert > 1 ? p.expert : p.expert_tensor,
                    fmt::format("{} * {} must divide {} * {} * data ({} * {} * {} = {})", rules.key(p.expert),
                                rules.key(p.expert_tensor), rules.key(p.tensor), rules.key(p.context),
                                p.tensor, p.context, p.data, stage));
  }

  if (p.sequence_parallel) {
    rules.require(p.tensor > 1, p.sequence_parallel,
                  fmt::format("requires {} > 1 (got {})", rules.key(p.tensor), p.tensor));
    rules.divisible(m.seq_length, {rules.term(p.tensor)},
                    fmt::format(" when {} is true", rules.key(p.sequence_parallel)));
  }
  // Context parallelism: 2 * context chunks per sequence (then split over tp under sp).
  if (p.context > 1) {
    const std::string when = fmt::format(" when {} > 1", rules.key(p.context));
    if (p.sequence_parallel)
      rules.divisible(m.seq_length, {{"2", 2}, rules.term(p.context), rules.term(p.tensor)},
                      when + fmt::format(" with {}", rules.key(p.sequence_parallel)));
    else
      rules.divisible(m.seq_length, {{"2", 2}, rules.term(p.context)}, when);
    if (p.context_comm == ContextComm::A2A) {
      const std::string a2a = fmt::format(" when {} is a2a", rules.key(p.context_comm));
      rules.divisible(m.num_attention_heads, {rules.term(p.tensor), rules.term(p.context)}, a2a);
      rules.divisible(m.num_query_groups, {rules.term(p.tensor), rules.term(p.context)}, a2a);
    }
  }
}

}  // namespace parallel
