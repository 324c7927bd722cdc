// Config loading, overrides, validation messages and the YAML round trip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/sharding.hpp"
#include "paths.hpp"

namespace parallel {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using parallel::testing::source_dir;

// The ConfigError message `run` throws, or "<no error>"; every message must be one line.
std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const ConfigError& e) {
    std::string message = e.what();
    EXPECT_THAT(message, StartsWith("config: "));
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_THAT(message, Not(HasSubstr(".cpp:"))) << "config errors carry no source location";
    return message;
  }
  return "<no error>";
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {},
                        int world = 1) {
  return error_of([&] { parse_config(yaml, overrides, world); });
}

// Defaults plus overrides.
std::string override_error(const std::vector<std::string>& overrides, int world = 1) {
  return parse_error("", overrides, world);
}

// ---- defaults, files, overrides ----------------------------------------------------------------

TEST(Config, EmptyDocumentGivesDefaults) {
  Config c = parse_config("", {}, 1);
  const Config defaults;
  EXPECT_EQ(c.model.num_layers, defaults.model.num_layers);
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.normalization, Normalization::LayerNorm);
  EXPECT_EQ(c.train.precision, Precision::FP32);
  EXPECT_EQ(c.train.output_dir, "runs/default");
  EXPECT_EQ(c.optimizer.lr_decay, LrDecay::Cosine);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.data.split, "969,30,1");
  EXPECT_TRUE(c.checkpoint.dir.empty());
  // Comments only, and a section whose keys are all commented out, are empty too.
  EXPECT_EQ(config_to_yaml(parse_config("# nothing\nmodel:\n  # num_layers: 4\n", {}, 1)), config_to_yaml(c));
}

TEST(Config, ValidationFillsDerivedFields) {
  Config c = parse_config("", {}, 2);
  EXPECT_EQ(c.parallel.data, 2);
  EXPECT_EQ(c.model.num_query_groups, c.model.num_attention_heads);
  EXPECT_EQ(c.model.ffn_hidden_size, 4 * c.model.hidden_size);
  EXPECT_EQ(c.model.max_position_embeddings, c.model.seq_length);

  c = parse_config("", {"parallel.tensor=2", "model.num_query_groups=2", "model.ffn_hidden_size=172"}, 8);
  EXPECT_EQ(c.parallel.data, 4);
  EXPECT_EQ(c.model.num_query_groups, 2);
  EXPECT_EQ(c.model.ffn_hidden_size, 172);
}

TEST(Config, ValidateIsIdempotent) {
  Config c = parse_config("", {"parallel.pipeline=2"}, 4);
  std::string before = config_to_yaml(c);
  validate_config(c, 4);
  validate_config(c, 4);
  EXPECT_EQ(config_to_yaml(c), before);
  EXPECT_EQ(c.parallel.data, 2);
}

TEST(Config, TinyYamlLoads) {
  std::string path = (source_dir() / "configs" / "tiny.yaml").string();
  Config c = load_config(path, {}, 1);
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_attention_heads, 4);
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.seq_length, 32);
  EXPECT_EQ(c.train.micro_batch_size, 2);
  EXPECT_EQ(c.train.global_batch_size, 8);
  EXPECT_EQ(c.train.steps, 10);
  EXPECT_EQ(c.data.path, "synthetic");
  EXPECT_EQ(c.parallel.data, 1);
  // The layouts its comments promise.
  EXPECT_EQ(load_config(path, {}, 4).parallel.data, 4);
  EXPECT_EQ(load_config(path, {"parallel.tensor=2", "parallel.pipeline=2"}, 4).parallel.data, 1);
}

TEST(Config, OverridesWinAndApplyInOrder) {
  Config c = parse_config("train:\n  steps: 3\n",
                          {"train.steps=5", "model.normalization=rmsnorm", "train.steps=7"}, 1);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.model.normalization, Normalization::RMSNorm);

  c = parse_config("checkpoint:\n  load: latest\n",
                   {"checkpoint.load=", "data.path=/data/my corpus", " optimizer.lr = 0.5", "train.seed=+42"},
                   1);
  EXPECT_EQ(c.checkpoint.load, "");
  EXPECT_EQ(c.data.path, "/data/my corpus");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.train.seed, 42u);
}

// Context parallelism runs on either device (its attention is built from device ops).
TEST(Config, ContextParallelOnCuda) {
  const Config c = parse_config("", {"parallel.context=2", "train.device=cuda"}, 2);
  EXPECT_EQ(c.parallel.context, 2);
  EXPECT_EQ(c.train.device, DeviceKind::CUDA);
}

TEST(Config, EnumsByLowercaseName) {
  Config c = parse_config(
      "model: {normalization: rmsnorm, activation: swiglu, position_embedding: rope}\n"
      "train: {precision: bf16, recompute: selective, device: cuda}\n"
      "optimizer: {lr_decay: linear}\n",
      {}, 1);
  EXPECT_EQ(c.model.normalization, Normalization::RMSNorm);
  EXPECT_EQ(c.model.activation, Activation::SwiGLU);
  EXPECT_EQ(c.model.position_embedding, PositionEmbedding::Rope);
  EXPECT_EQ(c.train.precision, Precision::BF16);
  EXPECT_EQ(c.train.recompute, Recompute::Selective);
  EXPECT_EQ(c.train.device, DeviceKind::CUDA);
  EXPECT_EQ(c.optimizer.lr_decay, LrDecay::Linear);
  EXPECT_EQ(parse_config("", {"train.precision=fp16", "train.recompute=full"}, 1).train.recompute,
            Recompute::Full);
}

// ---- reading errors ------------------------------------------------------------------------------

// ---- LoRA (docs/lora.md) -----------------------------------------------------------------------

TEST(ConfigLora, NestedMapDottedKeysAndListsAreTheSame) {
  const Config nested = parse_config(
      "model:\n  activation: swiglu\n  ffn_hidden_size: 128\n  lora:\n    rank: 8\n    alpha: 16\n"
      "    dropout: 0.1\n    target_modules: [q_proj, v_proj, down_proj]\n",
      {}, 1);
  const Config dotted = parse_config("model:\n  activation: swiglu\n  ffn_hidden_size: 128\n",
                                     {"model.lora.rank=8", "model.lora.alpha=16", "model.lora.dropout=0.1",
                                      "model.lora.target_modules=q_proj,v_proj,down_proj"},
                                     1);
  EXPECT_EQ(nested.model.lora.rank, 8);
  EXPECT_EQ(nested.model.lora.scale(), 2.0);
  EXPECT_EQ(nested.model.lora.target_modules, "q_proj,v_proj,down_proj");
  EXPECT_EQ(config_to_yaml(nested), config_to_yaml(dotted));
  EXPECT_TRUE(nested.model.lora_targets("q"));
  EXPECT_TRUE(nested.model.lora_targets("fc2"));
  EXPECT_FALSE(nested.model.lora_targets("k"));
  // The YAML written back reads as the same config.
  EXPECT_EQ(config_to_yaml(parse_config(config_to_yaml(nested), {}, 1)), config_to_yaml(nested));
  EXPECT_EQ(lora_target_modules("down_proj, q ,k_proj,q_proj"), (std::vector<std::string>{"q", "k", "fc2"}));
  EXPECT_EQ(lora_target_modules("w1,w2,w3"), (std::vector<std::string>{"gate", "up", "fc2"}));  // Mixtral
}

TEST(ConfigLora, OneLineErrors) {
  EXPECT_EQ(override_error({"model.lora.rank=4", "model.lora.target_modules=q,attn"}),
            "config: model.lora.target_modules = \"q,attn\": unknown module \"attn\" (q, k, v, o, fc1, gate, "
            "up, fc2, or q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, w1, w3, w2)");
  EXPECT_THAT(override_error({"model.lora.rank=4", "model.lora.target_modules=,"}),
              HasSubstr("names no module"));
  EXPECT_THAT(override_error({"model.lora.rank=4", "model.lora.target_modules=gate"}),
              HasSubstr("gate exists only in a swiglu MLP"));
  EXPECT_THAT(override_error({"model.lora.rank=4", "model.lora.target_modules=experts"}),
              HasSubstr("unknown module \"experts\""));
  EXPECT_EQ(override_error({"model.lora.rank=-1"}), "config: model.lora.rank = -1: must be >= 0");
  EXPECT_EQ(override_error({"model.lora.rank=4", "model.lora.alpha=0"}),
            "config: model.lora.alpha = 0.0: must be > 0");
  EXPECT_THAT(override_error({"model.lora.rank=4", "model.lora.dropout=1"}),
              StartsWith("config: model.lora.dropout = 1.0: must be in"));
  EXPECT_THAT(override_error({"model.lora.rank=4", "model.num_experts=4", "model.lora.dropout=0.1"}),
              HasSubstr("LoRA dropout on MoE models (model.num_experts > 0) is not supported"));
  EXPECT_EQ(override_error({"model.lora.rank=4", "model.num_experts=4"}), "<no error>");  // on the experts
  EXPECT_THAT(
      override_error({"model.lora.rank=4", "model.num_experts=4", "model.lora.target_modules=fc1,fc2"}),
      HasSubstr("adapters on the experts alone are not supported"));
  EXPECT_THAT(override_error({"model.lora.rnak=4"}), HasSubstr("model.lora.rnak: unknown key"));
  EXPECT_THAT(parse_error("model:\n  lora:\n    rank: 4\n    rank: 8\n"),
              HasSubstr("model.lora.rank: given twice"));
}

