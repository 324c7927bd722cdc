#pragma once
// The machinery of the op table (tests/common/op_cases.hpp, run by tests/unit/test_backend_ops.cpp),
// in the spirit of ggml's test-backend-ops: a row is one op at one activation dtype and one shape,
// with a function that runs it through the public parallel::ops API on a device and an fp64
// reference, and the tolerance the row is held to. See docs/ops.md.
//
// Everything is compared as doubles: an op's outputs are read back to the host and widened, the
// reference is computed in double on the (widened) inputs and rounded to each output's dtype with
// round_to below, which is written here from scratch (not dtype.hpp's conversions) so the library's
// own narrowing is under test too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "parallel/device.hpp"
#include "parallel/dtype.hpp"
#include "parallel/tensor.hpp"

namespace parallel::testing::op_table {

// ---- 16-bit arithmetic, from first principles -------------------------------------------------

struct FloatFormat {
  int mantissa_bits;  // including the implicit bit: fp32 24, fp16 11, bf16 8
  int min_exp;        // exponent of the smallest normal: fp32/bf16 -126, fp16 -14
  double max;         // largest finite value
};

inline FloatFormat format_of(DType dt) {
  switch (dt) {
    case DType::BF16:
      return {8, -126, 3.3895313892515355e38};
    case DType::F16:
      return {11, -14, 65504.0};
    default:
      return {24, -126, static_cast<double>(std::numeric_limits<float>::max())};
  }
}

// The spacing of `dt`'s values at |x| (for x = 0: the smallest subnormal).
inline double ulp(double x, DType dt) {
  const FloatFormat f = format_of(dt);
  const double a = std::fabs(x);
  int e = f.min_exp;
  if (a > 0 && std::isfinite(a)) e = std::max(f.min_exp, std::ilogb(a));
  return std::ldexp(1.0, e - (f.mantissa_bits - 1));
}

// x rounded to the nearest value of `dt`, ties to even (the default rounding mode of nearbyint);
// subnormals kept, overflow to +-inf, NaN stays NaN.
inline double round_to(double x, DType dt) {
  if (!std::isfinite(x) || x == 0) return x;
  if (dt == DType::F32) return static_cast<double>(static_cast<float>(x));
  const double q = ulp(x, dt);
  const double r = std::nearbyint(x / q) * q;
  return std::fabs(r) > format_of(dt).max ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

// ---- outputs and tolerances -------------------------------------------------------------------

// One output of an op as doubles, with the dtype it is stored in (which sets its ulp).
struct Output {
  std::string name;
  DType dtype = DType::F32;
  std::vector<double> v;
};
using Outputs = std::vector<Output>;

inline std::vector<double> values(const Tensor& t) {
  const std::vector<float> f = t.to_float_vector();  // reads a device tensor back to the host
  return {f.begin(), f.end()};
}
inline Output output(std::string name, const Tensor& t) { return {std::move(name), t.dtype(), values(t)}; }

// A reference output: exact values rounded to the output's dtype.
inline Output rounded(std::string name, DType dt, std::vector<double> exact) {
  for (double& x : exact) x = round_to(x, dt);
  return {std::move(name), dt, std::move(exact)};
}

// Element i passes when |got - want| <= ulps * ulp(want, dtype) + rel * max_j |want_j|.
// `ulps` is measured in each output's own dtype (a 16-bit y, an fp32 rstd); `rel` is relative to
// the largest reference value of that output, for results that are small through cancellation
// (sums, dot products). {0, 0} demands bitwise equality.
struct Tol {
  double ulps = 0;
  double rel = 0;
  std::string str() const {
    if (ulps == 0 && rel == 0) return "bitwise";
    std::string s;
    if (ulps != 0) s = fmt::format("{:g} ulp", ulps);
    if (rel != 0) s += fmt::format("{}{:.0e} rel", s.empty() ? "" : " + ", rel);
    return s;
  }
};

struct Verdict {
  bool ok = true;
  double worst = 0;    // the largest |got - want| / allowed (<= 1 passes; inf where allowed is 0)
  std::string detail;  // the worst element, when it fails
};

inline Verdict compare(const Outputs& got, const Outputs& want, const Tol& tol) {
  Verdict r;
  if (got.size() != want.size()) return {false, INFINITY, fmt::format("{} outputs, expected {}", got.size(), want.size())};
  for (size_t o = 0; o < want.size(); o++) {
    const Output &g = got[o], &w = want[o];
    if (g.v.size() != w.v.size()) {
      r = {false, INFINITY, fmt::format("{}: {} values, expected {}", w.name, g.v.size(), w.v.size())};
      return r;
    }
    double scale = 0;
    for (double x : w.v)
      if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
    for (size_t i = 0; i < w.v.size(); i++) {
      const double a = g.v[i], e = w.v[i];
      if (a == e || (std::isnan(a) && std::isnan(e))) continue;
      const double allowed = tol.ulps * ulp(e, w.dtype) + tol.rel * scale;
      const double err = std::fabs(a - e);
      const double ratio = std::isnan(err) ? INFINITY : (allowed > 0 ? err / allowed : INFINITY);
      if (ratio > r.worst) {
        r.worst = ratio;
        if (ratio > 1) {
          r.ok = false;
          r.detail = fmt::format("{}[{}] = {:.9g}, expected {:.9g} (diff {:.3g} = {:.3g} ulp of {}; tolerance {})",
                                 w.name, i, a, e, err, err / ulp(e, w.dtype), dtype_name(w.dtype), tol.str());
        }
      }
    }
  }
  return r;
}

// ---- rows -------------------------------------------------------------------------------------

// One invocation of an op, prepared (inputs built and moved) on a device.
struct Prepared {
  std::function<void()> launch;      // runs the op on the prepared tensors (again, in speed mode)
  std::function<Outputs()> outputs;  // its outputs, read back to the host
  double bytes = 0;                  // bytes one launch reads and writes (speed mode: GB/s)
  double flops = 0;                  // floating-point operations of one launch (GFLOP/s), 0 if not counted
};

struct Row {
  std::string op;          // the parallel::ops function
  DType dtype;             // the activation dtype
  std::string shape;       // what the row runs on, in words
  std::string fixed;       // the arguments that are not activations and their dtypes (per the contract)
  Tol tol;                 // the CPU against the fp64 reference
  Tol cuda_tol;            // CUDA against the CPU
  std::function<Prepared(Device)> prepare;
  std::function<Outputs()> reference;  // empty in the speed table
  std::string name() const { return fmt::format("{} {} {}", op, dtype_name(dtype), shape); }
};

// A wrong dtype combination that the op must refuse with a parallel::Error naming the op and the
// argument: the message must contain "ops::<op>" and "<arg> is".
struct Rejection {
  std::string op;
  std::string arg;
  std::string what;  // the combination, in words
  std::function<void()> call;
};

// ---- deterministic inputs ---------------------------------------------------------------------

inline std::vector<float> uniform_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}
// Uniform values in [lo, hi) stored in dt (rounded by the library's conversion; the references read
// the stored values back).
inline Tensor uniform(const Shape& shape, DType dt, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return Tensor::from_floats(uniform_floats(shape_numel(shape), seed, lo, hi), shape, dt);
}
inline Tensor int_tensor(const Shape& shape, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(shape_numel(shape)));
  for (int32_t& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape);
}
inline std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return {p, p + t.numel()};
}
// t on `device` (a copy there; the CPU gets its own clone, since ops write their arguments).
inline Tensor on(const Tensor& t, Device device) { return device.is_cpu() ? t.clone() : t.to(device); }

}  // namespace parallel::testing::op_table
