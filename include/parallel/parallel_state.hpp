#pragma once
// Process groups for the parallel axes, in Megatron-Core's rank order tp-cp-dp-pp (tensor
// fastest, pipeline slowest):
//     rank = tp + TP * (cp + CP * (dp + DP * pp))
// Experts fold onto the same ranks (Megatron-Core's expert grid): within a pipeline stage the
// TP * CP * DP ranks are also laid out as etp-ep-edp,
//     tp + TP * (cp + CP * dp) = etp + ETP * (ep + EP * edp),
// so dense layers use tp x cp x dp x pp and experts etp x ep x edp x pp over the same world;
// ep * etp must divide TP * CP * DP.
// RankGrid is the pure arithmetic (testable without any process); ParallelState builds the
// communicators from it. Both are passed explicitly to whoever needs them: there is no global.
//
// Context parallelism (cp) splits each sample's sequence over the cp group; the cp ranks of one
// dp rank hold the same dense parameters and see different tokens, so dense gradients are reduced
// (and the loss averaged) over dp x cp. Expert parameters are split over ep (and etp) and
// replicated over edp: their gradients are reduced over edp only.
#include <memory>
#include <vector>

#include "parallel/communicator.hpp"

namespace parallel {

struct ParallelSizes {
  int tensor = 1;
  int context = 1;
  int pipeline = 1;
  int data = 1;
  int expert = 1;         // ep: folded onto tensor * context * data (not a factor of the world)
  int expert_tensor = 1;  // etp: tensor parallelism inside experts
  int world() const { return tensor * context * pipeline * data; }
  // edp: the expert-data-parallel size, tensor * context * data / (expert * expert_tensor).
  int expert_data() const { return tensor * context * data / (expert * expert_tensor); }
};

// A rank's place on the dense axes (tp, cp, dp, pp) and, derived from them, on the expert axes
// (etp, ep, edp; RankGrid::coord fills them, RankGrid::rank ignores them).
struct Coord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int etp = 0, ep = 0, edp = 0;
  bool operator==(const Coord&) const = default;
};

class RankGrid {
 public:
  // Throws parallel::Error if a size is < 1.
  explicit RankGrid(ParallelSizes sizes);
  // Throws parallel::Error if a size is < 1 or expert * expert_tensor does not divide
  // tensor * context * data.
  // Derives data = world / (tensor * context * pipeline); throws if it does not divide.
  static RankGrid from_world(int world_size, int tensor, int pipeline, int context = 1, int expert = 1,
                             int expert_tensor = 1);

  const ParallelSizes& sizes() const { return sizes_; }
  int world_size() const { return sizes_.world(); }
  Coord coord(int rank) const;
  int rank(const Coord& c) const;

  // The ranks of each group containing `rank`, in group-rank order.
  std::vector<int> tensor_group(int rank) const;    // vary tp
  std::vector<int> context_group(int rank) const;   // vary cp
  std::vector<int> data_group(int rank) const;      // vary dp
  std::vector<int> pipeline_group(int rank) const;  // vary pp
  // vary dp and cp: the ranks holding the same dense parameters, over which their gradients are
  // reduced (and optimizer state sharded) and the loss averaged.
  std::vector<int> data_context_group(int rank) const;
  // vary tp and pp (Megatron's model-parallel group): each dense parameter element once, up to the
  // cp and dp replicas, which hold equal gradients after the dp x cp reduction. The gradient norm
  // and the fp16 overflow check sum over it.
  std::vector<int> model_group(int rank) const;
  // The expert groups (same pipeline stage): vary ep (token dispatch), vary etp, vary edp (expert
  // gradient reduction), and vary etp, ep and pp (each expert element once: the expert part of the
  // gradient norm).
  std::vector<int> expert_group(int rank) const;
  std::vector<int> expert_tensor_group(int rank) const;
  std::vector<int> expert_data_group(int rank) const;
  std::vector<int> expert_model_group(int rank) const;
  // First and last pipeline stage of `rank`'s pipeline (one rank when pp == 1); tied embeddings
  // are kept in sync over it. Empty if `rank` is on neither stage.
  std::vector<int> embedding_group(int rank) const;

 private:
  ParallelSizes sizes_;
};

class ParallelState {
 public:
  // Collective over `world`: splits it into every group. `world.size()` must equal the grid's.
  // device CPU: the groups are `world`'s backend (MPI). device CUDA: every group is a NCCL
  // communicator on that GPU (world must then be an MpiCommunicator, NCCL's bootstrap), which
  // carries CPU tensors over its MPI twin; the pipeline group gets per-direction p2p links
  // (NcclOptions). world() itself stays as given.
  ParallelState(Communicator& world, const RankGrid& grid, Device device = Device::cpu());

  const RankGrid& grid() const { return grid_; }
  const Coord& coord() const { return coord_; }
  int rank() const { return world_.rank(); }

  Communicator& world() { return world_; }
  Communicator& tp() { return *tp_; }
  Communicator& cp() { return *cp_; }
  Communicator& dp() { return *dp_; }
  Communicator& dp_cp() { return *dp_cp_; }  // dense gradient reduction, loss averaging
  Communicator& pp() { return *pp_; }
  Communicator& model() { return *model_; }
  Communicator& ep() { return *ep_; }                      // MoE token dispatch
  Communicator& etp() { return *etp_; }                    // tensor parallelism inside experts
  Communicator& edp() { return *edp_; }                    // expert gradient reduction
  Communicator& expert_model() { return *expert_model_; }  // expert part of the gradient norm
  // nullptr on ranks that are on neither the first nor the last pipeline stage.
  Communicator* embedding() { return embedding_.get(); }

  Device device() const { return device_; }  // where this rank computes and its groups communicate
  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == grid_.sizes().pipeline - 1; }

 private:
  Communicator& world_;
  RankGrid grid_;
  Coord coord_;
  Device device_;
  // device CUDA: the MPI groups the NCCL ones were bootstrapped from (and send CPU tensors over).
  std::vector<std::unique_ptr<Communicator>> host_groups_;
  std::unique_ptr<Communicator> tp_, cp_, dp_, dp_cp_, pp_, model_, embedding_;
  std::unique_ptr<Communicator> ep_, etp_, edp_, expert_model_;
};

}  // namespace parallel