TEST(ConfigErrors, UnknownKeySuggestsTheNearest) {
  EXPECT_EQ(parse_error("model:\n  hidden_sise: 64\n"),
            "config: model.hidden_sise: unknown key (did you mean model.hidden_size?)");
  // A key in the wrong section points at the right one.
  EXPECT_THAT(parse_error("model:\n  tensor: 2\n"), HasSubstr("did you mean parallel.tensor?"));
  EXPECT_THAT(override_error({"optimizer.warmup=3"}), HasSubstr("did you mean optimizer.warmup_steps?"));
  std::string far = override_error({"model.zzzzzzzzzz=1"});
  EXPECT_THAT(far, HasSubstr("config: model.zzzzzzzzzz: unknown key"));
  EXPECT_THAT(far, Not(HasSubstr("did you mean")));
}

TEST(ConfigErrors, UnknownSection) {
  EXPECT_EQ(parse_error("modle:\n  num_layers: 2\n"), "config: modle: unknown section (did you mean model?)");
  EXPECT_THAT(
      parse_error("foo: {}\n"),
      HasSubstr(
          "config: foo: unknown section (sections: model, parallel, train, optimizer, data, checkpoint)"));
  EXPECT_THAT(override_error({"trian.steps=3"}), HasSubstr("trian: unknown section (did you mean train?)"));
}

TEST(ConfigErrors, SectionMustBeAMap) {
  EXPECT_THAT(parse_error("model: 3\n"), HasSubstr("config: model: must be a map"));
  EXPECT_THAT(parse_error("train: [1, 2]\n"), HasSubstr("config: train: must be a map"));
  EXPECT_THAT(parse_error("- model\n- train\n"), HasSubstr("the top level must be a map of sections"));
}

TEST(ConfigErrors, DataParallelSizeIsDerived) {
  std::string message = parse_error("parallel:\n  data: 2\n");
  EXPECT_THAT(message, HasSubstr("parallel.data"));
  EXPECT_THAT(message, HasSubstr("derived"));
  EXPECT_THAT(message, HasSubstr("world size"));
  EXPECT_THAT(override_error({"parallel.data=2"}), HasSubstr("derived"));
}

TEST(ConfigErrors, RepeatedKey) {
  EXPECT_THAT(parse_error("train:\n  steps: 3\n  steps: 4\n"), HasSubstr("train.steps: given twice"));
}

TEST(ConfigErrors, WrongTypes) {
  EXPECT_EQ(parse_error("train:\n  steps: ten\n"), "config: train.steps = \"ten\": expected an integer");
  EXPECT_EQ(override_error({"train.steps=2.5"}), "config: train.steps = 2.5: expected an integer");
  EXPECT_THAT(override_error({"train.steps=1e3"}), HasSubstr("expected an integer"));
  // Quoting makes a string, even of digits.
  EXPECT_THAT(parse_error("train:\n  steps: \"10\"\n"),
              HasSubstr("train.steps = \"10\": expected an integer"));
  EXPECT_THAT(parse_error("train:\n  steps:\n"), HasSubstr("train.steps = null: expected an integer"));
  EXPECT_THAT(parse_error("model:\n  num_layers: [1, 2]\n"),
              HasSubstr("model.num_layers = a list: expected an integer"));
  EXPECT_THAT(override_error({"train.steps=99999999999"}),
              HasSubstr("train.steps = 99999999999: out of range"));
  EXPECT_THAT(override_error({"train.seed=-1"}), HasSubstr("train.seed = -1: out of range [0, "));
  EXPECT_THAT(override_error({"model.add_bias=1"}), HasSubstr("model.add_bias = 1: expected true or false"));
  EXPECT_THAT(override_error({"model.add_bias=maybe"}), HasSubstr("expected true or false"));
  EXPECT_THAT(override_error({"model.dropout=abc"}), HasSubstr("model.dropout = \"abc\": expected a number"));
  EXPECT_THAT(override_error({"model.dropout=true"}), HasSubstr("model.dropout = true: expected a number"));
  EXPECT_THAT(override_error({"optimizer.lr=nan"}), HasSubstr("expected a finite number"));
  EXPECT_THAT(parse_error("data:\n  path: {a: 1}\n"), HasSubstr("data.path = a map: expected a string"));
}

TEST(ConfigErrors, EnumValueNotInTheList) {
  EXPECT_EQ(override_error({"model.normalization=batchnorm"}),
            "config: model.normalization = \"batchnorm\": must be one of layernorm, rmsnorm");
  EXPECT_THAT(override_error({"model.normalization=LayerNorm"}),
              HasSubstr("must be one of layernorm, rmsnorm"));
  EXPECT_THAT(override_error({"model.activation=relu"}), HasSubstr("must be one of gelu, swiglu"));
  EXPECT_THAT(override_error({"model.position_embedding=alibi"}), HasSubstr("must be one of learned, rope"));
  EXPECT_THAT(override_error({"train.precision=fp8"}), HasSubstr("must be one of fp32, bf16, fp16"));
  EXPECT_THAT(override_error({"train.recompute=some"}), HasSubstr("must be one of none, selective, full"));
  EXPECT_THAT(override_error({"optimizer.lr_decay=step"}),
              HasSubstr("must be one of constant, linear, cosine"));
  EXPECT_THAT(override_error({"train.device=tpu"}), HasSubstr("must be one of cpu, cuda"));
}

TEST(ConfigErrors, MalformedOverride) {
  EXPECT_EQ(override_error({"model.num_layers"}),
            "config: override \"model.num_layers\": expected section.key=value");
  EXPECT_THAT(override_error({"num_layers=2"}),
              HasSubstr("override \"num_layers=2\": expected section.key=value"));
  EXPECT_THAT(override_error({"=2"}), HasSubstr("override \"=2\""));
  EXPECT_THAT(override_error({"model.=2"}), HasSubstr("override \"model.=2\""));
  EXPECT_THAT(override_error({"model.num_layers=[1"}), HasSubstr("override \"model.num_layers=[1\""));
}

TEST(ConfigErrors, YamlSyntaxErrorNamesFileAndLine) {
  std::string message = parse_error("model:\n  num_layers: 2\n  hidden_size: [64\n");
  EXPECT_THAT(message, HasSubstr("config: <string>:"));
  EXPECT_THAT(message, HasSubstr("YAML syntax error"));

  auto path = std::filesystem::temp_directory_path() / "parallel_test_config_bad.yaml";
  std::ofstream(path) << "model:\n  num_layers: 2\n bad: indent: here\n";
  message = error_of([&] { load_config(path.string(), {}, 1); });
  std::filesystem::remove(path);
  EXPECT_THAT(message, HasSubstr(path.string() + ":3:"));
  EXPECT_THAT(message, HasSubstr("YAML syntax error"));
}

TEST(ConfigErrors, MissingFile) {
  EXPECT_THAT(error_of([] { load_config("/nonexistent/dir/tiny.yaml", {}, 1); }),
              HasSubstr("config: cannot read \"/nonexistent/dir/tiny.yaml\": No such file or directory"));
}

// ---- validation rules: each case is one rule seen failing -----------------------------------------

struct RuleCase {
  std::string name;
  std::vector<std::string> overrides;
  int world;
  std::vector<std::string> expected;  // substrings of the message: the key, the value, the rule
};

std::ostream& operator<<(std::ostream& out, const RuleCase& rule) { return out << rule.name; }

class ConfigRule : public ::testing::TestWithParam<RuleCase> {};

TEST_P(ConfigRule, FailsWithItsMessage) {
  const RuleCase& rule = GetParam();
  std::string message = override_error(rule.overrides, rule.world);
  for (const std::string& part : rule.expected) EXPECT_THAT(message, HasSubstr(part));
}

