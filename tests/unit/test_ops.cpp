// The CPU ops (include/parallel/ops.hpp) against naive double-precision references written as
// plain loops below. Backwards are checked against their analytic double reference, and each
// reference backward is itself checked against central finite differences of the double forward
// (eps 1e-5 in double: truncation error ~eps^2 * f''' ~ 1e-10, rounding ~1e-16 / eps ~ 1e-11, so a
// 1e-6 tolerance is loose). Sizes are odd so that vector remainders and uneven thread splits run.
//
// Tolerances against the fp32 kernels: one fp32 operation has relative error 6e-8; a dot product
// of length K with |terms| <= 1 accumulates at most ~K * 6e-8 in the worst case and ~sqrt(K) * 6e-8
// typically. The bounds below are a few times the typical error and far below any real bug.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {

using Vec = std::vector<double>;

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor tensor(const std::vector<float>& v, const Shape& shape) { return Tensor::from_vector(v, shape); }
Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return tensor(random_floats(shape_numel(shape), seed, lo, hi), shape);
}
Vec to_double(const Tensor& t) {
  const std::vector<float> f = t.to_float_vector();
  return Vec(f.begin(), f.end());
}

// |got - want| <= atol + rtol |want| everywhere; reports the worst element.
void expect_close(const Vec& got, const Vec& want, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double excess = std::abs(got[i] - want[i]) - (atol + rtol * std::abs(want[i]));
    if (!(excess <= worst)) {  // also catches NaN
      worst = std::isnan(excess) ? std::numeric_limits<double>::infinity() : excess;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << got[at] << ", expected " << want[at]
                        << " (atol " << atol << ", rtol " << rtol << ")";
}
void expect_close(const Tensor& got, const Vec& want, double atol, double rtol, const std::string& what) {
  expect_close(to_double(got), want, atol, rtol, what);
}

// Central differences of a scalar function f of the vector v, at every element.
Vec finite_diff(const std::function<double(const Vec&)>& f, Vec v, double eps = 1e-5) {
  Vec g(v.size());
  for (size_t i = 0; i < v.size(); i++) {
    const double saved = v[i];
    v[i] = saved + eps;
    const double up = f(v);
    v[i] = saved - eps;
    const double down = f(v);
    v[i] = saved;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// The error message of a failing call (empty when it does not throw parallel::Error).
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- gemm -------------------------------------------------------------------------------------

namespace {
// c = alpha op(a) op(b) + beta c, all row-major, in double.
Vec gemm_ref(const Vec& a, bool ta, const Vec& b, bool tb, const Vec& c, int64_t m, int64_t n, int64_t k,
             double alpha, double beta) {
  Vec out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t p = 0; p < k; p++) {
        const double av = ta ? a[p * m + i] : a[i * k + p];
        const double bv = tb ? b[j * k + p] : b[p * n + j];
        s += av * bv;
      }
      out[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  return out;
}

void check_gemm(int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha, float beta) {
  const std::string what = "gemm m=" + std::to_string(m) + " n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + " ta=" + std::to_string(ta) +
                           " tb=" + std::to_string(tb) + " alpha=" + std::to_string(alpha) +
                           " beta=" + std::to_string(beta);
  Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1);
  Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2);
  Tensor c = random_tensor({m, n}, 3);
  const Vec want = gemm_ref(to_double(a), ta, to_double(b), tb, to_double(c), m, n, k, alpha, beta);
  ops::gemm(a, ta, b, tb, c, alpha, beta);
  // |a|, |b| <= 1: the fp32 dot products of length k are within ~k * 6e-8 * k / 3 worst case.
  expect_close(c, want, 2e-6 * static_cast<double>(k), 1e-6, what);
}
}  // namespace

TEST(OpsGemm, AllTranspositionsBeta0And1) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) check_gemm(37, 29, 53, ta, tb, 1.0f, beta);
}

TEST(OpsGemm, AlphaBetaAndLargerOddShapes) {
  check_gemm(37, 29, 53, false, true, 0.5f, 0.25f);
  check_gemm(129, 67, 515, false, true, 1.0f, 0.0f);
  check_gemm(67, 129, 515, true, false, 1.0f, 1.0f);  // the weight-gradient case, accumulating
  check_gemm(1, 1, 1, false, false, 2.0f, 1.0f);
}

// 16-bit operands over several tiles with ragged edges: where oneDNN has no kernel for the dtype
// (bf16 below AVX-512, fp16 below AVX512-FP16) the product runs tile by tile (gemm.cpp,
// widened_gemm, tiles of 256 x 256), and every element must still be the product of the widened
// operands, rounded once into c; with a bias (gemm_bias), and with an fp32 c accumulating (beta 1).
TEST(OpsGemm, SixteenBitAcrossTileEdges) {
  const int64_t m = 300, n = 520, k = 70;
  for (DType dt : {DType::BF16, DType::F16})
    for (DType ct : {dt, DType::F32})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const std::string what = "gemm " + std::string(dtype_name(dt)) + " c " +
                                   std::string(dtype_name(ct)) + " ta=" + std::to_string(ta) +
                                   " tb=" + std::to_string(tb);
          Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1).to(dt);
          Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2).to(dt);
          Tensor c = random_tensor({m, n}, 3).to(ct);
          const float beta = ct == DType::F32 ? 1.0f : 0.0f;
          // c's rounding (2^-8 relative for bf16, 2^-11 for fp16) plus the fp32 sums' error.
          const double rtol = ct == DType::F32 ? 1e-6 : dt == DType::BF16 ? 4e-3 : 5e-4;
          const Vec want = gemm_ref(to_double(a), ta, to_double(b), tb, to_double(c), m, n, k, 1.0, beta);
          ops::gemm(a, ta, b, tb, c, 1.0f, beta);
          expect_close(c, want, 2e-6 * static_cast<double>(k), rtol, what);
          if (ct != dt) continue;
          Tensor bias = random_tensor({n}, 4).to(dt);
          Vec want_bias = gemm_ref(to_double(a), ta, to_double(b), tb, Vec(static_cast<size_t>(m * n), 0.0),
                                   m, n, k, 1.0, 0.0);
          const Vec bv = to_double(bias);
          for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
              want_bias[static_cast<size_t>(i * n + j)] += bv[static_cast<size_t>(j)];
          ops::gemm_bias(a, ta, b, tb, bias, c);
          expect_close(c, want_bias, 2e-6 * static_cast<double>(k), rtol, what + " + bias");
        }
}

