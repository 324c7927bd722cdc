#include "parallel/parameter.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

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

Tensor fused_rows(const std::vector<Parameter>& parts, Tensor Parameter::*member, const char* who) {
  const Tensor& first = parts.front().*member;
  if (parts.size() == 1) return first;
  int64_t rows = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Tensor& t = parts[i].*member;
    const Tensor& prev = parts[i == 0 ? 0 : i - 1].*member;
    PARALLEL_CHECK(t.is_contiguous() && t.storage() == first.storage() &&
                       (i == 0 || t.storage_offset() == prev.storage_offset() + prev.numel()),
                   "{} {}: fused parts must stay adjacent in one storage", who, parts[i].name);
    rows += t.size(0);
  }
  Shape shape = first.shape();
  shape[0] = rows;
  return Tensor::from_blob(first.data_ptr(), shape, first.dtype(), first.device());
}

void move_parameters(const std::vector<Parameter*>& params, Device device) {
  for (Tensor Parameter::*member : {&Parameter::value, &Parameter::grad}) {
    // Runs of parts back to back in one storage, in storage order; anything else moves alone.
    std::vector<std::vector<Parameter*>> groups;
    std::unordered_map<const Storage*, std::size_t> group_of;
    std::unordered_set<const Parameter*> seen;
    for (Parameter* p : params) {
      const Tensor& t = p->*member;
      if (!seen.insert(p).second || !t.defined() || t.device() == device) continue;
      const Storage* s = t.is_contiguous() ? t.storage().get() : nullptr;
      if (s == nullptr) {
        groups.push_back({p});
        continue;
      }
      auto [it, fresh] = group_of.try_emplace(s, groups.size());
      if (fresh) groups.emplace_back();
      groups[it->second].push_back(p);
    }
    for (auto& group : groups) {
      std::stable_sort(group.begin(), group.end(), [member](const Parameter* a, const Parameter* b) {
        return (a->*member).storage_offset() < (b->*member).storage_offset();
      });
      bool adjacent = group.size() > 1;
      for (std::size_t i = 1; i < group.size() && adjacent; ++i) {
        const Tensor &prev = group[i - 1]->*member, &t = group[i]->*member;
        adjacent = t.dtype() == prev.dtype() && t.storage_offset() == prev.storage_offset() + prev.numel();
      }
      if (!adjacent) {
        for (Parameter* p : group) p->*member = (p->*member).to(device);
        continue;
      }
      int64_t total = 0;
      for (Parameter* p : group) total += (p->*member).numel();
      Tensor moved = Tensor::empty({total}, (group.front()->*member).dtype(), device);
      int64_t offset = 0;
      for (Parameter* p : group) {
        Tensor& t = p->*member;
        Tensor slot = moved.narrow(0, offset, t.numel());
        slot.copy_(t.flatten());
        offset += t.numel();
        t = slot.view(t.shape());
      }
    }
  }
}

namespace {
thread_local Device g_parameter_device = Device::cpu();
}  // namespace

Device parameter_device() { return g_parameter_device; }
ParameterDeviceScope::ParameterDeviceScope(Device device) : outer_(g_parameter_device) {
  g_parameter_device = device;
}
ParameterDeviceScope::~ParameterDeviceScope() { g_parameter_device = outer_; }

namespace {
thread_local bool g_frozen_parameters = false;
}  // namespace

Tensor parameter_grad(const Shape& shape) {
  if (g_frozen_parameters) return Tensor();
  return Tensor::zeros(shape, DType::F32, parameter_device());
}
FrozenParameterScope::FrozenParameterScope(bool frozen) : outer_(g_frozen_parameters) {
  g_frozen_parameters = frozen;
}
FrozenParameterScope::~FrozenParameterScope() { g_frozen_parameters = outer_; }

void zero_grads(const std::vector<Parameter*>& params) {
  for (Parameter* p : params)
    if (p->grad.defined() && p->grad.numel() > 0) p->grad.zero_();
}

}  // namespace parallel
