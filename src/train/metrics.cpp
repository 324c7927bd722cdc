#include "parallel/metrics.hpp"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "parallel/error.hpp"

namespace parallel {

double model_flops_per_token(const ModelConfig& m) {
  const double h = m.hidden_size, L = m.num_layers, s = m.seq_length, V = m.vocab_size;
  const double heads = m.num_attention_heads;
  const double groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const double d = h / heads;
  const double ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4.0 * h;
  // Weights a token is multiplied with, per layer: q, k, v, output projection, and the MLP
  // (SwiGLU has three matrices, GeLU two).
  const double attn_weights = h * (heads * d) + 2.0 * h * (groups * d) + (heads * d) * h;
  const double mlp_weights = (m.activation == Activation::SwiGLU ? 3.0 : 2.0) * h * ffn;
  const double forward = 2.0 * (L * (attn_weights + mlp_weights) + h * V)  // matmuls with weights
                         + L * 2.0 * 2.0 * s * heads * d;                  // q·kᵀ and p·v
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
                      {"host_reads", m.host_reads}};
  if (m.loss_scale > 0) j["loss_scale"] = m.loss_scale;
  if (m.skipped) j["skipped"] = true;
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
  if (m.skipped) line += fmt::format(" | skipped (loss scale {:g})", m.loss_scale);
  return line;
}

}  // namespace parallel