TEST(OpsGemm, CachedPrimitiveSeesNewDataAndBetaAccumulates) {
  // Same shape twice: the cached primitive must not remember the first call's pointers.
  check_gemm(37, 29, 53, false, false, 1.0f, 0.0f);
  check_gemm(37, 29, 53, false, false, 1.0f, 0.0f);
  // beta = 1 twice ADDS twice: the accumulation of weight gradients over micro-batches.
  Tensor a = random_tensor({5, 3}, 4), b = random_tensor({3, 7}, 5), c = Tensor::zeros({5, 7}, DType::F32);
  ops::gemm(a, false, b, false, c, 1.0f, 1.0f);
  ops::gemm(a, false, b, false, c, 1.0f, 1.0f);
  const Vec once = gemm_ref(to_double(a), false, to_double(b), false, Vec(35, 0.0), 5, 7, 3, 1.0, 0.0);
  Vec twice(once.size());
  for (size_t i = 0; i < once.size(); i++) twice[i] = 2 * once[i];
  expect_close(c, twice, 1e-5, 1e-6, "gemm beta=1 twice");
}

TEST(OpsGemm, EmptyInnerDimensionLeavesBetaC) {
  Tensor a = Tensor::zeros({4, 0}, DType::F32), b = Tensor::zeros({0, 3}, DType::F32);
  Tensor c = tensor(std::vector<float>(12, 2.0f), {4, 3});
  ops::gemm(a, false, b, false, c, 1.0f, 0.5f);
  expect_close(c, Vec(12, 1.0), 0, 0, "gemm k=0");
}

TEST(OpsGemm, RejectsBadShapesDtypesAndLayouts) {
  Tensor a = random_tensor({37, 53}, 1), b = random_tensor({50, 29}, 2),
         c = Tensor::zeros({37, 29}, DType::F32);
  const std::string msg = error_of([&] { ops::gemm(a, false, b, false, c); });
  EXPECT_NE(msg.find("ops::gemm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[37, 53]"), std::string::npos) << msg;
  Tensor bi = Tensor::zeros({53, 29}, DType::I32);
  EXPECT_NE(error_of([&] { ops::gemm(a, false, bi, false, c); }).find("int32"), std::string::npos);
  Tensor wide = random_tensor({53, 58}, 3);
  Tensor strided = wide.narrow(1, 0, 29);  // [53, 29] with row stride 58
  EXPECT_NE(error_of([&] { ops::gemm(a, false, strided, false, c); }).find("contiguous"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::gemm(a, false, Tensor(), false, c); }).find("undefined"), std::string::npos);
}

// ---- bias and element-wise ----------------------------------------------------------------------

TEST(OpsBias, AddBiasAndBackwardAccumulates) {
  for (int64_t rows : {15, 301}) {  // 301 x 301 takes the threaded path
    const int64_t h = rows == 15 ? 7 : 301;
    Tensor y = random_tensor({rows, h}, 10), bias = random_tensor({h}, 11);
    Vec want = to_double(y);
    const Vec bv = to_double(bias);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < h; j++) want[r * h + j] += bv[j];
    ops::add_bias(y, bias);
    expect_close(y, want, 1e-7, 1e-7, "add_bias");

    Tensor dy = random_tensor({rows, h}, 12), dbias = random_tensor({h}, 13);
    Vec dwant = to_double(dbias);  // starts non-zero: the op must ADD
    const Vec dyv = to_double(dy);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < h; j++) dwant[j] += dyv[r * h + j];
    ops::bias_backward(dy, dbias);
    // A float sum over `rows` terms of size <= 1: ~sqrt(rows) * 6e-8 * rows typical.
    expect_close(dbias, dwant, 1e-6 * static_cast<double>(rows), 1e-6, "bias_backward");
  }
}

TEST(OpsElementwise, AddAddInPlaceScale) {
  const int64_t n = 3 * (1 << 14) + 17;  // several OpenMP chunks plus a remainder
  Tensor a = random_tensor({n}, 20), b = random_tensor({n}, 21), out = Tensor::zeros({n}, DType::F32);
  const Vec av = to_double(a), bv = to_double(b);
  Vec sum(av.size()), scaled(av.size());
  for (size_t i = 0; i < av.size(); i++) {
    sum[i] = static_cast<float>(av[i] + bv[i]);  // fp32 addition is correctly rounded
    scaled[i] = static_cast<float>(static_cast<float>(av[i] + bv[i]) * 0.375f);
  }
  ops::add(a, b, out);
  expect_close(out, sum, 0, 0, "add");
  ops::add(a, b, a);  // out aliasing a
  expect_close(a, sum, 0, 0, "add aliasing");
  Tensor c = tensor(std::vector<float>(av.begin(), av.end()), {n});
  ops::add_(c, b);
  expect_close(c, sum, 0, 0, "add_");
  ops::scale_(c, 0.375f);
  expect_close(c, scaled, 0, 0, "scale_");
  Tensor wrong = Tensor::zeros({n + 1}, DType::F32);
  EXPECT_NE(error_of([&] { ops::add_(c, wrong); }).find("ops::add_"), std::string::npos);
}

namespace {
constexpr double kGc = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGa = 0.044715;
double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(kGc * (x + kGa * x * x * x))); }
double gelu_grad_ref(double x) {
  const double t = std::tanh(kGc * (x + kGa * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGc * (1 + 3 * kGa * x * x);
}
}  // namespace

TEST(OpsElementwise, GeluForwardBackward) {
  const int64_t n = 3 * (1 << 14) + 17;
  Tensor x = random_tensor({n}, 30, -6.0f, 6.0f), y = Tensor::zeros({n}, DType::F32);
  Tensor dy = random_tensor({n}, 31), dx = Tensor::zeros({n}, DType::F32);
  const Vec xv = to_double(x), dyv = to_double(dy);
  Vec yw(xv.size()), dxw(xv.size());
  for (size_t i = 0; i < xv.size(); i++) {
    yw[i] = gelu_ref(xv[i]);
    dxw[i] = dyv[i] * gelu_grad_ref(xv[i]);
  }
  ops::gelu_forward(x, y);
  ops::gelu_backward(dy, x, dx);
  // A few fp32 roundings in the exp/sigmoid evaluation: 1e-6 relative plus 1e-7 absolute near 0.
  expect_close(y, yw, 1e-7, 1e-6, "gelu_forward");
  expect_close(dx, dxw, 1e-7, 2e-6, "gelu_backward");
  // The reference derivative against finite differences of the reference forward.
  for (double v : {-5.0, -1.3, -0.2, 0.0, 0.37, 2.1, 4.9}) {
    const double fd = (gelu_ref(v + 1e-5) - gelu_ref(v - 1e-5)) / 2e-5;
    EXPECT_NEAR(gelu_grad_ref(v), fd, 1e-8) << "x = " << v;
  }
}

namespace {
double silu(double g) { return g / (1 + std::exp(-g)); }
// x [rows, 2f] -> y [rows, f]
Vec swiglu_ref(const Vec& x, int64_t rows, int64_t f) {
  Vec y(static_cast<size_t>(rows * f));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < f; i++) y[r * f + i] = silu(x[r * 2 * f + i]) * x[r * 2 * f + f + i];
  return y;
}
Vec swiglu_grad_ref(const Vec& dy, const Vec& x, int64_t rows, int64_t f) {
  Vec dx(x.size());
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < f; i++) {
      const double g = x[r * 2 * f + i], u = x[r * 2 * f + f + i], s = 1 / (1 + std::exp(-g));
      dx[r * 2 * f + i] = dy[r * f + i] * u * (s + g * s * (1 - s));
      dx[r * 2 * f + f + i] = dy[r * f + i] * silu(g);
    }
  return dx;
}
}  // namespace

