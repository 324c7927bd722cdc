// The measured CPU peak (hardware_peak.hpp): structure and plausibility only. The bands are wide on
// purpose: the figure depends on the machine and on its load, and this test must not flake.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/hardware_peak.hpp"

using namespace parallel;

namespace {

constexpr const char* kOverride = "PARALLEL_CPU_PEAK_GFLOPS";

// Runs the test without the override a user may have set, and puts it back afterwards.
class HardwarePeak : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv(kOverride)) saved_ = v;
    unsetenv(kOverride);
  }
  void TearDown() override {
    if (saved_)
      setenv(kOverride, saved_->c_str(), 1);
    else
      unsetenv(kOverride);
  }
  std::optional<std::string> saved_;
};

bool has(const std::string& isa, const std::string& name) {
  return (" " + isa + " ").find(" " + name + " ") != std::string::npos;
}

// Every available figure: positive, per thread between 0.1 GFLOP/s and 100 TFLOP/s (no CPU core is
// outside), the slowest thread no faster than the mean, and the total the mean times the threads
// that can run at once.
void expect_plausible(const PeakFigure& f, const CpuPeak& p, const char* name) {
  SCOPED_TRACE(name);
  if (!f.available) {
    EXPECT_FALSE(f.why_not.empty());
    EXPECT_EQ(f.flops_total, 0.0);
    return;
  }
  EXPECT_FALSE(f.isa.empty());
  EXPECT_GT(f.flops_per_thread, 1e8);
  EXPECT_LT(f.flops_per_thread, 1e14);
  EXPECT_GT(f.flops_per_thread_min, 0.0);
  EXPECT_LE(f.flops_per_thread_min, f.flops_per_thread * (1 + 1e-9));
  const int concurrent = std::min(p.threads, p.cpus);
  EXPECT_NEAR(f.flops_total, f.flops_per_thread * concurrent, 1e-6 * f.flops_total);
  EXPECT_GE(f.flops_total, f.flops_per_thread * (1 - 1e-9));
  EXPECT_LE(f.flops_total, f.flops_per_thread * p.threads * (1 + 1e-9));
}

}  // namespace

TEST_F(HardwarePeak, MeasurementIsPlausible) {
  const CpuPeak& p = measured_cpu_peak();
  EXPECT_FALSE(p.isa.empty());
  EXPECT_GE(p.threads, 1);
  // Every OpenMP thread of the library took part (ctest sets OMP_NUM_THREADS=1).
  if (const char* n = std::getenv("OMP_NUM_THREADS"); n != nullptr && std::atoi(n) > 0)
    EXPECT_EQ(p.threads, std::atoi(n));
  EXPECT_GE(p.cpus, 1);
  EXPECT_GT(p.seconds, 0.0);
  EXPECT_LT(p.seconds, 1.0);  // the contract: well under a second (typically ~0.1 s)

  ASSERT_TRUE(p.fp32_fma.available);  // every CPU has some fp32 kernel
  expect_plausible(p.fp32_fma, p, "fp32_fma");
  expect_plausible(p.fp16_fma, p, "fp16_fma");
  expect_plausible(p.bf16_dot, p, "bf16_dot");
  expect_plausible(p.amx_bf16, p, "amx_bf16");
  if (has(p.isa, "avx512f")) {
    EXPECT_EQ(p.fp32_fma.isa, "avx512f");
  }
  std::printf("%s\n", describe(p).c_str());
}

TEST_F(HardwarePeak, FiguresFollowTheIsa) {
  const CpuPeak& p = measured_cpu_peak();
  EXPECT_EQ(p.bf16_dot.available, has(p.isa, "avx512_bf16"));
  if (!has(p.isa, "avx512_fp16")) EXPECT_FALSE(p.fp16_fma.available);
  // AMX needs the CPU bit and the kernel's permission; without the bit it is never measured.
  if (!has(p.isa, "amx_bf16")) {
    EXPECT_FALSE(p.amx_bf16.available);
    EXPECT_EQ(p.amx_bf16.why_not, "CPU has no amx_bf16");
  }
  if (p.bf16_dot.available) {
    // 64 FLOPs an instruction against an FMA's 32: no CPU with the unit runs it at under half rate.
    EXPECT_GE(p.bf16_dot.flops_total, 0.5 * p.fp32_fma.flops_total);
  }
}