const RuleCase kRules[] = {
    // Counts.
    {"NumLayersPositive", {"model.num_layers=0"}, 1, {"model.num_layers = 0: must be >= 1"}},
    // pretrain_gpt --plan with this many layers was OOM-killed after 77 s, without a word.
    {"NumLayersBounded",
     {"model.num_layers=2147483647"},
     1,
     {"model.num_layers = 2147483647: must be <= 1048576"}},
    {"HiddenSizePositive", {"model.hidden_size=0"}, 1, {"model.hidden_size = 0: must be >= 1"}},
    {"HeadsPositive", {"model.num_attention_heads=0"}, 1, {"model.num_attention_heads = 0: must be >= 1"}},
    {"VocabPositive", {"model.vocab_size=0"}, 1, {"model.vocab_size = 0: must be >= 1"}},
    {"SeqLengthPositive", {"model.seq_length=-4"}, 1, {"model.seq_length = -4: must be >= 1"}},
    {"MicroBatchPositive", {"train.micro_batch_size=0"}, 1, {"train.micro_batch_size = 0: must be >= 1"}},
    {"GlobalBatchPositive", {"train.global_batch_size=0"}, 1, {"train.global_batch_size = 0: must be >= 1"}},
    {"StepsPositive", {"train.steps=0"}, 1, {"train.steps = 0: must be >= 1"}},
    {"TensorPositive", {"parallel.tensor=0"}, 1, {"parallel.tensor = 0: must be >= 1"}},
    {"PipelinePositive", {"parallel.pipeline=0"}, 1, {"parallel.pipeline = 0: must be >= 1"}},
    {"VirtualStagesPositive",
     {"parallel.virtual_stages=0"},
     1,
     {"parallel.virtual_stages = 0: must be >= 1"}},
    {"LogIntervalPositive", {"train.log_interval=0"}, 1, {"train.log_interval = 0: must be >= 1"}},
    {"EvalStepsPositive", {"train.eval_steps=0"}, 1, {"train.eval_steps = 0: must be >= 1"}},
    {"EvalIntervalNonNegative", {"train.eval_interval=-1"}, 1, {"train.eval_interval = -1: must be >= 0"}},
    {"WarmupNonNegative", {"optimizer.warmup_steps=-1"}, 1, {"optimizer.warmup_steps = -1: must be >= 0"}},
    {"SaveIntervalNonNegative",
     {"checkpoint.save_interval=-1"},
     1,
     {"checkpoint.save_interval = -1: must be >= 0"}},
    {"KeepLastNonNegative", {"checkpoint.keep_last=-2"}, 1, {"checkpoint.keep_last = -2: must be >= 0"}},
    {"QueryGroupsNonNegative",
     {"model.num_query_groups=-1"},
     1,
     {"model.num_query_groups = -1: must be >= 0"}},
    {"FfnNonNegative", {"model.ffn_hidden_size=-1"}, 1, {"model.ffn_hidden_size = -1: must be >= 0"}},
    {"MaxPositionsNonNegative",
     {"model.max_position_embeddings=-1"},
     1,
     {"model.max_position_embeddings = -1: must be >= 0"}},
    {"FirstStageNonNegative",
     {"parallel.first_stage_layers=-1"},
     1,
     {"parallel.first_stage_layers = -1: must be >= 0"}},
    {"BucketSizeNonNegative", {"optimizer.bucket_size=-1"}, 1, {"optimizer.bucket_size = -1: must be >= 0"}},
    // Mixture of experts.
    {"ExpertsNonNegative", {"model.num_experts=-1"}, 1, {"model.num_experts = -1: must be >= 0"}},
    {"TopkAtMostExperts",
     {"model.num_experts=4", "model.moe_router_topk=5"},
     1,
     {"model.moe_router_topk = 5: must be <= model.num_experts (4)"}},
    {"TopkPositive", {"model.moe_router_topk=0"}, 1, {"model.moe_router_topk = 0: must be >= 1"}},
    {"LayerFreqPositive", {"model.moe_layer_freq=0"}, 1, {"model.moe_layer_freq = 0: must be >= 1"}},
    {"AuxCoeffNonNegative",
     {"model.moe_aux_loss_coeff=-0.1"},
     1,
     {"model.moe_aux_loss_coeff = -0.1: must be >= 0"}},
    {"CapacityNonNegative",
     {"model.moe_capacity_factor=-1"},
     1,
     {"model.moe_capacity_factor = -1.0: must be >= 0"}},
    // MoE routing (router.hpp).
    {"ScoreFunctionKnown", {"model.moe_router_score_function=relu"}, 1, {"model.moe_router_score_function"}},
    {"ScalingPositive",
     {"model.moe_routed_scaling_factor=0"},
     1,
     {"model.moe_routed_scaling_factor = 0.0: must be > 0"}},
    {"TopkGroupAtMostGroups",
     {"model.num_experts=8", "model.moe_n_group=2", "model.moe_topk_group=3"},
     1,
     {"model.moe_topk_group = 3: must be in [1, model.moe_n_group] (2)"}},
    {"GroupsDivideExperts",
     {"model.num_experts=8", "model.moe_n_group=3"},
     1,
     {"model.moe_n_group = 3: must divide model.num_experts (8)"}},
    {"GroupsOfTwoAtLeast",
     {"model.num_experts=8", "model.moe_n_group=8", "model.moe_topk_group=4"},
     1,
     {"model.moe_n_group = 8: must leave at least 2 experts per group (model.num_experts = 8)"}},
    {"TopkFitsEligibleGroups",
     {"model.num_experts=8", "model.moe_n_group=4", "model.moe_topk_group=1", "model.moe_router_topk=3"},
     1,
     {"model.moe_router_topk = 3: must be <= model.moe_topk_group * experts per group (2)"}},
    {"SeqAuxNonNegative",
     {"model.moe_seq_aux_loss_coeff=-1"},
     1,
     {"model.moe_seq_aux_loss_coeff = -1.0: must be >= 0"}},
    {"ForceLoadBalancingNeedsExperts",
     {"model.moe_router_force_load_balancing=true"},
     1,
     {"model.moe_router_force_load_balancing = true: requires model.num_experts > 0"}},
    {"ForceLoadBalancingNotABool",
     {"model.num_experts=4", "model.moe_router_force_load_balancing=sometimes"},
     1,
     {"model.moe_router_force_load_balancing"}},
    {"BiasSpeedNonNegative",
     {"model.moe_bias_update_speed=-0.1"},
     1,
     {"model.moe_bias_update_speed = -0.1: must be >= 0"}},
    {"FirstKDenseNonNegative",
     {"model.moe_first_k_dense_replace=-1"},
     1,
     {"model.moe_first_k_dense_replace = -1: must be >= 0"}},
    {"MtpDepthNonNegative", {"model.mtp_num_layers=-1"}, 1, {"model.mtp_num_layers = -1: must be >= 0"}},
    {"MtpDepthBelowSequence",
     {"model.mtp_num_layers=2", "model.seq_length=2"},
     1,
     {"model.mtp_num_layers = 2: must be below model.seq_length (2)"}},
    {"MtpScaleNonNegative",
     {"model.mtp_loss_scaling_factor=-0.5"},
     1,
     {"model.mtp_loss_scaling_factor = -0.5: must be >= 0"}},
    {"MtpNeedsRope",
     {"model.mtp_num_layers=1", "model.position_embedding=learned"},
     1,
     {"model.mtp_num_layers = 1: must be 0 with model.position_embedding = learned"}},
    {"MtpRefusesLossMasks",
     {"model.mtp_num_layers=1", "model.position_embedding=rope", "data.eod_mask_loss=true",
      "data.eod_token=0"},
     1,
     {"model.mtp_num_layers = 1: must be 0 with data.format = sft, data.eod_mask_loss"}},
    {"MoeWithTensorNeedsSequenceParallel",
     {"model.num_experts=4", "parallel.tensor=2"},
     2,
     {"parallel.tensor = 2: MoE layers with tensor parallelism need parallel.sequence_parallel = true"}},
    {"SharedExpertDivisibleByTensor",
     {"model.num_experts=4", "parallel.tensor=2", "parallel.sequence_parallel=true",
      "model.moe_shared_expert_ffn_hidden_size=33"},
     2,
     {"model.moe_shared_expert_ffn_hidden_size = 33: must be divisible by parallel.tensor (2)"}},
    // Model shape.
    {"HiddenDivisibleByHeads",
     {"model.hidden_size=66"},
     1,
     {"model.hidden_size = 66: must be divisible by model.num_attention_heads (4)"}},
    {"HeadsDivisibleByQueryGroups",
     {"model.num_query_groups=3"},
     1,
     {"model.num_attention_heads = 4: must be divisible by model.num_query_groups (3)"}},
    {"HeadsDivisibleByTensor",
     {"model.num_attention_heads=6", "model.hidden_size=72", "parallel.tensor=4"},
     4,
     {"config: model.num_attention_heads = 6: must be divisible by parallel.tensor (4)"}},
    {"QueryGroupsDivisibleByTensor",
     {"model.num_attention_heads=8", "model.num_query_groups=2", "parallel.tensor=4"},
     4,
     {"model.num_query_groups = 2: must be divisible by parallel.tensor (4)"}},
    {"FfnDivisibleByTensor",
     {"model.num_attention_heads=8", "model.ffn_hidden_size=100", "parallel.tensor=8"},
     8,
     {"model.ffn_hidden_size = 100: must be divisible by parallel.tensor (8)"}},
    {"RopeHeadDimEven",
     {"model.position_embedding=rope", "model.hidden_size=36"},
     1,
     {"model.hidden_size = 36", "head dimension", "= 9 must be even for rope"}},
    {"RopeExplicitHeadDimEven",
     {"model.position_embedding=rope", "model.head_dim=9"},
     1,
     {"model.head_dim = 9: must be even for rope"}},
    {"HeadDimNonNegative", {"model.head_dim=-1"}, 1, {"model.head_dim = -1: must be >= 0"}},
    {"SeqLengthWithinPositions",
     {"model.seq_length=256", "model.max_position_embeddings=128"},
     1,
     {"model.seq_length = 256: must be <= model.max_position_embeddings (128) with learned position "
      "embeddings"}},
    // Parallel layout.
    {"WorldDivisibleByModelRanks",
     {"parallel.tensor=4"},
     6,
     {"world size = 6: must be divisible by parallel.tensor * parallel.pipeline * parallel.context "
      "(4 * 1 * 1 = 4)"}},
    {"WorldSizePositive", {}, 0, {"world size = 0: must be >= 1"}},
    {"ContextSequenceIntoChunks",
     {"parallel.context=2", "model.seq_length=6"},
     2,
     {"model.seq_length = 6: must be divisible by 2 * parallel.context (2 * 2 = 4) when parallel.context > "
      "1"}},
    {"ContextSequenceIntoChunksWithSp",
     {"parallel.context=2", "parallel.tensor=2", "parallel.sequence_parallel=true", "model.seq_length=12"},
     4,
     {"model.seq_length = 12: must be divisible by 2 * parallel.context * parallel.tensor (2 * 2 * 2 = 8) "
      "when parallel.context > 1 with parallel.sequence_parallel"}},
    {"ContextA2aHeads",
     {"parallel.context=4", "parallel.context_comm=a2a", "model.num_attention_heads=2"},
     4,
     {"model.num_attention_heads = 2: must be divisible by parallel.tensor * parallel.context (1 * 4 = 4) "
      "when parallel.context_comm is a2a"}},
    {"ContextA2aQueryGroups",
     {"parallel.context=2", "parallel.context_comm=a2a", "model.num_query_groups=1"},
     2,
     {"model.num_query_groups = 1: must be divisible by parallel.tensor * parallel.context (1 * 2 = 2)"}},
    {"ContextCommName", {"parallel.context_comm=ring"}, 1, {"parallel.context_comm", "ring"}},
    {"ExpertNeedsExperts", {"parallel.expert=2"}, 2, {"parallel.expert = 2: needs model.num_experts > 0"}},
    {"ExpertFoldsOntoTensorContextData",
     {"model.num_experts=8", "parallel.expert=4", "parallel.pipeline=2"},
     4,
     {"parallel.expert = 4: parallel.expert * parallel.expert_tensor must divide parallel.tensor * "
      "parallel.context * data (1 * 1 * 2 = 2)"}},
    {"ExpertTensorNeedsExperts",
     {"parallel.expert_tensor=2"},
     2,
     {"parallel.expert_tensor = 2: needs model.num_experts > 0"}},
    {"ExpertTensorFoldsOntoTensorContextData",
     {"model.num_experts=4", "parallel.expert_tensor=2", "parallel.pipeline=2"},
     2,
     {"parallel.expert_tensor = 2: parallel.expert * parallel.expert_tensor must divide parallel.tensor * "
      "parallel.context * data (1 * 1 * 1 = 1)"}},
    {"ExpertTensorWithExpertsFolds",
     {"model.num_experts=4", "parallel.expert=2", "parallel.expert_tensor=2"},
     2,
     {"parallel.expert = 2: parallel.expert * parallel.expert_tensor must divide parallel.tensor * "
      "parallel.context * data (1 * 1 * 2 = 2)"}},
    {"ExpertFfnDivisibleByExpertTensor",
     {"model.num_experts=4", "parallel.expert_tensor=4", "model.moe_ffn_hidden_size=6"},
     4,
     {"model.moe_ffn_hidden_size = 6: must be divisible by parallel.expert_tensor (4)"}},
    {"MoeHsdpReplicasDivideExpertData",
     {"model.num_experts=4", "parallel.expert=4", "optimizer.sharding=optim_grads",
      "optimizer.sharding_group_size=2"},
     8,
     {"optimizer.sharding_group_size = 2: with MoE, the replicas (data * parallel.context / "
      "optimizer.sharding_group_size = 4) must divide the expert data parallel size (parallel.tensor * "
      "parallel.context * data / (parallel.expert * parallel.expert_tensor) = 2)"}},
    {"LayersDivisibleByStages",
     {"model.num_layers=3", "parallel.pipeline=2"},
     2,
     {"model.num_layers = 3: must be divisible by parallel.pipeline * parallel.virtual_stages (2 * 1 = 2)"}},
    {"LayersDivisibleByVirtualStages",
     {"model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_stages=4"},
     2,
     {"model.num_layers = 4: must be divisible by parallel.pipeline * parallel.virtual_stages (2 * 4 = 8)"}},
    {"ExplicitStagesNeedPipeline",
     {"parallel.first_stage_layers=1"},
     1,
     {"parallel.first_stage_layers = 1: requires parallel.pipeline > 1"}},
    {"ExplicitStagesNeedOneVirtualStage",
     {"model.num_layers=8", "parallel.pipeline=2", "parallel.virtual_stages=2",
      "parallel.first_stage_layers=4"},
     2,
     {"parallel.virtual_stages = 2: must be 1 when parallel.first_stage_layers or parallel.last_stage_layers "
      "is set"}},
    {"FirstPlusLastIsAllLayersOnTwoStages",
     {"model.num_layers=8", "parallel.pipeline=2", "parallel.first_stage_layers=3",
      "parallel.last_stage_layers=4"},
     2,
     {"model.num_layers = 8: must equal parallel.first_stage_layers + parallel.last_stage_layers when "
      "parallel.pipeline is 2"}},
    {"MiddleStagesSplitEvenly",
     {"model.num_layers=10", "parallel.pipeline=4", "parallel.first_stage_layers=3",
      "parallel.last_stage_layers=2"},
     4,
     {"model.num_layers = 10", "the remaining layers (5) must split evenly over the other stages (2)"}},
    {"ExplicitStagesLeaveLayers",
     {"model.num_layers=4", "parallel.pipeline=3", "parallel.first_stage_layers=2",
      "parallel.last_stage_layers=2"},
     3,
     {"model.num_layers = 4", "the remaining layers (0) must split evenly over the other stages (1)"}},
    {"VirtualStagesNeedPipeline",
     {"parallel.virtual_stages=2"},
     1,
     {"parallel.virtual_stages = 2: requires parallel.pipeline > 1 (got 1)"}},
    {"VirtualStagesNeedMicroBatchesDivisibleByPipeline",
     {"model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_stages=2", "train.micro_batch_size=2",
      "train.global_batch_size=6"},
     2,
     {"train.global_batch_size = 6: the number of micro-batches",
      "= 3) must be divisible by parallel.pipeline (2)", "parallel.virtual_stages > 1"}},
    {"ZeroBubbleNeedsOneVirtualStage",
     {"model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_stages=2",
      "parallel.pipeline_schedule=zb-h1"},
     2,
     {"parallel.pipeline_schedule = zb-h1: requires parallel.virtual_stages = 1 (got 2)"}},
    {"OneFOneBNeedsOneVirtualStage",
     {"model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_stages=2",
      "parallel.pipeline_schedule=1f1b"},
     2,
     {"parallel.pipeline_schedule = 1f1b: requires parallel.virtual_stages = 1 (got 2)"}},
    {"InterleavedNeedsVirtualStages",
     {"parallel.pipeline=2", "parallel.pipeline_schedule=interleaved"},
     2,
     {"parallel.pipeline_schedule = interleaved: requires parallel.virtual_stages > 1 (got 1)"}},
    {"ZeroBubbleVNeedsTwoVirtualStages",
     {"model.num_layers=4", "parallel.pipeline=2", "parallel.pipeline_schedule=zb-v"},
     2,
     {"parallel.pipeline_schedule = zb-v: requires parallel.virtual_stages = 2 (got 1)"}},
    {"DualPipeVNeedsTwoVirtualStages",
     {"model.num_layers=12", "parallel.pipeline=2", "parallel.virtual_stages=3",
      "parallel.pipeline_schedule=dualpipe-v"},
     2,
     {"parallel.pipeline_schedule = dualpipe-v: requires parallel.virtual_stages = 2 (got 3)"}},
    {"VSchedulesNeedTwicePipelineMicroBatches",
     {"model.num_layers=8", "parallel.pipeline=4", "parallel.virtual_stages=2", "train.micro_batch_size=1",
      "train.global_batch_size=6", "parallel.pipeline_schedule=zb-v"},
     4,
     {"train.global_batch_size = 6: the number of micro-batches",
      "= 6) must be at least 2 * parallel.pipeline (8) for parallel.pipeline_schedule = zb-v"}},
    {"UnknownPipelineSchedule",
     {"parallel.pipeline_schedule=zb-h2"},
     1,
     {"parallel.pipeline_schedule", "zb-h2", "zb-h1"}},
    {"GlobalBatchDivisibleByMicroTimesData",
     {"train.global_batch_size=10", "train.micro_batch_size=2"},
     2,
     {"train.global_batch_size = 10: must be divisible by train.micro_batch_size * parallel.data (2 * 2 = "
      "4)"}},
    {"SequenceParallelNeedsTensor",
     {"parallel.sequence_parallel=true"},
     1,
     {"parallel.sequence_parallel = true: requires parallel.tensor > 1 (got 1)"}},
    {"SequenceParallelSeqLengthDivisible",
     {"parallel.sequence_parallel=true", "parallel.tensor=4", "model.seq_length=30"},
     4,
     {"model.seq_length = 30: must be divisible by parallel.tensor (4) when parallel.sequence_parallel is "
      "true"}},
    // Real-valued knobs.
    {"DropoutBelowOne", {"model.dropout=1"}, 1, {"model.dropout = 1.0: must be in [0.0, 1.0)"}},
    {"DropoutNonNegative", {"model.dropout=-0.1"}, 1, {"model.dropout = -0.1: must be in [0.0, 1.0)"}},
    {"InitStdPositive", {"model.init_std=0"}, 1, {"model.init_std = 0.0: must be > 0"}},
    {"NormEpsilonPositive", {"model.norm_epsilon=-1e-5"}, 1, {"model.norm_epsilon = -1.0e-05: must be > 0"}},
    {"RopeThetaPositive", {"model.rope_theta=0"}, 1, {"model.rope_theta = 0.0: must be >= 1"}},
    {"RopeThetaSubnormal", {"model.rope_theta=1e-310"}, 1, {"model.rope_theta = 1.0e-310: must be >= 1"}},
    // Window patterns need a window.
    {"WindowPatternNeedsWindow",
     {"model.sliding_window_pattern=2"},
     1,
     {"model.sliding_window_pattern = 2: needs model.sliding_window > 0"}},
    {"MaxWindowLayersNeedsWindow",
     {"model.max_window_layers=1"},
     1,
     {"model.max_window_layers = 1: needs model.sliding_window > 0"}},
    {"EodTokenBelowVocab",
     {"data.eod_token=999999", "model.vocab_size=1000"},
     1,
     {"data.eod_token = 999999: must be below model.vocab_size (1000)"}},
    {"SlidingWindowNonNegative", {"model.sliding_window=-1"}, 1, {"model.sliding_window = -1: must be >= 0"}},
    {"RopeScalingNeedsRope",
     {"model.rope_scaling=linear"},
     1,
     {"model.rope_scaling = linear: needs model.position_embedding = rope"}},
    {"RopeScalingFactorPositive",
     {"model.position_embedding=rope", "model.rope_scaling=linear", "model.rope_scaling_factor=0"},
     1,
     {"model.rope_scaling_factor = 0.0: must be in [0.001, 1000.0]"}},
    // 1e-310 passed "> 0", and the loss was NaN from step 2 while the run exited 0.
    {"RopeScalingFactorSubnormal",
     {"model.position_embedding=rope", "model.rope_scaling=linear", "model.rope_scaling_factor=1e-310"},
     1,
     {"model.rope_scaling_factor = 1.0e-310: must be in [0.001, 1000.0]"}},
    {"NonfinitePolicyNotWarn",
     {"train.nonfinite_policy=warn"},
     1,
     {"train.nonfinite_policy = warn: must be stop or skip (an update with inf or NaN gradients ruins every "
      "weight)"}},
    {"SpikeFactorAboveOne",
     {"train.spike_factor=0.5"},
     1,
     {"train.spike_factor = 0.5: must be 0 (off) or > 1"}},
    {"SdcCheckIntervalNonNegative",
     {"train.sdc_check_interval=-1"},
     1,
     {"train.sdc_check_interval = -1: must be >= 0"}},
    {"SdcPolicyNotSkip",
     {"train.sdc_policy=skip"},
     1,
     {"train.sdc_policy = skip: must be stop or warn (the two runs came from the same state"}},
    {"SdcCheckNeedsUnshardedGradients",
     {"train.sdc_check_interval=5", "optimizer.sharding=optim_grads"},
     2,
     {"train.sdc_check_interval = 5: needs optimizer.sharding = none or optim"}},
    {"SpikeWindowPositive", {"train.spike_window=0"}, 1, {"train.spike_window = 0: must be >= 1"}},
    {"MaxConsecutiveSkipsNonNegative",
     {"train.max_consecutive_skips=-1"},
     1,
     {"train.max_consecutive_skips = -1: must be >= 0"}},
    {"RopeHighAboveLowFreqFactor",
     {"model.position_embedding=rope", "model.rope_scaling=llama3", "model.rope_high_freq_factor=1"},
     1,
     {"model.rope_high_freq_factor = 1.0: must be > model.rope_low_freq_factor (1.0)"}},
    {"YarnBetaFastAtLeastBetaSlow",
     {"model.position_embedding=rope", "model.rope_scaling=yarn", "model.rope_beta_fast=0.5"},
     1,
     {"model.rope_beta_fast = 0.5: must be >= model.rope_beta_slow (1.0)"}},
    {"YarnKeysNeedYarn",
     {"model.position_embedding=rope", "model.rope_scaling=llama3", "model.rope_mscale_all_dim=1"},
     1,
     {"model.rope_mscale_all_dim = 1.0: needs model.rope_scaling = yarn"}},
    {"MlaNeedsRope",
     {"model.attention=mla", "model.kv_lora_rank=8", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
      "model.v_head_dim=8", "model.add_bias=false"},
     1,
     {"model.position_embedding = learned: must be rope with model.attention = mla"}},
    {"MlaNoBiases",
     {"model.attention=mla", "model.kv_lora_rank=8", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
      "model.v_head_dim=8", "model.add_bias=false", "model.position_embedding=rope", "model.add_bias=true"},
     1,
     {"model.add_bias = true: must be false with model.attention = mla"}},
    {"MlaRopeHeadEven",
     {"model.attention=mla", "model.kv_lora_rank=8", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
      "model.v_head_dim=8", "model.add_bias=false", "model.position_embedding=rope",
      "model.qk_rope_head_dim=3"},
     1,
     {"model.qk_rope_head_dim = 3: must be even (rope rotates pairs)"}},
    {"MlaKvLoraRankPositive",
     {"model.attention=mla", "model.kv_lora_rank=8", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
      "model.v_head_dim=8", "model.add_bias=false", "model.position_embedding=rope", "model.kv_lora_rank=0"},
     1,
     {"model.kv_lora_rank = 0: must be >= 1"}},
    {"MlaSizesNeedMla", {"model.v_head_dim=8"}, 1, {"model.v_head_dim = 8: needs model.attention = mla"}},
    {"HfRopeInterleaveNeedsMla",
     {"model.hf_rope_interleave=true"},
     1,
     {"model.hf_rope_interleave = true: needs model.attention = mla"}},
    {"PeakTflopsNonNegative", {"train.peak_tflops=-1"}, 1, {"train.peak_tflops = -1.0: must be >= 0"}},
    {"CommTimeoutPositive", {"train.comm_timeout_s=0"}, 1, {"train.comm_timeout_s = 0.0: must be > 0"}},
    {"LrPositive", {"optimizer.lr=0"}, 1, {"optimizer.lr = 0.0: must be > 0"}},
    {"MinLrAtMostLr",
     {"optimizer.lr=0.001", "optimizer.min_lr=0.01"},
     1,
     {"optimizer.min_lr = 0.01: must be in [0.0, optimizer.lr (0.001)]"}},
    {"MinLrNonNegative",
     {"optimizer.min_lr=-1e-5"},
     1,
     {"optimizer.min_lr = -1.0e-05: must be in [0.0, optimizer.lr"}},
    {"Beta1BelowOne", {"optimizer.beta1=1"}, 1, {"optimizer.beta1 = 1.0: must be in [0.0, 1.0)"}},
    {"Beta2BelowOne", {"optimizer.beta2=1.5"}, 1, {"optimizer.beta2 = 1.5: must be in [0.0, 1.0)"}},
    {"Beta2NonNegative", {"optimizer.beta2=-0.5"}, 1, {"optimizer.beta2 = -0.5: must be in [0.0, 1.0)"}},
    {"EpsPositive", {"optimizer.eps=0"}, 1, {"optimizer.eps = 0.0: must be > 0"}},
    {"WeightDecayNonNegative",
     {"optimizer.weight_decay=-0.1"},
     1,
     {"optimizer.weight_decay = -0.1: must be >= 0"}},
    {"ClipGradNonNegative", {"optimizer.clip_grad=-1"}, 1, {"optimizer.clip_grad = -1.0: must be >= 0"}},
    {"WarmupWithinSteps",
     {"optimizer.warmup_steps=20"},
     1,
     {"optimizer.warmup_steps = 20: must be <= train.steps (10)"}},
    {"OverlapParamGatherNeedsDistributed",
     {"optimizer.overlap_param_gather=true"},
     1,
     {"optimizer.overlap_param_gather = true: requires optimizer.distributed = true"}},
    {"OverlapUpdateName",
     {"optimizer.overlap_update=yes"},
     1,
     {"optimizer.overlap_update = \"yes\": must be one of auto, true, false"}},
    {"OverlapUpdateNeedsNoClipping",
     {"optimizer.overlap_update=true", "optimizer.clip_grad=0.5"},
     1,
     {"optimizer.overlap_update = true: requires optimizer.clip_grad = 0: clipping needs"}},
    {"OverlapUpdateNotFp16",
     {"optimizer.overlap_update=true", "optimizer.clip_grad=0", "train.precision=fp16"},
     1,
     {"optimizer.overlap_update = true: requires train.precision other than fp16"}},
    {"OverlapUpdateNotMuon",
     {"optimizer.overlap_update=true", "optimizer.clip_grad=0", "optimizer.type=muon"},
     1,
     {"optimizer.overlap_update = true: requires optimizer.type = adamw"}},
    {"OverlapUpdateGuardMustNotSkip",
     {"optimizer.overlap_update=true", "optimizer.clip_grad=0", "train.spike_factor=4",
      "train.spike_policy=skip"},
     1,
     {"optimizer.overlap_update = true: requires train.nonfinite_policy and train.spike_policy other than "
      "skip"}},
    {"OptimizerTypeName",
     {"optimizer.type=lion"},
     1,
     {"optimizer.type = \"lion\": must be one of adamw, muon"}},
    {"MuonMomentumBelowOne",
     {"optimizer.type=muon", "optimizer.muon_momentum=1"},
     1,
     {"optimizer.muon_momentum = 1.0: must be in [0.0, 1.0)"}},
    {"MuonNsStepsPositive",
     {"optimizer.type=muon", "optimizer.muon_ns_steps=0"},
     1,
     {"optimizer.muon_ns_steps = 0: must be in [1, 100) (torch.optim.Muon's bound)"}},
    {"MuonScaleName",
     {"optimizer.muon_scale=spectral"},
     1,
     {"optimizer.muon_scale = \"spectral\": must be one of match_rms_adamw, original"}},
    {"ShardingName",
     {"optimizer.sharding=zero3"},
     1,
     {"optimizer.sharding = \"zero3\": must be one of none, optim, optim_grads, optim_grads_params"}},
    {"ShardingGroupNonNegative",
     {"optimizer.sharding=optim", "optimizer.sharding_group_size=-1"},
     1,
     {"optimizer.sharding_group_size = -1: must be >= 0"}},
    {"ShardingGroupNeedsSharding",
     {"optimizer.sharding_group_size=2"},
     4,
     {"optimizer.sharding_group_size = 2: requires optimizer.sharding other than none"}},
    {"ShardingGroupDividesData",
     {"optimizer.sharding=optim_grads", "optimizer.sharding_group_size=3"},
     4,
     {"optimizer.sharding_group_size = 3: must divide parallel.data (4)"}},
    {"ReshardAfterForwardOnlyZero3",
     {"optimizer.sharding=optim_grads", "optimizer.reshard_after_forward=false"},
     2,
     {"optimizer.reshard_after_forward = false: may be false only with optimizer.sharding = "
      "optim_grads_params"}},
    {"PrefetchNonNegative",
     {"optimizer.prefetch_units=-1"},
     1,
     {"optimizer.prefetch_units = -1: must be >= 0"}},
    {"LossScalePositive",
     {"optimizer.initial_loss_scale=0"},
     1,
     {"optimizer.initial_loss_scale = 0.0: must be > 0"}},
    {"LossScaleWindowPositive",
     {"optimizer.loss_scale_window=0"},
     1,
     {"optimizer.loss_scale_window = 0: must be >= 1"}},
    // Data.
    {"SplitAtMostThree",
     {"data.split=1,2,3,4"},
     1,
     {"data.split = \"1,2,3,4\": must be one to three", "positive sum"}},
    {"SplitNumbers", {"data.split=a,b"}, 1, {"data.split = \"a,b\": must be one to three"}},
    {"SplitNonNegative",
     {"data.split=-1,2"},
     1,
     {"data.split = \"-1,2\": must be one to three", "non-negative"}},
    {"SplitPositiveSum", {"data.split=0,0,0"}, 1, {"data.split = \"0,0,0\": must be", "with a positive sum"}},
    {"SplitNotEmpty", {"data.split="}, 1, {"data.split = \"\": must be one to three"}},
    {"SplitNoEmptyPart", {"data.split=1,,"}, 1, {"data.split = \"1,,\": must be one to three"}},
    {"Tokenizer",
     {"data.tokenizer=bert"},
     1,
     {"data.tokenizer = \"bert\": must be one of GPT2BPETokenizer, ByteLevel, gpt2, HuggingFace"}},
    {"HuggingFaceTokenizerNeedsItsFile",
     {"data.tokenizer=HuggingFace"},
     1,
     {"data.tokenizer_file = \"\": is needed with data.tokenizer = HuggingFace (the tokenizer.json)"}},
    {"TokenizerFileOnlyWithHuggingFace",
     {"data.tokenizer=ByteLevel", "data.tokenizer_file=tokenizer.json"},
     1,
     {"data.tokenizer_file = \"tokenizer.json\": is read only with data.tokenizer = HuggingFace, not "
      "ByteLevel"}},
    {"TokenizerFileNotWithTheDefault",
     {"data.tokenizer_file=tokenizer.json"},
     1,
     {"data.tokenizer_file = \"tokenizer.json\": is read only with data.tokenizer = HuggingFace, not gpt2"}},
};