TEST(OpsElementwise, SwigluForwardBackward) {
  for (int64_t rows : {35, 1001}) {  // [7, 5, 2f] and a threaded size
    const int64_t f = 37;
    const Shape xs = rows == 35 ? Shape{7, 5, 2 * f} : Shape{rows, 2 * f};
    const Shape ys = rows == 35 ? Shape{7, 5, f} : Shape{rows, f};
    Tensor x = random_tensor(xs, 40, -5.0f, 5.0f), y = Tensor::zeros(ys, DType::F32);
    Tensor dy = random_tensor(ys, 41), dx = Tensor::zeros(xs, DType::F32);
    const Vec xv = to_double(x), dyv = to_double(dy);
    ops::swiglu_forward(x, y);
    ops::swiglu_backward(dy, x, dx);
    expect_close(y, swiglu_ref(xv, rows, f), 1e-6, 1e-6, "swiglu_forward");
    expect_close(dx, swiglu_grad_ref(dyv, xv, rows, f), 1e-6, 2e-6, "swiglu_backward");
  }
  // Reference backward vs finite differences of L = <dy, swiglu(x)> on a small case.
  const int64_t rows = 3, f = 5;
  const Vec x = to_double(random_tensor({rows, 2 * f}, 42, -3, 3)),
            dy = to_double(random_tensor({rows, f}, 43));
  const Vec fd = finite_diff([&](const Vec& xx) { return dot(dy, swiglu_ref(xx, rows, f)); }, x);
  expect_close(swiglu_grad_ref(dy, x, rows, f), fd, 1e-6, 1e-6, "swiglu reference vs finite differences");
  Tensor bad = Tensor::zeros({rows, f + 1}, DType::F32);
  EXPECT_NE(error_of([&] {
              ops::swiglu_forward(random_tensor({rows, 2 * f}, 1), bad);
            }).find("ops::swiglu_forward"),
            std::string::npos);
}

// ---- rounding to bf16 / fp16 -------------------------------------------------------------------

// Values that stress the rounding: exact ties in both directions, the largest finite values and
// their overflow neighbours, inf, NaNs (quiet, signalling, with payloads), zeros, fp32 and fp16
// subnormals and the fp16 normal/subnormal boundary, then a random sweep of bit patterns.
namespace {

std::vector<float> rounding_cases() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u,  // +-0, +-1
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,  // bf16 ties to even (down / up) and neighbours
      0x3f801000u, 0x3f803000u, 0x3f801001u, 0x3f800fffu,  // fp16 ties to even (down / up) and neighbours
      0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu,  // fp32 max, bf16 overflow tie
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u,  // fp16 65504, just below / at / above 65520
      0x7f800000u, 0xff800000u,                            // +-inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0xff812345u, 0x7fffffffu,  // NaNs
      0x00000001u, 0x80000001u, 0x007fffffu, 0x00400000u, 0x00008000u,               // fp32 subnormals
      0x33800000u, 0x33000000u, 0x33000001u, 0x33c00000u, 0xb3400000u,               // around 2^-24
      0x38800000u, 0x387fffffu, 0x387fe000u, 0x387ff000u, 0xb87ff000u, 0x38000000u,  // around 2^-14
  };
  std::mt19937 gen(2024);
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<uint32_t>(gen()));
  // Values near 1 with all low-bit patterns, so every tie/non-tie combination appears.
  for (uint32_t low = 0; low < 0x10000u; low += 7) bits.push_back(0x3f800000u | low);
  std::vector<float> out;
  for (uint32_t b : bits) out.push_back(std::bit_cast<float>(b));
  return out;
}

