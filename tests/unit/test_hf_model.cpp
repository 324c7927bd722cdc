// Hugging Face folders (include/parallel/hf_model.hpp): config.json parsing and its refusals, the
// tensor checks, sharded folders, sizes, and config.json written back. The numbers (training the
// imported models against PyTorch, on one rank and tp2 x pp2) are tests/scripts/hf_llama.sh.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/hf_model.hpp"
#include "parallel/safetensors.hpp"
#include "paths.hpp"

namespace parallel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Tensors = std::map<std::string, Tensor>;
using parallel::testing::fixtures_dir;
using ::testing::HasSubstr;

std::string read(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

json fixture_config(const std::string& model) {
  return json::parse(read(fixtures_dir() + "/hf_" + model + "_tiny/config.json"));
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("test_hf_model_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str(const std::string& child) const { return (path_ / child).string(); }

 private:
  fs::path path_;
};

// The one-line message of `f`'s parallel::Error (empty and a failure if nothing is thrown).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string config_error(const json& j) {
  return error_of([&] { hf::model_from_config_json(j.dump(), "config.json"); });
}

TEST(HfModel, ReadsTheFixturesConfigs) {
  const hf::HfModel llama = hf::model_from_config_json(fixture_config("llama").dump(), "llama");
  EXPECT_EQ(llama.architecture, hf::Architecture::Llama);
  const ModelConfig& m = llama.model;
  EXPECT_EQ(m.num_layers, 2);
  EXPECT_EQ(m.hidden_size, 24);
  EXPECT_EQ(m.num_attention_heads, 4);
  EXPECT_EQ(m.num_query_groups, 2);
  EXPECT_EQ(m.ffn_hidden_size, 32);
  EXPECT_EQ(m.vocab_size, 48);
  EXPECT_EQ(m.max_position_embeddings, 64);
  EXPECT_EQ(m.seq_length, 64);
  EXPECT_EQ(m.normalization, Normalization::RMSNorm);
  EXPECT_EQ(m.activation, Activation::SwiGLU);
  EXPECT_EQ(m.position_embedding, PositionEmbedding::Rope);
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(m.norm_epsilon, 1e-5);
  EXPECT_FALSE(m.add_bias);
  EXPECT_FALSE(m.add_qkv_bias);
  EXPECT_FALSE(m.tie_embeddings);

  const hf::HfModel qwen2 = hf::model_from_config_json(fixture_config("qwen2").dump(), "qwen2");
  EXPECT_EQ(qwen2.architecture, hf::Architecture::Qwen2);
  EXPECT_TRUE(qwen2.model.add_qkv_bias);
  EXPECT_FALSE(qwen2.model.add_bias);
  EXPECT_TRUE(qwen2.model.tie_embeddings);

  // Mistral: the window is the model's, no cap on the sequence (sliding-window attention).
  json mistral = fixture_config("mistral");
  mistral["max_position_embeddings"] = 32768;
  mistral["sliding_window"] = 1024;
  const hf::HfModel mis = hf::model_from_config_json(mistral.dump(), "mistral");
  EXPECT_EQ(mis.architecture, hf::Architecture::Mistral);
  EXPECT_EQ(mis.model.sliding_window, 1024);
  EXPECT_EQ(mis.model.seq_length, 4096);
  EXPECT_EQ(mis.model.num_attention_heads, 6);

  const hf::HfModel gpt2 =
      hf::model_from_config_json(read(fixtures_dir() + "/hf_gpt2_tiny_config.json"), "gpt2");
  EXPECT_EQ(gpt2.architecture, hf::Architecture::GPT2);
  EXPECT_EQ(gpt2.model.ffn_hidden_size, 128);
  EXPECT_EQ(gpt2.model.max_position_embeddings, 16);
  EXPECT_EQ(gpt2.model.normalization, Normalization::LayerNorm);
}

json t5_config(const std::string& model) {
  return json::parse(read(fixtures_dir() + "/hf_" + model + "_t5/config.json"));
}

// transformers 5 writes rope_parameters (theta and scaling together) and dtype; 4.x wrote rope_theta,
// rope_scaling and torch_dtype. Both read as the same model.
TEST(HfModel, ReadsTransformers5Configs) {
  const hf::HfModel llama = hf::model_from_config_json(t5_config("llama").dump(), "llama_t5");
  EXPECT_EQ(llama.architecture, hf::Architecture::Llama);
  EXPECT_DOUBLE_EQ(llama.model.rope_theta, 500000.0);
  EXPECT_EQ(llama.model.rope_scaling.type, RopeScalingType::None);
  EXPECT_EQ(config_to_yaml(Config{.model = llama.model}),
            config_to_yaml(
                Config{.model = hf::model_from_config_json(fixture_config("llama").dump(), "4.x").model}));

  const hf::HfModel llama3 = hf::model_from_config_json(t5_config("llama3").dump(), "llama3_t5");
  EXPECT_DOUBLE_EQ(llama3.model.rope_theta, 10000.0);
  EXPECT_EQ(llama3.model.rope_scaling.type, RopeScalingType::Llama3);
  EXPECT_DOUBLE_EQ(llama3.model.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(llama3.model.rope_scaling.high_freq_factor, 32.0);
  EXPECT_DOUBLE_EQ(llama3.model.rope_scaling.original_max_position_embeddings, 256.0);
  EXPECT_EQ(config_to_yaml(Config{.model = llama3.model}),
            config_to_yaml(
                Config{.model = hf::model_from_config_json(fixture_config("llama3").dump(), "4.x").model}));

  const hf::HfModel mistral = hf::model_from_config_json(t5_config("mistral").dump(), "mistral_t5");
  EXPECT_EQ(mistral.architecture, hf::Architecture::Mistral);
  EXPECT_DOUBLE_EQ(mistral.model.rope_theta, 1e6);
  EXPECT_EQ(mistral.model.sliding_window, 4096);
  EXPECT_EQ(mistral.model.hf_architecture, "MistralForCausalLM");

  const hf::HfModel qwen2 = hf::model_from_config_json(t5_config("qwen2").dump(), "qwen2_t5");
  EXPECT_EQ(qwen2.architecture, hf::Architecture::Qwen2);
  EXPECT_DOUBLE_EQ(qwen2.model.rope_theta, 1000.0);
  EXPECT_EQ(qwen2.model.sliding_window, 0);

  // A rope_parameters without rope_type is "default" (transformers 5 fills it in); the same
  // rotary embedding given in both layouts is accepted.
  json j = t5_config("llama");
  j["rope_parameters"].erase("rope_type");
  EXPECT_DOUBLE_EQ(hf::model_from_config_json(j.dump(), "c").model.rope_theta, 500000.0);
  j = t5_config("llama3");
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = j["rope_parameters"];
  j["rope_scaling"].erase("rope_theta");
  j["torch_dtype"] = "float32";
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "c").model.rope_scaling.type, RopeScalingType::Llama3);
}

// Two keys that say two different things: transformers 4.x reads the top-level ones, 5.x
// rope_parameters' theta and rope_scaling's type. Refused, naming both.
TEST(HfModel, RefusesConflictingDuplicatesNamingBothKeys) {
  json j = t5_config("llama");
  j["rope_theta"] = 10000.0;
  EXPECT_THAT(config_error(j),
              HasSubstr("rope_theta = 10000.0 and rope_parameters.rope_theta = 500000.0 disagree"));
  j["rope_theta"] = 500000.0;
  EXPECT_NO_THROW(hf::model_from_config_json(j.dump(), "c"));

  j = t5_config("llama3");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  EXPECT_THAT(config_error(j), HasSubstr("rope_scaling = {\"factor\":8.0,\"rope_type\":\"linear\"} and "
                                         "rope_parameters = {"));
  j = t5_config("llama");
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 32}};
  EXPECT_THAT(config_error(j), HasSubstr("disagree"));
  j = t5_config("llama");
  j["rope_parameters"]["type"] = "linear";
  EXPECT_THAT(config_error(j), HasSubstr("rope_parameters.rope_type = \"default\" and rope_parameters.type = "
                                         "\"linear\" disagree"));
  j = fixture_config("llama");
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_THAT(config_error(j),
              HasSubstr("architectures = [\"MistralForCausalLM\"] and model_type = \"llama\" disagree"));
}

