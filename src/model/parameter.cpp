#include "parallel/parameter.hpp"

#include <algorithm>
#include <unordered_map>

namespace parallel {

std::vector<std::vector<Parameter*>> fused_units(const std::vector<Parameter*>& params, const char* who) {
  std::vector<std::vector<Parameter*>> units;
  std::unordered_map<const Storage*, std::size_t> unit_of;
  for (Parameter* p : params) {
    const Storage* s = p->value.storage().get();
    auto [it, fresh] = unit_of.try_emplace(s, units.size());
    if (fresh) units.emplace_back();
    units[it->second].push_back(p);
  }
  for (auto& unit : units) {
    std::stable_sort(unit.begin(), unit.end(), [](const Parameter* a, const Parameter* b) {
      return a->value.storage_offset() < b->value.storage_offset();
    });
    for (std::size_t i = 1; i < unit.size(); ++i) {
      const Tensor& prev = unit[i - 1]->value;
      PARALLEL_CHECK(unit[i]->value.storage_offset() == prev.storage_offset() + prev.numel(),
                     "{}: {} shares storage with {} but is not adjacent to it", who, unit[i]->name,
                     unit[i - 1]->name);
    }
  }
  return units;
}

void zero_grads(const std::vector<Parameter*>& params) {
  for (Parameter* p : params)
    if (p->grad.defined() && p->grad.numel() > 0) p->grad.zero_();
}

}  // namespace parallel
