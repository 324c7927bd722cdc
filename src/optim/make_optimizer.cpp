// The optimizer a DataParallel replica's layout takes (optimizer.hpp).
#include "parallel/optimizer.hpp"

namespace parallel {

std::unique_ptr<Optimizer> make_optimizer(DataParallel& ddp, const OptimizerConfig& config,
                                          OptimizerGroups groups, DataParallel* experts) {
  if (ddp.options().distributed_optimizer)
    return std::make_unique<DistributedOptimizer>(ddp, config, groups, experts);
  return std::make_unique<AdamW>(ddp, config, groups, experts);
}

}  // namespace parallel
