// The sharding modes' names (sharding.hpp), as optimizer.sharding spells them.
#include "parallel/sharding.hpp"

#include <string>

#include "parallel/error.hpp"

namespace parallel {

const char* sharding_name(Sharding sharding) {
  switch (sharding) {
    case Sharding::None:
      return "none";
    case Sharding::Optim:
      return "optim";
    case Sharding::OptimGrads:
      return "optim_grads";
    case Sharding::OptimGradsParams:
      return "optim_grads_params";
  }
  return "?";
}

Sharding sharding_from_name(std::string_view name) {
  constexpr Sharding kAll[] = {Sharding::None, Sharding::Optim, Sharding::OptimGrads,
                               Sharding::OptimGradsParams};
  std::string names;
  for (Sharding s : kAll) {
    if (name == sharding_name(s)) return s;
    names += names.empty() ? "" : ", ";
    names += sharding_name(s);
  }
  throw ConfigError(fmt::format("unknown sharding mode '{}' (expected one of {})", name, names));
}

}  // namespace parallel
