// The CUDA device layer: the caching allocator, host <-> device copies, dtype conversion and fill.
// Conversions are checked bit for bit against the CPU reference in dtype.hpp, exhaustively for the
// 16-bit sources. Every test skips on a machine without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "../../src/cuda/cuda_caching_allocator.hpp"
#include "gpu.hpp"
#include "parallel/allocator.hpp"
#include "parallel/device.hpp"
#include "parallel/dtype.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

constexpr std::size_t kMiB = 1 << 20;
using cuda::CudaCachingAllocator;

Stream stream_of(cudaStream_t s) { return Stream{static_cast<void*>(s)}; }

// Owns a non-blocking stream for one test.
struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~TestStream() { cudaStreamDestroy(s); }
  Stream get() const { return stream_of(s); }
};

// ---- device discovery ------------------------------------------------------------------------

TEST(CudaDevice, CountNeverThrows) {
  int n = -1;
  EXPECT_NO_THROW(n = cuda_device_count());
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  REQUIRE_GPU();
  int runtime_count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&runtime_count), cudaSuccess);
  EXPECT_EQ(n, runtime_count);
}

TEST(CudaDevice, NoGpuGivesClearErrors) {
  // Passes (not skips) with a GPU: on a GPU machine every skip counts as a failure.
  if (cuda_device_count() > 0) return;  // the no-GPU error path is not reachable
  EXPECT_THROW(allocator_for(Device::cuda(0)), Error);
  EXPECT_THROW(Tensor::empty({4}, DType::F32, Device::cuda(0)), Error);
}

// ---- caching allocator -----------------------------------------------------------------------

TEST(CudaAllocator, ZeroBytesIsNull) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  EXPECT_EQ(a.allocate(0, {}), nullptr);
  a.deallocate(nullptr, 0, {});
  EXPECT_EQ(a.stats().num_system_allocations, 0u);
}

TEST(CudaAllocator, FreedBlockIsReusedWithoutCudaMalloc) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  void* p = a.allocate(1000, {});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.allocated, 1000u);
  EXPECT_EQ(s.num_allocations, 1u);
  EXPECT_EQ(s.num_system_allocations, 1u);
  EXPECT_EQ(s.reserved, CudaCachingAllocator::kSmallSegment);
  a.deallocate(p, 1000, {});
  EXPECT_EQ(a.stats().allocated, 0u);
  EXPECT_EQ(a.stats().reserved, CudaCachingAllocator::kSmallSegment);  // cached, not returned

  void* q = a.allocate(1000, {});
  EXPECT_EQ(q, p);
  s = a.stats();
  EXPECT_EQ(s.num_allocations, 2u);
  EXPECT_EQ(s.num_system_allocations, 1u);
  a.deallocate(q, 1000, {});
}

