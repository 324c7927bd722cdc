#pragma once
// JSON whose objects give each key once (internal to the library): a plain parse keeps the last of
// two values silently, which in a safetensors header, a checkpoint index, a tokenizer or a JSONL
// document hides which one was meant.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace parallel::io {

// Where parse_unique_keys found a key given twice.
struct DuplicateKey {
  std::string key;
  int depth = 0;  // 1: a key of the top-level object
};

// nlohmann::json::parse (syntax errors throw json::parse_error as it does), but an object holding
// one key twice stops the parse: *duplicate is filled in and the result is null. Linear in the
// text (nlohmann's parse callbacks are quadratic in the entries of an object: every nested object
// that ends scans its parent for a discarded value).
nlohmann::json parse_unique_keys(std::string_view text, DuplicateKey* duplicate);

}  // namespace parallel::io
