#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/metrics.hpp"

using namespace parallel;

TEST(Metrics, ModelFlopsMatchTheClosedFormForGpt2Small) {
  // GPT-2 124M: L=12, h=768, 12 heads, s=1024, V=50257, GeLU with 4h FFN. Megatron's closed form
  // for this architecture (Narayanan et al. 2021, eq. 3) per token:
  //   72 L h^2 (1 + s/(6h) + V/(12 L h)) / 1   (FLOPs per token, forward + backward)
  ModelConfig m;
  m.num_layers = 12;
  m.hidden_size = 768;
  m.num_attention_heads = 12;
  m.seq_length = 1024;
  m.vocab_size = 50257;
  const double L = 12, h = 768, s = 1024, V = 50257;
  const double closed = 72.0 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
  EXPECT_NEAR(model_flops_per_token(m) / closed, 1.0, 1e-12);
}

TEST(Metrics, GroupedQueryAttentionAndSwiGluChangeTheCount) {
  ModelConfig m;
  m.num_layers = 1;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.seq_length = 8;
  m.vocab_size = 10;
  const double mha = model_flops_per_token(m);
  m.num_query_groups = 2;  // k and v each lose 64 x 32 weights: 2 x 2048 fewer multiply-adds
  EXPECT_DOUBLE_EQ(mha - model_flops_per_token(m), 3.0 * 2.0 * 2.0 * 64 * 32);
  m.num_query_groups = 0;
  m.activation = Activation::SwiGLU;
  m.ffn_hidden_size = 256;  // same as the GeLU default 4h: one more [h, f] matrix
  EXPECT_DOUBLE_EQ(model_flops_per_token(m) - mha, 3.0 * 2.0 * 64 * 256);
}

// A MoE layer counts the router, the top-k experts a token visits and the shared expert: with 8
// experts of width 64, top-2 and a shared expert of 32, the GeLU MLP's 2 [h, 256] matrices become
// [8, h] + 2 x 2 [h, 64] + 2 [h, 32].
TEST(Metrics, MoeFlopsCountTheExpertsATokenVisits) {
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.seq_length = 8;
  m.vocab_size = 10;
  const double dense = model_flops_per_token(m);
  m.num_experts = 8;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 64;
  m.moe_shared_expert_ffn_hidden_size = 32;
  m.moe_layer_freq = 2;  // layer 0 only
  const double moe_layer = 64.0 * 8 + 2 * 2 * 64.0 * 64 + 2 * 64.0 * 32;
  EXPECT_DOUBLE_EQ(dense - model_flops_per_token(m), 3.0 * 2.0 * (2 * 64.0 * 256 - moe_layer));
}

TEST(Metrics, JsonLinesAreWrittenAndFlushed) {
  const auto dir = std::filesystem::temp_directory_path() / "parallel_test_metrics";
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "sub" / "metrics.jsonl").string();
  {
    MetricsWriter w(path);
    StepMetrics s;
    s.step = 1;
    s.loss = 4.5;
    s.lr = 1e-3;
    s.grad_norm = std::numeric_limits<double>::infinity();
    s.comm_wait_ms = 12.5;
    w.write_train(s);
    w.write_eval(1, 4.25);
    std::ifstream in(path);  // readable before the writer closes: flushed per line
    std::string line;
    std::getline(in, line);
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"], 1);
    EXPECT_EQ(j["loss"], 4.5);
    EXPECT_TRUE(j["grad_norm"].is_null());
    EXPECT_EQ(j["comm_wait_ms"], 12.5);
    for (const char* key : {"lr", "tokens_per_sec", "step_time_ms", "mfu", "peak_flops_per_rank"})
      EXPECT_TRUE(j.contains(key)) << key;
    std::getline(in, line);
    EXPECT_EQ(nlohmann::json::parse(line)["eval_loss"], 4.25);
  }
  std::filesystem::remove_all(dir);
}

TEST(Metrics, GuardCountsAndSkipReasonsAreWritten) {
  const auto dir = std::filesystem::temp_directory_path() / "parallel_test_metrics_guard";
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "metrics.jsonl").string();
  {
    MetricsWriter w(path);
    StepMetrics s;
    s.step = 6;
    s.loss = 4.5;
    s.skipped = true;
    s.skip_reason = "spike";
    s.skipped_steps = 2;
    s.spikes = 1;
    s.nonfinite_steps = 1;
    w.write_train(s);
    s.step = 7;
    s.skipped = false;
    s.skip_reason.clear();
    w.write_train(s);
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["skipped"], true);
    EXPECT_EQ(j["skip_reason"], "spike");
    EXPECT_EQ(j["skipped_steps"], 2);
    EXPECT_EQ(j["spikes"], 1);
    EXPECT_EQ(j["nonfinite_steps"], 1);
    std::getline(in, line);
    j = nlohmann::json::parse(line);
    EXPECT_FALSE(j.contains("skipped"));
    EXPECT_FALSE(j.contains("skip_reason"));
    EXPECT_EQ(j["spikes"], 1);  // counts since the start, on every line
    StepMetrics spike;
    spike.skipped = true;
    spike.skip_reason = "spike";
    EXPECT_THAT(progress_line(spike, 10, 1), testing::EndsWith(" | skipped (spike)"));
    spike.skip_reason = "overflow";
    spike.loss_scale = 1024;
    EXPECT_THAT(progress_line(spike, 10, 1), testing::EndsWith(" | skipped (loss scale 1024)"));
  }
  std::filesystem::remove_all(dir);
}

TEST(Metrics, ProgressLineIsReadable) {
  StepMetrics s;
  s.step = 120;
  s.loss = 4.12345;
  s.lr = 2.95e-4;
  s.grad_norm = 0.8123;
  s.tokens_per_sec = 12345;
  s.mfu = 0.412;
  EXPECT_EQ(progress_line(s, 2000, 192),
            "step  120/2000 | loss 4.1235 | lr 2.95e-04 | grad 0.812 | 12.3k tok/s | MFU 41.2% | ETA 3m12s");
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(3720), "1h02m");
}

TEST(Metrics, StragglersAreRanksFarAboveTheMedianBusyTime) {
  // Median (the lower one for an even count) 0.2 s: 0.5 s is 2.5x and 0.3 s above it; 0.35 s is not 2x.
  const std::vector<double> busy = {0.2, 0.21, 0.5, 0.19, 0.35, 0.2};
  EXPECT_EQ(find_stragglers(busy), (std::vector<int>{2}));
  const std::string line = straggler_warning(busy, find_stragglers(busy));
  EXPECT_EQ(
      line,
      "straggler: rank 2 busy 500 ms per step (2.5x the median); median 200 ms over 6 ranks (busy: step "
      "time outside communication waits)");
  // Two ranks: the lower median is the faster rank.
  EXPECT_EQ(find_stragglers(std::vector<double>{1.0, 2.5}), (std::vector<int>{1}));
  // Millisecond steps: 3x the median but only 4 ms above it is scheduler noise, not a straggler.
  EXPECT_TRUE(find_stragglers(std::vector<double>{0.002, 0.002, 0.006, 0.002}).empty());
  EXPECT_EQ(find_stragglers(std::vector<double>{0.002, 0.002, 0.006, 0.002}, 2.0, 0.0),
            (std::vector<int>{2}));
  EXPECT_TRUE(find_stragglers(std::vector<double>{1.0}).empty());
  EXPECT_TRUE(straggler_warning(busy, {}).empty());
}
