// Reads a training config, validates it against the number of ranks, builds the tensor / pipeline /
// data process groups and checks each with a real all-reduce, then prints the layout from rank 0.
// This is what the quick start runs until the GPT trainer exists.
//   mpirun -np 4 build/bin/parallel_layout --config configs/quickstart.yaml [--set key=value ...]
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/log.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/runtime.hpp"

namespace {

struct Args {
  std::string config;
  std::vector<std::string> overrides;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--config" || arg == "--set") && i + 1 < argc) {
      (arg == "--config" ? a.config : a.overrides.emplace_back()) = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: parallel_layout --config FILE [--set section.key=value ...]\n\nkeys:\n%s",
                  parallel::config_reference().c_str());
      std::exit(0);
    } else {
      throw parallel::ConfigError("parallel_layout: unknown argument '" + arg + "' (see --help)");
    }
  }
  if (a.config.empty()) throw parallel::ConfigError("parallel_layout: --config FILE is required");
  return a;
}

// Sums (world rank + 1) over `group` and compares with the members RankGrid says it has.
void check_group(const char* name, parallel::Communicator& group, const std::vector<int>& members, int rank) {
  parallel::Tensor t = parallel::Tensor::full({1}, rank + 1.0, parallel::DType::F32);
  group.all_reduce(t);
  double want = 0;
  for (int r : members) want += r + 1;
  PARALLEL_CHECK(t.to_float_vector()[0] == want, "{} group all-reduce gave {}, expected {}", name,
                 t.to_float_vector()[0], want);
}

}  // namespace

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) {
    const Args args = parse_args(argc, argv);
    parallel::Config cfg = parallel::load_config(args.config, args.overrides, rt.world_size());
    const auto grid =
        parallel::RankGrid::from_world(rt.world_size(), cfg.parallel.tensor, cfg.parallel.pipeline);
    parallel::ParallelState state(rt.world(), grid);
    const int r = rt.rank();
    check_group("tensor", state.tp(), grid.tensor_group(r), r);
    check_group("pipeline", state.pp(), grid.pipeline_group(r), r);
    check_group("data", state.dp(), grid.data_group(r), r);
    check_group("model", state.model(), grid.model_group(r), r);
    if (auto* emb = state.embedding()) check_group("embedding", *emb, grid.embedding_group(r), r);

    const auto& c = state.coord();
    parallel::logger().info("tp {}/{}  pp {}/{}  dp {}/{}", c.tp, grid.sizes().tensor, c.pp,
                            grid.sizes().pipeline, c.dp, grid.sizes().data);
    rt.world().barrier();
    parallel::progress().info(
        "layout OK: {} ranks = tensor {} x pipeline {} x data {}; model {} layers, hidden {}",
        rt.world_size(), grid.sizes().tensor, grid.sizes().pipeline, grid.sizes().data, cfg.model.num_layers,
        cfg.model.hidden_size);
    return 0;
  });
}
