// The MoE router (router.hpp; docs/model.md, "Routing").
#include "router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "parallel/error.hpp"

namespace parallel::model {

Router::Router(const ModelConfig& config, int layer)
    : c_(config), experts_(config.num_experts), topk_(config.moe_router_topk) {
  load_.assign(static_cast<std::size_t>(experts_), 0);
  if (config.moe_router_expert_bias) {
    // HF's name (DeepseekV3TopkRouter.e_score_correction_bias) under the router's prefix.
    bias.name = fmt::format("layers.{}.mlp.router.e_score_correction_bias", layer);
    bias.value = Tensor::zeros({experts_}, DType::F32);
    bias.global_shape = {experts_};
  }
}

namespace {

// The balanced choice (router.hpp): token t's j-th choice is expert (t k + j) mod E, so over T tokens
// each expert gets T k / E assignments (within one when E does not divide T k), and k <= E choices
// of a token are distinct.
int32_t balanced_choice(int64_t t, int64_t j, int64_t k, int64_t E) {
  return static_cast<int32_t>((t * k + j) % E);
}

}  // namespace

void Router::route(const float* logits, int64_t T, int64_t B, Routing& r) const {
  const int64_t E = experts_, k = topk_;
  const auto Es = static_cast<std::size_t>(E);
  const bool sigmoid = c_.moe_router_score_function == MoeScoreFunction::Sigmoid;
  const float* bias_v = bias.value.defined() ? bias.value.data<float>() : nullptr;
  const int64_t G = c_.moe_n_group, per_group = E / G, eligible_groups = c_.moe_topk_group;
  r.tokens = T;
  r.sequences = B;
  r.logits.assign(logits, logits + T * E);
  r.scores.resize(static_cast<std::size_t>(T * E));
  r.lse.resize(static_cast<std::size_t>(T));
  r.choice.resize(static_cast<std::size_t>(T * k));
  r.weight.resize(static_cast<std::size_t>(T * k));
  std::vector<float> choose(Es);
  std::vector<int32_t> order(Es), groups(static_cast<std::size_t>(G));
  std::vector<float> group_score(static_cast<std::size_t>(G));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float* s = r.scores.data() + t * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    r.lse[static_cast<std::size_t>(t)] = static_cast<float>(std::log(sum) + mx);
    for (int64_t e = 0; e < E; ++e)
      s[e] = sigmoid ? static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))))
                     : static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / sum);
    // Scores for choosing: bias-corrected, and -inf outside the token's best groups.
    for (std::size_t e = 0; e < Es; ++e) choose[e] = bias_v != nullptr ? s[e] + bias_v[e] : s[e];
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        const float* c = choose.data() + g * per_group;
        float a = -INFINITY, b = -INFINITY;  // the group's two best
        for (int64_t i = 0; i < per_group; ++i) {
          if (c[i] > a) {
            b = a;
            a = c[i];
          } else if (c[i] > b) {
            b = c[i];
          }
        }
        group_score[static_cast<std::size_t>(g)] = a + b;
      }
      std::iota(groups.begin(), groups.end(), 0);
      std::partial_sort(
          groups.begin(), groups.begin() + eligible_groups, groups.end(), [&](int32_t a, int32_t b) {
            return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
          });
      std::vector<char> keep(static_cast<std::size_t>(G), 0);
      for (int64_t i = 0; i < eligible_groups; ++i) keep[static_cast<std::size_t>(groups[i])] = 1;
      for (std::size_t e = 0; e < Es; ++e)
        if (!keep[e / static_cast<std::size_t>(per_group)]) choose[e] = -INFINITY;
    }
    if (c_.moe_router_force_load_balancing) {
      for (int64_t j = 0; j < k; ++j) order[static_cast<std::size_t>(j)] = balanced_choice(t, j, k, E);
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return choose[a] > choose[b] || (choose[a] == choose[b] && a < b);
      });
    }
    // Combine weights from the scores without the bias.
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += s[order[static_cast<std::size_t>(j)]];
    const double norm = c_.moe_norm_topk_prob ? chosen : 1.0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<std::size_t>(j)];
      r.choice[static_cast<std::size_t>(t * k + j)] = e;
      r.weight[static_cast<std::size_t>(t * k + j)] =
          static_cast<float>(static_cast<double>(s[e]) / norm * c_.moe_routed_scaling_factor);
    }
  }
}

