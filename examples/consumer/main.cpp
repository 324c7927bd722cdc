// Uses only the installed headers and library: starts the runtime, builds the process groups for
// tensor parallel size 2 when there are two or more ranks, and checks an all-reduce.
#include <cstdio>
#include <parallel/parallel_state.hpp>
#include <parallel/runtime.hpp>

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [](parallel::Runtime& rt) {
    const int tp = rt.world_size() % 2 == 0 ? 2 : 1;
    parallel::ParallelState state(rt.world(), parallel::RankGrid::from_world(rt.world_size(), tp, 1));
    parallel::Tensor t = parallel::Tensor::full({3}, rt.rank() + 1.0, parallel::DType::F32);
    state.dp().all_reduce(t);
    // Sum over the data-parallel group of (world rank + 1).
    double want = 0;
    for (int r : state.grid().data_group(rt.rank())) want += r + 1;
    if (t.to_float_vector()[0] != want) {
      std::fprintf(stderr, "consumer: rank %d got %f, want %f\n", rt.rank(), t.to_float_vector()[0], want);
      return 1;
    }
    if (rt.rank() == 0)
      std::printf("consumer: OK on %d rank(s), tp=%d dp=%d\n", rt.world_size(), tp, state.dp().size());
    return 0;
  });
}
