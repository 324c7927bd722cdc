// The meta device's contract (meta.hpp, meta_communicator.hpp): no values, the same checks as real
// tensors, events recorded, bytes counted; the meta communicator's records and refusals.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "parallel/allocator.hpp"
#include "parallel/meta.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/ops.hpp"
#include "parallel/recording_communicator.hpp"

namespace parallel {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Meta, TensorsHaveShapeAndDtypeButNoValues) {
  const Tensor t = Tensor::zeros({4, 8}, DType::BF16, Device::meta());
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.device(), Device::meta());
  EXPECT_EQ(t.str(), "Tensor[4, 8] bf16 meta");
  EXPECT_EQ(t.data_ptr(), nullptr);
  EXPECT_EQ(t.narrow(1, 2, 4).shape(), (Shape{4, 4}));
  EXPECT_EQ(t.view({32}).shape(), (Shape{32}));

  const std::string data = error_of([&] { (void)t.data<bf16>(); });
  EXPECT_NE(data.find("data<T>() of Tensor[4, 8] bf16 meta: a meta tensor has shape and dtype but no values"),
            std::string::npos)
      << data;
  EXPECT_NE(error_of([&] { (void)t.to_float_vector(); }).find("to_float_vector()"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)t.to(Device::cpu()); }).find("copy_ into a cpu tensor"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)ops::sum_of_squares(t); }).find("ops::sum_of_squares"), std::string::npos);
  // Host values may enter a meta run (its synthetic data): only the shape and dtype go.
  const Tensor from_host = Tensor::from_vector<int32_t>({1, 2, 3}, {3}).to(Device::meta());
  EXPECT_EQ(from_host.device(), Device::meta());
  EXPECT_EQ(from_host.dtype(), DType::I32);
}

TEST(Meta, AllocatorCountsBytesAsTheCpuOneDoes) {
  Allocator& meta = allocator_for(Device::meta());
  const MemoryStats before = meta.stats();
  meta.reset_peak();
  {
    const Tensor a = Tensor::empty({1000}, DType::F32, Device::meta());
    const Tensor b = Tensor::empty({10}, DType::BF16, Device::meta());
    EXPECT_EQ(meta.stats().allocated, before.allocated + 4020);
  }
  EXPECT_EQ(meta.stats().allocated, before.allocated);
  EXPECT_EQ(meta.stats().peak_allocated, before.allocated + 4020);
  EXPECT_EQ(memory_stats(Device::meta()).num_system_allocations, 0u);
}

// The same bad call fails with the same message on the CPU and on meta: one check path.
TEST(Meta, OpsCheckTheirContractAsForRealTensors) {
  for (const Device d : {Device::cpu(), Device::meta()}) {
    SCOPED_TRACE(d.str());
    const Tensor a = Tensor::zeros({4, 8}, DType::F32, d), b = Tensor::zeros({6, 3}, DType::F32, d);
    Tensor c = Tensor::zeros({4, 3}, DType::F32, d);
    EXPECT_NE(error_of([&] { ops::gemm(a, false, b, false, c); }).find("does not fit"), std::string::npos);
  }
  auto message = [](Device d, const std::function<void(Device)>& call) { return error_of([&] { call(d); }); };
  const std::vector<std::function<void(Device)>> bad = {
      [](Device d) {
        const Tensor a = Tensor::zeros({4, 8}, DType::F32, d), b = Tensor::zeros({6, 3}, DType::F32, d);
        Tensor c = Tensor::zeros({4, 3}, DType::F32, d);
        ops::gemm(a, false, b, false, c);
      },
      [](Device d) {
        Tensor x = Tensor::zeros({4, 8}, DType::BF16, d), y = Tensor::zeros({4, 8}, DType::F32, d);
        ops::gelu_forward(x, y);
      },
      [](Device d) {
        const Tensor x = Tensor::zeros({2, 8}, DType::I32, d);
        Tensor y = Tensor::zeros({2, 8}, DType::I32, d);
        ops::add(x, x, y);
      },
      [](Device d) {
        Tensor a = Tensor::zeros({4, 8}, DType::F32, d);
        const Tensor strided = Tensor::zeros({4, 16}, DType::F32, d).narrow(1, 0, 8);
        ops::add_(a, strided);
      },
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    const std::string cpu = message(Device::cpu(), bad[i]), meta = message(Device::meta(), bad[i]);
    EXPECT_FALSE(cpu.empty()) << i;
    EXPECT_EQ(cpu, meta) << i;
  }
  // Meta and CPU tensors in one op: the usual device error.
  const Tensor x = Tensor::zeros({2, 4}, DType::F32, Device::meta());
  Tensor y = Tensor::zeros({2, 4}, DType::F32);
  EXPECT_NE(error_of([&] { ops::gelu_forward(x, y); }).find("is on cpu but x is on meta"), std::string::npos);
}