void Router::route_balanced(int64_t T, int64_t B, Routing& r) const {
  const int64_t E = experts_, k = topk_;
  r.tokens = T;
  r.sequences = B;
  r.logits.assign(static_cast<std::size_t>(T * E), 0.0f);
  r.scores.assign(static_cast<std::size_t>(T * E), 1.0f / static_cast<float>(E));
  r.lse.assign(static_cast<std::size_t>(T), 0.0f);
  r.choice.resize(static_cast<std::size_t>(T * k));
  r.weight.assign(static_cast<std::size_t>(T * k), 1.0f / static_cast<float>(k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      r.choice[static_cast<std::size_t>(t * k + j)] = balanced_choice(t, j, k, E);
}

namespace {

// s' of one token: the scores as the balance losses see them (sum 1 for sigmoid too).
void normalised(const float* s, int64_t E, bool sigmoid, std::vector<double>& out) {
  double sum = 1.0;
  if (sigmoid) {
    sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += s[e];
  }
  for (int64_t e = 0; e < E; ++e) out[static_cast<std::size_t>(e)] = s[e] / sum;
}

}  // namespace

std::vector<float> Router::statistics(const Routing& r) const {
  const int64_t E = experts_, k = topk_, T = r.tokens, B = r.sequences;
  const auto Es = static_cast<std::size_t>(E), Bs = static_cast<std::size_t>(B);
  const bool sigmoid = c_.moe_router_score_function == MoeScoreFunction::Sigmoid;
  // [E] counts, [E] sum s', [B, E] counts, [B, E] sum s', sum lse^2, T.
  std::vector<float> st(2 * Es + 2 * Bs * Es + 2, 0.0f);
  float *count = st.data(), *mass = count + E, *seq_count = mass + E, *seq_mass = seq_count + B * E;
  std::vector<double> sn(Es);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = t % B;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = r.choice[static_cast<std::size_t>(t * k + j)];
      count[e] += 1.0f;
      seq_count[b * E + e] += 1.0f;
    }
    normalised(r.scores.data() + t * E, E, sigmoid, sn);
    for (int64_t e = 0; e < E; ++e) {
      mass[e] += static_cast<float>(sn[static_cast<std::size_t>(e)]);
      seq_mass[b * E + e] += static_cast<float>(sn[static_cast<std::size_t>(e)]);
    }
    const float l = r.lse[static_cast<std::size_t>(t)];
    st[st.size() - 2] += l * l;
  }
  st.back() = static_cast<float>(T);
  return st;
}

Router::Losses Router::losses(const std::vector<float>& st, int64_t B) const {
  const int64_t E = experts_, k = topk_;
  const float *count = st.data(), *mass = count + E, *seq_count = mass + E, *seq_mass = seq_count + B * E;
  const double T = st.back(), S = T / static_cast<double>(B), Ed = static_cast<double>(E),
               kd = static_cast<double>(k);
  Losses out;
  double dot = 0, seq_dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(count[e]) * mass[e];
  for (int64_t i = 0; i < B * E; ++i) seq_dot += static_cast<double>(seq_count[i]) * seq_mass[i];
  out.aux = c_.moe_aux_loss_coeff * Ed / (kd * T * T) * dot;
  out.seq_aux = c_.moe_seq_aux_loss_coeff * Ed / (static_cast<double>(B) * kd * S * S) * seq_dot;
  out.z = c_.moe_z_loss_coeff * st[st.size() - 2] / T;
  return out;
}

