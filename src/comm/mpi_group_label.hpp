#pragma once
// A group's name and members, shared by an MpiCommunicator with its pending operations so that the
// watchdog's message names the group as it is called when the wait expires (internal).
#include <string>
#include <vector>

namespace parallel::detail {

struct MpiGroupLabel {
  std::string name = "unnamed";
  std::vector<int> world_ranks;  // group rank -> MPI_COMM_WORLD rank
};

}  // namespace parallel::detail
