#include "parallel/parameter.hpp"

namespace parallel {

void zero_grads(const std::vector<Parameter*>& params) {
  for (Parameter* p : params)
    if (p->grad.defined() && p->grad.numel() > 0) p->grad.zero_();
}

}  // namespace parallel
