// MpiCommunicator: every collective and point-to-point operation on fp32/bf16/fp16, each reduce op,
// uneven sizes, async handles, split, and argument errors.
//
// Every rank computes its inputs and the expected outputs from formulas of (rank, index), so a
// wrong element on any rank is caught without a reference rank. Checks use EXPECT_* (never an early
// return) so that every rank issues the same sequence of collectives even after a failure.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "../../src/comm/pair_reduce.hpp"
#include "mpi_test.hpp"
#include "parallel/communicator.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {

using testing::world;

const std::vector<int64_t> kSizes = {0, 1, 7, 1003};
const std::vector<DType> kFloatTypes = {DType::F32, DType::BF16, DType::F16};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};

// The value a float takes once stored in `dtype`.
float stored(DType dtype, float v) {
  switch (dtype) {
    case DType::BF16:
      return bf16_to_float(float_to_bf16(v));
    case DType::F16:
      return f16_to_float(float_to_f16(v));
    default:
      return v;
  }
}

// Integers in [-48, 48] times 1/4: exact in all three float types, varied in sign and order so
// that max and min pick different ranks at different indices.
float quarter_value(int rank, int64_t i) {
  return static_cast<float>((rank * 131 + i * 17 + 11) % 97 - 48) * 0.25f;
}

// Small signed integers whose partial sums over up to 8 ranks stay below 256 in magnitude
// (7 * (1 + ... + 8) = 252): exact in bf16 (8 significant bits), so the sum is exact whatever order
// MPI adds in.
float small_int_value(int rank, int64_t i) {
  const float sign = (i + rank) % 3 == 0 ? -1.0f : 1.0f;
  return sign * static_cast<float>((rank % 8 + 1) * (i % 7 + 1));
}

// Not representable: exercises rounding after every pairwise step.
float wavy_value(int rank, int64_t i) { return 3.0f * std::sin(0.7f * rank + 0.13f * static_cast<float>(i)); }

using ValueFn = std::function<float(int, int64_t)>;

Tensor make(int64_t n, DType dtype, int rank, const ValueFn& f, int64_t first = 0) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = f(rank, first + i);
  return Tensor::from_floats(v, {n}, dtype);
}

// What all_gather of f's chunks produces: element i comes from the rank whose chunk holds i.
std::vector<float> gathered(int64_t n, const ValueFn& f) {
  std::vector<float> v;
  for (int r = 0; r < world().size(); ++r) {
    const Chunk c = chunk_of(n, world().size(), r);
    for (int64_t j = 0; j < c.count; ++j) v.push_back(f(r, c.offset + j));
  }
  return v;
}

std::vector<float> stored_values(int64_t n, DType dtype, const std::function<float(int64_t)>& f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = stored(dtype, f(i));
  return v;
}

// Unit roundoff of the type: the largest relative error of one rounding.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return std::ldexp(1.0, -8);
    case DType::F16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -24);
  }
}

struct Expected {
  double value;
  double tolerance;
};

// The reduction of the stored inputs of every rank at global index i. A sum of p terms rounds at
// most p - 1 times, each time by at most u times a partial sum, and no partial sum exceeds the sum
// of magnitudes, so (p - 1) * u * sum|x| bounds the error whatever the order.
Expected reduce_expected(ReduceOp op, DType dtype, int p, const ValueFn& f, int64_t i) {
  double sum = 0, abs_sum = 0;
  double best = stored(dtype, f(0, i));
  for (int r = 0; r < p; ++r) {
    const double x = stored(dtype, f(r, i));
    sum += x;
    abs_sum += std::fabs(x);
    if (op == ReduceOp::Max) best = std::max(best, x);
    if (op == ReduceOp::Min) best = std::min(best, x);
  }
  if (op != ReduceOp::Sum) return {best, 0.0};
  // The final value is stored in the type too: one more rounding.
  return {sum, p * unit_roundoff(dtype) * abs_sum};
}

std::string label(DType dtype, ReduceOp op, int64_t n) {
  return fmt::format("{} {} n={} rank={}", dtype_name(dtype), reduce_op_name(op), n, world().rank());
}

void check_reduced(const Tensor& t, ReduceOp op, int64_t first, const ValueFn& f, bool exact) {
  const std::vector<float> got = t.to_float_vector();
  ASSERT_EQ(static_cast<int64_t>(got.size()), t.numel());
  int bad = 0;
  for (int64_t j = 0; j < t.numel() && bad < 5; ++j) {
    const Expected e = reduce_expected(op, t.dtype(), world().size(), f, first + j);
    const double tol = exact ? 0.0 : e.tolerance;
    if (std::fabs(got[static_cast<std::size_t>(j)] - e.value) > tol) {
      ++bad;
      ADD_FAILURE() << label(t.dtype(), op, t.numel()) << " index " << first + j << ": got "
                    << got[static_cast<std::size_t>(j)] << ", expected " << e.value << " +- " << tol;
    }
  }
}

// ---- all_reduce ----------------------------------------------------------------------------

TEST(Collectives, AllReduceExactValues) {
  auto& comm = world();
  for (DType dtype : kFloatTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : kSizes) {
        SCOPED_TRACE(label(dtype, op, n));
        const ValueFn f = op == ReduceOp::Sum ? ValueFn(small_int_value) : ValueFn(quarter_value);
        Tensor t = make(n, dtype, comm.rank(), f);
        WorkHandle w = comm.all_reduce(t, op, false);
        EXPECT_TRUE(w->is_completed());
        check_reduced(t, op, 0, f, /*exact=*/true);
      }
}