void expect_rounding_matches(DType precision) {
  const std::vector<float> values = rounding_cases();
  Tensor x = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  ops::round_to_precision_(x, precision);
  const std::vector<float> got = x.to_float_vector();
  int64_t mismatches = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float want = precision == DType::BF16 ? bf16_to_float(float_to_bf16(values[i]))
                                                : f16_to_float(float_to_f16(values[i]));
    const uint32_t w = std::bit_cast<uint32_t>(want), g = std::bit_cast<uint32_t>(got[i]);
    if (w != g && ++mismatches <= 10)
      ADD_FAILURE() << dtype_name(precision) << ": input 0x" << std::hex << std::bit_cast<uint32_t>(values[i])
                    << " gave 0x" << g << ", expected 0x" << w;
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace

TEST(OpsRounding, Bf16MatchesTheScalarConversionBitwise) { expect_rounding_matches(DType::BF16); }
TEST(OpsRounding, F16MatchesTheScalarConversionBitwise) { expect_rounding_matches(DType::F16); }

TEST(OpsRounding, F32IsANoOpAndOtherDtypesAreRejected) {
  const std::vector<float> values = rounding_cases();
  Tensor x = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  ops::round_to_precision_(x, DType::F32);
  const std::vector<float> got = x.to_float_vector();
  for (std::size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(values[i]));
  // Rounding is idempotent: an already rounded tensor does not change.
  ops::round_to_precision_(x, DType::BF16);
  const std::vector<float> once = x.to_float_vector();
  ops::round_to_precision_(x, DType::BF16);
  const std::vector<float> twice = x.to_float_vector();
  for (std::size_t i = 0; i < once.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(once[i]), std::bit_cast<uint32_t>(twice[i]));
  std::string msg = error_of([&] { ops::round_to_precision_(x, DType::I32); });
  EXPECT_NE(msg.find("precision"), std::string::npos) << msg;
  Tensor h = Tensor::zeros({4}, DType::BF16);
  msg = error_of([&] { ops::round_to_precision_(h, DType::BF16); });
  EXPECT_NE(msg.find("x is bf16"), std::string::npos) << msg;
}

// ---- dropout ------------------------------------------------------------------------------------

TEST(OpsDropout, ZeroProbabilityCopies) {
  Tensor x = random_tensor({1001}, 50), y = Tensor::zeros({1001}, DType::F32);
  ops::dropout_forward(x, y, 0.0f, 1234, 0);
  expect_close(y, to_double(x), 0, 0, "dropout p=0");
}

TEST(OpsDropout, HalfKeptScaledAndBackwardUsesTheSameMask) {
  const int64_t n = 100003;
  Tensor x = random_tensor({n}, 51, 0.5f, 1.5f), y = Tensor::zeros({n}, DType::F32);
  ops::dropout_forward(x, y, 0.5f, 42, 7);
  const Vec xv = to_double(x), yv = to_double(y);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    if (yv[i] != 0.0) {
      kept++;
      EXPECT_EQ(yv[i], 2.0 * xv[i]) << i;  // exact: the scale is a power of two here
    }
  }
  // Binomial(n, 0.5): standard deviation of the fraction is 0.5 / sqrt(n) = 0.0016; 0.01 is 6 sigma.
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 0.5, 0.01);

  Tensor ones = tensor(std::vector<float>(n, 1.0f), {n}), dx = Tensor::zeros({n}, DType::F32);
  ops::dropout_backward(ones, dx, 0.5f, 42, 7);
  const Vec dxv = to_double(dx);
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(dxv[i], yv[i] != 0.0 ? 2.0 : 0.0) << i;

  Tensor all = Tensor::zeros({n}, DType::F32);
  ops::dropout_forward(x, all, 1.0f, 42, 7);
  expect_close(all, Vec(n, 0.0), 0, 0, "dropout p=1");
  EXPECT_NE(error_of([&] { ops::dropout_forward(x, y, 1.5f, 1, 0); }).find("ops::dropout_forward"),
            std::string::npos);
}

TEST(OpsDropout, DeterministicPerSeedAndOffset) {
  const int64_t n = 4099;
  Tensor x = random_tensor({n}, 52, 0.5f, 1.5f);
  Tensor a = Tensor::zeros({n}, DType::F32), b = Tensor::zeros({n}, DType::F32),
         c = Tensor::zeros({n}, DType::F32);
  ops::dropout_forward(x, a, 0.3f, 99, 1000);
  ops::dropout_forward(x, b, 0.3f, 99, 1000);
  ops::dropout_forward(x, c, 0.3f, 100, 1000);
  EXPECT_EQ(a.to_float_vector(), b.to_float_vector());
  const std::vector<float> av = a.to_float_vector(), cv = c.to_float_vector();
  int64_t same = 0;
  for (int64_t i = 0; i < n; i++) same += (av[i] == 0.0f) == (cv[i] == 0.0f);
  // Independent masks agree with probability 0.7^2 + 0.3^2 = 0.58, not 1.
  EXPECT_LT(static_cast<double>(same) / static_cast<double>(n), 0.65);
}

TEST(OpsDropout, SlicingInvariance) {
  const int64_t n = 100;
  Tensor x = random_tensor({n}, 53, 0.5f, 1.5f), y = Tensor::zeros({n}, DType::F32);
  ops::dropout_forward(x, y, 0.5f, 7, 500);
  Tensor xs = x.narrow(0, 10, 10), ys = Tensor::zeros({10}, DType::F32);
  ops::dropout_forward(xs, ys, 0.5f, 7, 510);
  const std::vector<float> full = y.to_float_vector(), part = ys.to_float_vector();
  EXPECT_EQ(part, std::vector<float>(full.begin() + 10, full.begin() + 20));
}

// ---- normalisation ------------------------------------------------------------------------------

namespace {
struct LnRef {
  Vec y, mean, rstd;
};
LnRef layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int64_t rows, int64_t h, double eps) {
  LnRef out{Vec(x.size()), Vec(rows), Vec(rows)};
  for (int64_t r = 0; r < rows; r++) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < h; i++) m += x[r * h + i];
    m /= h;
    for (int64_t i = 0; i < h; i++) v += (x[r * h + i] - m) * (x[r * h + i] - m);
    v /= h;
    const double rs = 1 / std::sqrt(v + eps);
    for (int64_t i = 0; i < h; i++) out.y[r * h + i] = (x[r * h + i] - m) * rs * w[i] + b[i];
    out.mean[r] = m;
    out.rstd[r] = rs;
  }
  return out;
}
struct LnGrad {
  Vec dx, dw, db;
};
LnGrad layernorm_grad_ref(const Vec& dy, const Vec& x, const Vec& w, int64_t rows, int64_t h, double eps) {
  const Vec zero_b(static_cast<size_t>(h), 0.0);
  const LnRef f = layernorm_ref(x, w, zero_b, rows, h, eps);
  LnGrad g{Vec(x.size()), Vec(h), Vec(h)};
  for (int64_t r = 0; r < rows; r++) {
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < h; i++) {
      const double xhat = (x[r * h + i] - f.mean[r]) * f.rstd[r];
      mg += w[i] * dy[r * h + i];
      mgx += w[i] * dy[r * h + i] * xhat;
    }
    mg /= h;
    mgx /= h;
    for (int64_t i = 0; i < h; i++) {
      const double xhat = (x[r * h + i] - f.mean[r]) * f.rstd[r];
      g.dx[r * h + i] = f.rstd[r] * (w[i] * dy[r * h + i] - mg - xhat * mgx);
      g.dw[i] += dy[r * h + i] * xhat;
      g.db[i] += dy[r * h + i];
    }
  }
  return g;
}
Vec plus(const Vec& a, const Vec& b) {
  Vec c(a.size());
  for (size_t i = 0; i < a.size(); i++) c[i] = a[i] + b[i];
  return c;
}
}  // namespace

