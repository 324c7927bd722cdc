#pragma once
// The committed PyTorch fixtures (tests/reference/make_fixtures.py, make_mtp_fixture.py): one
// safetensors file of named tensors per case and, for a whole GPT, its ModelConfig in the file's
// metadata. A missing fixture or name is a failure, never a skip.
#include <filesystem>
#include <map>
#include <string>

#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/safetensors.hpp"
#include "parallel/tensor.hpp"
#include "paths.hpp"

namespace parallel::testing {

using Fixture = std::map<std::string, Tensor>;
using FixtureMetadata = std::map<std::string, std::string>;

inline std::string fixture_path(const std::string& name) {
  return fixtures_dir() + "/" + name + ".safetensors";
}

inline Fixture load_fixture(const std::string& name) {
  const std::string dir = fixtures_dir();
  if (!std::filesystem::is_directory(dir))
    PARALLEL_FAIL(
        "PyTorch fixtures missing: {} is not a directory (they are committed; regenerate with "
        "tests/reference/make_fixtures.py)",
        dir);
  return safetensors::load(fixture_path(name));
}

inline const Tensor& get(const Fixture& f, const std::string& name) {
  auto it = f.find(name);
  if (it == f.end()) PARALLEL_FAIL("fixture has no tensor '{}'", name);
  return it->second;
}

inline const std::string& metadata_at(const FixtureMetadata& meta, const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) PARALLEL_FAIL("fixture metadata has no '{}'", key);
  return it->second;
}

// The whole-GPT fixture's model (make_fixtures.py's metadata keys), without dropout. Keys a fixture
// adds for one feature (make_mtp_fixture.py's mtp_*) are read by that feature's test.
inline ModelConfig gpt_config_of(const FixtureMetadata& meta) {
  const auto at = [&](const std::string& key) -> const std::string& { return metadata_at(meta, key); };
  const auto integer = [&](const std::string& key) { return std::stoi(at(key)); };
  const auto boolean = [&](const std::string& key) { return at(key) == "true"; };
  ModelConfig c;
  c.num_layers = integer("num_layers");
  c.hidden_size = integer("hidden_size");
  c.num_attention_heads = integer("num_attention_heads");
  c.num_query_groups = integer("num_query_groups");
  c.ffn_hidden_size = integer("ffn_hidden_size");
  c.vocab_size = integer("vocab_size");
  c.seq_length = integer("seq_length");
  c.max_position_embeddings = integer("max_position_embeddings");
  c.normalization = at("normalization") == "rmsnorm" ? Normalization::RMSNorm : Normalization::LayerNorm;
  c.activation = at("activation") == "swiglu" ? Activation::SwiGLU : Activation::GeLU;
  c.position_embedding =
      at("position_embedding") == "rope" ? PositionEmbedding::Rope : PositionEmbedding::Learned;
  c.add_bias = boolean("add_bias");
  c.tie_embeddings = boolean("tie_embeddings");
  c.norm_epsilon = std::stod(at("norm_epsilon"));
  c.rope_theta = std::stod(at("rope_theta"));
  c.dropout = 0.0;
  return c;
}

inline FixtureMetadata fixture_metadata(const std::string& name) {
  return safetensors::load_metadata(fixture_path(name));
}

}  // namespace parallel::testing
