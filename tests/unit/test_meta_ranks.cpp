// Every rank of a job as a meta rank, one after another in this one process, with no MPI (this
// binary never initialises it): each rank's training step (tests/common/meta_step.hpp) runs alone
// over a MetaCommunicator, and the ranks' records must fit together as a real job's would:
//   - on every group, each member issues the same collectives (kind, bytes, dtype, reduce op,
//     async) in the same order - a mismatch would hang or corrupt a real run;
//   - between every two ranks, what one sends the other receives: the same message sizes in the
//     same order (send / recv and each op of a batch_p2p).
// test_meta_step holds each rank's record to what the real ranks issue on 2 and 4 ranks; this test
// reaches layouts of 8 ranks on a machine that runs 4.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "meta_step.hpp"
#include "parallel/meta_communicator.hpp"

namespace parallel {
namespace {

using testing::kMetaModel;
using testing::MetaLayout;

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

// What keeps `logs` (one per world rank) from fitting together as a real job's records; empty when
// they fit. Counts the collective calls and point-to-point messages seen.
std::vector<std::string> mismatches(const std::vector<std::vector<CommEvent>>& logs, std::size_t& collectives,
                                    std::size_t& messages) {
  std::vector<std::string> out;
  // Collectives per group: key (name, members) -> each member's sequence.
  std::map<std::pair<std::string, std::vector<int>>, std::map<int, std::vector<std::string>>> groups;
  // Point-to-point: (from, to) -> sizes sent; (to, from) -> sizes received.
  std::map<std::pair<int, int>, std::vector<int64_t>> sent, received;
  collectives = messages = 0;
  for (std::size_t r = 0; r < logs.size(); ++r) {
    const int rank = static_cast<int>(r);
    for (const CommEvent& e : logs[r]) {
      if (e.kind == "send" || e.kind == "recv") {
        (e.kind == "send" ? sent : received)[{rank, e.peers.at(0)}].push_back(e.bytes);
        ++messages;
      } else if (e.kind == "batch_p2p") {
        const auto ops = batch_ops(e.detail);
        if (ops.size() != e.peers.size()) out.push_back("malformed " + e.str());
        for (std::size_t i = 0; i < std::min(ops.size(), e.peers.size()); ++i) {
          (ops[i].first ? sent : received)[{rank, e.peers[i]}].push_back(ops[i].second);
          ++messages;
        }
      } else {
        CommEvent shape = e;  // what every member must agree on
        shape.peers.clear();
        groups[{e.group, e.ranks}][rank].push_back(shape.str());
        ++collectives;
      }
    }
  }
  for (const auto& [group, members] : groups) {
    if (members.size() != group.second.size())
      out.push_back(fmt::format("group {}: {} of {} members communicated", group.first, members.size(),
                                group.second.size()));
    const auto& [first_rank, first] = *members.begin();
    for (const auto& [rank, seq] : members)
      if (seq != first)
        out.push_back(fmt::format("group {}: rank {} and rank {} issue different collectives", group.first,
                                  rank, first_rank));
  }
  for (const auto& [pair, sizes] : sent) {
    const auto it = received.find({pair.second, pair.first});
    if (it == received.end() || it->second != sizes)
      out.push_back(
          fmt::format("{} -> {}: sent [{}], received [{}]", pair.first, pair.second, fmt::join(sizes, ", "),
                      it == received.end() ? std::string() : fmt::format("{}", fmt::join(it->second, ", "))));
  }
  for (const auto& [pair, sizes] : received)
    if (!sent.count({pair.second, pair.first}))
      out.push_back(fmt::format("{} receives from {}, who never sends", pair.first, pair.second));
  return out;
}

class MetaRanksTest : public ::testing::TestWithParam<MetaLayout> {};

TEST_P(MetaRanksTest, EveryRanksRecordFitsTogether) {
  const int n = GetParam().world_size;
  const Config config = parse_config(kMetaModel, GetParam().overrides, n);
  std::vector<std::vector<CommEvent>> logs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto log = std::make_shared<CommLog>();
    MetaCommunicator world(r, n, log);
    const testing::StepResult step = testing::run_step(config, world, Device::meta());
    EXPECT_GT(step.peak_bytes, 0);
    logs[static_cast<std::size_t>(r)] = log->events();
  }

  std::size_t collectives = 0, messages = 0;
  const std::vector<std::string> problems = mismatches(logs, collectives, messages);
  EXPECT_GT(collectives, 0u);
  EXPECT_TRUE(problems.empty()) << GetParam().label << ": " << fmt::format("{}", fmt::join(problems, "; "));
  std::printf("%s: %d ranks, %zu collective calls, %zu point-to-point messages, %zu mismatches\n",
              GetParam().label, n, collectives, messages, problems.size());
}

// The check has teeth: records that would hang a real job are caught.
TEST(MetaRanks, MismatchedRecordsAreCaught) {
  auto log0 = std::make_shared<CommLog>(), log1 = std::make_shared<CommLog>();
  MetaCommunicator r0(0, 2, log0), r1(1, 2, log1);
  r0.set_name("dp");
  r1.set_name("dp");
  Tensor a = Tensor::empty({8}, DType::F32, Device::meta()),
         b = Tensor::empty({16}, DType::F32, Device::meta());
  r0.all_reduce(a);
  r1.all_reduce(b);  // another size
  r0.send(a, 1);
  r1.recv(b, 0);  // another size
  std::size_t collectives = 0, messages = 0;
  const auto problems = mismatches({log0->events(), log1->events()}, collectives, messages);
  EXPECT_EQ(collectives, 2u);
  EXPECT_EQ(messages, 2u);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0], "group dp: rank 1 and rank 0 issue different collectives");
  EXPECT_EQ(problems[1], "0 -> 1: sent [32], received [64]");
  log1->clear();
  EXPECT_EQ(mismatches({log0->events(), log1->events()}, collectives, messages).size(), 2u);  // 1 silent
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MetaRanksTest,
    ::testing::Values(
        MetaLayout{"tp2_pp2", 4, {"parallel.tensor=2", "parallel.pipeline=2", "train.global_batch_size=16"}},
        MetaLayout{"tp2_sp_pp2_dp2_distributed",
                   8,
                   {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.pipeline=2",
                    "optimizer.distributed=true", "train.global_batch_size=16"}},
        MetaLayout{
            "pp4_interleaved_dp2_zero3_bf16",
            8,
            {"parallel.pipeline=4", "parallel.virtual_stages=2", "model.num_layers=8",
             "optimizer.sharding=optim_grads_params", "train.precision=bf16", "train.global_batch_size=32"}},
        MetaLayout{
            "cp2_tp2_dp2", 8, {"parallel.context=2", "parallel.tensor=2", "train.global_batch_size=16"}}),
    [](const ::testing::TestParamInfo<MetaLayout>& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