TEST(OpsNorm, LayerNormForwardBackwardAccumulates) {
  const float eps = 1e-5f;
  for (Shape xs : {Shape{37, 3, 53}, Shape{701, 67}}) {  // the second takes the threaded path
    const int64_t h = xs.back(), rows = shape_numel(xs) / h;
    Tensor x = random_tensor(xs, 60, -2, 3), w = random_tensor({h}, 61), b = random_tensor({h}, 62);
    Tensor y = Tensor::zeros(xs, DType::F32), mean = Tensor::zeros({rows}, DType::F32);
    Tensor rstd = Tensor::zeros({rows}, DType::F32);
    ops::layernorm_forward(x, w, b, y, mean, rstd, eps);
    const LnRef ref = layernorm_ref(to_double(x), to_double(w), to_double(b), rows, h, eps);
    expect_close(y, ref.y, 1e-5, 1e-5, "layernorm y");
    expect_close(mean, ref.mean, 1e-6, 1e-6, "layernorm mean");
    expect_close(rstd, ref.rstd, 1e-6, 1e-5, "layernorm rstd");

    Tensor dy = random_tensor(xs, 63), dx = Tensor::zeros(xs, DType::F32);
    Tensor dw = random_tensor({h}, 64), db = random_tensor({h}, 65);  // non-zero: must ADD
    const Vec dw0 = to_double(dw), db0 = to_double(db);
    ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
    const LnGrad g = layernorm_grad_ref(to_double(dy), to_double(x), to_double(w), rows, h, eps);
    expect_close(dx, g.dx, 1e-5, 1e-4, "layernorm dx");
    // dweight/dbias sum `rows` terms of size ~1 in fp32.
    expect_close(dw, plus(dw0, g.dw), 1e-6 * static_cast<double>(rows), 1e-5, "layernorm dweight");
    expect_close(db, plus(db0, g.db), 1e-6 * static_cast<double>(rows), 1e-5, "layernorm dbias");
  }
}

TEST(OpsNorm, LayerNormReferenceMatchesFiniteDifferences) {
  const int64_t rows = 3, h = 7;
  const double eps = 1e-5;
  const Vec x = to_double(random_tensor({rows, h}, 66, -2, 2)), w = to_double(random_tensor({h}, 67));
  const Vec b = to_double(random_tensor({h}, 68)), dy = to_double(random_tensor({rows, h}, 69));
  const LnGrad g = layernorm_grad_ref(dy, x, w, rows, h, eps);
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    return dot(dy, layernorm_ref(xx, ww, bb, rows, h, eps).y);
  };
  expect_close(g.dx, finite_diff([&](const Vec& v) { return loss(v, w, b); }, x), 1e-6, 1e-6, "FD dx");
  expect_close(g.dw, finite_diff([&](const Vec& v) { return loss(x, v, b); }, w), 1e-6, 1e-6, "FD dweight");
  expect_close(g.db, finite_diff([&](const Vec& v) { return loss(x, w, v); }, b), 1e-6, 1e-6, "FD dbias");
}

TEST(OpsNorm, LayerNormLargeMeanKeepsPrecision) {
  // E[x^2] - E[x]^2 in fp32 would lose everything here (x ~ 1000, spread ~0.01: variance 1e-4 next
  // to x^2 ~ 1e6, below fp32's resolution); two passes keep ~1e-3 relative.
  const int64_t h = 257;
  std::vector<float> xv = random_floats(h, 70, -0.01f, 0.01f);
  for (float& v : xv) v += 1000.0f;
  Tensor x = tensor(xv, {1, h}), w = tensor(std::vector<float>(h, 1.0f), {h}),
         b = Tensor::zeros({h}, DType::F32);
  Tensor y = Tensor::zeros({1, h}, DType::F32), mean = Tensor::zeros({1}, DType::F32),
         rstd = Tensor::zeros({1}, DType::F32);
  ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-12f);
  const LnRef ref = layernorm_ref(to_double(x), to_double(w), to_double(b), 1, h, 1e-12);
  expect_close(rstd, ref.rstd, 0, 1e-2, "layernorm rstd at mean 1000");
}

namespace {
struct RmsRef {
  Vec y, rstd;
};
RmsRef rmsnorm_ref(const Vec& x, const Vec& w, int64_t rows, int64_t h, double eps) {
  RmsRef out{Vec(x.size()), Vec(rows)};
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t i = 0; i < h; i++) ss += x[r * h + i] * x[r * h + i];
    const double rs = 1 / std::sqrt(ss / h + eps);
    for (int64_t i = 0; i < h; i++) out.y[r * h + i] = x[r * h + i] * rs * w[i];
    out.rstd[r] = rs;
  }
  return out;
}
struct RmsGrad {
  Vec dx, dw;
};
RmsGrad rmsnorm_grad_ref(const Vec& dy, const Vec& x, const Vec& w, int64_t rows, int64_t h, double eps) {
  const RmsRef f = rmsnorm_ref(x, w, rows, h, eps);
  RmsGrad g{Vec(x.size()), Vec(h)};
  for (int64_t r = 0; r < rows; r++) {
    const double rs = f.rstd[r];
    double s = 0;
    for (int64_t i = 0; i < h; i++) s += w[i] * dy[r * h + i] * x[r * h + i];
    for (int64_t i = 0; i < h; i++) {
      g.dx[r * h + i] = rs * w[i] * dy[r * h + i] - x[r * h + i] * rs * rs * rs * s / h;
      g.dw[i] += dy[r * h + i] * x[r * h + i] * rs;
    }
  }
  return g;
}
}  // namespace

TEST(OpsNorm, RmsNormForwardBackwardAccumulates) {
  const float eps = 1e-6f;
  for (Shape xs : {Shape{37, 3, 53}, Shape{701, 67}}) {
    const int64_t h = xs.back(), rows = shape_numel(xs) / h;
    Tensor x = random_tensor(xs, 80, -2, 3), w = random_tensor({h}, 81);
    Tensor y = Tensor::zeros(xs, DType::F32), rstd = Tensor::zeros({rows}, DType::F32);
    ops::rmsnorm_forward(x, w, y, rstd, eps);
    const RmsRef ref = rmsnorm_ref(to_double(x), to_double(w), rows, h, eps);
    expect_close(y, ref.y, 1e-5, 1e-5, "rmsnorm y");
    expect_close(rstd, ref.rstd, 1e-6, 1e-5, "rmsnorm rstd");

    Tensor dy = random_tensor(xs, 82), dx = Tensor::zeros(xs, DType::F32), dw = random_tensor({h}, 83);
    const Vec dw0 = to_double(dw);
    ops::rmsnorm_backward(dy, x, w, rstd, dx, dw);
    const RmsGrad g = rmsnorm_grad_ref(to_double(dy), to_double(x), to_double(w), rows, h, eps);
    expect_close(dx, g.dx, 1e-5, 1e-4, "rmsnorm dx");
    expect_close(dw, plus(dw0, g.dw), 1e-6 * static_cast<double>(rows), 1e-5, "rmsnorm dweight");
  }
  const int64_t rows = 3, h = 7;
  const Vec x = to_double(random_tensor({rows, h}, 84, -2, 2)), w = to_double(random_tensor({h}, 85));
  const Vec dy = to_double(random_tensor({rows, h}, 86));
  const RmsGrad g = rmsnorm_grad_ref(dy, x, w, rows, h, 1e-6);
  auto loss = [&](const Vec& xx, const Vec& ww) { return dot(dy, rmsnorm_ref(xx, ww, rows, h, 1e-6).y); };
  expect_close(g.dx, finite_diff([&](const Vec& v) { return loss(v, w); }, x), 1e-6, 1e-6, "rmsnorm FD dx");
  expect_close(g.dw, finite_diff([&](const Vec& v) { return loss(x, v); }, w), 1e-6, 1e-6,
               "rmsnorm FD dweight");
}

