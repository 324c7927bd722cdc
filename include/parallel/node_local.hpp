#pragma once
// The names parallel.node_local accepts and how its list reads: plain strings, no MPI, so that the
// config parser can check the key without the library's communication side (the fuzz target
// config_yaml links the parser alone). Where the named groups lie on the nodes is node_map.hpp's
// business, once the world is launched.
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace parallel {

// The groups parallel.node_local can name: tp, cp, dp, pp, ep, etp, edp (RankGrid's groups) and
// shard, the dense HSDP shard group (optimizer.sharding_group_size consecutive ranks of dp x cp;
// all of dp x cp when 0).
std::span<const std::string_view> node_local_group_names();
// parallel.node_local's list: "tp, shard" -> {"tp", "shard"} (blanks around names dropped; an empty
// entry is kept as "", for the config to refuse); "" -> {}.
std::vector<std::string> split_group_list(std::string_view list);

}  // namespace parallel