TEST(CudaAllocator, SmallRequestsShareOneSegment) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  std::vector<void*> ptrs;
  for (int i = 0; i < 16; ++i) ptrs.push_back(a.allocate(100'000, {}));  // 16 x 100 KB < 2 MiB
  EXPECT_EQ(a.stats().num_system_allocations, 1u);
  EXPECT_EQ(a.stats().allocated, 16u * 100'000u);
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ptrs[i]) % 512, 0u);
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(ptrs[i], ptrs[j]);
  }
  // Blocks must not overlap: write a distinct byte into each and read all back.
  for (std::size_t i = 0; i < ptrs.size(); ++i)
    ASSERT_EQ(cudaMemset(ptrs[i], static_cast<int>(i + 1), 100'000), cudaSuccess);
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    std::vector<uint8_t> host(100'000);
    ASSERT_EQ(cudaMemcpy(host.data(), ptrs[i], host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint8_t b : host) ASSERT_EQ(b, i + 1);
  }
  for (void* p : ptrs) a.deallocate(p, 100'000, {});
  // Everything merged back into one whole segment, which empty_cache returns.
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
}

TEST(CudaAllocator, LargeRequestsRoundTo2MiBAndSplit) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  void* big = a.allocate(3 * kMiB, {});
  EXPECT_EQ(a.stats().reserved, 4 * kMiB);
  a.deallocate(big, 3 * kMiB, {});

  void* p = a.allocate(8 * kMiB + 1, {});  // no cached block is large enough: a 10 MiB segment
  EXPECT_EQ(a.stats().num_system_allocations, 2u);
  EXPECT_EQ(a.stats().reserved, 14 * kMiB);
  a.deallocate(p, 8 * kMiB + 1, {});

  // Best fit: 5 MiB splits the cached 10 MiB segment, 4 MiB takes the cached 4 MiB one; freeing
  // merges the split segment back, so a 10 MiB request needs no new cudaMalloc.
  void* x = a.allocate(5 * kMiB, {});
  void* y = a.allocate(4 * kMiB, {});
  EXPECT_EQ(a.stats().num_system_allocations, 2u);
  EXPECT_NE(x, y);
  a.deallocate(x, 5 * kMiB, {});
  a.deallocate(y, 4 * kMiB, {});
  void* z = a.allocate(10 * kMiB, {});
  EXPECT_EQ(a.stats().num_system_allocations, 2u) << "freed neighbours should have merged";
  a.deallocate(z, 10 * kMiB, {});
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
}

TEST(CudaAllocator, BlocksAreCachedPerStream) {
  REQUIRE_GPU();
  TestStream s1, s2;
  CudaCachingAllocator a(0);
  void* p = a.allocate(4 * kMiB, s1.get());
  a.deallocate(p, 4 * kMiB, s1.get());
  // Another stream may still be ordered before s1's last use: it must not get s1's block.
  void* q = a.allocate(4 * kMiB, s2.get());
  EXPECT_NE(q, p);
  EXPECT_EQ(a.stats().num_system_allocations, 2u);
  void* r = a.allocate(4 * kMiB, s1.get());
  EXPECT_EQ(r, p);
  EXPECT_EQ(a.stats().num_system_allocations, 2u);
  a.deallocate(q, 4 * kMiB, s2.get());
  a.deallocate(r, 4 * kMiB, s1.get());
}

// record_stream: a block allocated on s1 and used on s2 (held back by a sleeping host callback) is
// not reused on s1 until s2's work queued before the free has completed.
TEST(CudaAllocator, RecordStreamHoldsBlockUntilOtherStreamIsDone) {
  REQUIRE_GPU();
  TestStream s1, s2;
  CudaCachingAllocator a(0);
  void* p = a.allocate(4 * kMiB, s1.get());
  a.record_stream(p, s1.get());  // its own stream: nothing to record
  a.record_stream(p, s2.get());
  ASSERT_EQ(cudaLaunchHostFunc(
                s2.s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr),
            cudaSuccess);
  a.deallocate(p, 4 * kMiB, s1.get());
  EXPECT_EQ(a.held_blocks(), 1u);
  void* q = a.allocate(4 * kMiB, s1.get());
  EXPECT_NE(q, p) << "reused while s2 may still use it";
  ASSERT_EQ(cudaStreamSynchronize(s2.s), cudaSuccess);
  void* r = a.allocate(4 * kMiB, s1.get());
  EXPECT_EQ(r, p) << "s2 is done: the block is back in s1's pool";
  EXPECT_EQ(a.held_blocks(), 0u);
  a.deallocate(q, 4 * kMiB, s1.get());
  a.deallocate(r, 4 * kMiB, s1.get());
  // A block used on its own stream only goes back at once.
  void* t = a.allocate(4 * kMiB, s1.get());
  a.deallocate(t, 4 * kMiB, s1.get());
  EXPECT_EQ(a.held_blocks(), 0u);
}

TEST(CudaAllocator, PeakAndEmptyCacheKeepLiveBlocks) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  void* keep = a.allocate(3 * kMiB, {});
  void* tmp = a.allocate(5 * kMiB, {});
  EXPECT_EQ(a.stats().peak_allocated, 8 * kMiB);
  a.deallocate(tmp, 5 * kMiB, {});
  EXPECT_EQ(a.stats().peak_allocated, 8 * kMiB);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated, 3 * kMiB);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 4 * kMiB);  // only the live block's segment remains
  ASSERT_EQ(cudaMemset(keep, 0, 3 * kMiB), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  a.deallocate(keep, 3 * kMiB, {});
}

