#pragma once
// The router of a mixture-of-experts layer (docs/model.md, "Routing"): from the fp32 logits [T, E]
// of T tokens (host values) to each token's k experts and combine weights, the balance losses, and
// d(objective)/d(logits) for the backward. Host code: the MoE layer reads the logits back from the
// device (moe.cpp), so every device routes alike.
//
//   s        = softmax(logits) over the experts, or sigmoid(logits) per expert   (score function)
//   c        = s + bias                      bias: aux-loss-free balancing, only for choosing
//   groups   : n_group groups of E / n_group experts; a group's score is the sum of its two best c;
//              only the best topk_group groups are eligible (n_group 1: all)
//   choice   = top-k of c over the eligible experts (ties to the lower expert index); with
//              moe_router_force_load_balancing (benchmarking): expert (t k + j) mod E for token t's
//              j-th choice, whatever the scores, groups and bias - every expert gets its exact share,
//              the choice a meta run assumes (route_balanced)
//   w_j      = s[e_j] (/ sum_j s[e_j] with norm_topk_prob) * routed_scaling_factor
// The balance losses see normalised scores s' (s for softmax, s / sum_e s for sigmoid):
//   aux      = aux_coeff * E / (k T^2) * sum_e count_e * sum_t s'[t, e]      (Switch / GShard)
//   seq_aux  = alpha * E / (B k S^2) * sum_b sum_e count_{b,e} * sum_{t in b} s'[t, e]  (DeepSeek-V3:
//              per sequence b of S tokens, averaged over the B sequences of the micro-batch)
//   z        = z_coeff / T * sum_t logsumexp(logits_t)^2
// with count the top-k assignments before capacity drops. The bias has no gradient: after each
// optimizer step, bias_e += speed * sign(mean_e load - load_e) over the step's assignments summed
// over every rank that routed tokens of the layer (GPTModel::update_router_bias).
#include <cstdint>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/parameter.hpp"

namespace parallel::model {

class Router {
 public:
  // `layer`: the global layer index, for the bias's name.
  Router(const ModelConfig& config, int layer);

  // One micro-batch's routing, kept for the backward.
  struct Routing {
    int64_t tokens = 0, sequences = 1;  // T, and B: token t belongs to sequence t % B ([s, b] rows)
    std::vector<float> logits;          // [T, E]
    std::vector<float> scores;          // [T, E] s
    std::vector<float> lse;             // [T] logsumexp of the logits (z loss)
    std::vector<int32_t> choice;        // [T, k] chosen experts, best first
    std::vector<float> weight;          // [T, k] combine weights
  };
  // Routes T tokens of B sequences from their logits (host, [T, E]). Under
  // moe_router_force_load_balancing the choice is route_balanced's and the weights, losses and
  // gradients follow from the scores of the experts so chosen.
  void route(const float* logits, int64_t tokens, int64_t sequences, Routing& r) const;
  // A meta run's stated assumption (meta.hpp): balanced routing, token t's j-th choice expert
  // (t k + j) mod E with weight 1 / k, whatever the options (no values to route on).
  void route_balanced(int64_t tokens, int64_t sequences, Routing& r) const;

  // The balance losses' sums over this rank's tokens, to be summed over the ranks that hold the
  // other tokens of the same sequences (tp shards under sp, cp chunks) before losses() and
  // backward(): [E] counts, [E] sum_t s', [B, E] counts, [B, E] sum_t s' per sequence, sum_t lse^2,
  // T.
  std::vector<float> statistics(const Routing& r) const;
  struct Losses {
    double aux = 0, seq_aux = 0, z = 0;  // coefficients applied
  };
  Losses losses(const std::vector<float>& stats, int64_t sequences) const;
  // d(objective)/d(logits) [T, E]: from d(objective)/d(weight) [T, k] and the losses, weighted by
  // loss_scale (GPTModel::set_moe_loss_scale), their statistics summed over the ranks.
  std::vector<float> backward(const Routing& r, const std::vector<float>& dweight,
                              const std::vector<float>& stats, double loss_scale) const;

  // Aux-loss-free balancing: counts one forward's assignments towards this step's load, and moves
  // the bias by the step's load summed over ranks (`load`, [E]); then the count starts over.
  void count_load(const Routing& r);
  std::vector<int64_t>& load() { return load_; }
  void update_bias(const std::vector<int64_t>& load);
  // [E] fp32 on the host, replicated wherever the layer is; no gradient (grad undefined), not
  // trained: checkpointed as state. Undefined value when the bias is off.
  Parameter bias;

 private:
  const ModelConfig& c_;
  int64_t experts_, topk_;
  std::vector<int64_t> load_;
};

}  // namespace parallel::model
