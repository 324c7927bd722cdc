// The GEMM choice of PARALLEL_GEMM=auto (kernels/gemm/gemm_rule.hpp): a pure function of the problem
// and the compute capability, so every rank and every run make the same one. Runs on the CPU (the
// rule needs no GPU), in builds with and without CUDA.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../kernels/gemm/gemm_rule.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {

using kernels::GemmImpl;
using kernels::GemmMode;
using kernels::GemmProblem;

TEST(GemmRule, ParsesTheEnvironmentVariable) {
  EXPECT_EQ(kernels::parse_gemm_mode(nullptr), GemmMode::Auto);
  EXPECT_EQ(kernels::parse_gemm_mode(""), GemmMode::Auto);
  EXPECT_EQ(kernels::parse_gemm_mode("auto"), GemmMode::Auto);
  EXPECT_EQ(kernels::parse_gemm_mode("ours"), GemmMode::Ours);
  EXPECT_EQ(kernels::parse_gemm_mode("cublaslt"), GemmMode::CublasLt);
  EXPECT_EQ(kernels::parse_gemm_mode("timed"), GemmMode::Timed);
  for (const GemmMode m : {GemmMode::Auto, GemmMode::Ours, GemmMode::CublasLt, GemmMode::Timed})
    EXPECT_EQ(kernels::parse_gemm_mode(kernels::gemm_mode_name(m)), m);
  for (const char* bad : {"cublas", "OURS", "TIMED", "auto ", "1"}) {
    try {
      kernels::parse_gemm_mode(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("PARALLEL_GEMM"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad), std::string::npos) << msg;
      EXPECT_NE(msg.find("ours, cublaslt, auto, timed"), std::string::npos) << msg;
    }
  }
}

// Timing per process could make ranks disagree: the trainer refuses it on more than one rank.
TEST(GemmRule, TimedIsForOneProcessOnly) {
  for (const GemmMode m : {GemmMode::Auto, GemmMode::Ours, GemmMode::CublasLt})
    for (const int ranks : {1, 2, 8}) EXPECT_TRUE(kernels::gemm_mode_allowed(m, ranks));
  EXPECT_TRUE(kernels::gemm_mode_allowed(GemmMode::Timed, 1));
  EXPECT_FALSE(kernels::gemm_mode_allowed(GemmMode::Timed, 2));
  EXPECT_FALSE(kernels::gemm_mode_allowed(GemmMode::Timed, 8));
}

// Problems across shapes (GPT-2 layers, odd edges, past our kernel's limits), transpositions,
// dtypes and architectures.
std::vector<GemmProblem> problems() {
  std::vector<GemmProblem> out;
  const int64_t dims[][3] = {{8192, 2304, 768}, {8192, 768, 3072},         {768, 3072, 8192}, {1, 1, 1},
                             {130, 96, 72},     {65535 * 128 + 1, 64, 64}, {64, 64, 0}};
  for (const auto& d : dims)
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const DType ab : {DType::BF16, DType::F16})
          for (const DType c : {DType::F32, ab})
            for (const bool gelu : {false, true})
              for (const int arch : {70, 80, 86, 89, 90, 100}) {
                GemmProblem p;
                p.m = d[0];
                p.n = d[1];
                p.k = d[2];
                p.trans_a = ta;
                p.trans_b = tb;
                p.dtype = ab;
                p.c_dtype = c;
                p.gelu = gelu;
                p.arch = arch;
                out.push_back(p);
              }
  return out;
}

TEST(GemmRule, GeluEpilogueAndEmptySumRunOursEverythingElseCublasLt) {
  for (const GemmProblem& p : problems()) {
    SCOPED_TRACE(std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) + " arch " +
                 std::to_string(p.arch) + (p.gelu ? " gelu" : ""));
    const GemmImpl want = p.gelu || p.k == 0 ? GemmImpl::Ours : GemmImpl::CublasLt;
    EXPECT_EQ(kernels::gemm_rule(p), want);
  }
}

// cuBLASLt's epilogue takes a 16-bit bias only where it was seen to round once: a @ b^T, every
// dimension a multiple of 8, aligned pointers.
TEST(GemmRule, Bias16InCublasLtOnlyForAlignedForwardLayout) {
  EXPECT_TRUE(kernels::gemm_bias16_in_cublaslt(false, true, 8192, 2304, 768, true));
  EXPECT_TRUE(kernels::gemm_bias16_in_cublaslt(false, true, 24, 64, 16, true));
  EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, false, 24, 64, 16, true));  // a @ b
  EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(true, true, 24, 64, 16, true));
  EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(true, false, 24, 64, 16, true));
  EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, false, 37, 29, 41, true));  // the op table's miss
  for (const int64_t odd : {1, 4, 12, 4097}) {
    EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, true, odd, 64, 64, true)) << odd;
    EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, true, 64, odd, 64, true)) << odd;
    EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, true, 64, 64, odd, true)) << odd;
  }
  EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, true, 64, 64, 0, true));
  EXPECT_FALSE(kernels::gemm_bias16_in_cublaslt(false, true, 64, 64, 64, false));  // misaligned
}

// What makes it safe across ranks and runs: the answer depends on the problem only, not on what was
// asked before (no cache, no timing), so any order of calls, on any rank, gives the same answers.
TEST(GemmRule, SameAnswerInAnyOrder) {
  const std::vector<GemmProblem> ps = problems();
  std::vector<GemmImpl> forward, backward(ps.size());
  for (const GemmProblem& p : ps) forward.push_back(kernels::gemm_rule(p));
  for (std::size_t i = ps.size(); i-- > 0;) backward[i] = kernels::gemm_rule(ps[i]);
  EXPECT_EQ(forward, backward);
}

TEST(GemmRule, OursSupportsItsGridAndIntLimits) {
  EXPECT_TRUE(kernels::gemm_ours_supports(65535 * 128, 1, 1));
  EXPECT_FALSE(kernels::gemm_ours_supports(65535 * 128 + 1, 1, 1));
  EXPECT_FALSE(kernels::gemm_ours_supports(1, int64_t{1} << 31, 1));
  EXPECT_FALSE(kernels::gemm_ours_supports(1, 1, int64_t{1} << 31));
}

}  // namespace
}  // namespace parallel