// The key table: every key is read, known inert, or refused in one line naming it and the rule.
TEST(HfModel, RefusesEveryKeyThatChangesTheModelAndIsNotRead) {
  // Unknown to the table: refused.
  for (const char* key :
       {"attn_logit_softcapping", "final_logit_softcapping", "qk_layernorm", "no_rope_layers",
        "attention_chunk_size", "residual_multiplier", "embedding_multiplier"}) {
    json j = t5_config("llama");
    j[key] = 30.0;
    EXPECT_THAT(config_error(j),
                HasSubstr(fmt::format("config.json: {} = 30.0: not supported: it changes the model", key)));
  }
  // A key of another family: Qwen2's window keys mean nothing to a Llama reader.
  json j = t5_config("llama");
  j["use_sliding_window"] = false;
  EXPECT_THAT(config_error(j), HasSubstr("use_sliding_window = false: not supported: it changes the model"));
  j = t5_config("llama");
  j["sliding_window"] = 4096;
  EXPECT_THAT(config_error(j), HasSubstr("sliding_window = 4096: not supported"));
  // Known and refused.
  j = t5_config("llama");
  j["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_THAT(config_error(j),
              HasSubstr("quantization_config = {\"quant_method\":\"fp8\"}: not supported: it "
                        "changes the model (quantized weights)"));
  j = t5_config("llama");
  j["auto_map"] = {{"AutoModelForCausalLM", "modeling.Model"}};
  EXPECT_THAT(config_error(j), HasSubstr("auto_map = "));
  // Inert only at the default.
  const std::pair<const char*, json> at_default[] = {{"partial_rotary_factor", 0.5},
                                                     {"pruned_heads", {{"0", {1}}}},
                                                     {"is_encoder_decoder", true},
                                                     {"add_cross_attention", true},
                                                     {"torchscript", true}};
  for (const auto& [key, value] : at_default) {
    j = t5_config("llama");
    j[key] = value;
    EXPECT_THAT(config_error(j),
                HasSubstr(fmt::format("{} = {}: not supported: it changes the model", key, value.dump())));
  }
  j = t5_config("llama");
  j["partial_rotary_factor"] = 1.0;
  j["pruned_heads"] = json::object();
  EXPECT_NO_THROW(hf::model_from_config_json(j.dump(), "c"));
  j = t5_config("llama");
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(config_error(j), HasSubstr("rope_parameters.partial_rotary_factor = 0.5: not supported"));
  j = t5_config("llama");
  j["rope_parameters"]["attention_factor"] = 1.2;
  EXPECT_THAT(config_error(j),
              HasSubstr("rope_parameters.attention_factor = 1.2: not supported: it changes the model"));
  // Qwen2's windows: layer_types must say what use_sliding_window and max_window_layers say.
  j = t5_config("qwen2");
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THAT(config_error(j), HasSubstr("layer 1 must be \"full_attention\""));
  // Dropout that is not ours: attention-only dropout.
  j = t5_config("llama");
  j["attention_dropout"] = 0.1;
  EXPECT_THAT(config_error(j), HasSubstr("attention_dropout = 0.1: not supported"));
  json gpt2 = json::parse(read(fixtures_dir() + "/hf_gpt2_tiny_config.json"));
  gpt2["attn_pdrop"] = 0.1;
  EXPECT_THAT(config_error(gpt2), HasSubstr("attn_pdrop = 0.1: not supported: must equal resid_pdrop"));
  gpt2 = json::parse(read(fixtures_dir() + "/hf_gpt2_tiny_config.json"));
  gpt2["scale_attn_weights"] = false;
  EXPECT_THAT(config_error(gpt2),
              HasSubstr("scale_attn_weights = false: not supported: it changes the model"));

  // Inert keys of every kind are accepted: tokens, generation, outputs, bookkeeping, dtype.
  j = t5_config("llama");
  for (const char* key :
       {"_name_or_path", "output_attentions", "output_hidden_states", "return_dict", "use_cache",
        "torchscript", "use_bfloat16", "chunk_size_feed_forward", "problem_type", "max_length", "temperature",
        "top_p", "do_sample", "num_beams", "_attn_implementation"})
    j[key] = nullptr;
  j["eos_token_id"] = {128001, 128008, 128009};
  j["torch_dtype"] = "bfloat16";  // the storage dtype, even against dtype: tensors carry their own
  j["id2label"] = {{"0", "LABEL_0"}};
  EXPECT_NO_THROW(hf::model_from_config_json(j.dump(), "c"));
}

