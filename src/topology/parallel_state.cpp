#include "parallel/parallel_state.hpp"

#include <algorithm>
#include <utility>

#include "parallel/error.hpp"
#include "parallel/local_communicator.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/nccl_communicator.hpp"

namespace parallel {
namespace {

// Every rank of a group computes the same member list, so its smallest rank is a color that all
// members agree on and no other group shares; the position in the list is the rank in the group.
std::unique_ptr<Communicator> split_into(Communicator& world, const std::vector<int>& members,
                                         const char* name) {
  const int me = world.rank();
  if (members.empty()) {
    auto none = world.split_group({});
    PARALLEL_CHECK(none == nullptr, "split with color -1 returned a {} communicator", name);
    return none;
  }
  auto it = std::find(members.begin(), members.end(), me);
  PARALLEL_CHECK(it != members.end(), "rank {} is not in its own {} group", me, name);
  auto comm = world.split_group(members);
  PARALLEL_CHECK(comm != nullptr, "split of the {} group returned no communicator", name);
  PARALLEL_CHECK(comm->size() == static_cast<int>(members.size()) && comm->rank() == it - members.begin(),
                 "{} group: expected rank {} of {}, communicator says {} of {}", name, it - members.begin(),
                 members.size(), comm->rank(), comm->size());
  return comm;
}

}  // namespace

ParallelState::ParallelState(Communicator& world, const RankGrid& grid, Device device)
    : world_(world), grid_(grid), coord_(), device_(device) {
  const auto& s = grid.sizes();
  // Checked before any split: a mismatch on one rank would otherwise leave the others hung in it.
  if (world.size() != grid.world_size())
    PARALLEL_FAIL(
        "world size {} does not match the parallel layout tensor({}) x context({}) x pipeline({}) x data({}) "
        "= "
        "{}",
        world.size(), s.tensor, s.context, s.pipeline, s.data, grid.world_size());
  const int me = world.rank();
  coord_ = grid.coord(me);
  // Every rank must make the same sequence of split calls, members or not.
  tp_ = split_into(world, grid.tensor_group(me), "tensor");
  cp_ = split_into(world, grid.context_group(me), "context");
  dp_ = split_into(world, grid.data_group(me), "data");
  dp_cp_ = split_into(world, grid.data_context_group(me), "data x context");
  pp_ = split_into(world, grid.pipeline_group(me), "pipeline");
  model_ = split_into(world, grid.model_group(me), "model");
  embedding_ = split_into(world, grid.embedding_group(me), "embedding");
  ep_ = split_into(world, grid.expert_group(me), "expert");
  etp_ = split_into(world, grid.expert_tensor_group(me), "expert tensor");
  edp_ = split_into(world, grid.expert_data_group(me), "expert data");
  expert_model_ = split_into(world, grid.expert_model_group(me), "expert model");
  // Named by purpose, for messages such as the watchdog's ("all_reduce on group dp (world ranks
  // 0,2) pending ..."); the NCCL groups made below from these take the same names.
  auto name_all = [this] {
    for (auto& [group, label] :
         {std::pair{&tp_, "tp"}, std::pair{&cp_, "cp"}, std::pair{&dp_, "dp"}, std::pair{&dp_cp_, "dp_cp"},
          std::pair{&pp_, "pp"}, std::pair{&model_, "model"}, std::pair{&embedding_, "embedding"},
          std::pair{&ep_, "ep"}, std::pair{&etp_, "etp"}, std::pair{&edp_, "edp"},
          std::pair{&expert_model_, "expert_model"}})
      if (*group != nullptr) (*group)->set_name(label);
  };
  name_all();
  if (device.is_cpu() || device.is_meta()) return;  // meta: world's own groups (meta_communicator.hpp)

  // On GPUs: a NCCL communicator per group, bootstrapped over (and falling back for CPU tensors
  // to) the MPI group just made, which is kept alive here. In the same order on every rank;
  // ranks outside a group (the embedding group) skip it, and NCCL creation is collective only
  // over the group's members. A one-rank group gets a LocalCommunicator instead (identity
  // collectives, no NCCL): a single-GPU run then needs no working NCCL at all.
  PARALLEL_CHECK(dynamic_cast<MpiCommunicator*>(&world) != nullptr,
                 "ParallelState on {}: the world communicator must be MPI (NCCL's bootstrap), got {}",
                 device.str(), world.backend());
  set_current_device(device);
  auto to_nccl = [&](std::unique_ptr<Communicator>& group, bool p2p_links) {
    if (group == nullptr) return;
    auto* mpi = dynamic_cast<MpiCommunicator*>(group.get());
    PARALLEL_CHECK(mpi != nullptr, "ParallelState: an MPI split returned a {} communicator",
                   group->backend());
    std::unique_ptr<Communicator> on_device =
        make_device_communicator(*mpi, device, {.p2p_links = p2p_links});
    host_groups_.push_back(std::move(group));
    group = std::move(on_device);
  };
  to_nccl(tp_, false);
  to_nccl(cp_, false);
  to_nccl(dp_, false);
  to_nccl(dp_cp_, false);
  to_nccl(pp_, true);
  to_nccl(model_, false);
  to_nccl(embedding_, false);
  to_nccl(ep_, false);
  to_nccl(etp_, false);
  to_nccl(edp_, false);
  to_nccl(expert_model_, false);
  name_all();
}

}  // namespace parallel
