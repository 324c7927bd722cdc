// The meta device (meta.hpp, meta_communicator.hpp) against the real ranks: for each layout, every
// rank first runs one training step as a meta rank - the real GPTModel chunks, pipeline schedule,
// DataParallel and optimizer step, on Device::meta() with a MetaCommunicator standing for its rank
// of the job and talking to no one - and then the same step for real on the CPU over MPI, through a
// RecordingCommunicator around the world. The collectives and transfers both record (kind, bytes,
// dtype, group and its world ranks, peers, reduce op, async) must be equal and in the same order,
// and the meta allocator's peak is compared with the CPU allocator's.
//
// The step is composed as Trainer composes it (tests/common/meta_step.hpp).
// Run on 2 and 4 ranks; a layout whose world size differs is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "meta_step.hpp"
#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/comm_log.hpp"
#include "parallel/config.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/meta.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/precision.hpp"
#include "parallel/recording_communicator.hpp"

namespace parallel {
namespace {

using testing::run_step;
using testing::StepResult;
using testing::world;

using testing::kMetaModel;
using testing::MetaLayout;

class MetaStepTest : public ::testing::TestWithParam<MetaLayout> {};

TEST_P(MetaStepTest, MetaRankIssuesTheRealRanksCollectivesAndPeak) {
  Communicator& w = world();
  if (w.size() != GetParam().world_size) GTEST_SKIP() << "needs " << GetParam().world_size << " ranks";
  const Config config = parse_config(kMetaModel, GetParam().overrides, w.size());

  // First the meta rank: no MPI call is made (its communicator has no one to talk to).
  auto meta_log = std::make_shared<CommLog>();
  StepResult meta;
  {
    MetaCommunicator meta_world(w.rank(), w.size(), meta_log);
    meta = run_step(config, meta_world, Device::meta());
  }
  auto real_log = std::make_shared<CommLog>();
  StepResult real;
  {
    RecordingCommunicator recorded(w, real_log);
    real = run_step(config, recorded, Device::cpu());
  }

  const std::vector<CommEvent>& m = meta_log->events();
  const std::vector<CommEvent>& r = real_log->events();
  if (std::getenv("PARALLEL_META_STEP_LOG") != nullptr)  // every event of every rank, for reading
    for (const CommEvent& e : m) std::printf("%s rank %d: %s\n", GetParam().label, w.rank(), e.str().c_str());
  EXPECT_GT(r.size(), 0u);
  EXPECT_EQ(m.size(), r.size()) << GetParam().label << " rank " << w.rank();
  // MoE routed by the router's weights (`routed`): the token dispatch's bytes follow the routing -
  // balanced on meta, the router's choice on the real rank - so an all_to_allv is compared without
  // its bytes (kind, group, members, dtype, order and everything else still equal); the sums are
  // printed side by side. Under model.moe_router_force_load_balancing the bytes are compared too.
  const bool routed = GetParam().routed;
  int64_t meta_dispatch = 0, real_dispatch = 0;
  for (std::size_t i = 0; i < std::min(m.size(), r.size()); ++i) {
    CommEvent a = m[i], b = r[i];
    if (routed && a.kind == "all_to_allv" && b.kind == "all_to_allv") {
      meta_dispatch += a.bytes;
      real_dispatch += b.bytes;
      a.bytes = b.bytes = 0;
    }
    EXPECT_EQ(a, b) << GetParam().label << " rank " << w.rank() << " event " << i << ": meta " << m[i].str()
                    << " | real " << r[i].str();
    if (a != b) break;
  }
  if (routed)
    std::printf("%s rank %d: all_to_allv bytes, meta (balanced) %lld, real (routed) %lld\n", GetParam().label,
                w.rank(), static_cast<long long>(meta_dispatch), static_cast<long long>(real_dispatch));

  // The peaks, printed per rank in rank order.
  // For reference, the memory plan's figure (memory_plan.cpp: the trainer's first two steps on
  // meta) for this rank, which adds the packed 16-bit weights and the steps after the first.
  const MemoryPlan plan = plan_memory(config, w.size());
  constexpr int kFields = 6;
  Tensor mine = Tensor::zeros({kFields}, DType::I64);
  mine.data<int64_t>()[0] = meta.peak_bytes;
  mine.data<int64_t>()[1] = real.peak_bytes;
  mine.data<int64_t>()[2] = static_cast<int64_t>(r.size());
  mine.data<int64_t>()[3] = meta.peak_with_construction;
  mine.data<int64_t>()[4] = real.peak_with_construction;
  mine.data<int64_t>()[5] = plan.ranks[static_cast<std::size_t>(w.rank())].allocator_bytes;
  Tensor all = Tensor::zeros({kFields * w.size()}, DType::I64);
  w.all_gather(mine, all);
  if (w.rank() == 0) {
    for (int k = 0; k < w.size(); ++k) {
      const int64_t* v = all.data<int64_t>() + kFields * k;
      std::printf(
          "%s rank %d: %lld collectives and transfers equal; step peak meta %lld B, real %lld B; with "
          "construction meta %.3f MiB, real %.3f MiB (%+.2f %%); memory_plan %.3f MiB\n",
          GetParam().label, k, static_cast<long long>(v[2]), static_cast<long long>(v[0]),
          static_cast<long long>(v[1]), v[3] / 1048576.0, v[4] / 1048576.0,
          100.0 * (static_cast<double>(v[3]) / static_cast<double>(v[4]) - 1.0), v[5] / 1048576.0);
    }
    std::printf("%s rank 0: %zu op events, %.3f GFLOP on meta\n", GetParam().label, meta.op_events,
                meta.flops / 1e9);
  }
  EXPECT_GT(meta.op_events, 0u);
  EXPECT_GT(meta.peak_bytes, 0);
  // The same allocations in the same order: the step's peaks agree to the byte (the MPI backend
  // allocates no tensors of its own) - but for the pipeline's send buffers. The executor frees a
  // send's buffer when it polls the send complete (executor.cpp), which on a real rank depends on
  // when the peer receives (MPI's rendezvous above its eager limit); a meta send completes at
  // once. So a real peak may exceed the meta one by buffers still in flight: at most the bytes this
  // rank sends in the step.
  int64_t sent = 0;
  for (const CommEvent& e : r)
    if (e.kind == "send" || e.kind == "batch_p2p") sent += e.bytes;
  // MoE routed by the weights: the expert activations follow the routing, so only the 10 % bound
  // below holds.
  if (!routed) {
    EXPECT_GE(real.peak_bytes, meta.peak_bytes) << GetParam().label << " rank " << w.rank();
    EXPECT_LE(real.peak_bytes - meta.peak_bytes, sent) << GetParam().label << " rank " << w.rank();
    if (sent == 0) EXPECT_EQ(meta.peak_bytes, real.peak_bytes) << GetParam().label << " rank " << w.rank();
  }
  EXPECT_LE(std::abs(static_cast<double>(meta.peak_with_construction) /
                         static_cast<double>(real.peak_with_construction) -
                     1.0),
            0.10)
      << GetParam().label << " rank " << w.rank();
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MetaStepTest,
    ::testing::Values(
        MetaLayout{"tp2_sp",
                   2,
                   {"parallel.tensor=2", "parallel.sequence_parallel=true", "train.global_batch_size=8"}},
        MetaLayout{"dp2_distributed", 2, {"optimizer.distributed=true", "train.global_batch_size=16"}},
        MetaLayout{"pp2_1f1b",
                   2,
                   {"parallel.pipeline=2", "parallel.pipeline_schedule=1f1b", "train.global_batch_size=16"}},
        MetaLayout{"tp2_pp2", 4, {"parallel.tensor=2", "parallel.pipeline=2", "train.global_batch_size=16"}},
        MetaLayout{"tp2_sp_dp2_distributed_bf16",
                   4,
                   {"parallel.tensor=2", "parallel.sequence_parallel=true", "optimizer.distributed=true",
                    "train.precision=bf16", "train.global_batch_size=16"}},
        MetaLayout{"dp4_zero3", 4, {"optimizer.sharding=optim_grads_params", "train.global_batch_size=16"}},
        // The overlapped update: bucket updates and all-gathers issued during the backward.
        MetaLayout{
            "dp2_zero1_overlapped_update",
            2,
            {"optimizer.distributed=true", "optimizer.overlap_grad_reduce=true",
             "optimizer.overlap_param_gather=true", "optimizer.clip_grad=0", "optimizer.overlap_update=true",
             "optimizer.bucket_size=20000", "train.global_batch_size=16"}},
        MetaLayout{"cp2_p2p", 2, {"parallel.context=2", "train.global_batch_size=8"}},
        MetaLayout{"pp2_zb_h1",
                   2,
                   {"parallel.pipeline=2", "parallel.pipeline_schedule=zb-h1", "train.global_batch_size=16"}},
        MetaLayout{"dp2_zero2_fp16",
                   2,
                   {"optimizer.sharding=optim_grads", "train.precision=fp16", "train.global_batch_size=16"}},
        MetaLayout{"tp2_sp_pp2_llama",
                   4,
                   {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.pipeline=2",
                    "model.num_query_groups=2", "model.activation=swiglu", "model.ffn_hidden_size=176",
                    "model.normalization=rmsnorm", "model.position_embedding=rope",
                    "model.tie_embeddings=false", "model.add_bias=false", "train.global_batch_size=16"}},
        MetaLayout{"cp2_a2a_dp2_distributed",
                   4,
                   {"parallel.context=2", "parallel.context_comm=a2a", "optimizer.distributed=true",
                    "train.global_batch_size=16"}},
        MetaLayout{"tp2_pp2_full_recompute_dropout",
                   4,
                   {"parallel.tensor=2", "parallel.pipeline=2", "train.recompute=full", "model.dropout=0.1",
                    "train.global_batch_size=16"}},
        MetaLayout{"pp2_dp2_zero3_bf16",
                   4,
                   {"parallel.pipeline=2", "optimizer.sharding=optim_grads_params", "train.precision=bf16",
                    "train.global_batch_size=16"}},
        // Muon: the momentum, the matrices assembled over dp shards and tp slices, Newton-Schulz's
        // GEMMs and temporaries, all through the allocator and the communicators alike.
        MetaLayout{"tp2_dp2_zero3_muon",
                   4,
                   {"parallel.tensor=2", "optimizer.sharding=optim_grads_params", "optimizer.type=muon",
                    "train.global_batch_size=16"}},
        MetaLayout{"tp2_sp_muon_bf16",
                   2,
                   {"parallel.tensor=2", "parallel.sequence_parallel=true", "optimizer.type=muon",
                    "train.precision=bf16", "train.global_batch_size=8"}},
        MetaLayout{"dp4_hsdp2_zero3",
                   4,
                   {"optimizer.sharding=optim_grads_params", "optimizer.sharding_group_size=2",
                    "train.global_batch_size=16"}},
        // MoE with the router forced to balance (model.moe_router_force_load_balancing): the real
        // router then chooses what the meta run assumes, so the dispatch's bytes and the peaks are
        // compared like any other layout's.
        MetaLayout{"moe_ep2",
                   2,
                   {"model.num_experts=4", "model.moe_router_topk=2", "parallel.expert=2",
                    "model.moe_token_dispatcher=alltoall", "model.moe_router_force_load_balancing=true",
                    "train.global_batch_size=16"}},
        MetaLayout{"moe_ep2_tp2_sp_distributed",
                   4,
                   {"model.num_experts=4", "model.moe_router_topk=2", "parallel.expert=2",
                    "parallel.tensor=2", "parallel.sequence_parallel=true", "optimizer.distributed=true",
                    "model.moe_token_dispatcher=alltoall", "model.moe_router_force_load_balancing=true",
                    "train.global_batch_size=16"}},
        // The same without forcing: the router routes by its weights, so the dispatch's bytes and
        // the peak follow the routing (compared through sums and the 10 % bound).
        MetaLayout{"moe_ep2_routed",
                   2,
                   {"model.num_experts=4", "model.moe_router_topk=2", "parallel.expert=2",
                    "model.moe_token_dispatcher=alltoall", "train.global_batch_size=16"},
                   true},
        MetaLayout{"pp2_zb_v",
                   2,
                   {"parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.pipeline_schedule=zb-v",
                    "train.global_batch_size=16"}},
        MetaLayout{"pp2_dualpipe_v",
                   2,
                   {"parallel.pipeline=2", "parallel.virtual_stages=2",
                    "parallel.pipeline_schedule=dualpipe-v", "train.global_batch_size=16"}},
        MetaLayout{"pp4_zb_v",
                   4,
                   {"parallel.pipeline=4", "parallel.virtual_stages=2", "parallel.pipeline_schedule=zb-v",
                    "model.num_layers=8", "train.global_batch_size=32"}},
        MetaLayout{"pp4_interleaved",
                   4,
                   {"parallel.pipeline=4", "parallel.virtual_stages=2", "model.num_layers=8",
                    "train.global_batch_size=16"}}),
    [](const ::testing::TestParamInfo<MetaLayout>& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace parallel