// YaRN as transformers reads it (_compute_yarn_parameters, standardize_rope_params): defaults for
// null or absent beta_fast / beta_slow / mscale / attention_factor / truncate, and a missing
// original_max_position_embeddings taken from max_position_embeddings; written back as transformers
// 5 writes it (the keys that are set) and read again to the same model.
TEST(HfModel, ReadsAndWritesYarn) {
  // Phi-3's top-level original_max_position_embeddings is not read: refused, not ignored.
  json phi = fixture_config("llama");
  phi["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  phi["original_max_position_embeddings"] = 32;
  EXPECT_THAT(config_error(phi), HasSubstr("original_max_position_embeddings = 32: not supported"));

  json j = t5_config("llama");
  j["rope_parameters"] = {{"rope_type", "yarn"},  {"rope_theta", 1000000.0}, {"factor", 4.0},
                          {"beta_fast", nullptr}, {"mscale", 0.707},         {"mscale_all_dim", 0.707},
                          {"truncate", false}};
  const hf::HfModel m = hf::model_from_config_json(j.dump(), "c");
  const RopeScaling& s = m.model.rope_scaling;
  EXPECT_EQ(s.type, RopeScalingType::Yarn);
  EXPECT_DOUBLE_EQ(s.factor, 4.0);
  EXPECT_DOUBLE_EQ(s.original_max_position_embeddings, j["max_position_embeddings"].get<double>());
  EXPECT_DOUBLE_EQ(s.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(s.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(s.mscale, 0.707);
  EXPECT_DOUBLE_EQ(s.mscale_all_dim, 0.707);
  EXPECT_DOUBLE_EQ(s.attention_factor, 0.0);
  EXPECT_FALSE(s.truncate);
  EXPECT_DOUBLE_EQ(rope_attention_factor(Rope(1e6, s)), 1.0);  // mscale / mscale_all_dim
  EXPECT_NEAR(yarn_softmax_scale_factor(s), std::pow(0.1 * 0.707 * std::log(4.0) + 1.0, 2), 1e-15);

  const json out = json::parse(hf::config_json_for(m.model, m.architecture, "float32", ""));
  const json want = {{"rope_type", "yarn"},
                     {"rope_theta", 1000000.0},
                     {"factor", 4.0},
                     {"beta_fast", 32.0},
                     {"beta_slow", 1.0},
                     {"mscale", 0.707},
                     {"mscale_all_dim", 0.707},
                     {"truncate", false},
                     {"original_max_position_embeddings", j["max_position_embeddings"]}};
  EXPECT_EQ(out["rope_parameters"], want);
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "yarn");
  const hf::HfModel again = hf::model_from_config_json(out.dump(), "export");
  EXPECT_EQ(config_to_yaml(Config{.model = again.model}), config_to_yaml(Config{.model = m.model}));

  // transformers 4.x's rope_scaling, with an attention factor given outright.
  json v4 = fixture_config("llama");
  v4["rope_scaling"] = {{"rope_type", "yarn"},
                        {"factor", 2.0},
                        {"attention_factor", 1.5},
                        {"original_max_position_embeddings", 32}};
  const hf::HfModel m4 = hf::model_from_config_json(v4.dump(), "v4");
  EXPECT_DOUBLE_EQ(m4.model.rope_scaling.original_max_position_embeddings, 32.0);
  EXPECT_DOUBLE_EQ(rope_attention_factor(Rope(1e4, m4.model.rope_scaling)), 1.5);
  EXPECT_DOUBLE_EQ(yarn_softmax_scale_factor(m4.model.rope_scaling), 1.0);
}

// Issue 24's probe: num_hidden_layers 1e9 ran 65 s into an OOM kill; now one line, at once.
TEST(HfModel, RefusesTooManyLayersAtOnce) {
  json j = t5_config("llama");
  j["num_hidden_layers"] = 1000000000;
  EXPECT_THAT(config_error(j), HasSubstr("num_hidden_layers = 1000000000: too large (at most 65536 layers)"));
  json gpt2 = json::parse(read(fixtures_dir() + "/hf_gpt2_tiny_config.json"));
  gpt2["n_layer"] = 1000000000;
  EXPECT_THAT(config_error(gpt2), HasSubstr("n_layer = 1000000000: too large"));
  j["num_hidden_layers"] = 4294967296;
  EXPECT_THAT(config_error(j), HasSubstr("num_hidden_layers = 4294967296: too large"));
}

// Configs as published on the Hugging Face hub (transformers 4.x writers) and as transformers 5
// re-saves them, and the full to_dict() of each config class (tests/reference/make_hf_hub_configs.py):
// all of them import, with their rotary embedding.
TEST(HfModel, ReadsTheHubConfigsOfEverySupportedFamily) {
  const json all = json::parse(read(fixtures_dir() + "/hf_hub_configs.json"));
  ASSERT_GE(all.size(), 20u);
  for (const auto& [name, c] : all.items()) {
    SCOPED_TRACE(name);
    hf::HfModel m;
    ASSERT_NO_THROW(m = hf::model_from_config_json(c.dump(), name)) << name;
    const double theta = c.contains("rope_parameters") ? c["rope_parameters"]["rope_theta"].get<double>()
                                                       : c.value("rope_theta", 10000.0);
    EXPECT_DOUBLE_EQ(m.model.rope_theta, theta);
    const bool scaled = (c.contains("rope_parameters") && c["rope_parameters"]["rope_type"] == "llama3") ||
                        (c.contains("rope_scaling") && c["rope_scaling"].is_object());
    EXPECT_EQ(m.model.rope_scaling.type, scaled ? RopeScalingType::Llama3 : RopeScalingType::None);
    EXPECT_EQ(m.model.hf_architecture, hf::architecture_name(m.architecture));
  }
}

TEST(HfModel, RefusesWhatItDoesNotImplementNamingTheKey) {
  json j = fixture_config("llama");
  j["architectures"] = {"GemmaForCausalLM"};
  EXPECT_THAT(config_error(j), HasSubstr("architectures = [\"GemmaForCausalLM\"]: not supported"));
  j.erase("architectures");
  j["model_type"] = "phi3";
  EXPECT_THAT(config_error(j), HasSubstr("model_type = \"phi3\": not supported"));

  for (const char* type : {"dynamic", "longrope", "su"}) {
    j = fixture_config("llama");
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 8.0}};
    EXPECT_THAT(config_error(j),
                HasSubstr(fmt::format("rope_scaling.rope_type = \"{}\": not supported", type)));
  }
  j = fixture_config("llama");
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};  // the older spelling
  EXPECT_THAT(config_error(j), HasSubstr("rope_scaling.type = \"dynamic\": not supported"));
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 16}};
  EXPECT_THAT(config_error(j), HasSubstr("missing key 'rope_scaling.factor'"));
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"short_factor", {1.0}}};
  EXPECT_THAT(config_error(j), HasSubstr("rope_scaling.short_factor = [1.0]: not supported"));
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1.0}, {"beta_slow", 2.0}};
  EXPECT_THAT(config_error(j), HasSubstr("rope_scaling.beta_fast = 1.0: must be >= beta_slow"));
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_NO_THROW(hf::model_from_config_json(j.dump(), "config.json"));
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}};
  EXPECT_THAT(config_error(j), HasSubstr("missing key 'rope_scaling.high_freq_factor'"));
  j["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_THAT(config_error(j), HasSubstr("missing key 'rope_scaling.factor'"));
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 4.0},
                       {"high_freq_factor", 1.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_THAT(config_error(j), HasSubstr("rope_scaling.high_freq_factor = 1.0: must be > low_freq_factor"));

  j = fixture_config("llama");
  j["hidden_act"] = "gelu";
  EXPECT_THAT(config_error(j), HasSubstr("hidden_act = \"gelu\": not supported"));
  // head_dim apart from hidden_size / num_attention_heads (24 / 4 = 6): model.head_dim; the quotient
  // itself leaves model.head_dim at 0.
  j = fixture_config("llama");
  j["head_dim"] = 8;
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "config.json").model.head_dim, 8);
  j["head_dim"] = 6;
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "config.json").model.head_dim, 0);
  j["head_dim"] = 0;
  EXPECT_THAT(config_error(j), HasSubstr("head_dim = 0: must be >= 1"));
  j = fixture_config("llama");
  j["attention_bias"] = true;
  EXPECT_THAT(config_error(j), HasSubstr("attention_bias = true: not supported without the other"));
  j["mlp_bias"] = true;
  EXPECT_TRUE(hf::model_from_config_json(j.dump(), "config.json").model.add_bias);
  j = fixture_config("qwen2");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 16;
  j["max_window_layers"] = 1;
  j.erase("layer_types");
  {
    const ModelConfig q = hf::model_from_config_json(j.dump(), "config.json").model;
    EXPECT_EQ(q.sliding_window, 16);
    EXPECT_EQ(q.max_window_layers, 1);
    EXPECT_EQ(q.layer_window(0), 0);
    EXPECT_EQ(q.layer_window(1), 16);
  }

  j = fixture_config("llama");
  j.erase("hidden_size");
  EXPECT_THAT(config_error(j), HasSubstr("config.json: missing key 'hidden_size'"));
  j = fixture_config("llama");
  j["num_hidden_layers"] = "two";
  EXPECT_THAT(config_error(j), HasSubstr("num_hidden_layers = \"two\": expected an integer"));
  j = fixture_config("llama");
  j["num_key_value_heads"] = 3;  // 4 heads do not group into 3
  EXPECT_THAT(config_error(j), HasSubstr("model.num_attention_heads"));
  EXPECT_THAT(error_of([] { hf::model_from_config_json("{not json", "config.json"); }),
              HasSubstr("config.json: not valid JSON"));

  json gpt2 = json::parse(read(fixtures_dir() + "/hf_gpt2_tiny_config.json"));
  gpt2["activation_function"] = "gelu";
  EXPECT_THAT(config_error(gpt2), HasSubstr("activation_function = \"gelu\": not supported"));
}

Tensors llama_tensors() { return hf::load_folder(fixtures_dir() + "/hf_llama_tiny"); }
ModelConfig llama_model() {
  return hf::model_from_config_json(fixture_config("llama").dump(), "config.json").model;
}

std::string import_error(const Tensors& tensors, const ModelConfig& m) {
  return error_of([&] { hf::from_hf(tensors, hf::Architecture::Llama, m, "dir"); });
}

