// NodeMap and group placement (node_map.hpp) against layouts worked out by hand, and
// parallel.node_local's names (node_local.hpp). The MPI side (discover_nodes on real nodes) is
// checked by tests/scripts/multinode.sh on network-namespace nodes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_of.hpp"
#include "parallel/config.hpp"
#include "parallel/node_local.hpp"
#include "parallel/node_map.hpp"

namespace parallel {
namespace {

using testing::error_of;

RankGrid grid(int tp, int pp, int dp, int cp = 1, int ep = 1) {
  return RankGrid(ParallelSizes{.tensor = tp, .context = cp, .pipeline = pp, .data = dp, .expert = ep});
}

// Nodes of `per` consecutive ranks (the hostfile's slots filled in order), hosts n0, n1, ...
NodeMap blocks(int nodes, int per) {
  std::vector<int> keys;
  std::vector<std::string> hosts;
  for (int r = 0; r < nodes * per; ++r) {
    keys.push_back(1000 + r / per);
    hosts.push_back("n" + std::to_string(r / per));
  }
  return node_map_from_keys(keys, hosts);
}

// "name:inside" for each placed group, e.g. "tp:1 dp:0".
std::string placement(const NodeMap& nodes, const RankGrid& g, int k = 0) {
  std::string out;
  for (const GroupPlacement& p : place_groups(nodes, g, k))
    out +=
        (out.empty() ? "" : " ") + p.name + std::to_string(p.size) + ":" + (p.inside_node ? "in" : "across");
  return out;
}

TEST(NodeMap, NodesNumberedByTheirLowestRank) {
  // Any key names a node; ranks 0, 1 and 4 share one, 2 and 3 another.
  const NodeMap m =
      node_map_from_keys(std::vector<int>{7, 7, 3, 3, 7}, std::vector<std::string>{"a", "a", "b", "b", "a"});
  EXPECT_EQ(m.node_of, (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(m.hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(m.ranks_on(0), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(m.ranks_per_node(), 0);
  EXPECT_EQ(m.local_rank(4), 2);
  EXPECT_EQ(m.local_rank(3), 1);
  EXPECT_TRUE(m.inside_one_node(std::vector<int>{0, 4}));
  EXPECT_FALSE(m.inside_one_node(std::vector<int>{1, 2}));
  EXPECT_EQ(m.describe(), "2 nodes, uneven: a ranks 0,1,4, b ranks 2-3");
  EXPECT_EQ(blocks(2, 2).describe(), "2 nodes x 2 ranks: n0 ranks 0-1, n1 ranks 2-3");
  EXPECT_EQ(blocks(1, 1).describe(), "1 node x 1 rank: n0 ranks 0");
  EXPECT_NE(error_of([] { node_map_from_keys(std::vector<int>{1}, std::vector<std::string>{}); }), "");
}

TEST(NodeMap, TensorInsideDataAcross) {
  // 2 nodes x 2 ranks at tp2 dp2: tp {0,1} {2,3} on one node each, dp {0,2} {1,3} across.
  EXPECT_EQ(placement(blocks(2, 2), grid(2, 1, 2)), "tp2:in dp2:across shard2:across");
  // tp2 pp2 on the same nodes: the pipeline's stages are the farthest apart.
  EXPECT_EQ(placement(blocks(2, 2), grid(2, 2, 1)), "tp2:in pp2:across");
  // tp4 on nodes of 2 ranks crosses.
  EXPECT_EQ(placement(blocks(2, 2), grid(4, 1, 1)), "tp4:across");
}

TEST(NodeMap, HsdpShardGroupInsideNode) {
  // dp4 on 2 x 2, shards in groups of 2: {0,1} {2,3} inside, replicas {0,2} {1,3} across.
  EXPECT_EQ(group_members(grid(1, 1, 4), "shard", 3, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(placement(blocks(2, 2), grid(1, 1, 4), 2), "dp4:across shard2:in");
  // Without HSDP the shard group is all of dp.
  EXPECT_EQ(placement(blocks(2, 2), grid(1, 1, 4), 0), "dp4:across shard4:across");
  // tp2 dp4 on 2 x 4, groups of 2: rank 0's dp x cp is {0,2,4,6}, its shard group {0,2} on node 0.
  EXPECT_EQ(group_members(grid(2, 1, 4), "shard", 6, 2), (std::vector<int>{4, 6}));
  EXPECT_EQ(placement(blocks(2, 4), grid(2, 1, 4), 2), "tp2:in dp4:across shard2:in");
  // cp2 dp2 on 2 x 2: dp x cp varies cp fastest, so a shard group of 2 is the cp pair {0,1}.
  EXPECT_EQ(group_members(grid(1, 1, 2, 2), "shard", 1, 2), (std::vector<int>{0, 1}));
}

TEST(NodeMap, ExpertGroupsInsideNode) {
  // dp4 ep2 on 2 x 2: ep {0,1} {2,3} inside, expert-dp {0,2} {1,3} across.
  EXPECT_EQ(placement(blocks(2, 2), grid(1, 1, 4, 1, 2)), "dp4:across ep2:in edp2:across shard4:across");
  // ep4 on nodes of 2 crosses.
  EXPECT_EQ(placement(blocks(2, 2), grid(1, 1, 4, 1, 4)), "dp4:across ep4:across shard4:across");
  EXPECT_EQ(group_members(grid(1, 1, 4, 1, 2), "edp", 3, 0), (std::vector<int>{1, 3}));
  EXPECT_NE(error_of([] { group_members(grid(1, 1, 2), "dpp", 0, 0); }).find("unknown group 'dpp'"),
            std::string::npos);
}

TEST(NodeMap, NodeLocalList) {
  EXPECT_EQ(split_group_list(" tp , shard"), (std::vector<std::string>{"tp", "shard"}));
  EXPECT_EQ(split_group_list(""), std::vector<std::string>{});
  EXPECT_EQ(split_group_list("tp,,dp"), (std::vector<std::string>{"tp", "", "dp"}));
  EXPECT_EQ(parse_config("parallel:\n  node_local: tp, ep, shard\n", {}, 1).parallel.node_local,
            "tp, ep, shard");
  const std::string bad = error_of([] { parse_config("", {"parallel.node_local=tp,nodes"}, 1); });
  EXPECT_NE(bad.find("parallel.node_local"), std::string::npos) << bad;
  EXPECT_NE(bad.find("unknown group 'nodes'"), std::string::npos) << bad;
  EXPECT_NE(error_of([] { parse_config("", {"parallel.node_local=tp,,dp"}, 1); }).find("unknown group ''"),
            std::string::npos);
}

}  // namespace
}  // namespace parallel