std::vector<float> Router::backward(const Routing& r, const std::vector<float>& dweight,
                                    const std::vector<float>& st, double scale) const {
  const int64_t E = experts_, k = topk_, T = r.tokens, B = r.sequences;
  const auto Es = static_cast<std::size_t>(E);
  const bool sigmoid = c_.moe_router_score_function == MoeScoreFunction::Sigmoid;
  const float *count = st.data(), *seq_count = count + 2 * E;
  const double Tt = st.back(), S = Tt / static_cast<double>(B), Ed = static_cast<double>(E),
               kd = static_cast<double>(k);
  const double aux_g = c_.moe_aux_loss_coeff * Ed / (kd * Tt * Tt) * scale;
  const double seq_g = c_.moe_seq_aux_loss_coeff * Ed / (static_cast<double>(B) * kd * S * S) * scale;
  const double z_g = c_.moe_z_loss_coeff * 2.0 / Tt * scale;
  const double alpha = c_.moe_routed_scaling_factor;
  std::vector<float> dlogits(static_cast<std::size_t>(T * E));
  std::vector<double> ds(Es), sn(Es);
  for (int64_t t = 0; t < T; ++t) {
    const float* s = r.scores.data() + t * E;
    const float* l = r.logits.data() + t * E;
    const int64_t b = t % B;
    // The balance losses, through s' = s / sum s (sigmoid) or s' = s.
    double inner = 0, sum = 1.0;
    normalised(s, E, sigmoid, sn);
    for (std::size_t e = 0; e < Es; ++e) {
      ds[e] = aux_g * count[e] + seq_g * seq_count[static_cast<std::size_t>(b) * Es + e];
      inner += ds[e] * sn[e];
    }
    if (sigmoid) {
      sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += s[e];
      for (std::size_t e = 0; e < Es; ++e) ds[e] = (ds[e] - inner) / sum;
    }
    // The combine weights w_j = alpha s[e_j] (/ U, U = sum_j s[e_j]).
    const int32_t* ch = r.choice.data() + t * k;
    const float* dw = dweight.data() + t * k;
    if (c_.moe_norm_topk_prob) {
      double U = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) U += s[ch[j]];
      for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(dw[j]) * s[ch[j]];
      for (int64_t j = 0; j < k; ++j) ds[static_cast<std::size_t>(ch[j])] += alpha / U * (dw[j] - dot / U);
    } else {
      for (int64_t j = 0; j < k; ++j) ds[static_cast<std::size_t>(ch[j])] += alpha * dw[j];
    }
    // The score function, and the z loss (its gradient is softmax(logits) whatever the scores).
    double sds = 0;
    if (!sigmoid)
      for (int64_t e = 0; e < E; ++e) sds += s[e] * ds[static_cast<std::size_t>(e)];
    const double lse = r.lse[static_cast<std::size_t>(t)];
    for (int64_t e = 0; e < E; ++e) {
      const double de = ds[static_cast<std::size_t>(e)];
      double g = sigmoid ? de * s[e] * (1.0 - s[e]) : s[e] * (de - sds);
      if (z_g != 0) g += z_g * lse * std::exp(static_cast<double>(l[e]) - lse);
      dlogits[static_cast<std::size_t>(t * E + e)] = static_cast<float>(g);
    }
  }
  return dlogits;
}

void Router::count_load(const Routing& r) {
  for (int32_t e : r.choice) ++load_[static_cast<std::size_t>(e)];
}

void Router::update_bias(const std::vector<int64_t>& load_in) {
  const std::vector<int64_t> load = load_in;  // may be load_ itself, which restarts here
  std::fill(load_.begin(), load_.end(), 0);
  if (!bias.value.defined()) return;
  PARALLEL_CHECK(static_cast<int64_t>(load.size()) == experts_,
                 "Router::update_bias: {} loads for {} experts", load.size(), experts_);
  int64_t total = 0;
  for (int64_t n : load) total += n;
  float* b = bias.value.data<float>();
  // sign(mean - load_e) in integers: sign(total - E load_e).
  for (std::size_t e = 0; e < load.size(); ++e) {
    const int64_t d = total - experts_ * load[e];
    const double step = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
    b[e] = static_cast<float>(static_cast<double>(b[e]) + c_.moe_bias_update_speed * step);
  }
}

}  // namespace parallel::model