INSTANTIATE_TEST_SUITE_P(Rules, ConfigRule, ::testing::ValuesIn(kRules),
                         [](const auto& info) { return info.param.name; });

TEST(ConfigRules, ValidLayoutsPass) {
  // Explicit first/last stage layers with evenly split middle stages.
  Config c = parse_config("",
                          {"model.num_layers=10", "parallel.pipeline=4", "parallel.first_stage_layers=2",
                           "parallel.last_stage_layers=2"},
                          4);
  EXPECT_EQ(c.parallel.data, 1);
  // The V schedules need m >= 2p, not m divisible by p (9 micro-batches over 4 stages).
  parse_config(
      "",
      {"model.num_layers=8", "parallel.pipeline=4", "parallel.virtual_stages=2", "train.micro_batch_size=1",
       "train.global_batch_size=9", "parallel.pipeline_schedule=dualpipe-v"},
      4);
  // An explicit head size frees hidden_size from the heads (Qwen3), with qk-norm.
  parse_config(
      "",
      {"model.hidden_size=66", "model.head_dim=16", "model.position_embedding=rope", "model.qk_norm=true"},
      1);
  // Only the first stage given: the other stages share the rest.
  parse_config("", {"model.num_layers=7", "parallel.pipeline=3", "parallel.first_stage_layers=1"}, 3);
  parse_config("",
               {"model.num_layers=8", "parallel.pipeline=2", "parallel.first_stage_layers=3",
                "parallel.last_stage_layers=5"},
               2);
  // Interleaving with micro-batches divisible by the pipeline.
  parse_config("", {"model.num_layers=8", "parallel.pipeline=2", "parallel.virtual_stages=2"}, 4);
  // Context parallelism: 2 * context chunks; a2a with heads divisible by tp * cp; dp = world / (tp cp).
  EXPECT_EQ(parse_config("", {"parallel.context=4", "model.seq_length=32"}, 8).parallel.data, 2);
  parse_config("",
               {"parallel.context=2", "parallel.tensor=2", "parallel.sequence_parallel=true",
                "parallel.context_comm=a2a", "model.seq_length=32"},
               4);
  // Rope does not need a position table.
  parse_config(
      "", {"model.position_embedding=rope", "model.seq_length=256", "model.max_position_embeddings=128"}, 1);
  // Splits with missing parts and spaces.
  for (const char* split :
       {"data.split=1", "data.split=98,2", "data.split= 98 , 1.5 , 0.5", "data.split=0,1"}) {
    EXPECT_NO_THROW(parse_config("", {split}, 1)) << split;
  }
  for (const char* tokenizer : {"data.tokenizer=GPT2BPETokenizer", "data.tokenizer=ByteLevel"}) {
    EXPECT_NO_THROW(parse_config("", {tokenizer}, 1)) << tokenizer;
  }
  // HuggingFace with its tokenizer.json; document packing takes the end-of-document id from it, so
  // data.eod_token is not needed (the file itself is read by the trainer: check_tokenizer).
  {
    const Config hf = parse_config("",
                                   {"data.tokenizer=HuggingFace", "data.tokenizer_file=t/tokenizer.json",
                                    "data.reset_position_ids=true"},
                                   1);
    EXPECT_EQ(hf.data.tokenizer, "HuggingFace");
    EXPECT_EQ(hf.data.tokenizer_file, "t/tokenizer.json");
    EXPECT_EQ(parse_config(config_to_yaml(hf), {}, 1).data.tokenizer_file, "t/tokenizer.json");
  }
  EXPECT_NO_THROW(parse_config("", {"parallel.sequence_parallel=true", "parallel.tensor=2"}, 2));
  // MoE with every sharding mode; HSDP with 2 replicas over dp 8 and expert-dp 4 (ep 2).
  for (const char* sharding : {"optimizer.sharding=optim", "optimizer.sharding=optim_grads",
                               "optimizer.sharding=optim_grads_params"})
    EXPECT_NO_THROW(parse_config("", {"model.num_experts=4", "parallel.expert=2", sharding}, 4)) << sharding;
  EXPECT_NO_THROW(parse_config("",
                               {"model.num_experts=4", "parallel.expert=2", "optimizer.sharding=optim_grads",
                                "optimizer.sharding_group_size=4"},
                               8));
  EXPECT_NO_THROW(parse_config("", {"optimizer.distributed=true", "optimizer.overlap_param_gather=true"}, 1));
  // `distributed: true` is the spelling of `sharding: optim`; any sharding implies it.
  EXPECT_EQ(parse_config("", {"optimizer.distributed=true"}, 1).optimizer.sharding, Sharding::Optim);
  const Config zero3 =
      parse_config("",
                   {"optimizer.sharding=optim_grads_params", "optimizer.sharding_group_size=4",
                    "optimizer.reshard_after_forward=false", "optimizer.prefetch_units=2"},
                   8);
  EXPECT_TRUE(zero3.optimizer.distributed);
  EXPECT_EQ(zero3.optimizer.sharding, Sharding::OptimGradsParams);
  // The written config reads back the same (validation is idempotent).
  const Config again = parse_config(config_to_yaml(zero3), {}, 8);
  EXPECT_EQ(again.optimizer.sharding, Sharding::OptimGradsParams);
  EXPECT_EQ(again.optimizer.sharding_group_size, 4);
  EXPECT_FALSE(again.optimizer.reshard_after_forward);
  EXPECT_EQ(again.optimizer.prefetch_units, 2);
}

