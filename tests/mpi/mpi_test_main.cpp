// main() for multi-rank gtest binaries run under mpirun.
//
// Every rank runs every test. Rank 0 prints gtest's usual report; other ranks print only their
// failures, prefixed with their rank, so a failure on rank 3 is visible and fails mpirun's exit code.
#include <gtest/gtest.h>

#include "mpi_test.hpp"

namespace parallel::testing {
namespace {
Runtime* g_runtime = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

Runtime& runtime() { return *g_runtime; }
MpiCommunicator& world() { return g_runtime->world(); }

}  // namespace parallel::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return parallel::run_main(argc, argv, [](parallel::Runtime& rt) {
    parallel::testing::g_runtime = &rt;
    if (rt.rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new parallel::testing::RankFailurePrinter(rt.rank()));
    }
    int rc = RUN_ALL_TESTS();
    // Every rank must agree on the verdict: one failing rank fails the job.
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, rt.world().handle());
    return worst;
  });
}
