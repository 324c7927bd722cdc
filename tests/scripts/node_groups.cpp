// What one rank sees of its node and of its groups, for tests/scripts/multinode.sh to check against
// the namespace nodes it made: the launcher's local rank and size, MPI's node map (node_map.hpp),
// and each group's world ranks twice, from the rank grid's arithmetic (group_members) and from the
// communicators the library really builds (ParallelState's tp, dp, ep; DataParallel's HSDP shard
// group). One JSON object per rank in OUT_DIR/rank_R.json.
//   node_groups OUT_DIR TENSOR EXPERT SHARDING_GROUP_SIZE
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/data_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/node_map.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/parameter.hpp"
#include "parallel/runtime.hpp"

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) {
    using namespace parallel;
    PARALLEL_CHECK(argc == 5, "usage: node_groups OUT_DIR TENSOR EXPERT SHARDING_GROUP_SIZE");
    const int tensor = std::stoi(argv[2]), expert = std::stoi(argv[3]), k = std::stoi(argv[4]);
    MpiCommunicator& world = rt.world();
    const auto grid = RankGrid::from_world(world.size(), tensor, 1, 1, expert);
    ParallelState state(world, grid);
    const NodeMap nodes = discover_nodes(world, rt.launch().host);

    Parameter weight;
    weight.name = "weight";
    weight.value = Tensor::full({64}, 1.0, DType::F32);
    weight.grad = Tensor::zeros({64}, DType::F32);
    weight.global_shape = {64};
    DataParallelOptions options;
    options.distributed_optimizer = true;
    options.sharding = Sharding::Optim;
    options.sharding_group_size = k;
    DataParallel ddp(std::vector<Parameter*>{&weight}, state.dp_cp(), options);

    const int rank = world.rank();
    nlohmann::json out = {{"rank", rank},
                          {"host", rt.launch().host},
                          {"launcher",
                           {{"source", rt.launch().source},
                            {"local_rank", rt.launch().local_rank},
                            {"local_size", rt.launch().local_size}}},
                          {"node", nodes.node_of[rank]},
                          {"node_local_rank", nodes.local_rank(rank)},
                          {"node_size", nodes.ranks_on(nodes.node_of[rank]).size()},
                          {"nodes", nodes.describe()},
                          {"tp", state.tp().world_ranks()},
                          {"dp", state.dp().world_ranks()},
                          {"ep", state.ep().world_ranks()},
                          {"shard", ddp.shard_group().world_ranks()},
                          {"grid",
                           {{"tp", group_members(grid, "tp", rank, k)},
                            {"dp", group_members(grid, "dp", rank, k)},
                            {"ep", group_members(grid, "ep", rank, k)},
                            {"shard", group_members(grid, "shard", rank, k)}}}};
    for (const GroupPlacement& g : place_groups(nodes, grid, k)) out["inside_node"][g.name] = g.inside_node;
    std::ofstream(std::string(argv[1]) + "/rank_" + std::to_string(rank) + ".json") << out.dump() << "\n";
    return 0;
  });
}