// ---- output ----------------------------------------------------------------------------------------

TEST(ConfigYaml, RoundTrips) {
  Config c;
  c.model.num_layers = 8;
  c.model.hidden_size = 128;
  c.model.num_attention_heads = 8;
  c.model.num_query_groups = 2;
  c.model.normalization = Normalization::RMSNorm;
  c.model.activation = Activation::SwiGLU;
  c.model.position_embedding = PositionEmbedding::Rope;
  c.model.add_bias = false;
  c.model.dropout = 0.1;
  c.model.rope_theta = 500000.0;
  c.parallel.tensor = 2;
  c.parallel.pipeline = 2;
  c.parallel.sequence_parallel = true;
  c.train.seed = std::numeric_limits<uint64_t>::max();
  c.train.precision = Precision::FP16;
  c.train.recompute = Recompute::Selective;
  c.train.output_dir = "runs/a: b #c";  // needs quoting in YAML
  c.train.device = DeviceKind::CUDA;
  c.optimizer.lr = 0.1 + 0.2;  // not exactly 0.3: checks the shortest exact printing
  c.optimizer.min_lr = 1e-7;
  c.optimizer.eps = 1e-8;
  c.optimizer.lr_decay = LrDecay::Linear;
  c.optimizer.bucket_size = int64_t{1} << 40;
  c.data.path = "123";        // a string of digits stays a string
  c.data.vocab_file = "yes";  // and so does a YAML 1.1 boolean
  c.data.merge_file = "~";    // and a YAML null
  c.checkpoint.load = "";
  validate_config(c, 8);

  std::string yaml = config_to_yaml(c);
  Config back = parse_config(yaml, {}, 8);
  EXPECT_EQ(config_to_yaml(back), yaml);
  EXPECT_EQ(back.parallel.data, 2);
  EXPECT_EQ(back.train.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(back.optimizer.lr, 0.1 + 0.2);
  EXPECT_EQ(back.optimizer.eps, 1e-8);
  EXPECT_EQ(back.optimizer.bucket_size, int64_t{1} << 40);
  EXPECT_EQ(back.train.output_dir, "runs/a: b #c");
  EXPECT_EQ(back.data.path, "123");
  EXPECT_EQ(back.data.vocab_file, "yes");
  EXPECT_EQ(back.data.merge_file, "~");
  EXPECT_EQ(back.checkpoint.load, "");
  EXPECT_EQ(back.model.normalization, Normalization::RMSNorm);
  EXPECT_EQ(back.train.device, DeviceKind::CUDA);
  EXPECT_FALSE(back.model.add_bias);

  // Defaults and tiny.yaml round-trip too.
  Config defaults = parse_config("", {}, 1);
  EXPECT_EQ(config_to_yaml(parse_config(config_to_yaml(defaults), {}, 1)), config_to_yaml(defaults));
  Config tiny = load_config((source_dir() / "configs" / "tiny.yaml").string(), {}, 2);
  EXPECT_EQ(config_to_yaml(parse_config(config_to_yaml(tiny), {}, 2)), config_to_yaml(tiny));
}

// Keys as the reference lists them: the first word of every line after the header.
std::vector<std::string> reference_keys() {
  std::istringstream lines(config_reference());
  std::vector<std::string> keys;
  std::string line;
  std::getline(lines, line);  // header
  while (std::getline(lines, line)) keys.push_back(line.substr(0, line.find(' ')));
  return keys;
}

TEST(ConfigYaml, EmitsEveryKey) {
  std::string yaml = config_to_yaml(Config{});
  std::vector<std::string> keys = reference_keys();
  // Both directions, with no count to keep in step: the reference's keys are unique and are exactly
  // the "section.name" pairs the emitter writes.
  std::set<std::string> listed(keys.begin(), keys.end());
  EXPECT_EQ(listed.size(), keys.size()) << "config_reference() lists a key twice";
  std::set<std::string> emitted;
  {
    std::istringstream lines(yaml);
    std::string line, section;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      if (line[0] != ' ') {
        section = line.substr(0, line.find(':'));
      } else if (line.rfind("  ", 0) == 0 && line[2] != ' ' && line[2] != '-') {
        emitted.insert(section + "." + line.substr(2, line.find(':') - 2));
      }
    }
  }
  EXPECT_EQ(emitted, listed);
  for (const std::string& key : keys) {
    std::string section = key.substr(0, key.find('.'));
    std::string name = key.substr(key.find('.') + 1);
    size_t at = yaml.find("\n" + section + ":\n");
    if (section == "model") at = 0;  // the first section starts the document
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_NE(yaml.find("\n  " + name + ": ", at), std::string::npos) << key;
  }
  EXPECT_THAT(yaml, Not(HasSubstr("  data: ")));  // parallel.data is derived, not a key
}

