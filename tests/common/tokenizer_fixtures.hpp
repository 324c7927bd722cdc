#pragma once
// The committed tokenizer fixtures (tests/reference/make_hf_tokenizers.py,
// make_hf_tokenizer_families.py): the tokenizer.json files they trained and the ids the `tokenizers`
// library gave, as JSON. A missing file is a failure, never a skip.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "paths.hpp"

namespace parallel::testing {

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

// The tokenizer.json fixture of `kind` ("gpt2", "llama3", "llama2", ...).
inline std::string tokenizer_file(const std::string& kind) {
  return fixtures_dir() + "/hf_tokenizer_" + kind + ".json";
}

}  // namespace parallel::testing
