// Every rank of a job as a meta rank, one after another in this one process, with no MPI (this
// binary never initialises it): each rank's training step (tests/common/meta_step.hpp) runs alone
// over a MetaCommunicator, and the ranks' records must fit together as a real job's would:
//   - on every group, each member issues the same collectives (kind, bytes, dtype, reduce op,
//     async) in the same order - a mismatch would hang or corrupt a real run;
//   - between every two ranks, what one sends the other receives: the same message sizes in the
//     same order (send / recv and each op of a batch_p2p).
// test_meta_step holds each rank's record to what the real ranks issue on 2 and 4 ranks; this test
// reaches layouts of 8 ranks on a machine that runs 4.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "meta_step.hpp"
#include "parallel/meta_communicator.hpp"

namespace parallel {
namespace {

struct Layout {
  const char* label;
  int world_size;
  std::vector<std::string> overrides;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.label; }

const char* kModel = R"(
model:
  num_layers: 4
  hidden_size: 64
  num_attention_heads: 4
  vocab_size: 512
  seq_length: 64
train:
  micro_batch_size: 4
  steps: 1
optimizer:
  warmup_steps: 0
data:
  path: synthetic
)";

// "send 65536,recv 65536" -> (is_send, bytes) per op.
std::vector<std::pair<bool, int64_t>> batch_ops(const std::string& detail) {
  std::vector<std::pair<bool, int64_t>> out;
  std::stringstream ss(detail);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto space = item.find(' ');
    out.emplace_back(item.substr(0, space) == "send", std::stoll(item.substr(space + 1)));
  }
  return out;
}

class MetaRanksTest : public ::testing::TestWithParam<Layout> {};

TEST_P(MetaRanksTest, EveryRanksRecordFitsTogether) {
  const int n = GetParam().world_size;
  const Config config = parse_config(kModel, GetParam().overrides, n);
  std::vector<std::vector<CommEvent>> logs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto log = std::make_shared<CommLog>();
    MetaCommunicator world(r, n, log);
    const testing::StepResult step = testing::run_step(config, world, Device::meta());
    EXPECT_GT(step.peak_bytes, 0);
    logs[static_cast<std::size_t>(r)] = log->events();
  }

  // Collectives per group: key (name, members) -> each member's sequence.
  std::map<std::pair<std::string, std::vector<int>>, std::map<int, std::vector<std::string>>> groups;
  // Point-to-point: (from, to) -> sizes sent; (to, from) -> sizes received.
  std::map<std::pair<int, int>, std::vector<int64_t>> sent, received;
  std::size_t collectives = 0, messages = 0;
  for (int r = 0; r < n; ++r) {
    for (const CommEvent& e : logs[static_cast<std::size_t>(r)]) {
      if (e.kind == "send" || e.kind == "recv") {
        (e.kind == "send" ? sent : received)[{r, e.peers.at(0)}].push_back(e.bytes);
        ++messages;
      } else if (e.kind == "batch_p2p") {
        const auto ops = batch_ops(e.detail);
        ASSERT_EQ(ops.size(), e.peers.size()) << e.str();
        for (std::size_t i = 0; i < ops.size(); ++i) {
          (ops[i].first ? sent : received)[{r, e.peers[i]}].push_back(ops[i].second);
          ++messages;
        }
      } else {
        CommEvent shape = e;  // what every member must agree on
        shape.peers.clear();
        groups[{e.group, e.ranks}][r].push_back(shape.str());
        ++collectives;
      }
    }
  }
  EXPECT_GT(collectives, 0u);
  for (const auto& [group, members] : groups) {
    EXPECT_EQ(members.size(), group.second.size()) << group.first << ": not every member communicated";
    const std::vector<std::string>& first = members.begin()->second;
    for (const auto& [rank, seq] : members)
      EXPECT_EQ(seq, first) << GetParam().label << " group " << group.first << ": rank " << rank
                            << " vs rank " << members.begin()->first;
  }
  for (const auto& [pair, sizes] : sent) {
    const auto it = received.find({pair.second, pair.first});
    ASSERT_NE(it, received.end()) << pair.first << " sends to " << pair.second << ", who never receives";
    EXPECT_EQ(sizes, it->second) << GetParam().label << ": " << pair.first << " -> " << pair.second;
  }
  for (const auto& [pair, sizes] : received)
    EXPECT_TRUE(sent.count({pair.second, pair.first}))
        << pair.first << " receives from " << pair.second << ", who never sends";
  std::printf("%s: %d ranks, %zu collective calls, %zu point-to-point messages, all matched\n",
              GetParam().label, n, collectives, messages);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MetaRanksTest,
    ::testing::Values(
        Layout{"tp2_pp2", 4, {"parallel.tensor=2", "parallel.pipeline=2", "train.global_batch_size=16"}},
        Layout{"tp2_sp_pp2_dp2_distributed",
               8,
               {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.pipeline=2",
                "optimizer.distributed=true", "train.global_batch_size=16"}},
        Layout{
            "pp4_interleaved_dp2_zero3_bf16",
            8,
            {"parallel.pipeline=4", "parallel.virtual_stages=2", "model.num_layers=8",
             "optimizer.sharding=optim_grads_params", "train.precision=bf16", "train.global_batch_size=32"}},
        Layout{"cp2_tp2_dp2", 8, {"parallel.context=2", "parallel.tensor=2", "train.global_batch_size=16"}}),
    [](const ::testing::TestParamInfo<Layout>& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