TEST(ConfigReference, ListsKeyTypeDefaultAndMeaning) {
  std::string reference = config_reference();
  EXPECT_THAT(reference, HasSubstr("model.num_layers"));
  EXPECT_THAT(reference, HasSubstr("layernorm|rmsnorm"));
  EXPECT_THAT(reference, HasSubstr("\"runs/default\""));
  EXPECT_THAT(reference, HasSubstr("number of transformer layers"));
  EXPECT_THAT(reference, Not(HasSubstr("parallel.data ")));
}

TEST(ConfigReference, DocumentationCoversEveryKey) {
  std::ifstream file(source_dir() / "docs" / "configuration.md");
  ASSERT_TRUE(file) << "docs/configuration.md";
  std::stringstream text;
  text << file.rdbuf();
  for (const std::string& key : reference_keys()) {
    EXPECT_THAT(text.str(), HasSubstr("`" + key + "`")) << "docs/configuration.md does not document " << key;
  }
}

// Every shipped config loads and validates for the world size its comments name.
TEST(ConfigFiles, ShippedConfigsAreValid) {
  const std::pair<const char*, int> files[] = {{"tiny.yaml", 1},
                                               {"quickstart.yaml", 4},
                                               {"moe_small.yaml", 4},
                                               {"gpt2_124m.yaml", 1},
                                               {"gpt2_124m.yaml", 8},
                                               {"gpt_1b_gpu.yaml", 8},
                                               {"qwen3_moe_tiny.yaml", 4},
                                               {"mla_tiny.yaml", 4},
                                               {"deepseek_v3_tiny.yaml", 1},
                                               {"deepseek_v3_tiny.yaml", 4},
                                               {"deepseek_v3_small.yaml", 4}};
  for (const auto& [name, world] : files) {
    const std::string path = (source_dir() / "configs" / name).string();
    // world is copied into the lambda by name: Clang 14 cannot capture a structured binding.
    EXPECT_NO_THROW(load_config(path, {}, world))
        << name << " at world size " << world << ": "
        << error_of([&path, world = world] { load_config(path, {}, world); });
  }
}

