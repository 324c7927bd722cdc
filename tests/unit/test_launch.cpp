// Launcher discovery against fake environments: no variable is read from the real process.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "parallel/error.hpp"
#include "parallel/launch.hpp"

namespace parallel {
namespace {

using EnvMap = std::map<std::string, std::string>;

LaunchInfo discover(const EnvMap& vars) {
  return discover_launch([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// Every fragment must appear in the error message (variable names and values).
void expect_error(const EnvMap& vars, std::initializer_list<const char*> fragments) {
  try {
    LaunchInfo info = discover(vars);
    ADD_FAILURE() << "expected parallel::Error, got source '" << info.source << "' rank " << info.rank;
  } catch (const Error& e) {
    for (const char* f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "'" << f << "' not in: " << e.what();
  }
}

TEST(Launch, SingleProcessWhenNothingIsSet) {
  LaunchInfo info = discover({{"PATH", "/usr/bin"}, {"HOME", "/root"}});
  EXPECT_EQ(info.source, "single process");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 1);
  EXPECT_FALSE(info.host.empty());
}

TEST(Launch, OpenMpi) {
  LaunchInfo info = discover({{"OMPI_COMM_WORLD_RANK", "5"},
                              {"OMPI_COMM_WORLD_SIZE", "8"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(info.source, "open-mpi");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_FALSE(info.host.empty());
}

TEST(Launch, Slurm) {
  LaunchInfo info = discover(
      {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 2);
}

TEST(Launch, SlurmWithoutTasksPerNodeHasLocalSizeOne) {
  LaunchInfo info = discover({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 1);
}

// srun always sets SLURM_TASKS_PER_NODE; the node's own entry gives the local size.
TEST(Launch, SlurmTasksPerNodeList) {
  EnvMap env{{"SLURM_PROCID", "6"},
             {"SLURM_NTASKS", "7"},
             {"SLURM_LOCALID", "0"},
             {"SLURM_NODEID", "3"},
             {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
  EXPECT_EQ(discover(env).local_size, 1);
  env["SLURM_NODEID"] = "1";
  env["SLURM_PROCID"] = "3";
  env["SLURM_LOCALID"] = "1";
  EXPECT_EQ(discover(env).local_size, 2);
  // The explicit per-node count wins.
  env["SLURM_NTASKS_PER_NODE"] = "3";
  EXPECT_EQ(discover(env).local_size, 3);
  env.erase("SLURM_NTASKS_PER_NODE");
  env["SLURM_TASKS_PER_NODE"] = "2(x";
  expect_error(env, {"SLURM_TASKS_PER_NODE", "2(x"});
}

TEST(Launch, Pmi) {
  LaunchInfo info = discover({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}});
  EXPECT_EQ(info.source, "pmi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 1);

  info = discover({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.local_rank, 0);
}

TEST(Launch, Torchrun) {
  LaunchInfo info =
      discover({{"RANK", "7"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "7"}, {"LOCAL_WORLD_SIZE", "8"}});
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 7);
  EXPECT_EQ(info.world_size, 16);
  EXPECT_EQ(info.local_rank, 7);
  EXPECT_EQ(info.local_size, 8);
}

TEST(Launch, Precedence) {
  EnvMap ompi{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  EnvMap slurm{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}};
  EnvMap pmi{{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}};
  EnvMap torch{{"RANK", "3"}, {"WORLD_SIZE", "5"}};
  auto merge = [](std::initializer_list<EnvMap> parts) {
    EnvMap all;
    for (const auto& p : parts) all.insert(p.begin(), p.end());
    return all;
  };
  EXPECT_EQ(discover(merge({torch, pmi, slurm, ompi})).source, "open-mpi");
  EXPECT_EQ(discover(merge({torch, pmi, slurm, ompi})).world_size, 2);
  EXPECT_EQ(discover(merge({torch, pmi, slurm})).source, "slurm");
  EXPECT_EQ(discover(merge({torch, pmi, slurm})).world_size, 4);
  EXPECT_EQ(discover(merge({torch, pmi})).source, "pmi");
  EXPECT_EQ(discover(merge({torch, pmi})).world_size, 3);
  EXPECT_EQ(discover(merge({torch})).source, "torchrun");
  EXPECT_EQ(discover(merge({torch})).world_size, 5);
}

TEST(Launch, MalformedValues) {
  expect_error({{"OMPI_COMM_WORLD_RANK", "abc"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
               {"OMPI_COMM_WORLD_RANK", "abc"});
  expect_error({{"OMPI_COMM_WORLD_RANK", "1x"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
               {"OMPI_COMM_WORLD_RANK", "1x"});
  expect_error({{"OMPI_COMM_WORLD_RANK", ""}, {"OMPI_COMM_WORLD_SIZE", "4"}}, {"OMPI_COMM_WORLD_RANK"});
  expect_error({{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "4"}}, {"SLURM_PROCID", "-1"});
  expect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}, {"SLURM_NTASKS", "0"});
  expect_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "99999999999999999999"}},
               {"PMI_SIZE", "99999999999999999999"});
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "two"}}, {"WORLD_SIZE", "two"});
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-3"}}, {"LOCAL_RANK", "-3"});
}

TEST(Launch, InconsistentValues) {
  // rank >= size
  expect_error({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
               {"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4"});
  expect_error({{"RANK", "9"}, {"WORLD_SIZE", "8"}}, {"RANK=9", "WORLD_SIZE=8"});
  // local rank >= local size
  expect_error({{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}},
               {"LOCAL_RANK=4", "4"});
  expect_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}}, {"SLURM_LOCALID=1"});
  // Half a launcher's variables: the missing one is named.
  expect_error({{"OMPI_COMM_WORLD_RANK", "0"}}, {"OMPI_COMM_WORLD_SIZE", "missing"});
  expect_error({{"WORLD_SIZE", "2"}}, {"RANK", "missing"});
}

TEST(Launch, FromEnvironmentReadsTheProcessEnvironment) {
  // Whatever launched this test, discovery must succeed and be self-consistent.
  LaunchInfo info = discover_launch_from_environment();
  EXPECT_FALSE(info.source.empty());
  EXPECT_LT(info.rank, info.world_size);
  EXPECT_LT(info.local_rank, info.local_size);
}

}  // namespace
}  // namespace parallel
