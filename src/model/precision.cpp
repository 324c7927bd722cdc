// The mixed-precision policy (precision.hpp).
#include "parallel/precision.hpp"

#include <unordered_set>

namespace parallel {

DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::BF16:
      return DType::BF16;
    case Precision::FP16:
      return DType::F16;
    case Precision::FP32:
      break;
  }
  return DType::F32;
}

void cast_parameters(const std::vector<Parameter*>& params, DType dtype) {
  std::vector<Parameter*> todo;
  std::unordered_set<const Parameter*> seen;
  for (Parameter* p : params) {
    if (!seen.insert(p).second || p->value.dtype() == dtype) continue;
    PARALLEL_CHECK(p->value.is_contiguous(), "cast_parameters: {} must be contiguous", p->name);
    todo.push_back(p);
  }
  // A fused layer's parts stay adjacent in one new allocation.
  for (auto& unit : fused_units(todo, "cast_parameters")) {
    int64_t total = 0;
    for (Parameter* p : unit) total += p->numel();
    Tensor low = Tensor::empty({total}, dtype, unit.front()->value.device());
    int64_t offset = 0;
    for (Parameter* p : unit) {
      const int64_t n = p->numel();
      Tensor slot = low.narrow(0, offset, n);
      slot.copy_(p->value.flatten());
      p->value = slot.view(p->value.shape());
      offset += n;
    }
  }
}

}  // namespace parallel