// ---- strict parsing: one document, printable messages -----------------------------------------

TEST(ConfigStrict, MoreThanOneYamlDocumentIsRefusedNamingTheFile) {
  // yaml-cpp's Load would read the first document and ignore the second without a word.
  const std::string message = error_of(
      [] { parse_config("model:\n  num_layers: 2\n---\nmodel:\n  num_layers: 4\n", {}, 1, "run.yaml"); });
  EXPECT_THAT(message, HasSubstr("run.yaml"));
  EXPECT_THAT(message, HasSubstr("2 YAML documents"));
  // One document with an explicit start marker is still one document.
  EXPECT_EQ(parse_config("---\nmodel:\n  num_layers: 3\n", {}, 1).model.num_layers, 3);
}

TEST(ConfigStrict, RawBytesOfABinaryFileAreEscapedInMessages) {
  // A key holding a byte that is not UTF-8 (as in a binary file given as --config).
  const std::string message = parse_error("model:\n  hidden\x99size: 8\n");
  EXPECT_THAT(message, HasSubstr("\\x99"));
  EXPECT_EQ(message.find('\x99'), std::string::npos) << message;
  // Valid UTF-8 is kept as written.
  const std::string accented = "gr\xc3\xb6\xc3\x9f";  // "groß", two UTF-8 sequences
  EXPECT_THAT(parse_error("model:\n  " + accented + "e: 8\n"), HasSubstr(accented + "e"));
}

