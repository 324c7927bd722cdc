// Global gradient norm and clip coefficient.
#include "parallel/grad_norm.hpp"

#include <cmath>

#include "parallel/ops.hpp"

namespace parallel {

bool counts_toward_grad_norm(const Parameter& param, int tp_rank, bool first_pipeline_stage) {
  if (param.is_replicated_over_tp() && tp_rank != 0) return false;
  if (param.shared_across_pipeline && (!first_pipeline_stage || param.pipeline_copy)) return false;
  return true;
}

double reduce_grad_norm(Tensor& total, Communicator* model, Communicator* dp, Tensor experts,
                        Communicator* expert_model, Communicator* expert_dp) {
  // The collectives carry fp32: plenty for a sum of squares that is then square-rooted.
  if (model != nullptr && model->size() > 1) model->all_reduce(total, ReduceOp::Sum);
  if (dp != nullptr && dp->size() > 1) dp->all_reduce(total, ReduceOp::Sum);
  if (experts.defined()) {
    // Each expert element sits on exactly one rank of the expert-model group, and - sharded - on
    // one rank of the expert-dp sharding group.
    if (expert_model != nullptr && expert_model->size() > 1) expert_model->all_reduce(experts, ReduceOp::Sum);
    if (expert_dp != nullptr && expert_dp->size() > 1) expert_dp->all_reduce(experts, ReduceOp::Sum);
    ops::add_(total, experts);
  }
  // Meta (meta.hpp): the collectives above are issued, but there is no value to read. The stated
  // assumption is a norm of 0: finite (no fp16 overflow, the step is taken) and never clipped.
  if (total.device().is_meta()) return 0.0;
  return std::sqrt(static_cast<double>(total.to_float_vector()[0]));
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  return coeff < 1.0 ? coeff : 1.0;
}

}  // namespace parallel
