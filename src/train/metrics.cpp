#include "parallel/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "parallel/error.hpp"

namespace parallel {

double model_flops_per_token(const ModelConfig& m) {
  const double h = m.hidden_size, L = m.num_layers, s = m.seq_length, V = m.vocab_size;
  const double heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = m.attention_head_dim();
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4.0 * h;
  // Weights a token is multiplied with, per layer: q, k, v, output projection, and the MLP
  // (SwiGLU has three matrices, GeLU two).
  double attn_weights = h * (heads * d) + 2.0 * h * (groups * d) + (heads * d) * h;
  // q·kᵀ over query/key heads of dqk, p·v over value heads of dv.
  double dqk = d, dv = d;
  if (m.is_mla()) {
    // Multi-head latent attention: the down projections, the up projections from the latents, proj.
    dqk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    dv = m.v_head_dim;
    const double rq = m.q_lora_rank, rkv = m.kv_lora_rank;
    const double q_weights = rq > 0 ? h * rq + rq * heads * dqk : h * heads * dqk;
    attn_weights =
        q_weights + h * (rkv + m.qk_rope_head_dim) + rkv * heads * (m.qk_nope_head_dim + dv) + heads * dv * h;
  }
  const double matrices = m.activation == Activation::SwiGLU ? 3.0 : 2.0;
  const double mlp_weights = matrices * h * ffn;
  // A MoE layer: the router, the top-k experts a token visits and the shared expert; the other
  // experts' weights do no work for it.
  const double expert_ffn = m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : ffn;
  const double moe_weights = h * m.num_experts + m.moe_router_topk * matrices * h * expert_ffn +
                             matrices * h * m.moe_shared_expert_ffn_hidden_size;
  double moe_layers = 0;
  for (int i = 0; i < m.num_layers; ++i) moe_layers += m.is_moe_layer(i);
  const double ffn_weights = (L - moe_layers) * mlp_weights + moe_layers * moe_weights;
  double forward = 2.0 * (L * attn_weights + ffn_weights + h * V)  // matmuls with weights
                   + L * 2.0 * s * heads * (dqk + dv);             // q·kᵀ and p·v
  // Multi-token prediction: per depth eh_proj (2h -> h), a layer of the last one's make-up, the
  // output layer and its attention.
  const double last_ffn = m.is_moe_layer(m.num_layers - 1) ? moe_weights : mlp_weights;
  forward += m.mtp_num_layers *
             (2.0 * (2.0 * h * h + attn_weights + last_ffn + h * V) + 2.0 * s * heads * (dqk + dv));
  return 3.0 * forward;
}

MetricsWriter::MetricsWriter(const std::string& path) : out_(path) {}

namespace {
// JSON has no NaN or infinity: write null so that every line still parses.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

bool MetricsWriter::write_train(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", number(m.loss)},
                      {"lr", number(m.lr)},
                      {"grad_norm", number(m.grad_norm)},
                      {"tokens_per_sec", number(m.tokens_per_sec)},
                      {"step_time_ms", number(m.step_time_ms)},
                      {"mfu", number(m.mfu)},
                      {"peak_flops_per_rank", number(m.peak_flops_per_rank)},
                      {"host_reads", m.host_reads},
                      {"conversion_bytes", m.conversion_bytes},
                      {"minor_faults", m.minor_faults},
                      {"comm_wait_ms", number(m.comm_wait_ms)},
                      {"mem_peak_bytes", m.mem_peak_bytes}};
  if (m.loss_scale > 0) j["loss_scale"] = m.loss_scale;
  if (m.skipped) {
    j["skipped"] = true;
    j["skip_reason"] = m.skip_reason;
  }
  j["skipped_steps"] = m.skipped_steps;
  j["spikes"] = m.spikes;
  j["nonfinite_steps"] = m.nonfinite_steps;
  if (!m.moe_tokens_per_expert.empty()) {
    j["moe_aux_loss"] = number(m.moe_aux_loss);
    j["moe_z_loss"] = number(m.moe_z_loss);
    j["moe_tokens_per_expert"] = m.moe_tokens_per_expert;
  }
  if (!m.moe_expert_bias.empty()) {
    j["moe_expert_bias"] = m.moe_expert_bias;
    j["moe_expert_bias_spread"] = number(m.moe_expert_bias_spread);
  }
  if (!m.mtp_losses.empty()) {
    j["mtp_loss"] = number(m.mtp_loss);
    nlohmann::json depths = nlohmann::json::array();
    for (double l : m.mtp_losses) depths.push_back(number(l));
    j["mtp_losses"] = depths;
  }
  return out_.append(j.dump());
}

bool MetricsWriter::write_eval(int64_t step, double eval_loss) {
  return out_.append(nlohmann::json({{"step", step}, {"eval_loss", number(eval_loss)}}).dump());
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
}

std::string progress_line(const StepMetrics& m, int64_t total_steps, double seconds_left) {
  const int width = static_cast<int>(std::to_string(total_steps).size());
  std::string tps = m.tokens_per_sec >= 1e3 ? fmt::format("{:.1f}k", m.tokens_per_sec / 1e3)
                                            : fmt::format("{:.0f}", m.tokens_per_sec);
  std::string line = fmt::format(
      "step {:>{}}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {} tok/s | MFU {:.1f}% | ETA {}", m.step,
      width, total_steps, m.loss, m.lr, m.grad_norm, tps, 100.0 * m.mfu, format_duration(seconds_left));
  if (m.skipped && (m.skip_reason == "overflow" || m.skip_reason.empty()))
    line += fmt::format(" | skipped (loss scale {:g})", m.loss_scale);
  else if (m.skipped)
    line += fmt::format(" | skipped ({})", m.skip_reason == "spike" ? "spike" : "not finite");
  return line;
}

namespace {
double lower_median(std::span<const double> v) {
  std::vector<double> sorted(v.begin(), v.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted[(sorted.size() - 1) / 2];
}
}  // namespace

std::vector<int> find_stragglers(std::span<const double> busy_s, double factor, double min_excess_s) {
  std::vector<int> out;
  if (busy_s.size() < 2) return out;
  const double median = lower_median(busy_s);
  for (std::size_t r = 0; r < busy_s.size(); ++r)
    if (busy_s[r] > factor * median && busy_s[r] - median >= min_excess_s) out.push_back(static_cast<int>(r));
  return out;
}

std::string straggler_warning(std::span<const double> busy_s, const std::vector<int>& stragglers) {
  if (stragglers.empty() || busy_s.empty()) return {};
  const double median = lower_median(busy_s);
  std::string out = stragglers.size() == 1 ? "straggler: " : "stragglers: ";
  for (std::size_t i = 0; i < stragglers.size(); ++i) {
    const double t = busy_s[static_cast<std::size_t>(stragglers[i])];
    out += fmt::format("{}rank {} busy {:.0f} ms per step ({:.1f}x the median)", i ? ", " : "", stragglers[i],
                       t * 1e3, median > 0 ? t / median : 0.0);
  }
  return out + fmt::format("; median {:.0f} ms over {} ranks (busy: step time outside communication waits)",
                           median * 1e3, busy_s.size());
}

}  // namespace parallel
