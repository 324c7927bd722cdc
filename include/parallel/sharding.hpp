#pragma once
// ZeRO's accounting of the memory data parallelism shards (docs/optimizer.md, "Memory"): bytes per
// parameter of parameters + gradients + optimizer state on one rank, with `shard_ranks` ranks
// sharing the shards (the dp size, or optimizer.sharding_group_size under HSDP):
//
//   sharding             fp32          bf16/fp16 params, fp32 grads and main weights
//   none                 16            18
//   optim                8 + 8/d       6 + 12/d
//   optim_grads          4 + 12/d      2 + 16/d
//   optim_grads_params   16/d          18/d
//
// Parameters take 4 (fp32) or 2 bytes, gradients 4, Adam's exp_avg and exp_avg_sq 8, fp32 main
// weights 4 under low precision. Bucket padding (at most lcm(d, 128) elements per bucket) and the
// gathered or unsharded working buffers of a step in progress are not included: this is the
// steady state between steps. Memory planners call this; test_optimizer_memory measures it.
#include <string_view>

#include "parallel/config.hpp"
#include "parallel/dtype.hpp"

namespace parallel {

// "none", "optim", "optim_grads", "optim_grads_params": optimizer.sharding's spelling.
const char* sharding_name(Sharding sharding);
// The inverse, for programs that take the mode from their own flags. Throws parallel::ConfigError
// naming the accepted spellings.
Sharding sharding_from_name(std::string_view name);

constexpr double zero_bytes_per_parameter(Sharding sharding, Precision precision, int shard_ranks) {
  const double d = shard_ranks < 1 ? 1.0 : static_cast<double>(shard_ranks);
  const double param = precision == Precision::FP32 ? 4.0 : 2.0;
  const double grad = 4.0;
  const double state = precision == Precision::FP32 ? 8.0 : 12.0;  // exp_avg, exp_avg_sq [, main]
  switch (sharding) {
    case Sharding::None:
      return param + grad + state;
    case Sharding::Optim:
      return param + grad + state / d;
    case Sharding::OptimGrads:
      return param + (grad + state) / d;
    case Sharding::OptimGradsParams:
      return (param + grad + state) / d;
  }
  return 0.0;
}

// optimizer.type muon (docs/optimizer.md#muon): the fraction `muon_fraction` of the elements that
// are Muon matrices keep one fp32 momentum instead of Adam's two moments, 4 bytes less state each,
// sharded like the rest (over shard_ranks in every mode but none). Muon's working buffers during a
// step (one matrix at a time, gathered whole) are not included, as above.
constexpr double zero_bytes_per_parameter(Sharding sharding, Precision precision, int shard_ranks,
                                          double muon_fraction) {
  const double d = shard_ranks < 1 || sharding == Sharding::None ? 1.0 : static_cast<double>(shard_ranks);
  return zero_bytes_per_parameter(sharding, precision, shard_ranks) - 4.0 * muon_fraction / d;
}

}  // namespace parallel