TEST(Meta, OpsRecordTheirEvents) {
  const Tensor a = Tensor::zeros({16, 32}, DType::BF16, Device::meta());
  const Tensor b = Tensor::zeros({32, 8}, DType::BF16, Device::meta());
  Tensor c = Tensor::empty({16, 8}, DType::F32, Device::meta());
  MetaOpRecorder outer;
  {
    MetaOpRecorder rec;
    ops::gemm(a, false, b, false, c);
    ops::scale_(c, 2.0f);
    ASSERT_EQ(rec.events().size(), 2u);
    const OpEvent& g = rec.events()[0];
    EXPECT_EQ(g.op, "gemm");
    EXPECT_EQ(g.flops, 2.0 * 16 * 8 * 32);
    EXPECT_EQ(g.bytes_read, (16 * 32 + 32 * 8) * 2);
    EXPECT_EQ(g.bytes_written, 16 * 8 * 4);
    EXPECT_EQ(g.shapes, (std::vector<Shape>{{16, 32}, {32, 8}, {16, 8}}));
    EXPECT_EQ(g.dtypes, (std::vector<DType>{DType::BF16, DType::BF16, DType::F32}));
    const OpEvent& s = rec.events()[1];
    EXPECT_EQ(s.op, "scale_");
    EXPECT_EQ(s.bytes_read, 16 * 8 * 4);
    EXPECT_EQ(s.bytes_written, 16 * 8 * 4);
    EXPECT_EQ(rec.total_flops(), 2.0 * 16 * 8 * 32 + 16 * 8);
  }
  c.zero_();  // after the inner scope: the outer recorder's
  ASSERT_EQ(outer.events().size(), 1u);
  EXPECT_EQ(outer.events()[0].op, "fill_");
}

TEST(MetaCommunicator, RecordsWhatARecordedRealCommunicatorWould) {
  auto log = std::make_shared<CommLog>();
  MetaCommunicator world(5, 8, log);  // rank 5 of 8; no other process
  EXPECT_EQ(world.rank(), 5);
  EXPECT_EQ(world.size(), 8);
  EXPECT_EQ(world.backend(), "meta");
  // Groups from member lists (ParallelState's split_group); ranks outside get none.
  auto tp = world.split_group({4, 5, 6, 7});
  ASSERT_NE(tp, nullptr);
  tp->set_name("tp");
  EXPECT_EQ(tp->rank(), 1);
  EXPECT_EQ(tp->world_ranks(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(world.split_group({}), nullptr);
  EXPECT_NE(error_of([&] { (void)world.split(0, 0); }).find("split_group"), std::string::npos);
  auto pp = world.split_group({1, 5});
  pp->set_name("pp");

  Tensor x = Tensor::empty({64}, DType::BF16, Device::meta());
  Tensor part = Tensor::empty({16}, DType::BF16, Device::meta());
  tp->all_reduce(x, ReduceOp::Max);
  tp->reduce_scatter(x, part, ReduceOp::Sum, true);
  tp->all_gather(part, x);
  pp->send(part, 0);
  const P2POp ops[] = {{P2POp::Kind::Send, part, 0}, {P2POp::Kind::Recv, x, 0}};
  pp->batch_p2p(ops);
  const std::vector<CommEvent>& e = log->events();
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[0].str(), "all_reduce max 128 B bf16 on tp [4, 5, 6, 7]");
  EXPECT_EQ(e[1].str(), "reduce_scatter sum 128 B bf16 on tp [4, 5, 6, 7] async");
  EXPECT_EQ(e[2].str(), "all_gather 128 B bf16 on tp [4, 5, 6, 7]");
  EXPECT_EQ(e[3].str(), "send 32 B bf16 on pp [1, 5] peers [1] async");
  EXPECT_EQ(e[4].str(), "batch_p2p send 32,recv 128 160 B bf16 on pp [1, 5] peers [1, 1] async");

  // The contract is checked: a wrong chunk, a peer outside the group.
  Tensor wrong = Tensor::empty({15}, DType::BF16, Device::meta());
  EXPECT_NE(error_of([&] { tp->reduce_scatter(x, wrong); }).find("rank 1's chunk of 64 is 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pp->send(part, 2); }).find("peer 2 outside [0, 2)"), std::string::npos);
  EXPECT_EQ(log->events().size(), 5u);  // refused calls record nothing

  // A recording decorator around a meta communicator describes the calls identically.
  auto outer_log = std::make_shared<CommLog>();
  RecordingCommunicator rec(*tp, outer_log);
  rec.all_reduce(x, ReduceOp::Max);
  ASSERT_EQ(outer_log->events().size(), 1u);
  EXPECT_EQ(outer_log->events()[0], e[0]);
}

}  // namespace
}  // namespace parallel