TEST(CudaAllocator, SteadyStateDoesNoCudaMalloc) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  // A toy training step: activations of mixed sizes, freed in a different order than allocated.
  const std::vector<std::size_t> sizes = {4096,    3 * kMiB, 700'000,      64,        12 * kMiB,
                                          1 << 20, 123'457,  2 * kMiB + 1, 40 * kMiB, 513};
  auto step = [&] {
    std::vector<void*> ptrs;
    for (std::size_t s : sizes) ptrs.push_back(a.allocate(s, {}));
    for (std::size_t i = 0; i < sizes.size(); i += 2) a.deallocate(ptrs[i], sizes[i], {});
    for (std::size_t i = 1; i < sizes.size(); i += 2) a.deallocate(ptrs[i], sizes[i], {});
  };
  step();
  const auto after_warmup = a.stats().num_system_allocations;
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(a.stats().num_system_allocations, after_warmup);
  EXPECT_EQ(a.stats().allocated, 0u);
  EXPECT_EQ(a.stats().num_allocations, 11u * sizes.size());
}

TEST(CudaAllocator, OutOfMemoryThrowsWithSizes) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  void* small = a.allocate(1000, {});
  a.deallocate(small, 1000, {});  // a cached segment that the retry path releases
  const std::size_t huge = std::size_t{1} << 50;
  try {
    a.allocate(huge, {});
    FAIL() << "allocating 1 PiB succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(huge)), std::string::npos) << msg;
    EXPECT_NE(msg.find("allocated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.stats().reserved, 0u) << "the cache should have been emptied before the retry";
  // The allocator and the device stay usable.
  void* p = a.allocate(1000, {});
  EXPECT_NE(p, nullptr);
  a.deallocate(p, 1000, {});
}

TEST(CudaAllocator, FreeingForeignPointerThrows) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  int x = 0;
  EXPECT_THROW(a.deallocate(&x, sizeof x, {}), Error);
}

TEST(CudaAllocator, ThreadSafe) {
  REQUIRE_GPU();
  CudaCachingAllocator a(0);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < 2000; ++i) {
        if (live.size() < 16 && (rng() % 2 || live.empty())) {
          std::size_t bytes = 1 + rng() % (3 * kMiB);
          void* p = a.allocate(bytes, {});
          if (!p) ++failures;
          live.emplace_back(p, bytes);
        } else {
          auto [p, bytes] = live.back();
          live.pop_back();
          a.deallocate(p, bytes, {});
        }
      }
      for (auto [p, bytes] : live) a.deallocate(p, bytes, {});
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(a.stats().allocated, 0u);
}

TEST(CudaAllocator, ProcessAllocatorBacksCudaTensors) {
  REQUIRE_GPU();
  Allocator& a = allocator_for(Device::cuda(0));
  const MemoryStats before = a.stats();
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::F32, Device::cuda(0));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 256, 0u);
    EXPECT_EQ(a.stats().allocated, before.allocated + 4 * kMiB);
  }
  const auto system = a.stats().num_system_allocations;
  { Tensor t = Tensor::empty({1024, 1024}, DType::F32, Device::cuda(0)); }
  EXPECT_EQ(a.stats().num_system_allocations, system);
  EXPECT_EQ(a.stats().allocated, before.allocated);
}

// ---- copies ----------------------------------------------------------------------------------

std::vector<uint8_t> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A CPU tensor of `dtype` holding arbitrary bit patterns (NaNs included: copies must not care).
Tensor random_tensor(int64_t n, DType dtype, unsigned seed) {
  Tensor t = Tensor::empty({n}, dtype);
  const auto bytes = random_bytes(t.nbytes(), seed);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

TEST(CudaTensor, HostDeviceRoundTripEveryDtype) {
  REQUIRE_GPU();
  TestStream s;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8}) {
    for (int64_t n : {1, 7, 4097, 1 << 20}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n));
      Tensor host = random_tensor(n, t, static_cast<unsigned>(n));
      Tensor dev = host.to(Device::cuda(0));
      EXPECT_TRUE(dev.device().is_cuda());
      EXPECT_TRUE(same_bytes(dev.to(Device::cpu()), host));
      // Device to device, then back, on a side stream.
      Tensor dev2 = dev.clone();
      EXPECT_TRUE(same_bytes(dev2.to(Device::cpu(), s.get()), host));
      Tensor dev3 = host.to(Device::cuda(0), s.get());
      EXPECT_TRUE(same_bytes(dev3.to(Device::cpu(), s.get()), host));
    }
  }
}