TEST(Collectives, AllReduceSumRoundsWithinBound) {
  auto& comm = world();
  for (DType dtype : kFloatTypes)
    for (int64_t n : {int64_t{7}, int64_t{1003}, int64_t{70001}}) {
      SCOPED_TRACE(label(dtype, ReduceOp::Sum, n));
      Tensor t = make(n, dtype, comm.rank(), wavy_value);
      comm.all_reduce(t, ReduceOp::Sum, false);
      check_reduced(t, ReduceOp::Sum, 0, wavy_value, /*exact=*/false);
    }
}

TEST(Collectives, AllReduceRanksAgreeBitwise) {
  // Replicated parameters must stay identical: every rank must get the very same bf16 bits.
  auto& comm = world();
  Tensor t = make(1003, DType::BF16, comm.rank(), wavy_value);
  comm.all_reduce(t, ReduceOp::Sum, false);
  Tensor first = t.clone();
  comm.broadcast(first, 0, false);
  const std::vector<float> mine = t.to_float_vector(), root = first.to_float_vector();
  EXPECT_EQ(mine, root) << "rank " << comm.rank() << " disagrees with rank 0";
}

TEST(Collectives, AllReduceIntegers) {
  auto& comm = world();
  const int p = comm.size();
  std::vector<int32_t> i32(13);
  std::vector<int64_t> i64(13);
  for (int i = 0; i < 13; ++i) {
    i32[i] = comm.rank() * 1000 + i;
    i64[i] = (int64_t{1} << 40) * (comm.rank() + 1) + i;
  }
  Tensor a = Tensor::from_vector(i32, {13});
  Tensor b = Tensor::from_vector(i64, {13});
  comm.all_reduce(a, ReduceOp::Sum, false);
  comm.all_reduce(b, ReduceOp::Max, false);
  for (int i = 0; i < 13; ++i) {
    EXPECT_EQ(a.data<int32_t>()[i], 1000 * p * (p - 1) / 2 + p * i);
    EXPECT_EQ(b.data<int64_t>()[i], (int64_t{1} << 40) * p + i);
  }
}

// ---- reduce_scatter / all_gather -----------------------------------------------------------

TEST(Collectives, ReduceScatterUnevenChunks) {
  auto& comm = world();
  for (DType dtype : kFloatTypes)
    for (ReduceOp op : kOps)
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1003}, int64_t{comm.size() * 5}}) {
        SCOPED_TRACE(label(dtype, op, n));
        const ValueFn f = op == ReduceOp::Sum ? ValueFn(small_int_value) : ValueFn(quarter_value);
        const Chunk mine = chunk_of(n, comm.size(), comm.rank());
        Tensor in = make(n, dtype, comm.rank(), f);
        Tensor out = Tensor::full({mine.count}, -7.0, dtype);
        comm.reduce_scatter(in, out, op, false);
        check_reduced(out, op, mine.offset, f, /*exact=*/true);
        // The input is read, never written.
        EXPECT_EQ(in.to_float_vector(), make(n, dtype, comm.rank(), f).to_float_vector());
      }
}

TEST(Collectives, ReduceScatterRoundedSum) {
  auto& comm = world();
  for (DType dtype : {DType::BF16, DType::F32}) {
    const int64_t n = 4099;
    const Chunk mine = chunk_of(n, comm.size(), comm.rank());
    Tensor in = make(n, dtype, comm.rank(), wavy_value);
    Tensor out = Tensor::empty({mine.count}, dtype);
    comm.reduce_scatter(in, out, ReduceOp::Sum, false);
    check_reduced(out, ReduceOp::Sum, mine.offset, wavy_value, /*exact=*/false);
  }
}

TEST(Collectives, AllGatherUnevenChunks) {
  auto& comm = world();
  // Integers below 256 in magnitude, exact in every dtype; the rank's parity is mixed in so that a
  // chunk landing in the wrong slot shows even where the index pattern repeats.
  const ValueFn owned = [](int r, int64_t i) { return static_cast<float>(2 * (i % 251 - 125) + r % 2); };
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::I32})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1003}}) {
      SCOPED_TRACE(fmt::format("{} n={} rank={}", dtype_name(dtype), n, comm.rank()));
      const Chunk mine = chunk_of(n, comm.size(), comm.rank());
      Tensor in = make(mine.count, dtype, comm.rank(), owned, mine.offset);
      Tensor out = Tensor::full({n}, -1000.0, dtype);
      comm.all_gather(in, out, false);
      EXPECT_EQ(out.to_float_vector(), gathered(n, owned));
    }
}

TEST(Collectives, AllGatherInPlaceSlot) {
  // The sharded-buffer idiom: `in` is this rank's slot of `out` itself.
  auto& comm = world();
  const int64_t n = 1003;
  const Chunk mine = chunk_of(n, comm.size(), comm.rank());
  Tensor out = Tensor::full({n}, -1.0, DType::F32);
  Tensor slot = out.narrow(0, mine.offset, mine.count);
  slot.copy_(make(mine.count, DType::F32, comm.rank(), quarter_value, mine.offset));
  comm.all_gather(slot, out, false);
  EXPECT_EQ(out.to_float_vector(), gathered(n, quarter_value));
}

// ---- broadcast / all_to_all ----------------------------------------------------------------

TEST(Collectives, BroadcastFromEveryRoot) {
  auto& comm = world();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (int64_t n : kSizes)
      for (int root = 0; root < comm.size(); ++root) {
        SCOPED_TRACE(fmt::format("{} n={} root={}", dtype_name(dtype), n, root));
        Tensor t = comm.rank() == root ? make(n, dtype, root, wavy_value) : Tensor::full({n}, 99.0, dtype);
        comm.broadcast(t, root, false);
        EXPECT_EQ(t.to_float_vector(),
                  stored_values(n, dtype, [&](int64_t i) { return wavy_value(root, i); }));
      }
}

