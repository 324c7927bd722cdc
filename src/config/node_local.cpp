// parallel.node_local's vocabulary (node_local.hpp).
#include "parallel/node_local.hpp"

#include <array>

namespace parallel {
namespace {

constexpr std::array<std::string_view, 8> kGroupNames = {"tp", "cp", "dp", "pp", "ep", "etp", "edp", "shard"};

}  // namespace

std::span<const std::string_view> node_local_group_names() { return kGroupNames; }

std::vector<std::string> split_group_list(std::string_view list) {
  std::vector<std::string> out;
  if (list.find_first_not_of(" \t") == std::string_view::npos) return out;
  while (true) {
    const auto comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    const auto first = item.find_first_not_of(" \t");
    item = first == std::string_view::npos ? std::string_view()
                                           : item.substr(first, item.find_last_not_of(" \t") + 1 - first);
    out.emplace_back(item);
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace parallel