// yaml-cpp 0.7's LoadAll never returns on a document starting with a stray ',' (it re-reads the
// same null document forever, growing): found by the config fuzz target
// (fuzz/corpus/config_yaml/timeout-stray-comma-hangs-yaml-loadall).
TEST(ConfigErrors, StrayCommaIsASyntaxErrorNotAHang) {
  EXPECT_THAT(parse_error(","), HasSubstr("config: <string>:1:1: YAML syntax error: unexpected \",\" here"));
  EXPECT_THAT(parse_error("  , model: {}"), HasSubstr("<string>:1:3: YAML syntax error: unexpected \",\""));
  EXPECT_THAT(parse_error("train:\n  steps: 3\n---\n,"), HasSubstr("YAML syntax error: unexpected \",\""));
  // Commas where YAML allows them still parse.
  EXPECT_EQ(parse_config("model: {num_layers: 4, hidden_size: 32}\n", {}, 1).model.hidden_size, 32);
}

// Inputs the config fuzz target (fuzz/config_yaml.cpp) keeps as regressions: the derived values
// used to be computed in int and overflow (undefined behaviour) before any rule could refuse them.
TEST(ConfigErrors, DerivedSizesThatOverflowAreRefused) {
  EXPECT_THAT(override_error({"model.hidden_size=1073741824", "model.num_attention_heads=1"}),
              HasSubstr("config: model.hidden_size = 1073741824: must be <= 536870911 when "
                        "model.ffn_hidden_size is 0 (it defaults to 4 * model.hidden_size)"));
  // An explicit ffn_hidden_size lifts the limit.
  EXPECT_NO_THROW(parse_config(
      "", {"model.hidden_size=1073741824", "model.num_attention_heads=1", "model.ffn_hidden_size=1024"}, 1));
  EXPECT_THAT(
      override_error({"model.num_layers=1", "parallel.pipeline=3", "parallel.first_stage_layers=2147483647",
                      "parallel.last_stage_layers=2147483647"},
                     3),
      HasSubstr("the remaining layers (-4294967293) must split evenly over the other stages (1)"));
}

// The names programs take from their own flags (schedule_from_name, sharding_from_name) are the
// config's spellings, every one of them, and the inverse of the name functions.
TEST(ConfigNames, ScheduleAndShardingNamesAreTheConfigs) {
  for (PipelineSchedule kind : {PipelineSchedule::Auto, PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
                                PipelineSchedule::Interleaved, PipelineSchedule::ZeroBubbleH1,
                                PipelineSchedule::ZeroBubbleV, PipelineSchedule::DualPipeV}) {
    const std::string name = pipeline::schedule_name(kind);
    EXPECT_EQ(pipeline::schedule_from_name(name), kind) << name;
    // Interleaving and the V schedules need two stages per rank: give them a layout that fits.
    const bool v = kind == PipelineSchedule::Interleaved || kind == PipelineSchedule::ZeroBubbleV ||
                   kind == PipelineSchedule::DualPipeV;
    const std::string yaml = "parallel:\n  pipeline_schedule: " + name + "\n" +
                             (v ? "  pipeline: 2\n  virtual_stages: 2\nmodel:\n  num_layers: 4\n" : "");
    Config c;
    EXPECT_NO_THROW(c = parse_config(yaml, {}, v ? 2 : 1)) << name;
    EXPECT_EQ(c.parallel.pipeline_schedule, kind) << name;
  }
  for (Sharding mode : {Sharding::None, Sharding::Optim, Sharding::OptimGrads, Sharding::OptimGradsParams}) {
    const std::string name = sharding_name(mode);
    EXPECT_EQ(sharding_from_name(name), mode) << name;
    EXPECT_EQ(parse_config("optimizer:\n  sharding: " + name + "\n", {}, 1).optimizer.sharding, mode) << name;
  }
  try {
    pipeline::schedule_from_name("1F1B");
    ADD_FAILURE() << "schedule_from_name accepted 1F1B";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(
        e.what(),
        "unknown pipeline schedule '1F1B' (expected one of auto, gpipe, 1f1b, interleaved, zb-h1, zb-v, "
        "dualpipe-v)");
  }
  try {
    sharding_from_name("zero3");
    ADD_FAILURE() << "sharding_from_name accepted zero3";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(
        e.what(),
        "unknown sharding mode 'zero3' (expected one of none, optim, optim_grads, optim_grads_params)");
  }
}

}  // namespace
}  // namespace parallel