TEST(Collectives, AllToAll) {
  auto& comm = world();
  const int p = comm.size();
  // Element e of the block that rank `src` sends to rank `dst`.
  const auto value = [](int src, int dst, int64_t e) {
    return static_cast<float>(src * 64 + dst * 4 + e % 4);
  };
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      SCOPED_TRACE(fmt::format("{} block={}", dtype_name(dtype), block));
      std::vector<float> v(static_cast<std::size_t>(p * block));
      for (int dst = 0; dst < p; ++dst)
        for (int64_t e = 0; e < block; ++e)
          v[static_cast<std::size_t>(dst * block + e)] = value(comm.rank(), dst, e);
      Tensor in = Tensor::from_floats(v, {p * block}, dtype);
      Tensor out = Tensor::full({p * block}, -1.0, dtype);
      comm.all_to_all(in, out, false);
      // Block `src` of the result is what rank `src` addressed to this rank.
      EXPECT_EQ(out.to_float_vector(), stored_values(p * block, dtype, [&](int64_t i) {
                  return value(static_cast<int>(i / block), comm.rank(), i % block);
                }));
    }
}

// ---- point to point ------------------------------------------------------------------------

TEST(PointToPoint, RingSendRecv) {
  auto& comm = world();
  const int p = comm.size(), r = comm.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor out = make(1003, dtype, r, wavy_value);
    Tensor in = Tensor::zeros({1003}, dtype);
    WorkHandle rw = comm.recv(in, prev, 5);
    WorkHandle sw = comm.send(out, next, 5);
    sw->wait();
    rw->wait();
    rw->wait();  // idempotent
    EXPECT_TRUE(rw->is_completed());
    EXPECT_EQ(in.to_float_vector(), make(1003, dtype, prev, wavy_value).to_float_vector());
  }
}

// Both neighbours at once: with blocking sends this pattern deadlocks once messages exceed the
// eager limit, so the large size matters.
TEST(PointToPoint, BatchExchangeWithBothNeighbours) {
  auto& comm = world();
  const int p = comm.size(), r = comm.rank();
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  const int64_t n = 300000;  // 1.2 MB: beyond every transport's eager limit
  Tensor to_right = make(n, DType::F32, r, quarter_value);
  Tensor to_left = make(n, DType::F32, r, wavy_value);
  Tensor from_left = Tensor::zeros({n}, DType::F32);
  Tensor from_right = Tensor::zeros({n}, DType::F32);
  // Tags tell the two directions apart when left == right (two ranks).
  const std::vector<P2POp> ops = {
      {P2POp::Kind::Send, to_right, right, 1},
      {P2POp::Kind::Send, to_left, left, 2},
      {P2POp::Kind::Recv, from_left, left, 1},
      {P2POp::Kind::Recv, from_right, right, 2},
  };
  comm.batch_p2p(ops)->wait();
  EXPECT_EQ(from_left.to_float_vector(), make(n, DType::F32, left, quarter_value).to_float_vector());
  EXPECT_EQ(from_right.to_float_vector(), make(n, DType::F32, right, wavy_value).to_float_vector());
  EXPECT_TRUE(comm.batch_p2p({})->is_completed());
}

// ---- async handles -------------------------------------------------------------------------

