// What Runtime does to the process's environment before MPI and CUDA start (runtime.hpp): in a job
// of several ranks it asks CUDA for eager module loading, and it turns Open MPI's yield off, each
// only where the user's environment did not set the variable. The process's starting environment is
// read back from /proc/self/environ, which setenv() does not change, so the same test checks both
// the default and a user's value (the _user ctest runs it with CUDA_MODULE_LOADING=LAZY and names
// that value in PARALLEL_TEST_USER_CUDA_MODULE_LOADING).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "mpi_test.hpp"

namespace parallel::testing {
namespace {

// The value `name` had when the process started, if it had one.
std::optional<std::string> starting_value(const std::string& name) {
  std::ifstream in("/proc/self/environ", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t at = 0;
  while (at < all.size()) {
    const std::size_t end = std::min(all.find('\0', at), all.size());
    const std::string entry = all.substr(at, end - at);
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
    at = end + 1;
  }
  return std::nullopt;
}

std::optional<std::string> current_value(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

TEST(Runtime, AsksForEagerCudaModuleLoadingInJobsOfSeveralRanks) {
  const std::optional<std::string> user = starting_value("CUDA_MODULE_LOADING");
  const std::optional<std::string> now = current_value("CUDA_MODULE_LOADING");
  // The _user ctest names the value it started the ranks with, so that a launcher which did not
  // pass it on fails here instead of taking the default branch.
  if (const std::optional<std::string> given = current_value("PARALLEL_TEST_USER_CUDA_MODULE_LOADING"))
    ASSERT_EQ(user, given) << "the launcher did not pass CUDA_MODULE_LOADING on";
  if (user) {
    EXPECT_EQ(now, user) << "the user's CUDA_MODULE_LOADING must be kept";
  } else if (world().size() > 1) {
    EXPECT_EQ(now, std::optional<std::string>("EAGER"));
  } else {
    EXPECT_EQ(now, std::nullopt) << "a single rank keeps CUDA's default (lazy) loading";
  }
}

TEST(Runtime, TurnsOpenMpiYieldOffUnlessTheUserSetIt) {
  if (runtime().launch().source == "mpi (already initialised)")
    GTEST_SKIP() << "MPI was initialised before Runtime";
  const std::optional<std::string> user = starting_value("OMPI_MCA_mpi_yield_when_idle");
  EXPECT_EQ(current_value("OMPI_MCA_mpi_yield_when_idle"), user ? user : std::optional<std::string>("0"));
}

}  // namespace
}  // namespace parallel::testing