TEST(HfModel, TensorChecksNameTheTensor) {
  const ModelConfig m = llama_model();
  const Tensors good = llama_tensors();
  const Tensors params = hf::from_hf(good, hf::Architecture::Llama, m, "dir");
  EXPECT_EQ(params.size(), good.size());
  EXPECT_EQ(params.at("layers.1.attention.key.weight").shape(), (Shape{12, 24}));
  EXPECT_EQ(params.at("output.weight").shape(), (Shape{48, 24}));

  Tensors t = good;
  t.erase("model.layers.1.mlp.up_proj.weight");
  EXPECT_THAT(import_error(t, m), HasSubstr("dir: missing tensor 'model.layers.1.mlp.up_proj.weight'"));
  t = good;
  t["model.layers.0.self_attn.q_proj.bias"] = Tensor::zeros({24}, DType::F32);
  EXPECT_THAT(import_error(t, m), HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_proj.bias' [24]"));
  t = good;
  t["model.layers.0.self_attn.k_proj.weight"] = Tensor::zeros({24, 24}, DType::F32);
  EXPECT_THAT(import_error(t, m), HasSubstr("'model.layers.0.self_attn.k_proj.weight' has shape [24, 24]"));
  t = good;
  t["model.norm.weight"] = Tensor::zeros({24}, DType::I32);
  EXPECT_THAT(import_error(t, m), HasSubstr("'model.norm.weight' has dtype"));
  t = good;
  t["model.norm.weight"] = Tensor::zeros({24}, DType::F8E4M3);
  EXPECT_THAT(import_error(t, m), HasSubstr("fp8 is storage-only"));
  t = good;
  t["model.norm.weight"] = good.at("model.norm.weight").clone();
  t["model.norm.weight"].data<float>()[3] = std::nanf("");
  EXPECT_THAT(import_error(t, m), HasSubstr("tensor 'model.norm.weight' holds 1 non-finite value(s)"));
  EXPECT_NO_THROW(hf::from_hf(t, hf::Architecture::Llama, m, "dir", /*allow_nonfinite=*/true));

  // Tied: an lm_head equal to the embedding is accepted (and dropped), a different one is not.
  ModelConfig tied = m;
  tied.tie_embeddings = true;
  t = good;
  t["lm_head.weight"] = good.at("model.embed_tokens.weight").to(DType::BF16).to(DType::F32);
  EXPECT_THAT(import_error(t, tied), HasSubstr("'lm_head.weight' differs from 'model.embed_tokens.weight'"));
  t["lm_head.weight"] = good.at("model.embed_tokens.weight").clone();
  EXPECT_FALSE(hf::from_hf(t, hf::Architecture::Llama, tied, "dir").count("output.weight"));

  // Back: names, shapes and the requested dtype; a padded vocabulary loses its extra rows.
  Tensors padded = params;
  padded["output.weight"] = Tensor::zeros({128, 24}, DType::F32);
  padded["output.weight"].narrow(0, 0, 48).copy_(params.at("output.weight"));
  const Tensors back = hf::to_hf(padded, hf::Architecture::Llama, m, DType::BF16);
  EXPECT_EQ(back.size(), good.size());
  EXPECT_EQ(back.at("lm_head.weight").shape(), (Shape{48, 24}));
  EXPECT_EQ(back.at("lm_head.weight").dtype(), DType::BF16);
}

TEST(HfModel, ShardedFoldersAndTheirIndex) {
  const Tensors bf16 = hf::load_folder(fixtures_dir() + "/hf_llama_tiny_bf16");
  EXPECT_EQ(bf16.size(), 21u);
  EXPECT_EQ(bf16.at("model.layers.0.self_attn.q_proj.weight").dtype(), DType::BF16);

  const TempDir tmp;
  const std::string config = fixture_config("llama").dump();
  const Tensors tensors = llama_tensors();
  hf::save_folder(tmp.str("one"), tensors, config, 5'000'000'000);
  EXPECT_TRUE(fs::exists(tmp.str("one/model.safetensors")));
  EXPECT_FALSE(fs::exists(tmp.str("one/model.safetensors.index.json")));
  EXPECT_THAT(error_of([&] { hf::save_folder(tmp.str("one"), tensors, config, 1000); }),
              HasSubstr("already holds"));

  // 20 KB shards: every shard but the last is full, none exceeds the limit unless one tensor does.
  hf::save_folder(tmp.str("many"), tensors, config, 20'000);
  const json index = json::parse(read(tmp.str("many/model.safetensors.index.json")));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_EQ(files.size(), 3u);
  EXPECT_TRUE(files.count("model-00001-of-00003.safetensors"));
  EXPECT_TRUE(files.count("model-00003-of-00003.safetensors"));
  int64_t total = 0;
  for (const auto& [name, t] : tensors) total += static_cast<int64_t>(t.nbytes());
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  for (const std::string& f : files) EXPECT_LE(fs::file_size(tmp.str("many/" + f)), 20'000u + 4096u) << f;
  const Tensors loaded = hf::load_folder(tmp.str("many"));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors)
    EXPECT_EQ(loaded.at(name).to_float_vector(), t.to_float_vector()) << name;

  // An index that names a tensor its shard lacks, a shard with a tensor the index does not list.
  json broken = index;
  broken["weight_map"]["model.extra.weight"] = "model-00001-of-00003.safetensors";
  std::ofstream(tmp.str("many/model.safetensors.index.json")) << broken.dump();
  EXPECT_THAT(
      error_of([&] { hf::load_folder(tmp.str("many")); }),
      HasSubstr(
          "lists tensor 'model.extra.weight' in model-00001-of-00003.safetensors, which does not hold it"));
  broken = index;
  const std::string moved = index["weight_map"].begin().key();
  broken["weight_map"][moved] = "model-00002-of-00003.safetensors";
  std::ofstream(tmp.str("many/model.safetensors.index.json")) << broken.dump();
  EXPECT_THAT(error_of([&] { hf::load_folder(tmp.str("many")); }),
              HasSubstr("tensor '" + moved + "' is not listed for this file"));
  broken = index;
  broken["weight_map"][moved] = "../elsewhere.safetensors";
  std::ofstream(tmp.str("many/model.safetensors.index.json")) << broken.dump();
  EXPECT_THAT(error_of([&] { hf::load_folder(tmp.str("many")); }),
              HasSubstr("expected a file name in the folder"));
  fs::remove(tmp.str("many/model.safetensors.index.json"));
  EXPECT_THAT(error_of([&] { hf::load_folder(tmp.str("many")); }),
              HasSubstr("neither model.safetensors nor model.safetensors.index.json"));
}

TEST(HfModel, ParsesShardSizes) {
  EXPECT_EQ(hf::parse_size("5GB"), 5'000'000'000);
  EXPECT_EQ(hf::parse_size("500MB"), 500'000'000);
  EXPECT_EQ(hf::parse_size("8kb"), 8'000);
  EXPECT_EQ(hf::parse_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(hf::parse_size("64MiB"), int64_t{64} << 20);
  EXPECT_EQ(hf::parse_size("12345"), 12345);
  EXPECT_EQ(hf::parse_size("100B"), 100);
  for (const char* bad : {"", "0", "-1", "5XB", "1.5GB", "GB", "99999999999TB"})
    EXPECT_THAT(error_of([&] { hf::parse_size(bad); }), HasSubstr("size \"")) << bad;
}

// Qwen3, Qwen3-MoE and Mixtral as transformers 5.24 saved them (make_hf_qwen3.py).
TEST(HfModel, ReadsQwen3AndTheMoEFamilies) {
  const hf::HfModel qwen3 = hf::model_from_config_json(fixture_config("qwen3").dump(), "qwen3");
  EXPECT_EQ(qwen3.architecture, hf::Architecture::Qwen3);
  EXPECT_TRUE(qwen3.model.qk_norm);
  EXPECT_EQ(qwen3.model.head_dim, 8);  // 24 / 4 would be 6
  EXPECT_EQ(qwen3.model.attention_head_dim(), 8);
  EXPECT_FALSE(qwen3.model.add_bias || qwen3.model.add_qkv_bias);
  EXPECT_EQ(qwen3.model.num_experts, 0);
  const auto shapes = hf::llama_parameter_shapes(qwen3.model);
  EXPECT_EQ(shapes.at("layers.1.attention.q_norm.weight"), (Shape{8}));
  EXPECT_EQ(shapes.at("layers.0.attention.query.weight"), (Shape{32, 24}));
  EXPECT_EQ(shapes.at("layers.0.attention.proj.weight"), (Shape{24, 32}));
  json j = fixture_config("qwen3");
  j.erase("head_dim");  // Qwen3Config's default: 128, not hidden_size / heads
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "qwen3").model.head_dim, 128);
  j = fixture_config("qwen3");
  j["attention_bias"] = true;
  EXPECT_THAT(config_error(j), HasSubstr("attention_bias = true: not supported"));
  j = fixture_config("qwen3");
  j["attn_logit_softcapping"] = 30.0;  // a key that changes the model, unknown here
  EXPECT_THAT(config_error(j),
              HasSubstr("attn_logit_softcapping = 30.0: not supported: it changes the model"));
  j = fixture_config("qwen3");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4;
  j["max_window_layers"] = 1;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "qwen3").model.layer_window(1), 4);

  const hf::HfModel moe = hf::model_from_config_json(fixture_config("qwen3_moe").dump(), "qwen3_moe");
  EXPECT_EQ(moe.architecture, hf::Architecture::Qwen3Moe);
  EXPECT_TRUE(moe.model.qk_norm);
  EXPECT_EQ(moe.model.num_experts, 4);
  EXPECT_EQ(moe.model.moe_router_topk, 2);
  EXPECT_EQ(moe.model.moe_ffn_hidden_size, 16);
  EXPECT_EQ(moe.model.moe_layer_freq, 1);
  EXPECT_EQ(moe.model.moe_aux_loss_coeff, 0.0);  // output_router_logits false: no balancing loss
  const auto moe_shapes = hf::llama_parameter_shapes(moe.model);
  EXPECT_EQ(moe_shapes.at("layers.1.mlp.router.weight"), (Shape{4, 24}));
  EXPECT_EQ(moe_shapes.at("layers.1.mlp.experts.3.fc2.weight"), (Shape{24, 16}));
  EXPECT_FALSE(moe_shapes.count("layers.0.mlp.gate.weight"));
  j = fixture_config("qwen3_moe");
  j["num_experts"] = 4;  // transformers 4.x's name, beside 5.x's: must agree
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "qwen3_moe").model.num_experts, 4);
  j["num_experts"] = 8;
  EXPECT_THAT(config_error(j), HasSubstr("num_experts = 8: must equal num_local_experts (4)"));
  j = fixture_config("qwen3_moe");
  j.erase("num_local_experts");
  j["num_experts"] = 4;  // a 4.x config
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "qwen3_moe").model.num_experts, 4);
  EXPECT_FALSE(moe.model.moe_norm_topk_prob);
  j = fixture_config("qwen3_moe");
  j["norm_topk_prob"] = true;
  const hf::HfModel normed = hf::model_from_config_json(j.dump(), "qwen3_moe");
  EXPECT_TRUE(normed.model.moe_norm_topk_prob);
  EXPECT_EQ(json::parse(hf::config_json_for(normed.model, normed.architecture, "float32"))["norm_topk_prob"],
            true);
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, json, std::string>>{
           {"mlp_only_layers", json::array({0}), "mlp_only_layers = [0]: not supported"},
           {"decoder_sparse_step", 2, "decoder_sparse_step = 2: not supported"},
           {"output_router_logits", true, "output_router_logits = true: not supported"},
           {"use_sliding_window", true, "use_sliding_window = true: not supported"}}) {
    j = fixture_config("qwen3_moe");
    j[key] = value;
    EXPECT_THAT(config_error(j), HasSubstr(message)) << key;
  }
  // Mixtral: softmax, top-k renormalised to sum 1, experts intermediate_size wide, every layer.
  const hf::HfModel mix = hf::model_from_config_json(fixture_config("mixtral").dump(), "mixtral");
  EXPECT_EQ(mix.architecture, hf::Architecture::Mixtral);
  EXPECT_FALSE(mix.model.qk_norm);
  EXPECT_TRUE(mix.model.moe_norm_topk_prob);
  EXPECT_EQ(mix.model.moe_router_score_function, MoeScoreFunction::Softmax);
  EXPECT_EQ(mix.model.moe_routed_scaling_factor, 1.0);
  EXPECT_EQ(mix.model.num_experts, 4);
  EXPECT_EQ(mix.model.moe_router_topk, 2);
  EXPECT_EQ(mix.model.moe_ffn_hidden_size, 16);
  EXPECT_EQ(mix.model.sliding_window, 0);
  EXPECT_EQ(hf::llama_parameter_shapes(mix.model).at("layers.0.mlp.experts.1.gate.weight"), (Shape{16, 24}));
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, json, std::string>>{
           {"router_jitter_noise", 0.1, "router_jitter_noise = 0.1: not supported"},
           {"output_router_logits", true, "output_router_logits = true: not supported"},
           {"norm_topk_prob", true, "norm_topk_prob = true: not supported: it changes the model"},
           {"moe_intermediate_size", 8, "moe_intermediate_size = 8: not supported: it changes the model"}}) {
    j = fixture_config("mixtral");
    j[key] = value;
    EXPECT_THAT(config_error(j), HasSubstr(message)) << key;
  }
  j = fixture_config("mixtral");
  j["sliding_window"] = 4;  // as Mistral: every layer
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "mixtral").model.layer_window(1), 4);
  const json mix_written = json::parse(hf::config_json_for(mix.model, mix.architecture, "float32"));
  EXPECT_EQ(mix_written["model_type"], "mixtral");
  EXPECT_EQ(mix_written["num_local_experts"], 4);
  EXPECT_EQ(mix_written["num_experts_per_tok"], 2);
  EXPECT_EQ(mix_written["intermediate_size"], 16);
  EXPECT_EQ(mix_written["router_jitter_noise"], 0.0);
  EXPECT_EQ(mix_written["output_router_logits"], false);
  EXPECT_TRUE(mix_written["sliding_window"].is_null());
  EXPECT_FALSE(mix_written.contains("norm_topk_prob"));
  // The export refuses what an architecture cannot hold.
  EXPECT_THAT(error_of([&] { hf::config_json_for(qwen3.model, hf::Architecture::Llama, "float32"); }),
              HasSubstr("LlamaForCausalLM cannot hold this model: model.qk_norm = true"));
  EXPECT_THAT(error_of([&] { hf::config_json_for(moe.model, hf::Architecture::Qwen3, "float32"); }),
              HasSubstr("Qwen3ForCausalLM cannot hold this model: model.num_experts = 4"));
  ModelConfig mixtral = moe.model;
  mixtral.qk_norm = false;
  mixtral.hf_architecture.clear();
  EXPECT_EQ(hf::architecture_for(mixtral), hf::Architecture::Mixtral);
  EXPECT_THAT(error_of([&] { hf::config_json_for(mixtral, hf::Architecture::Mixtral, "float32"); }),
              HasSubstr("MixtralForCausalLM cannot hold this model: model.moe_norm_topk_prob = false"));
  // Router options neither family holds, one line naming the key.
  for (const auto& [edit, message] : std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>>{
           {[](ModelConfig& c) { c.moe_router_score_function = MoeScoreFunction::Sigmoid; },
            "model.moe_router_score_function = sigmoid"},
           {[](ModelConfig& c) { c.moe_n_group = 2; }, "model.moe_n_group = 2"},
           {[](ModelConfig& c) { c.moe_topk_group = 2; }, "model.moe_topk_group = 2"},
           {[](ModelConfig& c) { c.moe_router_expert_bias = true; }, "model.moe_router_expert_bias = true"},
           {[](ModelConfig& c) { c.moe_router_force_load_balancing = true; },
            "model.moe_router_force_load_balancing = true"},
           {[](ModelConfig& c) { c.moe_routed_scaling_factor = 2.5; },
            "model.moe_routed_scaling_factor = 2.5"},
           {[](ModelConfig& c) { c.moe_seq_aux_loss_coeff = 1e-4; }, "model.moe_seq_aux_loss_coeff = 0.0001"},
           {[](ModelConfig& c) { c.moe_first_k_dense_replace = 1; }, "model.moe_first_k_dense_replace = 1"},
           {[](ModelConfig& c) { c.moe_ffn_hidden_size = 8; }, "model.moe_ffn_hidden_size = 8"}}) {
    ModelConfig bad = mix.model;
    edit(bad);
    EXPECT_THAT(error_of([&] { hf::config_json_for(bad, hf::Architecture::Mixtral, "float32"); }),
                HasSubstr("MixtralForCausalLM cannot hold this model: " + message));
    if (message.find("ffn_hidden") != std::string::npos) continue;  // Qwen3-MoE has moe_intermediate_size
    bad = moe.model;
    edit(bad);
    EXPECT_THAT(error_of([&] { hf::config_json_for(bad, hf::Architecture::Qwen3Moe, "float32"); }),
                HasSubstr("Qwen3MoeForCausalLM cannot hold this model: " + message));
  }
  const json written = json::parse(hf::config_json_for(moe.model, moe.architecture, "float32"));
  EXPECT_EQ(written["num_local_experts"], 4);
  EXPECT_EQ(written["num_experts"], 4);
  EXPECT_EQ(written["norm_topk_prob"], false);
  EXPECT_EQ(written["head_dim"], 8);
}