TEST(Async, OverlappingCollectivesAndRing) {
  auto& comm = world();
  const int p = comm.size(), r = comm.rank();
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  Tensor a = make(1003, DType::F32, r, small_int_value);
  Tensor b = make(4099, DType::BF16, r, small_int_value);
  Tensor c = make(7, DType::F32, r, quarter_value);
  Tensor ring_out = make(513, DType::F32, r, wavy_value);
  Tensor ring_in = Tensor::zeros({513}, DType::F32);

  std::vector<WorkHandle> works;
  works.push_back(comm.all_reduce(a, ReduceOp::Sum, true));
  works.push_back(comm.all_reduce(b, ReduceOp::Sum, true));
  works.push_back(comm.all_reduce(c, ReduceOp::Max, true));
  const std::vector<P2POp> ring = {{P2POp::Kind::Send, ring_out, right, 3},
                                   {P2POp::Kind::Recv, ring_in, left, 3}};
  works.push_back(comm.batch_p2p(ring));

  // Work unrelated to the buffers while the operations run.
  double busy = 0;
  for (int i = 0; i < 200000; ++i) busy += std::sqrt(static_cast<double>(i));
  EXPECT_GT(busy, 0);

  // Polling must drive progress by itself and eventually report completion.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool all_done = false;
  while (!all_done && std::chrono::steady_clock::now() < deadline) {
    all_done = true;
    for (auto& w : works) all_done = w->is_completed() && all_done;
    if (!all_done) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_TRUE(all_done);
  for (auto& w : works) w->wait();
  for (auto& w : works) EXPECT_TRUE(w->is_completed());

  check_reduced(a, ReduceOp::Sum, 0, small_int_value, true);
  check_reduced(b, ReduceOp::Sum, 0, small_int_value, true);
  check_reduced(c, ReduceOp::Max, 0, quarter_value, true);
  EXPECT_EQ(ring_in.to_float_vector(), make(513, DType::F32, left, wavy_value).to_float_vector());
}

TEST(Async, HandleKeepsBuffersAlive) {
  // The caller may drop its tensors right after posting; the handle owns a reference.
  auto& comm = world();
  const int64_t n = 1003;
  const Chunk mine = chunk_of(n, comm.size(), comm.rank());
  Tensor out = Tensor::empty({n}, DType::F32);
  WorkHandle w;
  {
    Tensor in = make(mine.count, DType::F32, comm.rank(), quarter_value, mine.offset);
    w = comm.all_gather(in, out, true);
  }
  w->wait();
  EXPECT_EQ(out.to_float_vector(), gathered(n, quarter_value));
}

TEST(Async, AsyncReduceScatterAndBroadcast) {
  auto& comm = world();
  const int64_t n = 2 * comm.size() + 1;
  const Chunk mine = chunk_of(n, comm.size(), comm.rank());
  Tensor in = make(n, DType::BF16, comm.rank(), quarter_value);
  Tensor out = Tensor::empty({mine.count}, DType::BF16);
  Tensor b =
      comm.rank() == comm.size() - 1 ? make(9, DType::F16, 0, quarter_value) : Tensor::zeros({9}, DType::F16);
  WorkHandle w1 = comm.reduce_scatter(in, out, ReduceOp::Min, true);
  WorkHandle w2 = comm.broadcast(b, comm.size() - 1, true);
  w2->wait();
  w1->wait();
  check_reduced(out, ReduceOp::Min, mine.offset, quarter_value, true);
  EXPECT_EQ(b.to_float_vector(), make(9, DType::F16, 0, quarter_value).to_float_vector());
}

// ---- split ---------------------------------------------------------------------------------

TEST(Split, ByParity) {
  auto& comm = world();
  const int p = comm.size(), r = comm.rank();
  const int color = r % 2;
  std::unique_ptr<Communicator> sub = comm.split(color, r);
  ASSERT_NE(sub, nullptr);
  const int expected_size = color == 0 ? (p + 1) / 2 : p / 2;
  EXPECT_EQ(sub->size(), expected_size);
  EXPECT_EQ(sub->rank(), r / 2);
  EXPECT_EQ(sub->backend(), "mpi");
  // The sum of world ranks with my parity proves the group really is that set of ranks.
  Tensor t = Tensor::from_vector(std::vector<int64_t>{r}, {1});
  sub->all_reduce(t, ReduceOp::Sum, false);
  int64_t want = 0;
  for (int q = color; q < p; q += 2) want += q;
  EXPECT_EQ(t.data<int64_t>()[0], want);
}

TEST(Split, KeyReversesOrderAndNegativeColorOptsOut) {
  auto& comm = world();
  const int p = comm.size(), r = comm.rank();
  std::unique_ptr<Communicator> reversed = comm.split(0, p - r);
  ASSERT_NE(reversed, nullptr);
  EXPECT_EQ(reversed->rank(), p - 1 - r);
  EXPECT_EQ(reversed->size(), p);

  std::unique_ptr<Communicator> rest = comm.split(r == 0 ? -1 : 7, r);
  if (r == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_NE(rest, nullptr);
    EXPECT_EQ(rest->size(), p - 1);
    EXPECT_EQ(rest->rank(), r - 1);
    rest->barrier();
  }
}

// ---- argument errors: thrown on the calling rank before any communication -------------------

TEST(Errors, BadArgumentsThrowWithoutCommunicating) {
  auto& comm = world();
  const int p = comm.size();
  const Chunk mine = chunk_of(10, p, comm.rank());
  Tensor in = Tensor::zeros({10}, DType::F32);
  Tensor wrong_out = Tensor::zeros({mine.count + 1}, DType::F32);
  EXPECT_THROW(comm.reduce_scatter(in, wrong_out, ReduceOp::Sum, false), Error);
  Tensor bf_out = Tensor::zeros({mine.count}, DType::BF16);
  EXPECT_THROW(comm.reduce_scatter(in, bf_out, ReduceOp::Sum, false), Error);
  Tensor gather_in = Tensor::zeros({mine.count + 1}, DType::F32);
  EXPECT_THROW(comm.all_gather(gather_in, in, false), Error);

  Tensor matrix = Tensor::zeros({4, 6}, DType::F32);
  Tensor strided = matrix.narrow(1, 0, 3);
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_THROW(comm.all_reduce(strided, ReduceOp::Sum, false), Error);
  EXPECT_THROW(comm.broadcast(strided, 0, false), Error);
  EXPECT_THROW(comm.send(strided, 0, 0), Error);

  Tensor ok = Tensor::zeros({4}, DType::F32);
  EXPECT_THROW(comm.send(ok, p, 0), Error);
  EXPECT_THROW(comm.recv(ok, -1, 0), Error);
  EXPECT_THROW(comm.broadcast(ok, p, false), Error);
  EXPECT_THROW(comm.send(ok, 0, -3), Error);
  // One bad op in a batch rejects the whole batch before anything is posted.
  const std::vector<P2POp> batch = {{P2POp::Kind::Send, ok, (comm.rank() + 1) % p, 0},
                                    {P2POp::Kind::Recv, ok, p + 3, 0}};
  EXPECT_THROW(comm.batch_p2p(batch), Error);

  Tensor odd = Tensor::zeros({p * 2 + 1}, DType::F32);
  EXPECT_THROW(comm.all_to_all(odd, odd, false), Error);
  Tensor fp8 = Tensor::zeros({4}, DType::F8E4M3);
  EXPECT_THROW(comm.all_reduce(fp8, ReduceOp::Sum, false), Error);

  try {
    comm.reduce_scatter(in, wrong_out, ReduceOp::Sum, false);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out has"), std::string::npos) << e.what();
  }

  // No rank sent anything above, so the communicator is still in step: a real collective works
  // and the unmatched batch send (never posted) cannot be received by anyone.
  Tensor t = Tensor::full({3}, 1.0, DType::F32);
  comm.all_reduce(t, ReduceOp::Sum, false);
  EXPECT_EQ(t.to_float_vector(), std::vector<float>(3, static_cast<float>(p)));
  int pending = 0;
  MPI_Status status;
  comm.barrier();
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm.handle(), &pending, &status);
  EXPECT_EQ(pending, 0) << "a rejected call left a message behind";
}

