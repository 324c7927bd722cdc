#pragma once
// The global gradient norm over every rank of every parallel axis, each gradient element counted
// exactly once, and the clip coefficient (Megatron-Core's clip_grad_norm_fp32):
//   - replicated over tp (partition_dim < 0): every tp rank holds the same gradient; counted on
//     tp rank 0 only;
//   - shared_across_pipeline (tied embedding copies): counted on the first pipeline stage only, and
//     there not the output layer's copy (pipeline_copy; the V placement holds both on rank 0);
//   - the distributed optimizer: each rank of dp x cp counts its own shard and the sum also runs
//     over that group; a plain optimizer's dp and cp ranks all hold the same reduced gradients, so
//     neither is summed.
// The squares are then summed over the model-parallel group (tp x pp, ParallelState::model()),
// which leaves cp out for that reason.
// MoE experts are summed apart: an expert's replicas are the expert-dp ranks, not dp x cp. Each
// expert element sits on one rank of the expert-model group (etp x ep x pp) and, held whole (plain
// optimizer), on every rank of expert-dp: summed over expert-model only. Sharded (distributed
// optimizer, ZeRO-2/3), each expert-dp rank of the sharding group counts its own shard: summed over
// that group too.
#include "parallel/communicator.hpp"
#include "parallel/parameter.hpp"

namespace parallel {

// Whether this rank counts `param`'s gradient in the global norm.
bool counts_toward_grad_norm(const Parameter& param, int tp_rank, bool first_pipeline_stage);

// sqrt of the local sum of squares (an fp32 [1] tensor on the gradients' device) summed in place
// over `model` and `dp` (either may be null: not summed), plus - MoE - the experts' local sum of
// squares summed over `expert_model` and `expert_dp` (undefined: no experts; null groups: not
// summed). Reads the result: one host read.
double reduce_grad_norm(Tensor& local_sum_of_squares, Communicator* model, Communicator* dp,
                        Tensor expert_sum_of_squares = Tensor(), Communicator* expert_model = nullptr,
                        Communicator* expert_dp = nullptr);

// max_norm / (norm + 1e-6) if that is below 1, else 1; 1 when max_norm <= 0 (clipping off).
double clip_coefficient(double norm, double max_norm);

}  // namespace parallel