TEST(OpsNorm, RejectsMismatchedShapes) {
  Tensor x = random_tensor({5, 7}, 1), w = random_tensor({6}, 2), y = Tensor::zeros({5, 7}, DType::F32);
  Tensor r = Tensor::zeros({5}, DType::F32);
  const std::string msg = error_of([&] { ops::rmsnorm_forward(x, w, y, r, 1e-5f); });
  EXPECT_NE(msg.find("ops::rmsnorm_forward"), std::string::npos) << msg;
  Tensor w7 = random_tensor({7}, 3), r4 = Tensor::zeros({4}, DType::F32);
  EXPECT_NE(error_of([&] { ops::rmsnorm_forward(x, w7, y, r4, 1e-5f); }).find("rstd"), std::string::npos);
}

// ---- rope ---------------------------------------------------------------------------------------

namespace {
// Rotation of the pairs (i, i + d/2) of x = [s, b, heads, d] by sign * angle.
Vec rope_ref(const Vec& x, int64_t s, int64_t bh, int64_t d, int64_t offset, double theta, double sign) {
  Vec y = x;
  const int64_t half = d / 2;
  for (int64_t p = 0; p < s; p++)
    for (int64_t v = 0; v < bh; v++)
      for (int64_t i = 0; i < half; i++) {
        const double angle = sign * static_cast<double>(offset + p) * std::pow(theta, -2.0 * i / d);
        const int64_t base = (p * bh + v) * d;
        const double x1 = x[base + i], x2 = x[base + i + half];
        y[base + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
        y[base + i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
  return y;
}
}  // namespace

TEST(OpsRope, ForwardBackwardAndAdjoint) {
  const int64_t s = 7, b = 3, heads = 5, d = 12, offset = 11;
  const float theta = 10000.0f;
  const Shape xs{s, b, heads, d};
  Tensor x = random_tensor(xs, 90);
  const Vec xv = to_double(x);
  ops::rope_forward(x, offset, theta);
  // Angles up to 17 rad: a float cos/sin of them is within ~1e-6.
  expect_close(x, rope_ref(xv, s, b * heads, d, offset, theta, 1), 3e-6, 1e-6, "rope_forward");
  Tensor dy = random_tensor(xs, 91);
  const Vec dyv = to_double(dy);
  ops::rope_backward(dy, offset, theta);
  expect_close(dy, rope_ref(dyv, s, b * heads, d, offset, theta, -1), 3e-6, 1e-6, "rope_backward");
  // rope is linear, y = R x, so its backward must be R^T: <R x, dy> == <x, R^T dy>. This is the
  // finite-difference check made exact (the directional derivative of a linear map is the map).
  EXPECT_NEAR(dot(rope_ref(xv, s, b * heads, d, offset, theta, 1), dyv), dot(xv, to_double(dy)), 1e-4);
  ops::rope_forward(dy, offset, theta);  // backward then forward: identity
  expect_close(dy, dyv, 3e-6, 1e-6, "rope forward(backward(x)) == x");
  Tensor odd = Tensor::zeros({2, 1, 1, 5}, DType::F32);
  EXPECT_NE(error_of([&] { ops::rope_forward(odd, 0, theta); }).find("d even"), std::string::npos);
}

TEST(OpsRope, LargeThreadedTensor) {
  const int64_t s = 129, b = 2, heads = 4, d = 64, offset = 4000;
  Tensor x = random_tensor({s, b, heads, d}, 92);
  const Vec xv = to_double(x);
  ops::rope_forward(x, offset, 10000.0f);
  // Angles up to ~4100 rad: float cos/sin of a double angle rounded to fp32 results, ~1e-7.
  expect_close(x, rope_ref(xv, s, b * heads, d, offset, 10000.0, 1), 3e-6, 1e-6, "rope large");
}

// Linear scaling by 2 reads position p as p / 2: rows at even positions 2p of a scaled rope equal
// rows at positions p of the unscaled one (an identity of the rotation, not a second formula).
TEST(OpsRope, LinearScalingHalvesThePositions) {
  const int64_t s = 9, b = 2, heads = 3, d = 8, offset = 5;
  Tensor y = random_tensor({s, b, heads, d}, 93);
  // x's row r sits at position 2 * offset - 1 + r, so row 2p + 1 at 2 (offset + p); the other rows are 0.
  Tensor x = Tensor::zeros({2 * s, b, heads, d}, DType::F32);
  const Rope linear(10000.0, RopeScaling{.type = RopeScalingType::Linear, .factor = 2.0});
  const int64_t x_offset = 2 * offset - 1;
  for (int64_t p = 0; p < s; p++) x.narrow(0, 2 * p + 1, 1).copy_(y.narrow(0, p, 1));
  ops::rope_forward(x, x_offset, linear);
  ops::rope_forward(y, offset, 10000.0);
  for (int64_t p = 0; p < s; p++)
    expect_close(x.narrow(0, 2 * p + 1, 1).contiguous(), to_double(y.narrow(0, p, 1).contiguous()), 1e-6,
                 1e-6, "linear scaling");
}

// Llama 3's bands (head dim 8, theta 1e4: wavelengths 6.3, 63, 628, 6283; original context 256 with
// high_freq_factor 32 and low_freq_factor 1: kept below 8, divided above 256, blended between).
TEST(OpsRope, Llama3ScalingBands) {
  const Rope plain(10000.0);
  const Rope llama3(10000.0, RopeScaling{.type = RopeScalingType::Llama3,
                                         .factor = 8.0,
                                         .low_freq_factor = 1.0,
                                         .high_freq_factor = 32.0,
                                         .original_max_position_embeddings = 256.0});
  EXPECT_DOUBLE_EQ(rope_inv_freq(llama3, 0, 8), rope_inv_freq(plain, 0, 8));
  EXPECT_DOUBLE_EQ(rope_inv_freq(llama3, 2, 8), rope_inv_freq(plain, 2, 8) / 8.0);
  EXPECT_DOUBLE_EQ(rope_inv_freq(llama3, 3, 8), rope_inv_freq(plain, 3, 8) / 8.0);
  const double f = rope_inv_freq(plain, 1, 8), smooth = (256.0 * f / (2.0 * M_PI) - 1.0) / (32.0 - 1.0);
  EXPECT_NEAR(rope_inv_freq(llama3, 1, 8), (1.0 - smooth) * f / 8.0 + smooth * f, 1e-15);
  EXPECT_GT(rope_inv_freq(llama3, 1, 8), f / 8.0);
  EXPECT_LT(rope_inv_freq(llama3, 1, 8), f);
  Tensor x = Tensor::zeros({2, 1, 1, 8}, DType::F32);
  const Rope bad(
      10000.0, RopeScaling{.type = RopeScalingType::Llama3, .low_freq_factor = 4.0, .high_freq_factor = 1.0});
  EXPECT_NE(error_of([&] { ops::rope_forward(x, 0, bad); }).find("low_freq_factor"), std::string::npos);
}

// ---- embedding ----------------------------------------------------------------------------------

TEST(OpsEmbedding, ForwardZeroesForeignIdsBackwardAccumulates) {
  for (int64_t h : {7, 301}) {  // 37 * 3 * 301 takes the threaded path
    const int64_t b = 3, s = 37, rows = 11, vocab_start = 7;
    std::mt19937 gen(100);
    std::uniform_int_distribution<int32_t> id(0, 24);  // ids below, inside and above [7, 18)
    std::vector<int32_t> tok(static_cast<size_t>(b * s));
    for (int32_t& t : tok) t = id(gen);
    Tensor tokens = Tensor::from_vector(tok, {b, s}), w = random_tensor({rows, h}, 101);
    Tensor out = random_tensor({s, b, h}, 102);  // garbage that must be overwritten
    ops::embedding_forward(tokens, w, vocab_start, out);
    const Vec wv = to_double(w);
    Vec want(static_cast<size_t>(s * b * h), 0.0);
    for (int64_t si = 0; si < s; si++)
      for (int64_t bi = 0; bi < b; bi++) {
        const int64_t local = tok[bi * s + si] - vocab_start;
        if (local >= 0 && local < rows)
          for (int64_t j = 0; j < h; j++) want[(si * b + bi) * h + j] = wv[local * h + j];
      }
    expect_close(out, want, 0, 0, "embedding_forward");

    Tensor dout = random_tensor({s, b, h}, 103), dw = random_tensor({rows, h}, 104);
    Vec dwant = to_double(dw);  // starts non-zero: must ADD
    const Vec dv = to_double(dout);
    for (int64_t si = 0; si < s; si++)
      for (int64_t bi = 0; bi < b; bi++) {
        const int64_t local = tok[bi * s + si] - vocab_start;
        if (local >= 0 && local < rows)
          for (int64_t j = 0; j < h; j++) dwant[local * h + j] += dv[(si * b + bi) * h + j];
      }
    ops::embedding_backward(tokens, dout, vocab_start, dw);
    expect_close(dw, dwant, 1e-5, 1e-6, "embedding_backward");  // ~10 repeats of each id
  }
  Tensor tokens = Tensor::zeros({2, 3}, DType::I32), w = random_tensor({4, 5}, 1);
  Tensor wrong = Tensor::zeros({2, 3, 5}, DType::F32);  // [b, s, h] instead of [s, b, h]
  const std::string msg = error_of([&] { ops::embedding_forward(tokens, w, 0, wrong); });
  EXPECT_NE(msg.find("[s, b, h]"), std::string::npos) << msg;
  Tensor ftok = Tensor::zeros({2, 3}, DType::F32), out = Tensor::zeros({3, 2, 5}, DType::F32);
  EXPECT_NE(error_of([&] { ops::embedding_forward(ftok, w, 0, out); }).find("tokens"), std::string::npos);
}

// ---- cross-entropy ------------------------------------------------------------------------------

namespace {
// Loss per row over the first vocab_size columns of logits [n, width]; gradient of
// sum_i g_i loss_i (zero on padding columns).
struct CeRef {
  Vec loss, dlogits;
};
CeRef cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, const Vec& g, int64_t n,
                        int64_t width, int64_t vocab_size) {
  CeRef r{Vec(n), Vec(logits.size(), 0.0)};
  for (int64_t i = 0; i < n; i++) {
    const double* l = logits.data() + i * width;
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < vocab_size; j++) m = std::max(m, l[j]);
    for (int64_t j = 0; j < vocab_size; j++) sum += std::exp(l[j] - m);
    r.loss[i] = std::log(sum) + m - l[targets[i]];
    for (int64_t j = 0; j < vocab_size; j++)
      r.dlogits[i * width + j] = g[i] * (std::exp(l[j] - m) / sum - (j == targets[i] ? 1.0 : 0.0));
  }
  return r;
}

// Slices columns [start, start + width) of a row-major [n, total] tensor into a contiguous tensor.
Tensor column_slice(const Tensor& t, int64_t start, int64_t width) {
  return t.narrow(1, start, width).contiguous();
}

// Runs the three CE pieces on column ranges (each a simulated rank's shard), combining across
// ranges by hand as the vocab-parallel all-reduces would (max of row_max, sums of target_logit and
// sum_exp). Returns the loss per row and the gradient reassembled into [n, total] columns.
struct CeResult {
  Vec loss, dlogits;
};
CeResult cross_entropy_ranks(const Tensor& logits, const Tensor& targets, const Tensor& g, int64_t vocab_size,
                             const std::vector<int64_t>& widths) {
  const int64_t n = logits.size(0), total = logits.size(1);
  std::vector<Tensor> shards;
  std::vector<int64_t> starts;
  for (int64_t start = 0; int64_t w : widths) {
    shards.push_back(column_slice(logits, start, w));
    starts.push_back(start);
    start += w;
  }
  Vec row_max(n, -std::numeric_limits<double>::infinity()), target_logit(n, 0.0), sum_exp(n, 0.0);
  for (size_t r = 0; r < shards.size(); r++) {
    Tensor m = Tensor::zeros({n}, DType::F32), tl = Tensor::zeros({n}, DType::F32);
    ops::cross_entropy_local_stats(shards[r], targets, starts[r], vocab_size, m, tl);
    const Vec mv = to_double(m), tv = to_double(tl);
    for (int64_t i = 0; i < n; i++) {
      row_max[i] = std::max(row_max[i], mv[i]);
      target_logit[i] += tv[i];
    }
  }
  std::vector<float> max_f(row_max.begin(), row_max.end());
  Tensor global_max = tensor(max_f, {n});
  for (size_t r = 0; r < shards.size(); r++) {
    Tensor se = Tensor::zeros({n}, DType::F32);
    ops::cross_entropy_sum_exp(shards[r], global_max, starts[r], vocab_size, se);
    const Vec sv = to_double(se);
    for (int64_t i = 0; i < n; i++) sum_exp[i] += sv[i];
  }
  std::vector<float> sum_f(sum_exp.begin(), sum_exp.end());
  Tensor global_sum = tensor(sum_f, {n});
  CeResult out{Vec(n), Vec(static_cast<size_t>(n * total))};
  for (int64_t i = 0; i < n; i++) out.loss[i] = std::log(sum_exp[i]) + row_max[i] - target_logit[i];
  for (size_t r = 0; r < shards.size(); r++) {
    const int64_t w = shards[r].size(1);
    Tensor d = random_tensor({n, w}, 7);  // garbage that must be overwritten
    ops::cross_entropy_backward(shards[r], targets, global_max, global_sum, g, starts[r], vocab_size, d);
    const Vec dv = to_double(d);
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < w; j++) out.dlogits[i * total + starts[r] + j] = dv[i * w + j];
  }
  return out;
}
}  // namespace

