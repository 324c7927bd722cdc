// Built by a plain Makefile with `pkg-config --cflags --libs parallel`: starts the runtime, all-gathers
// every rank's id over the world group and checks the result.
#include <cstdio>
#include <parallel/runtime.hpp>
#include <parallel/tensor.hpp>
#include <vector>

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [](parallel::Runtime& rt) {
    const int n = rt.world_size();
    parallel::Tensor mine = parallel::Tensor::full({2}, rt.rank() + 1.0, parallel::DType::F32);
    parallel::Tensor all = parallel::Tensor::zeros({2 * n}, parallel::DType::F32);
    rt.world().all_gather(mine, all, /*async=*/false);
    const std::vector<float> got = all.to_float_vector();
    for (int r = 0; r < n; ++r) {
      if (got[2 * r] != r + 1.0f || got[2 * r + 1] != r + 1.0f) {
        std::fprintf(stderr, "consumer_make: rank %d sees %f from rank %d, want %d\n", rt.rank(), got[2 * r],
                     r, r + 1);
        return 1;
      }
    }
    if (rt.rank() == 0) std::printf("consumer_make: OK on %d rank(s)\n", n);
    return 0;
  });
}