TEST(Chunks, ArraySplitLayout) {
  // numpy.array_split(range(10), 4) -> sizes 3 3 2 2.
  const int64_t counts[] = {3, 3, 2, 2}, offsets[] = {0, 3, 6, 8};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(chunk_of(10, 4, i).count, counts[i]);
    EXPECT_EQ(chunk_of(10, 4, i).offset, offsets[i]);
  }
  EXPECT_EQ(chunk_of(2, 4, 3).count, 0);
  EXPECT_EQ(chunk_of(2, 4, 3).offset, 2);
  EXPECT_THROW(chunk_of(5, 0, 0), Error);
  EXPECT_THROW(chunk_of(5, 2, 2), Error);
  EXPECT_EQ(reduce_op_name(ReduceOp::Max), "max");
  EXPECT_TRUE(completed_work()->is_completed());
}

// The watchdog's deadline (communicator.hpp): a wait that ends within it is untouched, and its time
// is counted in comm_wait_seconds(). Expiry ends the job, so tests/scripts/watchdog.sh covers it.
TEST(Collectives, WaitsWithinTheDeadlineCompleteAndAreCounted) {
  auto& world = testing::world();
  EXPECT_THROW(set_comm_timeout(0), Error);
  EXPECT_THROW(set_comm_timeout(-1), Error);
  EXPECT_EQ(world.name(), "world");
  std::vector<int> all(static_cast<std::size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) all[static_cast<std::size_t>(r)] = r;
  EXPECT_EQ(world.world_ranks(), all);

  const double before = comm_timeout();
  set_comm_timeout(5.0);
  const double waited = comm_wait_seconds();
  // Rank 0 arrives 200 ms late: the others wait in the all-reduce, well within 5 s.
  if (world.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Tensor t = Tensor::full({4}, 1.0, DType::F32);
  world.all_reduce(t, ReduceOp::Sum, false);
  EXPECT_EQ(t.to_float_vector()[0], static_cast<float>(world.size()));
  if (world.rank() != 0) EXPECT_GE(comm_wait_seconds() - waited, 0.1);
  world.barrier();
  set_comm_timeout(before);
  EXPECT_EQ(comm_timeout(), before);
}

// ---- two-rank sums (mpi_communicator.hpp: point to point through a kept buffer) ---------------

// Pairs of world ranks (0-1, 2-3, ...), so every rank count runs the two-rank path.
std::unique_ptr<Communicator> pair_of_ranks() {
  auto& world = testing::world();
  return world.split(world.size() % 2 == 0 || world.rank() + 1 < world.size() ? world.rank() / 2 : -1,
                     world.rank());
}

// Rounding everywhere, and now and then the values that stress a reduction: infinities of both
// signs (inf - inf is NaN), NaN, subnormals of each format, signed zeros, sums on a rounding tie.
float pair_value(int rank, int64_t i) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            -3e-6f,
                            -0.0f,
                            0.0f,
                            1.0f + std::ldexp(1.0f, -8),
                            std::ldexp(1.0f, -9)};
  const int64_t k = (i * 7 + rank * 3) % 101;
  if (k < 9) return specials[k];
  return wavy_value(rank, i);
}

// What the sum of the two ranks' inputs is, bit for bit: the scalar definition, rank 0's operand
// first (MPI's in-place binomial all-reduce adds rank 0's data into rank 1's at the root).
std::vector<std::byte> pair_sum(const Tensor& x0, const Tensor& x1) {
  std::vector<std::byte> out(x0.nbytes());
  detail::pair_reduce_reference(x0.dtype(), ReduceOp::Sum, x0.data_ptr(), x1.data_ptr(), out.data(),
                                x0.numel());
  return out;
}

int64_t first_difference(const void* got, const std::vector<std::byte>& want, std::size_t es) {
  const auto* g = static_cast<const std::byte*>(got);
  for (std::size_t i = 0; i < want.size(); i += es)
    if (std::memcmp(g + i, want.data() + i, es) != 0) return static_cast<int64_t>(i / es);
  return -1;
}

TEST(TwoRankSums, AllReduceIsBitwiseTheScalarSumInEveryPieceLayout) {
  auto pair = pair_of_ranks();
  if (pair == nullptr) GTEST_SKIP() << "odd rank out";
  auto& comm = dynamic_cast<MpiCommunicator&>(*pair);
  ASSERT_EQ(comm.size(), 2);
  // One piece; several with a short tail; odd pieces (halves of unequal length: 65537 fp32
  // elements, 131075 16-bit ones). Every tensor is above the 1 MiB the two-rank path starts at.
  const std::pair<int64_t, int64_t> layouts[] = {
      {MpiCommunicator::kDefaultReducePieceBytes, 600011}, {262148, 600011}, {262150, 600011}};
  for (DType dtype : kFloatTypes)
    for (auto [piece, n] : layouts) {
      comm.set_reduce_piece_bytes(piece);
      const Tensor x0 = make(n, dtype, 0, pair_value), x1 = make(n, dtype, 1, pair_value);
      Tensor t = (comm.rank() == 0 ? x0 : x1).clone();
      comm.all_reduce(t, ReduceOp::Sum, false);
      EXPECT_EQ(first_difference(t.data_ptr(), pair_sum(x0, x1), dtype_size(dtype)), -1)
          << dtype_name(dtype) << " n=" << n << " piece=" << piece << " rank " << comm.rank();
    }
  comm.set_reduce_piece_bytes(MpiCommunicator::kDefaultReducePieceBytes);
  EXPECT_THROW(comm.set_reduce_piece_bytes(8), Error);
}