// DeepSeek-V3 as transformers 5.24 and 4.57 saved it (make_hf_deepseek_v3.py).
TEST(HfModel, ReadsDeepseekV3) {
  const hf::HfModel ds = hf::model_from_config_json(fixture_config("deepseek_v3").dump(), "deepseek_v3");
  const ModelConfig& m = ds.model;
  EXPECT_EQ(ds.architecture, hf::Architecture::DeepseekV3);
  EXPECT_TRUE(m.is_mla());
  EXPECT_EQ(m.q_lora_rank, 12);
  EXPECT_EQ(m.kv_lora_rank, 12);
  EXPECT_EQ(m.qk_nope_head_dim, 8);
  EXPECT_EQ(m.qk_rope_head_dim, 4);
  EXPECT_EQ(m.v_head_dim, 6);
  EXPECT_EQ(m.head_dim, 0);
  EXPECT_TRUE(m.hf_rope_interleave);
  EXPECT_EQ(m.rope_scaling.type, RopeScalingType::Yarn);
  EXPECT_EQ(m.rope_scaling.mscale, 1.0);
  EXPECT_EQ(m.rope_scaling.mscale_all_dim, 0.8);
  EXPECT_EQ(m.ffn_hidden_size, 32);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_ffn_hidden_size, 8);
  EXPECT_EQ(m.moe_shared_expert_ffn_hidden_size, 8);
  EXPECT_EQ(m.moe_router_score_function, MoeScoreFunction::Sigmoid);
  EXPECT_TRUE(m.moe_norm_topk_prob);
  EXPECT_EQ(m.moe_routed_scaling_factor, 2.5);
  EXPECT_EQ(m.moe_n_group, 4);
  EXPECT_EQ(m.moe_topk_group, 2);
  EXPECT_TRUE(m.moe_router_expert_bias);
  EXPECT_EQ(m.moe_first_k_dense_replace, 1);
  EXPECT_EQ(m.moe_seq_aux_loss_coeff, 0.0);
  EXPECT_EQ(ds.mtp_layers, 0);
  const auto shapes = hf::llama_parameter_shapes(m);
  EXPECT_EQ(shapes.at("layers.0.attention.q_latent_norm.weight"), (Shape{12}));
  EXPECT_EQ(shapes.at("layers.0.attention.q_up.weight"), (Shape{48, 12}));
  EXPECT_EQ(shapes.at("layers.0.attention.kv_down.weight"), (Shape{16, 24}));
  EXPECT_EQ(shapes.at("layers.0.attention.kv_up.weight"), (Shape{56, 12}));
  EXPECT_EQ(shapes.at("layers.0.attention.proj.weight"), (Shape{24, 24}));
  EXPECT_EQ(shapes.at("layers.0.mlp.gate.weight"), (Shape{32, 24}));  // dense: first_k_dense_replace 1
  EXPECT_FALSE(shapes.count("layers.0.mlp.router.weight"));
  EXPECT_EQ(shapes.at("layers.1.mlp.router.e_score_correction_bias"), (Shape{8}));
  EXPECT_EQ(shapes.at("layers.1.mlp.experts.7.fc2.weight"), (Shape{24, 8}));
  EXPECT_EQ(shapes.at("layers.1.mlp.shared_expert.fc2.weight"), (Shape{24, 8}));
  EXPECT_FALSE(shapes.count("layers.1.mlp.gate.weight"));

  // transformers 4.57's layout (rope_theta, rope_scaling) is the same model.
  const json t4 = json::parse(read(fixtures_dir() + "/hf_deepseek_v3_t4/config.json"));
  EXPECT_EQ(config_to_yaml(Config{.model = hf::model_from_config_json(t4.dump(), "t4").model}),
            config_to_yaml(Config{.model = m}));
  // q_lora_rank null: one plain q_proj (absent: transformers' default, 1536).
  json j = fixture_config("deepseek_v3");
  j["q_lora_rank"] = nullptr;
  const ModelConfig plain_q = hf::model_from_config_json(j.dump(), "ds").model;
  EXPECT_EQ(plain_q.q_lora_rank, 0);
  EXPECT_EQ(hf::llama_parameter_shapes(plain_q).at("layers.0.attention.query.weight"), (Shape{48, 24}));
  EXPECT_TRUE(json::parse(hf::config_json_for(plain_q, ds.architecture, "float32"))["q_lora_rank"].is_null());
  j.erase("q_lora_rank");
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "ds").model.q_lora_rank, 1536);
  // Multi-token prediction layers: num_nextn_predict_layers, or 5.x's num_mtp_layers (default 1).
  j = fixture_config("deepseek_v3");
  j.erase("num_nextn_predict_layers");
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "ds").mtp_layers, 1);
  j["num_mtp_layers"] = 2;
  EXPECT_EQ(hf::model_from_config_json(j.dump(), "ds").mtp_layers, 2);
  // DeepSeek's own config.json keys: read at the values transformers implements.
  j = fixture_config("deepseek_v3");
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"topk_method", "noaux_tc"},
                                                                            {"scoring_func", "sigmoid"},
                                                                            {"ep_size", 8},
                                                                            {"moe_layer_freq", 1},
                                                                            {"aux_loss_alpha", 0.001},
                                                                            {"seq_aux", true},
                                                                            {"num_local_experts", 8}})
    j[key] = value;
  EXPECT_EQ(config_to_yaml(Config{.model = hf::model_from_config_json(j.dump(), "ds").model}),
            config_to_yaml(Config{.model = m}));
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, json, std::string>>{
           {"topk_method", "greedy", "topk_method = \"greedy\": not supported: it changes the model"},
           {"scoring_func", "softmax", "scoring_func = \"softmax\": not supported"},
           {"moe_layer_freq", 2, "moe_layer_freq = 2: not supported"},
           {"num_key_value_heads", 2,
            "num_key_value_heads = 2: not supported: must equal num_attention_heads"},
           {"attention_bias", true, "attention_bias = true: not supported"},
           {"head_dim", 8, "head_dim = 8: must equal qk_rope_head_dim (4"},
           {"qk_head_dim", 13, "qk_head_dim = 13: must equal qk_nope_head_dim + qk_rope_head_dim (12"},
           {"num_local_experts", 4, "num_local_experts = 4: must equal n_routed_experts (8"},
           {"num_mtp_layers", 2, "num_mtp_layers = 2: must equal num_nextn_predict_layers (0"},
           {"first_k_dense_replace", -1, "first_k_dense_replace = -1: must be >= 0"},
           {"hidden_act", "gelu", "hidden_act = \"gelu\": not supported"},
           {"n_group", 3, "moe_n_group"},  // 8 experts in 3 groups: our config's rule, named by our key
           {"output_router_logits", true, "output_router_logits = true: not supported"},
           {"auto_map", json{{"AutoModelForCausalLM", "modeling_kimi.KimiForCausalLM"}},
            "auto_map = {\"AutoModelForCausalLM\":\"modeling_kimi.KimiForCausalLM\"}: not supported: it "
            "names "
            "modeling code other than DeepSeek-V3's own"}}) {
    j = fixture_config("deepseek_v3");
    j[key] = value;
    EXPECT_THAT(config_error(j), HasSubstr(message)) << key;
  }
  // A hub folder's auto_map naming DeepSeek's own DeepseekV3 classes is the same model.
  j = fixture_config("deepseek_v3");
  j["auto_map"] = {{"AutoConfig", "configuration_deepseek.DeepseekV3Config"},
                   {"AutoModel", "modeling_deepseek.DeepseekV3Model"},
                   {"AutoModelForCausalLM", "modeling_deepseek.DeepseekV3ForCausalLM"}};
  EXPECT_EQ(config_to_yaml(Config{.model = hf::model_from_config_json(j.dump(), "ds").model}),
            config_to_yaml(Config{.model = m}));

  // rope_interleave: the rope rows of q_up (per head) and kv_down are interleaved in the checkpoint,
  // in rotate-half order here; the export puts them back bit for bit.
  const std::map<std::string, Tensor> hf_tensors = hf::load_folder(fixtures_dir() + "/hf_deepseek_v3_tiny");
  const std::map<std::string, Tensor> ours = hf::from_hf(hf_tensors, ds.architecture, m, "ds");
  const auto row = [](const Tensor& t, int64_t r) { return t.narrow(0, r, 1).to_float_vector(); };
  const Tensor& q_hf = hf_tensors.at("model.layers.2.self_attn.q_b_proj.weight");
  const Tensor& q_ours = ours.at("layers.2.attention.q_up.weight");
  for (int64_t head : {0, 3}) {
    const int64_t base = head * 12 + 8;  // head block of n + r = 12 rows, rope rows from n = 8
    EXPECT_EQ(row(q_ours, head * 12), row(q_hf, head * 12));  // the nope rows stay
    EXPECT_EQ(row(q_ours, base + 0), row(q_hf, base + 0));
    EXPECT_EQ(row(q_ours, base + 1), row(q_hf, base + 2));
    EXPECT_EQ(row(q_ours, base + 2), row(q_hf, base + 1));
    EXPECT_EQ(row(q_ours, base + 3), row(q_hf, base + 3));
  }
  const Tensor& kv_hf = hf_tensors.at("model.layers.2.self_attn.kv_a_proj_with_mqa.weight");
  const Tensor& kv_ours = ours.at("layers.2.attention.kv_down.weight");
  EXPECT_EQ(row(kv_ours, 11), row(kv_hf, 11));  // the latent rows stay
  EXPECT_EQ(row(kv_ours, 13), row(kv_hf, 14));
  EXPECT_EQ(row(kv_ours, 14), row(kv_hf, 13));
  const std::map<std::string, Tensor> back = hf::to_hf(ours, ds.architecture, m);
  ASSERT_EQ(back.size(), hf_tensors.size());
  for (const auto& [name, t] : hf_tensors)
    EXPECT_EQ(back.at(name).to_float_vector(), t.to_float_vector()) << name;

  // What DeepseekV3ForCausalLM holds, and what holds latent attention.
  const json written = json::parse(hf::config_json_for(m, ds.architecture, "float32"));
  EXPECT_EQ(written["model_type"], "deepseek_v3");
  EXPECT_EQ(written["head_dim"], 4);
  EXPECT_EQ(written["qk_head_dim"], 12);
  EXPECT_EQ(written["n_shared_experts"], 1);
  EXPECT_EQ(written["num_nextn_predict_layers"], 0);
  EXPECT_EQ(written["rope_parameters"]["mscale_all_dim"], 0.8);
  EXPECT_EQ(config_to_yaml(Config{.model = hf::model_from_config_json(written.dump(), "back").model}),
            config_to_yaml(Config{.model = m}));
  ModelConfig anonymous = m;
  anonymous.hf_architecture.clear();
  EXPECT_EQ(hf::architecture_for(anonymous), hf::Architecture::DeepseekV3);
  EXPECT_THAT(error_of([&] { hf::config_json_for(m, hf::Architecture::Mixtral, "float32"); }),
              HasSubstr("MixtralForCausalLM cannot hold this model: model.attention = mla"));
  EXPECT_THAT(error_of([&] { hf::config_json_for(llama_model(), hf::Architecture::DeepseekV3, "float32"); }),
              HasSubstr("DeepseekV3ForCausalLM cannot hold this model: model.attention = mha"));
  for (const auto& [edit, message] : std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>>{
           {[](ModelConfig& c) { c.moe_router_score_function = MoeScoreFunction::Softmax; },
            "model.moe_router_score_function = softmax"},
           {[](ModelConfig& c) { c.moe_router_expert_bias = false; }, "model.moe_router_expert_bias = false"},
           {[](ModelConfig& c) { c.moe_router_force_load_balancing = true; },
            "model.moe_router_force_load_balancing = true"},
           {[](ModelConfig& c) { c.num_experts = 0; }, "model.num_experts = 0"},
           {[](ModelConfig& c) { c.moe_layer_freq = 2; }, "model.moe_layer_freq = 2"},
           {[](ModelConfig& c) { c.moe_capacity_factor = 1.25; }, "model.moe_capacity_factor = 1.25"},
           {[](ModelConfig& c) { c.moe_shared_expert_ffn_hidden_size = 12; },
            "model.moe_shared_expert_ffn_hidden_size = 12"},
           {[](ModelConfig& c) { c.moe_shared_expert_ffn_hidden_size = 0; },
            "model.moe_shared_expert_ffn_hidden_size = 0"}}) {
    ModelConfig bad = m;
    edit(bad);
    EXPECT_THAT(error_of([&] { hf::config_json_for(bad, hf::Architecture::DeepseekV3, "float32"); }),
                HasSubstr("DeepseekV3ForCausalLM cannot hold this model: " + message));
  }
}