TEST_F(HardwarePeak, PrecisionPicksItsFigure) {
  const CpuPeak& p = measured_cpu_peak();
  EXPECT_FALSE(cpu_peak_overridden());
  EXPECT_EQ(cpu_peak_flops(Precision::FP32), p.fp32_fma.flops_total);
  // bf16 is the best of the bf16 units, never below fp32.
  double bf16 = p.fp32_fma.flops_total;
  if (p.bf16_dot.available) bf16 = std::max(bf16, p.bf16_dot.flops_total);
  if (p.amx_bf16.available) bf16 = std::max(bf16, p.amx_bf16.flops_total);
  EXPECT_EQ(cpu_peak_flops(Precision::BF16), bf16);
  EXPECT_GE(cpu_peak_flops(Precision::BF16), cpu_peak_flops(Precision::FP32));
  EXPECT_EQ(cpu_peak_flops(Precision::FP16),
            p.fp16_fma.available ? p.fp16_fma.flops_total : p.fp32_fma.flops_total);
  EXPECT_NE(cpu_peak_source(Precision::FP32).find("fma"), std::string::npos);
  if (p.bf16_dot.available && p.bf16_dot.flops_total > p.fp32_fma.flops_total &&
      !(p.amx_bf16.available && p.amx_bf16.flops_total > p.bf16_dot.flops_total))
    EXPECT_EQ(cpu_peak_source(Precision::BF16), "avx512_bf16 dot");
}

TEST_F(HardwarePeak, UnboundRanksShareTheCpus) {
  const CpuPeak& p = measured_cpu_peak();
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    const double process = cpu_peak_flops(precision);
    EXPECT_EQ(cpu_peak_flops_per_rank(precision, 1), process);
    for (int ranks : {2, 4, 8}) {
      const double rank = cpu_peak_flops_per_rank(precision, ranks);
      EXPECT_GT(rank, 0.0);
      EXPECT_LE(rank, process);
      if (p.cpus == p.online_cpus) {  // unbound: the ranks together never exceed the machine
        const double per_thread = process / std::min(p.threads, p.cpus);
        EXPECT_LE(rank * ranks, per_thread * p.cpus * (1 + 1e-9));
        EXPECT_DOUBLE_EQ(rank, per_thread * std::min<double>(p.threads, double(p.cpus) / ranks));
      }
    }
  }
  setenv(kOverride, "50", 1);
  EXPECT_DOUBLE_EQ(cpu_peak_flops_per_rank(Precision::FP32, 4), 50e9);  // the override is taken as is
  unsetenv(kOverride);
}

TEST_F(HardwarePeak, RepeatedCallsReturnTheCachedMeasurement) {
  const CpuPeak& first = measured_cpu_peak();
  const double fp32 = first.fp32_fma.flops_total, seconds = first.seconds;
  EXPECT_EQ(&measured_cpu_peak(), &first);
  EXPECT_EQ(cpu_peak_flops(Precision::FP32), fp32);
  // From several threads at once: the same object, nothing measured again.
  std::vector<const CpuPeak*> seen(4, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i)
    threads.emplace_back([&seen, i] { seen[i] = &measured_cpu_peak(); });
  for (std::thread& t : threads) t.join();
  for (const CpuPeak* s : seen) EXPECT_EQ(s, &first);
  EXPECT_EQ(first.fp32_fma.flops_total, fp32);
  EXPECT_EQ(first.seconds, seconds);
}

TEST_F(HardwarePeak, EnvironmentOverridesEveryPrecision) {
  const double measured = cpu_peak_flops(Precision::FP32);
  setenv(kOverride, "123.5", 1);
  EXPECT_TRUE(cpu_peak_overridden());
  for (Precision precision : {Precision::FP32, Precision::BF16, Precision::FP16}) {
    EXPECT_DOUBLE_EQ(cpu_peak_flops(precision), 123.5e9);
    EXPECT_EQ(cpu_peak_source(precision), "PARALLEL_CPU_PEAK_GFLOPS");
  }
  for (const char* bad : {"abc", "-5", "0", "12x"}) {
    setenv(kOverride, bad, 1);
    EXPECT_THROW(cpu_peak_flops(Precision::FP32), ConfigError) << bad;
  }
  unsetenv(kOverride);
  EXPECT_FALSE(cpu_peak_overridden());
  EXPECT_EQ(cpu_peak_flops(Precision::FP32), measured);  // back to the (cached) measurement
}

TEST_F(HardwarePeak, DescriptionNamesIsaAndFigures) {
  const CpuPeak& p = measured_cpu_peak();
  const std::string line = describe(p);
  EXPECT_NE(line.find(p.isa), std::string::npos);
  EXPECT_NE(line.find("fp32 fma"), std::string::npos);
  EXPECT_NE(line.find("bf16 dot"), std::string::npos);
  EXPECT_NE(line.find("amx bf16"), std::string::npos);
}