TEST(TwoRankSums, Fp32AllReduceEqualsMpisOwnInPlaceAllReduce) {
  // The result MPI_Iallreduce in place gives, as the all-reduce did before it went point to point.
  auto pair = pair_of_ranks();
  if (pair == nullptr) GTEST_SKIP() << "odd rank out";
  auto& comm = dynamic_cast<MpiCommunicator&>(*pair);
  const int64_t n = 300007;
  Tensor ours = make(n, DType::F32, comm.rank(), pair_value);
  Tensor theirs = ours.clone();
  comm.all_reduce(ours, ReduceOp::Sum, false);
  MPI_Request request;
  ASSERT_EQ(MPI_Iallreduce(MPI_IN_PLACE, theirs.data_ptr(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                           comm.handle(), &request),
            MPI_SUCCESS);
  ASSERT_EQ(MPI_Wait(&request, MPI_STATUS_IGNORE), MPI_SUCCESS);
  // Bitwise, but for which NaN payload survives where both ranks hold a NaN (never here: the
  // inputs put NaN on one rank at a time).
  EXPECT_EQ(std::memcmp(ours.data_ptr(), theirs.data_ptr(), ours.nbytes()), 0);
}

TEST(TwoRankSums, ReduceScatterIsBitwiseTheScalarSum) {
  auto pair = pair_of_ranks();
  if (pair == nullptr) GTEST_SKIP() << "odd rank out";
  for (DType dtype : kFloatTypes)
    for (int64_t n : {int64_t{600011}, int64_t{524288}}) {
      const Tensor x0 = make(n, dtype, 0, pair_value), x1 = make(n, dtype, 1, pair_value);
      const Chunk mine = chunk_of(n, 2, pair->rank());
      Tensor out = Tensor::empty({mine.count}, dtype);
      pair->reduce_scatter(pair->rank() == 0 ? x0 : x1, out, ReduceOp::Sum, false);
      const Tensor a = x0.narrow(0, mine.offset, mine.count).contiguous();
      const Tensor b = x1.narrow(0, mine.offset, mine.count).contiguous();
      EXPECT_EQ(first_difference(out.data_ptr(), pair_sum(a, b), dtype_size(dtype)), -1)
          << dtype_name(dtype) << " n=" << n << " rank " << pair->rank();
    }
}

TEST(TwoRankSums, AsyncOperationsCompleteWhicheverIsWaitedFirst) {
  // The ranks wait for three pending operations in different orders; each still completes, in
  // call order underneath, and its buffers stay alive through the handle.
  auto pair = pair_of_ranks();
  if (pair == nullptr) GTEST_SKIP() << "odd rank out";
  const int r = pair->rank();
  const int64_t n = 600011;
  const Tensor x0 = make(n, DType::BF16, 0, pair_value), x1 = make(n, DType::BF16, 1, pair_value);
  Tensor a = (r == 0 ? x0 : x1).clone();
  Tensor b = make(n, DType::F32, r, quarter_value);
  const Chunk mine = chunk_of(n, 2, r);
  Tensor b_out = Tensor::empty({mine.count}, DType::F32);
  Tensor c = (r == 0 ? x0 : x1).clone();
  std::vector<WorkHandle> works;
  works.push_back(pair->all_reduce(a, ReduceOp::Sum, true));
  works.push_back(pair->reduce_scatter(b, b_out, ReduceOp::Sum, true));
  works.push_back(pair->all_reduce(c, ReduceOp::Sum, true));
  b = Tensor();  // the handle keeps `in` alive
  if (r == 0) {
    works[2]->wait();
    works[0]->wait();
    works[1]->wait();
  } else {
    while (!works[1]->is_completed()) {
    }
    works[0]->wait();
    works[2]->wait();
  }
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  const auto want = pair_sum(x0, x1);
  EXPECT_EQ(first_difference(a.data_ptr(), want, 2), -1);
  EXPECT_EQ(first_difference(c.data_ptr(), want, 2), -1);
  const std::vector<float> got = b_out.to_float_vector();
  for (int64_t j = 0; j < mine.count; ++j)
    ASSERT_EQ(got[static_cast<std::size_t>(j)],
              quarter_value(0, mine.offset + j) + quarter_value(1, mine.offset + j));
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(TwoRankSums, LargeSumsPageFaultOnlyOnTheFirstCall) {
  // A count, not a time: 48 MiB fp32 and 32 MiB bf16 all-reduces and a 48 MiB reduce-scatter,
  // after one call each, touch no new page (MPI's in-place all-reduce faulted in a fresh temporary
  // of the whole message at every call: 12,288 pages for the fp32 one).
  auto pair = pair_of_ranks();
  if (pair == nullptr) GTEST_SKIP() << "odd rank out";
  if (testing::world().size() > 2) GTEST_SKIP() << "one pair is enough (and memory is shared)";
  const int64_t n = int64_t{12} << 20;
  Tensor f = Tensor::full({n}, 0.5, DType::F32);
  Tensor h = Tensor::full({n}, 0.5, DType::BF16);
  Tensor out = Tensor::empty({chunk_of(n, 2, pair->rank()).count}, DType::F32);
  auto round = [&] {
    pair->all_reduce(f, ReduceOp::Sum, false);
    pair->all_reduce(h, ReduceOp::Sum, false);
    pair->reduce_scatter(f, out, ReduceOp::Sum, false);
  };
  round();
  const long before = minor_faults();
  for (int i = 0; i < 3; ++i) round();
  const long faults = minor_faults() - before;
  EXPECT_LT(faults, 64) << "rank " << pair->rank();
  EXPECT_EQ(out.to_float_vector()[0], 16.0f);  // 0.5 doubled four times, then summed once more
}

// ---- sums of three ranks or more (mpi_communicator.hpp: a ring over kept buffers) -------------

namespace ring {

// The world's ranks as a group of their own (so that piece sizes can change without touching the
// world) and, from 4 ranks on, the first three ranks and the rest (5 at 8 ranks): odd sizes beside
// powers of two. Groups of fewer than three are left out; every member lists its groups in the
// same order.
std::vector<std::unique_ptr<Communicator>> groups() {
  auto& w = world();
  std::vector<std::unique_ptr<Communicator>> out;
  if (w.size() >= 3) out.push_back(w.split(0, w.rank()));
  if (w.size() >= 4) {
    auto g = w.split(w.rank() < 3 ? 0 : 1, w.rank());
    if (g->size() >= 3) out.push_back(std::move(g));
  }
  return out;
}

std::vector<Tensor> inputs(int p, int64_t n, DType dtype, const ValueFn& f) {
  std::vector<Tensor> x;
  for (int r = 0; r < p; ++r) x.push_back(make(n, dtype, r, f));
  return x;
}

// The sum ring_reduce.hpp states, bit for bit: rank c's chunk is
// ((x[c+1] + x[c+2]) + ...) + x[c] (ranks mod p), each + the scalar pair_reduce_reference.
std::vector<std::byte> ordered_sum(const std::vector<Tensor>& x) {
  const int p = static_cast<int>(x.size());
  const int64_t n = x[0].numel();
  const DType dt = x[0].dtype();
  const std::size_t es = dtype_size(dt);
  std::vector<std::byte> out(x[0].nbytes());
  for (int c = 0; c < p; ++c) {
    const Chunk chunk = chunk_of(n, p, c);
    std::byte* partial = out.data() + chunk.offset * es;
    auto part = [&](int r) {
      return static_cast<const std::byte*>(x[(c + r) % p].data_ptr()) + chunk.offset * es;
    };
    std::memcpy(partial, part(1), chunk.count * es);
    for (int r = 2; r <= p; ++r)
      detail::pair_reduce_reference(dt, ReduceOp::Sum, partial, part(r), partial, chunk.count);
  }
  return out;
}

// Rank 0's bytes, as every rank of `g` sees them.
bool same_on_every_rank(Communicator& g, const Tensor& t) {
  Tensor root = t.clone();
  g.broadcast(root, 0, false);
  Tensor same =
      Tensor::full({1}, std::memcmp(root.data_ptr(), t.data_ptr(), t.nbytes()) == 0 ? 1 : 0, DType::I32);
  g.all_reduce(same, ReduceOp::Min, false);
  return same.data<int32_t>()[0] == 1;
}

}  // namespace ring

TEST(RingSums, AllReduceIsBitwiseTheStatedOrderOnEveryRank) {
  auto groups = ring::groups();
  if (groups.empty()) GTEST_SKIP() << "no group of three ranks or more";
  // One piece per chunk; several with a short tail (piece 262150 bytes: 16,387 fp32 elements per
  // rank and step). n is odd, so the chunks differ in length. Every message is above the 1 MiB
  // the ring starts at, and pair_value puts infinities, NaN and subnormals among rounded values.
  for (auto& g : groups) {
    auto& comm = dynamic_cast<MpiCommunicator&>(*g);
    for (int64_t piece : {MpiCommunicator::kDefaultReducePieceBytes, int64_t{262150}})
      for (DType dtype : kFloatTypes)
        for (int64_t n : {int64_t{600011}, int64_t{1048583}}) {
          comm.set_reduce_piece_bytes(piece);
          const auto x = ring::inputs(comm.size(), n, dtype, pair_value);
          Tensor t = x[static_cast<std::size_t>(comm.rank())].clone();
          comm.all_reduce(t, ReduceOp::Sum, false);
          EXPECT_EQ(first_difference(t.data_ptr(), ring::ordered_sum(x), dtype_size(dtype)), -1)
              << dtype_name(dtype) << " n=" << n << " piece=" << piece << " group of " << comm.size()
              << " rank " << comm.rank();
          EXPECT_TRUE(ring::same_on_every_rank(comm, t));
        }
    comm.set_reduce_piece_bytes(MpiCommunicator::kDefaultReducePieceBytes);
  }
}

TEST(RingSums, Fp32AllReduceMatchesAnFp64Sum) {
  // Against MPI_Allreduce of the same data in fp64: a sum of p fp32 terms rounds p - 1 times, each
  // time by at most 2^-24 of a partial sum (and once more to store), so p * 2^-24 * sum |x| bounds
  // the difference.
  for (auto& g : ring::groups()) {
    auto& comm = dynamic_cast<MpiCommunicator&>(*g);
    const int64_t n = 300007;
    Tensor t = make(n, DType::F32, comm.rank(), wavy_value);
    std::vector<double> sum(static_cast<std::size_t>(n)), abs_sum(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      sum[static_cast<std::size_t>(i)] = t.data<float>()[i];
      abs_sum[static_cast<std::size_t>(i)] = std::fabs(t.data<float>()[i]);
    }
    ASSERT_EQ(
        MPI_Allreduce(MPI_IN_PLACE, sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm.handle()),
        MPI_SUCCESS);
    ASSERT_EQ(
        MPI_Allreduce(MPI_IN_PLACE, abs_sum.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm.handle()),
        MPI_SUCCESS);
    comm.all_reduce(t, ReduceOp::Sum, false);
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      const double tol = comm.size() * std::ldexp(1.0, -24) * abs_sum[static_cast<std::size_t>(i)];
      if (std::fabs(t.data<float>()[i] - sum[static_cast<std::size_t>(i)]) > tol) {
        ++bad;
        ADD_FAILURE() << "index " << i << ": " << t.data<float>()[i] << " against "
                      << sum[static_cast<std::size_t>(i)] << " +- " << tol << " (group of " << comm.size()
                      << ")";
      }
    }
  }
}

TEST(RingSums, ReduceScatterIsBitwiseTheStatedOrderIncludingInPlace) {
  // Out of place, into this rank's own chunk of `in` (the ring writes it last, no copy), and into
  // a tensor overlapping another rank's chunk (the communicator sends from a copy then).
  for (auto& g : ring::groups()) {
    const int p = g->size(), r = g->rank();
    for (DType dtype : kFloatTypes)
      for (int64_t n : {int64_t{600011}, int64_t{1048576}}) {
        const auto x = ring::inputs(p, n, dtype, pair_value);
        const auto want = ring::ordered_sum(x);
        const Chunk mine = chunk_of(n, p, r);
        const std::size_t es = dtype_size(dtype);
        const std::vector<std::byte> want_mine(want.begin() + mine.offset * es,
                                               want.begin() + (mine.offset + mine.count) * es);
        const std::string what = fmt::format("{} n={} group of {} rank {}", dtype_name(dtype), n, p, r);

        Tensor out = Tensor::empty({mine.count}, dtype);
        g->reduce_scatter(x[static_cast<std::size_t>(r)], out, ReduceOp::Sum, false);
        EXPECT_EQ(first_difference(out.data_ptr(), want_mine, es), -1) << what << " out of place";

        Tensor in = x[static_cast<std::size_t>(r)].clone();
        Tensor slot = in.narrow(0, mine.offset, mine.count);
        g->reduce_scatter(in, slot, ReduceOp::Sum, false);
        EXPECT_EQ(first_difference(slot.data_ptr(), want_mine, es), -1) << what << " into its own slot";

        Tensor in2 = x[static_cast<std::size_t>(r)].clone();
        Tensor front = in2.narrow(0, 0, mine.count);
        g->reduce_scatter(in2, front, ReduceOp::Sum, false);
        EXPECT_EQ(first_difference(front.data_ptr(), want_mine, es), -1) << what << " over the front";
      }
  }
}

TEST(RingSums, AsyncOperationsCompleteWhicheverIsWaitedFirst) {
  for (auto& g : ring::groups()) {
    const int p = g->size(), r = g->rank();
    const int64_t n = 600011;
    const auto x = ring::inputs(p, n, DType::BF16, pair_value);
    const auto want = ring::ordered_sum(x);
    Tensor a = x[static_cast<std::size_t>(r)].clone();
    Tensor b = make(n, DType::F32, r, quarter_value);
    const Chunk mine = chunk_of(n, p, r);
    Tensor b_out = Tensor::empty({mine.count}, DType::F32);
    Tensor c = x[static_cast<std::size_t>(r)].clone();
    std::vector<WorkHandle> works;
    works.push_back(g->all_reduce(a, ReduceOp::Sum, true));
    works.push_back(g->reduce_scatter(b, b_out, ReduceOp::Sum, true));
    works.push_back(g->all_reduce(c, ReduceOp::Sum, true));
    b = Tensor();  // the handle keeps `in` alive
    if (r % 3 == 0) {
      works[2]->wait();
      works[0]->wait();
      works[1]->wait();
    } else if (r % 3 == 1) {
      while (!works[1]->is_completed()) {
      }
      works[0]->wait();
      works[2]->wait();
    } else {
      for (auto& w : works) w->wait();
    }
    for (auto& w : works) EXPECT_TRUE(w->is_completed());
    EXPECT_EQ(first_difference(a.data_ptr(), want, 2), -1);
    EXPECT_EQ(first_difference(c.data_ptr(), want, 2), -1);
    const std::vector<float> got = b_out.to_float_vector();
    for (int64_t j = 0; j < mine.count; ++j) {
      float sum = 0;  // quarter values: every order gives the exact sum
      for (int q = 0; q < p; ++q) sum += quarter_value(q, mine.offset + j);
      ASSERT_EQ(got[static_cast<std::size_t>(j)], sum);
    }
  }
}

TEST(RingSums, LargeSumsPageFaultOnlyOnTheFirstCall) {
  // A count, not a time, as for two ranks: 48 MiB fp32 and 32 MiB bf16 all-reduces and a 48 MiB
  // reduce-scatter touch no new page after one call each (MPI's libnbc mallocs a temporary of the
  // whole message per call, mapped afresh above glibc's mmap threshold).
  if (world().size() < 3) GTEST_SKIP() << "a ring needs three ranks";
  auto& w = world();
  const int64_t n = int64_t{12} << 20;
  // 2^-40 times powers of the group size: every partial sum is exact in fp32 and bf16.
  const double tiny = std::ldexp(1.0, -40);
  Tensor f = Tensor::full({n}, tiny, DType::F32);
  Tensor h = Tensor::full({n}, tiny, DType::BF16);
  Tensor out = Tensor::empty({chunk_of(n, w.size(), w.rank()).count}, DType::F32);
  auto round = [&] {
    w.all_reduce(f, ReduceOp::Sum, false);
    w.all_reduce(h, ReduceOp::Sum, false);
    w.reduce_scatter(f, out, ReduceOp::Sum, false);
  };
  round();
  const long before = minor_faults();
  for (int i = 0; i < 3; ++i) round();
  const long faults = minor_faults() - before;
  EXPECT_LT(faults, 64) << "rank " << w.rank();
  const double p = w.size();
  EXPECT_EQ(out.to_float_vector()[0],
            static_cast<float>(tiny * p * p * p * p * p));  // f: p^4, then once more
  EXPECT_EQ(h.to_float_vector()[0], static_cast<float>(tiny * p * p * p * p));
}

}  // namespace
}  // namespace parallel
