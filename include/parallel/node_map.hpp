#pragma once
// Which ranks share a node, as MPI sees it, and which process groups stay inside one node.
//
// Why: across machines a job is fast only while its chatty groups (tensor parallelism's
// all-reduces every layer, the HSDP shard group's gathers, expert parallelism's all-to-all) stay
// on a node's own links, and it is slow without any error when a hostfile or an allocation places
// ranks otherwise. The launcher's variables (LaunchInfo::local_rank, local_size) are only its word
// and not every launcher sets them; MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) is the grouping MPI
// itself uses for shared memory, so it is the one asked here (docs/multinode.md).
//
// The rank grid (parallel_state.hpp) is fixed, tensor fastest: a group whose ranks are
// consecutive stays inside a node exactly when the node's block of ranks holds it. Nothing here
// reorders ranks; the trainer reports where each group lies and refuses a run whose
// parallel.node_local names a group that crosses nodes.
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/mpi_communicator.hpp"
#include "parallel/node_local.hpp"
#include "parallel/parallel_state.hpp"

namespace parallel {

struct NodeMap {
  std::vector<int> node_of;        // world rank -> node; nodes numbered in the order of their lowest rank
  std::vector<std::string> hosts;  // node -> host name (that of its lowest rank)

  int num_nodes() const { return static_cast<int>(hosts.size()); }
  std::vector<int> ranks_on(int node) const;  // ascending
  // Ranks per node when every node has as many, else 0.
  int ranks_per_node() const;
  int local_rank(int rank) const;  // rank's index among the ranks of its node
  bool inside_one_node(std::span<const int> ranks) const;
  // "2 nodes x 2 ranks: host-a ranks 0-1, host-b ranks 2-3" (lists of ranks when not a range).
  std::string describe() const;
};

// From each world rank's node key (any value shared by exactly the ranks of one node) and host.
// Throws parallel::Error when the two lists differ in length or are empty.
NodeMap node_map_from_keys(std::span<const int> key_of_rank, std::span<const std::string> host_of_rank);

// Collective over `world`: MPI's shared-memory split, then every rank's node and host gathered, so
// every rank holds the same map.
NodeMap discover_nodes(MpiCommunicator& world, const std::string& host);

// The world ranks of `name`'s group that holds `rank`. Throws parallel::Error for an unknown name.
std::vector<int> group_members(const RankGrid& grid, std::string_view name, int rank,
                               int sharding_group_size);

struct GroupPlacement {
  std::string name;
  int size = 1;             // ranks per group
  bool inside_node = true;  // every group of this kind lies inside one node
};
// Every name of node_local_group_names() whose groups have more than one rank, in that order; the
// expert groups only when expert * expert_tensor > 1 (else they mirror the dense ranks of a stage).
std::vector<GroupPlacement> place_groups(const NodeMap& nodes, const RankGrid& grid, int sharding_group_size);

}  // namespace parallel
