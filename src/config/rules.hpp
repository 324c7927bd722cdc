#pragma once
// How validation rules name the keys they are about (internal to src/config): a rule is given the
// config member it checks, and the message names it by looking the member's address up in the key
// tables (config.cpp), so no rule spells a key. validate_config (config.cpp) and check_layout
// (layout_rules.cpp) both write their rules with it, so the two give the same one-line messages.
#include <fmt/format.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "parallel/config.hpp"

namespace parallel::detail {

// One factor of a rule's right-hand side: a key (or derived value) and its current value.
struct Term {
  std::string name;
  long long value;
};

// Builds messages for the rules of one config; every field given must be a member of that config.
class Rules {
 public:
  explicit Rules(const Config& c) : c_(c) {}

  template <typename T>
  std::string key(const T& field) const {
    return key_at(&field);
  }

  Term term(const int& field) const { return {key(field), field}; }

  // "config: KEY = VALUE: RULE"
  template <typename T>
  void require(bool ok, const T& field, std::string_view rule) const {
    if (!ok) fail_at(&field, rule);
  }

  template <typename T>
  void at_least(const T& field, T min) const {
    require(field >= min, field, fmt::format("must be >= {}", min));
  }

  // field % (a * b * ...) == 0; the message names each factor and the product.
  void divisible(const int& field, std::initializer_list<Term> by, std::string_view when = "") const;

  // lo <= field < hi (or <= hi when hi_inclusive).
  void in_range(const double& field, double lo, double hi, bool hi_inclusive,
                std::string_view hi_name = "") const;

 private:
  // "section.key" of the member at `field` (a key or a derived value).
  std::string key_at(const void* field) const;
  // Throws ConfigError "config: KEY = VALUE: RULE", the value displayed as its type reads.
  [[noreturn]] void fail_at(const void* field, std::string_view rule) const;

  const Config& c_;
};

}  // namespace parallel::detail