TEST(OpsCrossEntropy, PiecesAssembleTheLossOnOneAndSeveralRanks) {
  const int64_t n = 37, vocab_size = 101, padded = 112;  // padded to 2 ranks x 56 columns
  std::vector<float> lv = random_floats(n * padded, 110, -4.0f, 4.0f);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = vocab_size; j < padded; j++) lv[i * padded + j] = 50.0f;  // junk that would dominate
  Tensor logits = tensor(lv, {n, padded});
  std::mt19937 gen(111);
  std::uniform_int_distribution<int32_t> id(0, vocab_size - 1);
  std::vector<int32_t> tv(n);
  for (int32_t& t : tv) t = id(gen);
  tv[0] = 0;
  tv[1] = vocab_size - 1;  // the first and last real columns
  Tensor targets = Tensor::from_vector(tv, {n}), g = random_tensor({n}, 112, 0.1f, 1.0f);
  const CeRef ref = cross_entropy_ref(to_double(logits), tv, to_double(g), n, padded, vocab_size);

  // {112}: one rank with all columns; {56, 56}: two ranks; {50, 51, 11}: the last rank holds
  // only padding (vocab_start 101 == vocab_size), so its row_max is -inf and its sums 0.
  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{112}, std::vector<int64_t>{56, 56}, std::vector<int64_t>{50, 51, 11}}) {
    const std::string what = "cross-entropy with " + std::to_string(widths.size()) + " column ranges";
    const CeResult r = cross_entropy_ranks(logits, targets, g, vocab_size, widths);
    // log-sum-exp over 101 terms in fp32: ~1e-6 relative on losses of ~5.
    expect_close(r.loss, ref.loss, 1e-5, 1e-5, what + " loss");
    expect_close(r.dlogits, ref.dlogits, 1e-6, 1e-5, what + " dlogits");
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = vocab_size; j < padded; j++) ASSERT_EQ(r.dlogits[i * padded + j], 0.0) << what;
  }
}

