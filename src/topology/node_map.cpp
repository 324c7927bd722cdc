// Node discovery (MPI's shared-memory split) and where the parallel groups lie on the nodes.
#include "parallel/node_map.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <map>

#include "parallel/error.hpp"

namespace parallel {
namespace {

// "0-3" for a run of consecutive ranks, else "0,2,4".
std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.size() > 1 && ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size()))
    return fmt::format("{}-{}", ranks.front(), ranks.back());
  return fmt::format("{}", fmt::join(ranks, ","));
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) PARALLEL_FAIL("node discovery: {} failed (MPI error {})", what, rc);
}

}  // namespace

std::vector<int> NodeMap::ranks_on(int node) const {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(node_of.size()); ++r)
    if (node_of[r] == node) ranks.push_back(r);
  return ranks;
}

int NodeMap::ranks_per_node() const {
  const std::size_t first = ranks_on(0).size();
  for (int n = 1; n < num_nodes(); ++n)
    if (ranks_on(n).size() != first) return 0;
  return static_cast<int>(first);
}

int NodeMap::local_rank(int rank) const {
  PARALLEL_CHECK(rank >= 0 && rank < static_cast<int>(node_of.size()), "rank {} outside the node map of {}",
                 rank, node_of.size());
  const auto ranks = ranks_on(node_of[rank]);
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

bool NodeMap::inside_one_node(std::span<const int> ranks) const {
  return std::all_of(ranks.begin(), ranks.end(),
                     [&](int r) { return node_of.at(r) == node_of.at(ranks.front()); });
}

std::string NodeMap::describe() const {
  const int per = ranks_per_node();
  std::string out = per > 0 ? fmt::format("{} node{} x {} rank{}", num_nodes(), num_nodes() == 1 ? "" : "s",
                                          per, per == 1 ? "" : "s")
                            : fmt::format("{} nodes, uneven", num_nodes());
  for (int n = 0; n < num_nodes(); ++n)
    out += fmt::format("{} {} ranks {}", n == 0 ? ":" : ",", hosts[n], rank_list(ranks_on(n)));
  return out;
}

NodeMap node_map_from_keys(std::span<const int> key_of_rank, std::span<const std::string> host_of_rank) {
  PARALLEL_CHECK(!key_of_rank.empty() && key_of_rank.size() == host_of_rank.size(),
                 "node map: {} node keys for {} host names", key_of_rank.size(), host_of_rank.size());
  NodeMap map;
  std::map<int, int> node_of_key;  // numbered in order of first appearance: the node's lowest rank
  for (std::size_t r = 0; r < key_of_rank.size(); ++r) {
    auto [it, fresh] = node_of_key.emplace(key_of_rank[r], map.num_nodes());
    if (fresh) map.hosts.push_back(host_of_rank[r]);
    map.node_of.push_back(it->second);
  }
  return map;
}

NodeMap discover_nodes(MpiCommunicator& world, const std::string& host) {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(world.handle(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  // A node's key: its lowest world rank.
  int key = world.rank();
  const int rc = MPI_Allreduce(MPI_IN_PLACE, &key, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  check_mpi(rc, "MPI_Allreduce over the node");
  std::vector<int> keys(static_cast<std::size_t>(world.size()));
  check_mpi(MPI_Allgather(&key, 1, MPI_INT, keys.data(), 1, MPI_INT, world.handle()),
            "MPI_Allgather of node keys");
  constexpr int kHostChars = 256;
  std::array<char, kHostChars> mine{};
  host.copy(mine.data(), kHostChars - 1);
  std::vector<char> all(static_cast<std::size_t>(world.size()) * kHostChars);
  check_mpi(
      MPI_Allgather(mine.data(), kHostChars, MPI_CHAR, all.data(), kHostChars, MPI_CHAR, world.handle()),
      "MPI_Allgather of host names");
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r)
    hosts.emplace_back(all.data() + static_cast<std::size_t>(r) * kHostChars);
  return node_map_from_keys(keys, hosts);
}

std::vector<int> group_members(const RankGrid& grid, std::string_view name, int rank,
                               int sharding_group_size) {
  if (name == "tp") return grid.tensor_group(rank);
  if (name == "cp") return grid.context_group(rank);
  if (name == "dp") return grid.data_group(rank);
  if (name == "pp") return grid.pipeline_group(rank);
  if (name == "ep") return grid.expert_group(rank);
  if (name == "etp") return grid.expert_tensor_group(rank);
  if (name == "edp") return grid.expert_data_group(rank);
  if (name == "shard") {
    // DataParallel's HSDP split: k consecutive members of dp x cp share the shards.
    const auto dp_cp = grid.data_context_group(rank);
    const int k = sharding_group_size > 0 ? sharding_group_size : static_cast<int>(dp_cp.size());
    PARALLEL_CHECK(static_cast<int>(dp_cp.size()) % k == 0,
                   "sharding group size {} does not divide dp x cp = {}", k, dp_cp.size());
    const auto at = static_cast<int>(std::find(dp_cp.begin(), dp_cp.end(), rank) - dp_cp.begin());
    return {dp_cp.begin() + at / k * k, dp_cp.begin() + (at / k + 1) * k};
  }
  PARALLEL_FAIL("unknown group '{}' ({})", name, fmt::join(node_local_group_names(), ", "));
}

std::vector<GroupPlacement> place_groups(const NodeMap& nodes, const RankGrid& grid,
                                         int sharding_group_size) {
  PARALLEL_CHECK(static_cast<int>(nodes.node_of.size()) == grid.world_size(),
                 "node map of {} ranks for a rank grid of {}", nodes.node_of.size(), grid.world_size());
  std::vector<GroupPlacement> out;
  const bool experts = grid.sizes().expert * grid.sizes().expert_tensor > 1;
  for (std::string_view name : node_local_group_names()) {
    if (!experts && (name == "ep" || name == "etp" || name == "edp")) continue;
    GroupPlacement g{.name = std::string(name)};
    g.size = static_cast<int>(group_members(grid, name, 0, sharding_group_size).size());
    if (g.size == 1) continue;
    for (int r = 0; r < grid.world_size() && g.inside_node; ++r)
      g.inside_node = nodes.inside_one_node(group_members(grid, name, r, sharding_group_size));
    out.push_back(g);
  }
  return out;
}

}  // namespace parallel