// ---- conversions -----------------------------------------------------------------------------

// The CPU reference: decode the source to fp32 (exact), encode to the destination once.
float decode(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32:
      return t.data<float>()[i];
    case DType::BF16:
      return bf16_to_float(t.data<bf16>()[i]);
    case DType::F16:
      return f16_to_float(t.data<f16>()[i]);
    default:
      ADD_FAILURE() << "decode " << dtype_name(t.dtype());
      return 0;
  }
}

uint32_t encode_bits(float v, DType t) {
  switch (t) {
    case DType::F32:
      return std::bit_cast<uint32_t>(v);
    case DType::BF16:
      return float_to_bf16(v).bits;
    case DType::F16:
      return float_to_f16(v).bits;
    default:
      ADD_FAILURE() << "encode " << dtype_name(t);
      return 0;
  }
}

uint32_t bits_at(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::F32) return std::bit_cast<uint32_t>(t.data<float>()[i]);
  return static_cast<const uint16_t*>(t.data_ptr())[i];
}

// Every source value: all 65536 patterns of a 16-bit type; for fp32, the values that decide
// rounding (ties, overflow thresholds, subnormals, signed zeros, infinities) plus random patterns.
Tensor conversion_source(DType t) {
  if (t != DType::F32) {
    Tensor s = Tensor::empty({65536}, t);
    auto* p = static_cast<uint16_t*>(s.data_ptr());
    for (int i = 0; i < 65536; ++i) p[i] = static_cast<uint16_t>(i);
    return s;
  }
  std::vector<float> v = {0.0f,          -0.0f,       1.0f,        -1.0f,         65504.0f,      65519.99f,
                          65520.0f,      65536.0f,    1e38f,       -3.4e38f,      1e-8f,         5.96e-8f,
                          2.98e-8f,      2.99e-8f,    6.1e-5f,     1.0f / 3,      INFINITY,      -INFINITY,
                          std::nanf(""), 1.00390625f, 1.01171875f, 1.0009765625f, 1.0029296875f, 3.0e-39f};
  // bf16 ties: 1 + k * 2^-8 with odd/even k, and halfway cases for fp16 (2^-11 steps).
  for (uint32_t k = 0; k < 512; ++k) v.push_back(std::bit_cast<float>(0x3f800000u + (k << 15)));
  for (uint32_t k = 0; k < 512; ++k) v.push_back(std::bit_cast<float>(0x3f800000u + (k << 12)));
  std::mt19937 rng(42);
  while (v.size() < 200'003) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  Tensor s = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32);
  std::memcpy(s.data_ptr(), v.data(), v.size() * sizeof(float));
  return s;
}

void expect_converted(const Tensor& src, const Tensor& got, DType dst) {
  ASSERT_EQ(got.numel(), src.numel());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < src.numel(); ++i) {
    const float x = decode(src, i);
    const uint32_t want = encode_bits(x, dst);
    const uint32_t have = bits_at(got, i);
    if (std::isnan(x)) {
      // The hardware's canonical NaN differs from the reference's quieted payload; NaN must stay NaN.
      if (!std::isnan(decode(got, i))) ++mismatches;
      continue;
    }
    if (want != have && ++mismatches <= 5)
      ADD_FAILURE() << dtype_name(src.dtype()) << " -> " << dtype_name(dst) << " at " << i << ": source " << x
                    << " want 0x" << std::hex << want << " got 0x" << have;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaTensor, ConversionsMatchCpuReferenceBitExact) {
  REQUIRE_GPU();
  const DType types[] = {DType::F32, DType::BF16, DType::F16};
  for (DType from : types) {
    const Tensor src = conversion_source(from);
    const Tensor dev = src.to(Device::cuda(0));
    for (DType to : types) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      // Aligned: the vectorised path, with a tail (the sizes are not multiples of 8).
      expect_converted(src, dev.to(to).to(Device::cpu()), to);
      // Offset by one element: the unaligned, one-element-per-thread path.
      const int64_t n = src.numel() - 1;
      Tensor dst = Tensor::empty({n + 1}, to, Device::cuda(0)).narrow(0, 1, n);
      dst.copy_(dev.narrow(0, 1, n));
      expect_converted(src.narrow(0, 1, n).contiguous(), dst.to(Device::cpu()), to);
    }
  }
}