// DeepSeek's multi-token prediction layer (hf_deepseek_v3_mtp_tiny: model.layers.4.* beside the
// tiny model): enorm, hnorm, eh_proj, shared_head.norm and the decoder layer map to layers.4.* bit
// for bit, the embed_tokens / shared_head.head copies must equal the model's, the export writes them
// back. The import, training and refusals through convert_checkpoint: hf_deepseek_v3_mtp.sh.
TEST(HfModel, DeepseekV3MultiTokenPrediction) {
  TempDir dir;
  const std::string folder = dir.str("mtp");
  fs::create_directories(folder);
  for (const auto& entry : fs::directory_iterator(fixtures_dir() + "/hf_deepseek_v3_mtp_tiny"))
    fs::copy_file(entry.path(), fs::path(folder) / entry.path().filename());
  fs::copy_file(fixtures_dir() + "/hf_deepseek_v3_tiny/model.safetensors",
                fs::path(folder) / "model-00001-of-00002.safetensors");
  const hf::HfModel ds = hf::model_from_config_json(read(folder + "/config.json"), "mtp");
  ASSERT_EQ(ds.mtp_layers, 1);
  ModelConfig m = ds.model;
  m.mtp_num_layers = ds.mtp_layers;
  const Tensors hf_tensors = hf::load_folder(folder);
  const Tensors ours = hf::from_hf(hf_tensors, ds.architecture, m, "mtp");
  for (const auto& [theirs, mine] : std::vector<std::pair<std::string, std::string>>{
           {"model.layers.4.enorm.weight", "layers.4.enorm.weight"},
           {"model.layers.4.hnorm.weight", "layers.4.hnorm.weight"},
           {"model.layers.4.eh_proj.weight", "layers.4.eh_proj.weight"},
           {"model.layers.4.shared_head.norm.weight", "layers.4.final_norm.weight"},
           {"model.layers.4.input_layernorm.weight", "layers.4.input_norm.weight"},
           {"model.layers.4.self_attn.kv_b_proj.weight", "layers.4.attention.kv_up.weight"},
           {"model.layers.4.mlp.gate.e_score_correction_bias", "layers.4.mlp.router.e_score_correction_bias"},
           {"model.layers.4.mlp.experts.7.down_proj.weight", "layers.4.mlp.experts.7.fc2.weight"},
           {"model.layers.4.mlp.shared_experts.up_proj.weight", "layers.4.mlp.shared_expert.up.weight"}})
    EXPECT_EQ(ours.at(mine).to_float_vector(), hf_tensors.at(theirs).to_float_vector()) << theirs;
  // The fixture draws the two norms: a swap would show.
  EXPECT_NE(ours.at("layers.4.enorm.weight").to_float_vector(),
            ours.at("layers.4.hnorm.weight").to_float_vector());
  EXPECT_FALSE(ours.count("layers.4.embed_tokens.weight"));
  // The model's own parameters (test_mtp's names) and nothing else.
  EXPECT_EQ(ours.size(), hf::llama_parameter_shapes(m).size());
  const Tensors back = hf::to_hf(ours, ds.architecture, m);
  ASSERT_EQ(back.size(), hf_tensors.size());
  for (const auto& [name, t] : hf_tensors)
    EXPECT_EQ(back.at(name).to_float_vector(), t.to_float_vector()) << name;

  // A copy that differs from the model's embedding or head: refused, naming both.
  for (const auto& [copy, of] : std::vector<std::pair<std::string, std::string>>{
           {"model.layers.4.embed_tokens.weight", "model.embed_tokens.weight"},
           {"model.layers.4.shared_head.head.weight", "lm_head.weight"}}) {
    Tensors edited = hf_tensors;
    Tensor changed = edited.at(copy).to(DType::F32).contiguous().clone();
    changed.data<float>()[5] += 1.0f;
    edited[copy] = changed;
    EXPECT_THAT(error_of([&] { hf::from_hf(edited, ds.architecture, m, "mtp"); }),
                HasSubstr("mtp: '" + copy + "' differs from '" + of + "'"));
  }
  Tensors missing = hf_tensors;
  missing.erase("model.layers.4.shared_head.head.weight");
  EXPECT_THAT(error_of([&] { hf::from_hf(missing, ds.architecture, m, "mtp"); }),
              HasSubstr("missing tensor 'model.layers.4.shared_head.head.weight'"));

  // config.json: num_nextn_predict_layers is model.mtp_num_layers; only DeepSeek-V3 holds MTP.
  const json written = json::parse(hf::config_json_for(m, ds.architecture, "float32"));
  EXPECT_EQ(written["num_nextn_predict_layers"], 1);
  EXPECT_EQ(hf::model_from_config_json(written.dump(), "back").mtp_layers, 1);
  ModelConfig llama = llama_model();
  llama.mtp_num_layers = 1;
  EXPECT_THAT(error_of([&] { hf::config_json_for(llama, hf::Architecture::Llama, "float32"); }),
              HasSubstr("LlamaForCausalLM cannot hold this model: model.mtp_num_layers = 1"));
}