TEST(OpsCrossEntropy, ReferenceGradientMatchesFiniteDifferences) {
  const int64_t n = 3, width = 9, vocab_size = 7;
  const Vec logits = to_double(random_tensor({n, width}, 120, -3, 3)), g = {0.5, 1.0, 0.25};
  const std::vector<int32_t> targets = {2, 0, 6};
  const CeRef ref = cross_entropy_ref(logits, targets, g, n, width, vocab_size);
  const Vec fd = finite_diff(
      [&](const Vec& l) {
        const CeRef r = cross_entropy_ref(l, targets, g, n, width, vocab_size);
        return dot(g, r.loss);
      },
      logits);
  expect_close(ref.dlogits, fd, 1e-6, 1e-6,
               "cross-entropy reference vs finite differences");  // padding: 0 both
}

TEST(OpsCrossEntropy, LargeLogitsDoNotOverflowAndShapesAreChecked) {
  const int64_t n = 5, v = 2001;  // threaded, and exp(1000) would overflow without the max
  const std::vector<int32_t> tv = {0, 5, 17, 2000, 1000};
  Tensor logits = random_tensor({n, v}, 130, 990.0f, 1000.0f), targets = Tensor::from_vector(tv, {n});
  Tensor g = tensor(std::vector<float>(n, 1.0f), {n});
  const CeRef ref = cross_entropy_ref(to_double(logits), tv, to_double(g), n, v, v);
  const CeResult r = cross_entropy_ranks(logits, targets, g, v, {v});
  expect_close(r.loss, ref.loss, 1e-4, 1e-5, "cross-entropy large logits");
  Tensor m = Tensor::zeros({n + 1}, DType::F32), tl = Tensor::zeros({n}, DType::F32);
  const std::string msg = error_of([&] { ops::cross_entropy_local_stats(logits, targets, 0, v, m, tl); });
  EXPECT_NE(msg.find("row_max"), std::string::npos) << msg;
}

// ---- reductions ---------------------------------------------------------------------------------

TEST(OpsReduce, SumOfSquaresInDouble) {
  const int64_t n = 100003;
  Tensor x = random_tensor({n}, 140, -3, 3);
  double want = 0;
  for (float v : x.to_float_vector()) want += static_cast<double>(v) * v;
  EXPECT_NEAR(ops::sum_of_squares(x), want, 1e-12 * want);
  EXPECT_EQ(ops::sum_of_squares(Tensor::zeros({0}, DType::F32)), 0.0);
  // 1 + 2e-8: a float accumulator rounds the small squares away.
  EXPECT_NEAR(ops::sum_of_squares(tensor({1.0f, 1e-4f, 1e-4f}, {3})), 1.00000002, 1e-12);
}