TEST(CudaTensor, ConversionOnStreamAndSmallSizes) {
  REQUIRE_GPU();
  TestStream s;
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>(i) - 0.37f;
    Tensor host = Tensor::from_vector(v, {n});
    Tensor dev = host.to(Device::cuda(0), s.get());
    Tensor half = Tensor::empty({n}, DType::BF16, Device::cuda(0), s.get());
    half.copy_(dev, s.get());
    Tensor back = Tensor::empty({n}, DType::F32, Device::cuda(0), s.get());
    back.copy_(half, s.get());
    const std::vector<float> got = back.to(Device::cpu(), s.get()).to_float_vector();
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(got[i], bf16_to_float(float_to_bf16(v[i]))) << "n=" << n << " i=" << i;
  }
}

TEST(CudaTensor, UnsupportedConversionThrows) {
  REQUIRE_GPU();
  Tensor a = Tensor::zeros({8}, DType::I32, Device::cuda(0));
  Tensor b = Tensor::empty({8}, DType::F32, Device::cuda(0));
  EXPECT_THROW(b.copy_(a), Error);
}

// ---- fill ------------------------------------------------------------------------------------

TEST(CudaTensor, FillMatchesCpuEveryDtype) {
  REQUIRE_GPU();
  TestStream s;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8}) {
    for (double value : {0.0, 1.0, -3.25, 0.1, 7.0, 70000.0}) {
      if (t == DType::U8 && (value < 0 || value > 255)) continue;  // not representable
      for (int64_t n : {1, 3, 8, 1001, 1 << 20}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " value=" + std::to_string(value) +
                     " n=" + std::to_string(n));
        Tensor want = Tensor::empty({n}, t);
        want.fill_(value);
        Tensor dev = Tensor::empty({n}, t, Device::cuda(0), s.get());
        dev.fill_(value, s.get());
        EXPECT_TRUE(same_bytes(dev.to(Device::cpu(), s.get()), want));
        // An unaligned view: only its elements change.
        Tensor base = Tensor::zeros({n + 1}, t, Device::cuda(0));
        Tensor view = base.narrow(0, 1, n);
        view.fill_(value);
        Tensor host = base.to(Device::cpu());
        std::vector<uint8_t> zero(dtype_size(t), 0);
        EXPECT_EQ(std::memcmp(host.data_ptr(), zero.data(), zero.size()), 0);
        EXPECT_TRUE(same_bytes(host.narrow(0, 1, n).contiguous(), want));
      }
    }
  }
}

TEST(CudaTensor, FillRoundsLikeTheCpuReference) {
  REQUIRE_GPU();
  Tensor b = Tensor::full({5}, 0.1, DType::BF16, Device::cuda(0)).to(Device::cpu());
  Tensor h = Tensor::full({5}, 70000.0, DType::F16, Device::cuda(0)).to(Device::cpu());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(b.data<bf16>()[i].bits, float_to_bf16(0.1f).bits);
    EXPECT_EQ(h.data<f16>()[i].bits, 0x7c00);  // beyond fp16's range: +inf
  }
}