TEST(HfModel, WritesAConfigJsonThatReadsBackAsTheModel) {
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral"}) {
    const hf::HfModel in = hf::model_from_config_json(fixture_config(name).dump(), name);
    const std::string text = hf::config_json_for(in.model, in.architecture, "bfloat16");
    const hf::HfModel back = hf::model_from_config_json(text, name);
    EXPECT_EQ(back.architecture, in.architecture) << name;
    EXPECT_EQ(config_to_yaml(Config{.model = back.model}), config_to_yaml(Config{.model = in.model})) << name;
    EXPECT_EQ(json::parse(text)["torch_dtype"], "bfloat16");
    EXPECT_EQ(hf::architecture_for(in.model), in.architecture) << name;  // model.hf_architecture
    ModelConfig anonymous = in.model;  // without it: by the model's shape (Mistral: a sliding window)
    anonymous.hf_architecture.clear();
    EXPECT_EQ(hf::architecture_for(anonymous), in.architecture) << name;
    // transformers 5's layout, with 4.x's names of the same values.
    const json written = json::parse(text);
    EXPECT_EQ(written["dtype"], "bfloat16");
    EXPECT_EQ(written["rope_parameters"]["rope_theta"], in.model.rope_theta);
    EXPECT_EQ(written["rope_parameters"]["rope_type"], "default");
    EXPECT_EQ(written["rope_theta"], in.model.rope_theta);
  }
  // A template keeps the keys we do not own.
  json templ = fixture_config("mistral");
  templ["bos_token_id"] = 7;
  const hf::HfModel mistral = hf::model_from_config_json(templ.dump(), "mistral");
  const json out =
      json::parse(hf::config_json_for(mistral.model, hf::Architecture::Mistral, "float32", templ.dump()));
  EXPECT_EQ(out["bos_token_id"], 7);
  EXPECT_EQ(out["sliding_window"], 4096);
  EXPECT_EQ(out["architectures"][0], "MistralForCausalLM");
  // Without a template, Mistral stays Mistral with its window (it used to come back as Llama).
  const json plain =
      json::parse(hf::config_json_for(mistral.model, hf::architecture_for(mistral.model), "float32"));
  EXPECT_EQ(plain["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(plain["model_type"], "mistral");
  EXPECT_EQ(plain["sliding_window"], 4096);
  EXPECT_THAT(error_of([&] { hf::config_json_for(mistral.model, hf::Architecture::Llama, "float32"); }),
              HasSubstr("LlamaForCausalLM cannot hold this model: it has model.sliding_window = 4096"));
  ModelConfig wrong = mistral.model;
  wrong.hf_architecture = "GemmaForCausalLM";
  EXPECT_THAT(error_of([&] { hf::architecture_for(wrong); }),
              HasSubstr("model.hf_architecture = GemmaForCausalLM: not supported"));
  // Qwen2 cannot hold a model without q/k/v biases, nor Llama one with q/k/v biases only.
  const ModelConfig llama = llama_model();
  EXPECT_THAT(error_of([&] { hf::config_json_for(llama, hf::Architecture::Qwen2, "float32"); }),
              HasSubstr("Qwen2ForCausalLM cannot hold this model"));
  ModelConfig gelu = llama;
  gelu.activation = Activation::GeLU;
  EXPECT_THAT(error_of([&] { hf::architecture_for(gelu); }), HasSubstr("not a Llama-family architecture"));
}

}  // namespace
}  // namespace parallel