// Narrowed views (what context parallelism's reorders, the qkv split and the tp gathers copy, and
// the one-element columns of the model's targets [b, s] -> [s, b]): on the GPU, from and to the
// host, with and without a conversion, each against the CPU's own strided copy of the same views.
TEST(CudaTensor, NarrowedViewsCopyLikeTheCpu) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const Shape shape{6, 2, 8, 4};  // [s, b, heads, d]
  const Tensor host = Tensor::from_floats(std::vector<float>(384, 0.0f), shape, DType::F32);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = 0.37f * static_cast<float>(i) - 11.0f;
  struct View {
    int64_t dim, start, length;
  };
  for (const View v : {View{2, 2, 4}, View{1, 1, 1}, View{3, 1, 2}, View{0, 2, 3}, View{3, 2, 1}}) {
    SCOPED_TRACE("narrow(" + std::to_string(v.dim) + ", " + std::to_string(v.start) + ", " +
                 std::to_string(v.length) + ")");
    const Tensor want = host.narrow(v.dim, v.start, v.length).contiguous();
    for (DType t : {DType::F32, DType::BF16}) {
      const Tensor want_t = want.to(t);
      // gpu strided -> gpu contiguous (and converted), gpu strided -> host
      const Tensor src = host.to(gpu).narrow(v.dim, v.start, v.length);
      Tensor packed = Tensor::empty(want.shape(), t, gpu);
      packed.copy_(src);
      EXPECT_TRUE(same_bytes(packed.to(Device::cpu()), want_t));
      Tensor back = Tensor::empty(want.shape(), DType::F32, Device::cpu());
      back.copy_(src);
      EXPECT_TRUE(same_bytes(back, want));
      // contiguous (gpu or host) -> a narrowed gpu view; the rest of the destination untouched
      for (const Tensor& from : {want_t.to(gpu), want_t}) {
        Tensor dst_base = Tensor::zeros(shape, t, gpu);
        Tensor dst = dst_base.narrow(v.dim, v.start, v.length);
        dst.copy_(from);
        Tensor expect = Tensor::zeros(shape, t);
        Tensor expect_view = expect.narrow(v.dim, v.start, v.length);
        expect_view.copy_(want_t);
        EXPECT_TRUE(same_bytes(dst_base.to(Device::cpu()), expect));
      }
    }
  }
  // Views that are not rows at one pitch on both sides are refused, not copied wrongly.
  Tensor a = Tensor::zeros({4, 6, 8}, DType::F32, gpu);
  Tensor b = Tensor::zeros({6, 4, 8}, DType::F32, gpu);
  Tensor a_view = a.narrow(1, 1, 4).narrow(2, 0, 4);
  EXPECT_THROW(a_view.copy_(b.narrow(0, 0, 4).narrow(2, 0, 4)), Error);
}

// clone(), contiguous(), to(DType) and to_float_vector() copy on the tensor's own stream. The source
// is written on a non-blocking stream held back by a sleeping host callback: a copy on the legacy
// default stream (which does not wait for non-blocking streams) would run first and read the old
// zeros; a copy on the tensor's stream runs after the fill.
TEST(CudaTensor, CopiesRunOnTheTensorsStream) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  TestStream ts;
  const Stream s = ts.get();
  const int64_t rows = 512, cols = 1024;
  auto hold = [&] {
    ASSERT_EQ(cudaLaunchHostFunc(
                  ts.s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr),
              cudaSuccess);
  };
  auto all_equal = [](const Tensor& t, float want) {
    for (float v : t.to_float_vector())
      if (v != want) return false;
    return true;
  };
  for (int which = 0; which < 4; which++) {
    SCOPED_TRACE(which);
    Tensor src = Tensor::zeros({rows, cols}, DType::F32, gpu, s);
    ASSERT_EQ(cudaStreamSynchronize(ts.s), cudaSuccess);
    hold();
    src.fill_(7.0, s);
    if (which == 3) {  // device -> host on the tensor's stream
      EXPECT_TRUE(all_equal(src, 7.0f));
      continue;
    }
    Tensor out = which == 0   ? src.clone()
                 : which == 1 ? src.narrow(1, 8, cols / 2).contiguous()
                              : src.to(DType::BF16);
    ASSERT_EQ(cudaStreamSynchronize(ts.s), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(out.storage()->stream(), s);
    EXPECT_TRUE(all_equal(out, 7.0f));
  }
}

}  // namespace
}  // namespace parallel
