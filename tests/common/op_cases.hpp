#pragma once
// The op table: every parallel::ops op x activation dtype x a few shapes, each with its fp64
// reference and its tolerance (docs/ops.md, "The op table"). op_rows() at the bottom is the table
// itself, one line per row; the builders above it say, per op, which tensors the op touches, how
// they are made (deterministic random values), how the op is called and what the exact result is.
//
// References: plain loops in double on the inputs as stored (16-bit inputs widened), rounded to each
// output's dtype (op_table.hpp's round_to). Statistics and parameter gradients are fp32 per the
// contract of include/parallel/ops.hpp, so their references are rounded to fp32 whatever the row's
// dtype. Inputs that an op takes from an earlier op (norm statistics, attention's out and lse,
// cross-entropy's row_max and sum_exp) are computed here in double and stored in their contract
// dtype, so each row tests one op.
//
// Tolerances, the reasoning behind the numbers in the table:
//   bitwise        one rounding of an exact result (copies, max, selection, a*s or a+b in fp32,
//                  fp32 weights written to a 16-bit output).
//   1 ulp          16-bit outputs of element-wise math: the kernel computes in fp32 and rounds once;
//                  an fp32 value within a few fp32 ulps of exact can round to the other 16-bit
//                  neighbour, never further.
//   n ulp (fp32)   fp32 outputs of transcendental math (exp, tanh/sigmoid): a few fp32 ulps.
//   rel            results of sums (GEMM, norms, softmax, attention, parameter gradients), relative
//                  to the largest reference value of that output: fp32 accumulation error
//                  ~ sqrt(K) * 6e-8; small values that come from cancellation get no ulp bound.
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "op_table.hpp"
#include "parallel/ops.hpp"

namespace parallel::testing::op_table {

using V = std::vector<double>;
using Tensors = std::vector<Tensor>;

// What a builder describes; row() turns it into a Row.
struct Spec {
  std::function<Tensors()> make;                     // every tensor the op touches, on the CPU
  std::function<void(Tensors&)> call;                // the op on them (on any device)
  std::function<Outputs(const Tensors&)> read;       // its outputs
  std::function<Outputs(const Tensors&)> reference;  // the exact outputs, from make()'s tensors
  double flops = 0;
};

// read() for outputs that are tensors: (index into the tensors, name).
inline std::function<Outputs(const Tensors&)> outs(std::vector<std::pair<int, std::string>> which) {
  return [which](const Tensors& t) {
    Outputs o;
    for (const auto& [i, name] : which) o.push_back(output(name, t[static_cast<size_t>(i)]));
    return o;
  };
}

inline Row row(std::string op, DType dt, std::string shape, std::string fixed, Tol tol, Tol cuda_tol,
               Spec s) {
  Row r{std::move(op), dt, std::move(shape), std::move(fixed), tol, cuda_tol, {}, {}};
  r.prepare = [s](Device d) {
    Tensors t = s.make();
    double bytes = 0;
    for (Tensor& x : t) {
      x = on(x, d);
      bytes += static_cast<double>(x.nbytes());
    }
    Prepared run;
    run.launch = [t, call = s.call]() mutable { call(t); };
    run.outputs = [t, read = s.read] { return read(t); };
    run.bytes = bytes;
    run.flops = s.flops;
    return run;
  };
  r.reference = [s] { return s.reference(s.make()); };
  return r;
}

// The CUDA tolerance when a row states none: the CPU's, one ulp and twice the relative part wider
// (two fp32 implementations that may each round differently).
inline Tol cuda_default(Tol t) { return {t.ulps + 1, t.rel * 2}; }

inline std::string dims(const Shape& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); i++) r += (i ? "x" : "") + std::to_string(s[i]);
  return r;
}
inline const char* dn(DType d) { return dtype_name(d).data(); }
inline int64_t rows_of(const Shape& s) { return shape_numel(s) / s.back(); }

// ---- dense algebra ----------------------------------------------------------------------------

struct GemmShape {
  int64_t m, k, n;
  bool ta = false, tb = false;
  float alpha = 1.0f, beta = 0.0f;
};

inline Row gemm(DType dt, GemmShape g, DType c_dt, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform(g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, dt, 11),
                   uniform(g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, dt, 12), uniform({g.m, g.n}, c_dt, 13)};
  };
  s.call = [=](Tensors& t) { ops::gemm(t[0], g.ta, t[1], g.tb, t[2], g.alpha, g.beta); };
  s.read = outs({{2, "c"}});
  s.reference = [=](const Tensors& t) {
    const V A = values(t[0]), B = values(t[1]), C = values(t[2]);
    V c(static_cast<size_t>(g.m * g.n));
    for (int64_t i = 0; i < g.m; i++)
      for (int64_t j = 0; j < g.n; j++) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; p++)
          acc += A[g.ta ? p * g.m + i : i * g.k + p] * B[g.tb ? j * g.k + p : p * g.n + j];
        c[i * g.n + j] = g.alpha * acc + (g.beta != 0 ? g.beta * C[i * g.n + j] : 0.0);
      }
    return Outputs{rounded("c", c_dt, c)};
  };
  s.flops = 2.0 * g.m * g.n * g.k;
  return row("gemm", dt,
             fmt::format("{}x{}x{} {}{} alpha {} beta {}", g.m, g.k, g.n, g.ta ? "t" : "n", g.tb ? "t" : "n",
                         g.alpha, g.beta),
             fmt::format("c {}", dn(c_dt)), tol, cuda_default(tol), s);
}

// c = op(a) op(b) + bias (bias [N] fp32 or the activation dtype; c the activation dtype), the bias
// added before c's single rounding.
inline Row gemm_bias(DType dt, GemmShape g, DType bias_dt, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform(g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, dt, 14),
                   uniform(g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, dt, 15), uniform({g.n}, bias_dt, 16),
                   uniform({g.m, g.n}, dt, 17)};
  };
  s.call = [=](Tensors& t) { ops::gemm_bias(t[0], g.ta, t[1], g.tb, t[2], t[3]); };
  s.read = outs({{3, "c"}});
  s.reference = [=](const Tensors& t) {
    const V A = values(t[0]), B = values(t[1]), bias = values(t[2]);
    V c(static_cast<size_t>(g.m * g.n));
    for (int64_t i = 0; i < g.m; i++)
      for (int64_t j = 0; j < g.n; j++) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; p++)
          acc += A[g.ta ? p * g.m + i : i * g.k + p] * B[g.tb ? j * g.k + p : p * g.n + j];
        c[i * g.n + j] = acc + bias[j];
      }
    return Outputs{rounded("c", dt, c)};
  };
  s.flops = 2.0 * g.m * g.n * g.k;
  return row("gemm_bias", dt, fmt::format("{}x{}x{} {}{}", g.m, g.k, g.n, g.ta ? "t" : "n", g.tb ? "t" : "n"),
             fmt::format("bias {}", dn(bias_dt)), tol, cuda_default(tol), s);
}

// y [..., h] += bias [h] (bias fp32 or the activation dtype).
inline Row add_bias(DType dt, Shape shape, DType bias_dt, Tol tol) {
  Spec s;
  const int64_t h = shape.back();
  s.make = [=] { return Tensors{uniform(shape, dt, 21), uniform({h}, bias_dt, 22)}; };
  s.call = [](Tensors& t) { ops::add_bias(t[0], t[1]); };
  s.read = outs({{0, "y"}});
  s.reference = [=](const Tensors& t) {
    V y = values(t[0]);
    const V b = values(t[1]);
    for (size_t i = 0; i < y.size(); i++) y[i] += b[i % static_cast<size_t>(h)];
    return Outputs{rounded("y", dt, y)};
  };
  return row("add_bias", dt, dims(shape), fmt::format("bias {}", dn(bias_dt)), tol, cuda_default(tol), s);
}

// dbias [h] (fp32) += column sums of dy.
inline Row bias_backward(DType dt, Shape shape, Tol tol) {
  Spec s;
  const int64_t h = shape.back();
  s.make = [=] { return Tensors{uniform(shape, dt, 31), uniform({h}, DType::F32, 32)}; };
  s.call = [](Tensors& t) { ops::bias_backward(t[0], t[1]); };
  s.read = outs({{1, "dbias"}});
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]);
    V db = values(t[1]);
    for (size_t i = 0; i < dy.size(); i++) db[i % static_cast<size_t>(h)] += dy[i];
    return Outputs{rounded("dbias", DType::F32, db)};
  };
  return row("bias_backward", dt, dims(shape), "dbias fp32", tol, cuda_default(tol), s);
}

// ---- element-wise -----------------------------------------------------------------------------

inline Row add(DType dt, Shape shape, Tol tol) {
  Spec s;
  s.make = [=] { return Tensors{uniform(shape, dt, 41), uniform(shape, dt, 42), uniform(shape, dt, 43)}; };
  s.call = [](Tensors& t) { ops::add(t[0], t[1], t[2]); };
  s.read = outs({{2, "out"}});
  s.reference = [=](const Tensors& t) {
    V a = values(t[0]);
    const V b = values(t[1]);
    for (size_t i = 0; i < a.size(); i++) a[i] += b[i];
    return Outputs{rounded("out", dt, a)};
  };
  return row("add", dt, dims(shape), "-", tol, cuda_default(tol), s);
}

inline Row add_inplace(DType dt, Shape shape, Tol tol) {
  Spec s;
  s.make = [=] { return Tensors{uniform(shape, dt, 44), uniform(shape, dt, 45)}; };
  s.call = [](Tensors& t) { ops::add_(t[0], t[1]); };
  s.read = outs({{0, "a"}});
  s.reference = [=](const Tensors& t) {
    V a = values(t[0]);
    const V b = values(t[1]);
    for (size_t i = 0; i < a.size(); i++) a[i] += b[i];
    return Outputs{rounded("a", dt, a)};
  };
  return row("add_", dt, dims(shape), "-", tol, cuda_default(tol), s);
}

inline Row scale_inplace(DType dt, Shape shape, Tol tol) {
  constexpr float alpha = 0.37f;
  Spec s;
  s.make = [=] { return Tensors{uniform(shape, dt, 46)}; };
  s.call = [](Tensors& t) { ops::scale_(t[0], alpha); };
  s.read = outs({{0, "a"}});
  s.reference = [=](const Tensors& t) {
    V a = values(t[0]);
    for (double& x : a) x *= static_cast<double>(alpha);
    return Outputs{rounded("a", dt, a)};
  };
  return row("scale_", dt, dims(shape), "alpha 0.37", tol, cuda_default(tol), s);
}

// round_to_precision_ on an fp32 tensor; the row's dtype is the precision. Values span fp16's
// subnormals to beyond its range, plus exact ties.
inline Row round_to_precision(DType precision, int64_t n) {
  Spec s;
  s.make = [=] {
    std::vector<float> v = uniform_floats(n, 51);
    const std::vector<float> e = uniform_floats(n, 52, -30.0f, 18.0f);
    for (int64_t i = 0; i < n; i++) v[i] = std::ldexp(v[i], static_cast<int>(std::floor(e[i])));
    // Ties: halfway between neighbours in bf16 and in fp16, odd and even.
    const float ties[] = {
        1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(2.0f + 0x1p-7f),
        65520.0f,       65519.0f,           0x1p-25f,        0x1.8p-24f,          0.0f};
    for (size_t i = 0; i < std::size(ties) && i < v.size(); i++) v[i] = ties[i];
    return Tensors{Tensor::from_floats(v, {n}, DType::F32)};
  };
  s.call = [=](Tensors& t) { ops::round_to_precision_(t[0], precision); };
  s.read = outs({{0, "x"}});
  s.reference = [=](const Tensors& t) {
    V x = values(t[0]);
    for (double& y : x) y = round_to(y, precision);
    return Outputs{{"x", DType::F32, x}};
  };
  return row("round_to_precision_", precision, std::to_string(n), "x fp32", {}, {}, s);
}

inline double gelu_exact(double x) {
  const double c = std::sqrt(2.0 / M_PI), u = c * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
inline double gelu_grad(double x) {
  const double c = std::sqrt(2.0 / M_PI), u = c * (x + 0.044715 * x * x * x), th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3 * 0.044715 * x * x);
}

inline Row gelu_forward(DType dt, Shape shape, Tol tol) {
  Spec s;
  s.make = [=] { return Tensors{uniform(shape, dt, 61, -5.0f, 5.0f), uniform(shape, dt, 62)}; };
  s.call = [](Tensors& t) { ops::gelu_forward(t[0], t[1]); };
  s.read = outs({{1, "y"}});
  s.reference = [=](const Tensors& t) {
    V x = values(t[0]);
    for (double& v : x) v = gelu_exact(v);
    return Outputs{rounded("y", dt, x)};
  };
  return row("gelu_forward", dt, dims(shape), "-", tol, cuda_default(tol), s);
}

inline Row gelu_backward(DType dt, Shape shape, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform(shape, dt, 63), uniform(shape, dt, 64, -5.0f, 5.0f), uniform(shape, dt, 65)};
  };
  s.call = [](Tensors& t) { ops::gelu_backward(t[0], t[1], t[2]); };
  s.read = outs({{2, "dx"}});
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]), x = values(t[1]);
    V dx(x.size());
    for (size_t i = 0; i < x.size(); i++) dx[i] = dy[i] * gelu_grad(x[i]);
    return Outputs{rounded("dx", dt, dx)};
  };
  return row("gelu_backward", dt, dims(shape), "-", tol, cuda_default(tol), s);
}

// gelu_backward with fc1's bias gradient in the same pass: dbias (fp32 [f], from a nonzero start)
// += the column sums of dx. Two rows: dx against the exact gradient (gelu_backward's tolerance),
// and dbias against the start plus the column sums of the exact dx rounded to the row's dtype
// (the kernel's dx errors add up over the rows: a tolerance of its own).
inline Row gelu_backward_bias(DType dt, Shape shape, bool read_dbias, Tol tol) {
  Spec s;
  const auto h = static_cast<size_t>(shape.back());
  s.make = [=] {
    return Tensors{uniform(shape, dt, 63), uniform(shape, dt, 64, -5.0f, 5.0f), uniform(shape, dt, 65),
                   uniform({shape.back()}, DType::F32, 66)};
  };
  s.call = [](Tensors& t) { ops::gelu_backward_bias(t[0], t[1], t[2], t[3]); };
  s.read = read_dbias ? outs({{3, "dbias"}}) : outs({{2, "dx"}});
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]), x = values(t[1]);
    V dx(x.size()), db = values(t[3]);
    for (size_t i = 0; i < x.size(); i++) {
      dx[i] = dy[i] * gelu_grad(x[i]);
      db[i % h] += round_to(dx[i], dt);
    }
    return read_dbias ? Outputs{rounded("dbias", DType::F32, db)} : Outputs{rounded("dx", dt, dx)};
  };
  return row("gelu_backward_bias", dt, dims(shape), read_dbias ? "dbias fp32 (read)" : "dbias fp32; dx read",
             tol, cuda_default(tol), s);
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// x [rows, 2f] = [gate | up] -> y [rows, f].
inline Row swiglu_forward(DType dt, int64_t rows, int64_t f, Tol tol) {
  Spec s;
  s.make = [=] { return Tensors{uniform({rows, 2 * f}, dt, 71, -4.0f, 4.0f), uniform({rows, f}, dt, 72)}; };
  s.call = [](Tensors& t) { ops::swiglu_forward(t[0], t[1]); };
  s.read = outs({{1, "y"}});
  s.reference = [=](const Tensors& t) {
    const V x = values(t[0]);
    V y(static_cast<size_t>(rows * f));
    for (int64_t r = 0; r < rows; r++)
      for (int64_t i = 0; i < f; i++) {
        const double g = x[r * 2 * f + i], u = x[r * 2 * f + f + i];
        y[r * f + i] = g * sigmoid(g) * u;
      }
    return Outputs{rounded("y", dt, y)};
  };
  return row("swiglu_forward", dt, fmt::format("{}x{} -> f {}", rows, 2 * f, f), "-", tol, cuda_default(tol),
             s);
}

inline Row swiglu_backward(DType dt, int64_t rows, int64_t f, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform({rows, f}, dt, 73), uniform({rows, 2 * f}, dt, 74, -4.0f, 4.0f),
                   uniform({rows, 2 * f}, dt, 75)};
  };
  s.call = [](Tensors& t) { ops::swiglu_backward(t[0], t[1], t[2]); };
  s.read = outs({{2, "dx"}});
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]), x = values(t[1]);
    V dx(x.size());
    for (int64_t r = 0; r < rows; r++)
      for (int64_t i = 0; i < f; i++) {
        const double g = x[r * 2 * f + i], u = x[r * 2 * f + f + i], sg = sigmoid(g), d = dy[r * f + i];
        dx[r * 2 * f + i] = d * u * sg * (1.0 + g * (1.0 - sg));
        dx[r * 2 * f + f + i] = d * g * sg;
      }
    return Outputs{rounded("dx", dt, dx)};
  };
  return row("swiglu_backward", dt, fmt::format("{}x{} -> f {}", rows, 2 * f, f), "-", tol, cuda_default(tol),
             s);
}

// Dropout's mask. ops.hpp: element i is kept iff uniform(seed, offset + i) >= p. The generator is
// part of the cross-device contract (CUDA must draw the same masks: kernels/cpu/elementwise.cpp and
// kernels/cuda/elementwise.cu both use splitmix64's output function on key + (index + 1) * golden,
// key = mix64(seed), the top 24 bits as the uniform), so the reference pins it.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline bool dropout_keeps(float p, uint64_t seed, uint64_t index) {
  const uint64_t draw = mix64(mix64(seed) + (index + 1) * 0x9E3779B97F4A7C15ull) >> 40;
  return static_cast<double>(draw) / 16777216.0 >= static_cast<double>(p);
}
inline V dropout_exact(const V& x, float p, uint64_t seed, uint64_t offset) {
  if (p == 0.0f) return x;
  const double scale = p < 1.0f ? static_cast<double>(1.0f / (1.0f - p)) : 0.0;  // the fp32 1/(1-p)
  V y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = dropout_keeps(p, seed, offset + i) ? x[i] * scale : 0.0;
  return y;
}

// Forward on the whole tensor, and again in two halves at offsets offset and offset + half (a
// split tensor must draw the same mask), and the backward with the same (seed, offset).
inline Row dropout(DType dt, int64_t n, float p, Tol tol) {
  constexpr uint64_t seed = 1234, offset = 777;
  const int64_t half = n / 2 + 3;
  Spec s;
  s.make = [=] {
    return Tensors{uniform({n}, dt, 81), uniform({n}, dt, 82), uniform({n}, dt, 83), uniform({n}, dt, 84),
                   uniform({n}, dt, 85)};
  };
  s.call = [=](Tensors& t) {
    ops::dropout_forward(t[0], t[1], p, seed, offset);
    Tensor x1 = t[0].narrow(0, 0, half), x2 = t[0].narrow(0, half, n - half);
    Tensor y1 = t[2].narrow(0, 0, half), y2 = t[2].narrow(0, half, n - half);
    ops::dropout_forward(x1, y1, p, seed, offset);
    ops::dropout_forward(x2, y2, p, seed, offset + static_cast<uint64_t>(half));
    ops::dropout_backward(t[3], t[4], p, seed, offset);
  };
  s.read = outs({{1, "y"}, {2, "y (two halves)"}, {4, "dx"}});
  s.reference = [=](const Tensors& t) {
    const V y = dropout_exact(values(t[0]), p, seed, offset);
    return Outputs{rounded("y", dt, y), rounded("y (two halves)", dt, y),
                   rounded("dx", dt, dropout_exact(values(t[3]), p, seed, offset))};
  };
  return row("dropout_forward/backward", dt, fmt::format("{} p {}", n, p), "seed, offset", tol, tol, s);
}

// ---- normalisation ----------------------------------------------------------------------------

constexpr float kEps = 1e-5f;

// Per-row mean and rstd of x [rows, h] in double (layernorm; rms = true: rmsnorm's rstd only).
inline std::pair<V, V> norm_stats(const V& x, int64_t rows, int64_t h, bool rms) {
  V mean(static_cast<size_t>(rows), 0.0), rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; r++) {
    double m = 0, q = 0;
    if (!rms)
      for (int64_t i = 0; i < h; i++) m += x[r * h + i];
    m /= static_cast<double>(h);
    for (int64_t i = 0; i < h; i++) q += (x[r * h + i] - m) * (x[r * h + i] - m);
    mean[r] = m;
    rstd[r] = 1.0 / std::sqrt(q / static_cast<double>(h) + static_cast<double>(kEps));
  }
  return {mean, rstd};
}
inline Tensor f32_tensor(const V& v) {
  return Tensor::from_floats(std::vector<float>(v.begin(), v.end()), {static_cast<int64_t>(v.size())},
                             DType::F32);
}

inline Row layernorm_forward(DType dt, Shape shape, DType w_dt, Tol tol) {
  const int64_t h = shape.back(), rows = rows_of(shape);
  Spec s;
  s.make = [=] {
    return Tensors{uniform(shape, dt, 91, -1.5f, 2.5f),
                   uniform({h}, w_dt, 92, 0.5f, 1.5f),
                   uniform({h}, w_dt, 93),
                   uniform(shape, dt, 94),
                   uniform({rows}, DType::F32, 95),
                   uniform({rows}, DType::F32, 96)};
  };
  s.call = [](Tensors& t) { ops::layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], kEps); };
  s.read = outs({{3, "y"}, {4, "mean"}, {5, "rstd"}});
  s.reference = [=](const Tensors& t) {
    const V x = values(t[0]), w = values(t[1]), b = values(t[2]);
    const auto [mean, rstd] = norm_stats(x, rows, h, false);
    V y(x.size());
    for (int64_t r = 0; r < rows; r++)
      for (int64_t i = 0; i < h; i++) y[r * h + i] = (x[r * h + i] - mean[r]) * rstd[r] * w[i] + b[i];
    return Outputs{rounded("y", dt, y), rounded("mean", DType::F32, mean), rounded("rstd", DType::F32, rstd)};
  };
  return row("layernorm_forward", dt, dims(shape), fmt::format("weight/bias {}; mean/rstd fp32", dn(w_dt)),
             tol, cuda_default(tol), s);
}

inline Row layernorm_backward(DType dt, Shape shape, DType w_dt, Tol tol) {
  const int64_t h = shape.back(), rows = rows_of(shape);
  Spec s;
  s.make = [=] {
    Tensor x = uniform(shape, dt, 101, -1.5f, 2.5f);
    const auto [mean, rstd] = norm_stats(values(x), rows, h, false);
    return Tensors{uniform(shape, dt, 102),
                   x,
                   uniform({h}, w_dt, 103, 0.5f, 1.5f),
                   f32_tensor(mean),
                   f32_tensor(rstd),
                   uniform(shape, dt, 104),
                   uniform({h}, DType::F32, 105),
                   uniform({h}, DType::F32, 106)};
  };
  s.call = [](Tensors& t) { ops::layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]); };
  s.read = outs({{5, "dx"}, {6, "dweight"}, {7, "dbias"}});
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]), x = values(t[1]), w = values(t[2]), mean = values(t[3]), rstd = values(t[4]);
    V dx(x.size()), dw = values(t[6]), db = values(t[7]);
    for (int64_t r = 0; r < rows; r++) {
      double mg = 0, mgx = 0;
      for (int64_t i = 0; i < h; i++) {
        const double xh = (x[r * h + i] - mean[r]) * rstd[r], g = dy[r * h + i] * w[i];
        mg += g;
        mgx += g * xh;
        dw[i] += dy[r * h + i] * xh;
        db[i] += dy[r * h + i];
      }
      mg /= static_cast<double>(h);
      mgx /= static_cast<double>(h);
      for (int64_t i = 0; i < h; i++) {
        const double xh = (x[r * h + i] - mean[r]) * rstd[r], g = dy[r * h + i] * w[i];
        dx[r * h + i] = rstd[r] * (g - mg - xh * mgx);
      }
    }
    return Outputs{rounded("dx", dt, dx), rounded("dweight", DType::F32, dw),
                   rounded("dbias", DType::F32, db)};
  };
  return row("layernorm_backward", dt, dims(shape),
             fmt::format("weight {}; mean/rstd/dweight/dbias fp32", dn(w_dt)), tol, cuda_default(tol), s);
}

inline Row rmsnorm_forward(DType dt, Shape shape, DType w_dt, Tol tol) {
  const int64_t h = shape.back(), rows = rows_of(shape);
  Spec s;
  s.make = [=] {
    return Tensors{uniform(shape, dt, 111, -1.5f, 2.5f), uniform({h}, w_dt, 112, 0.5f, 1.5f),
                   uniform(shape, dt, 113), uniform({rows}, DType::F32, 114)};
  };
  s.call = [](Tensors& t) { ops::rmsnorm_forward(t[0], t[1], t[2], t[3], kEps); };
  s.read = outs({{2, "y"}, {3, "rstd"}});
  s.reference = [=](const Tensors& t) {
    const V x = values(t[0]), w = values(t[1]);
    const V rstd = norm_stats(x, rows, h, true).second;
    V y(x.size());
    for (int64_t r = 0; r < rows; r++)
      for (int64_t i = 0; i < h; i++) y[r * h + i] = x[r * h + i] * rstd[r] * w[i];
    return Outputs{rounded("y", dt, y), rounded("rstd", DType::F32, rstd)};
  };
  return row("rmsnorm_forward", dt, dims(shape), fmt::format("weight {}; rstd fp32", dn(w_dt)), tol,
             cuda_default(tol), s);
}

inline Row rmsnorm_backward(DType dt, Shape shape, DType w_dt, Tol tol) {
  const int64_t h = shape.back(), rows = rows_of(shape);
  Spec s;
  s.make = [=] {
    Tensor x = uniform(shape, dt, 121, -1.5f, 2.5f);
    return Tensors{uniform(shape, dt, 122),
                   x,
                   uniform({h}, w_dt, 123, 0.5f, 1.5f),
                   f32_tensor(norm_stats(values(x), rows, h, true).second),
                   uniform(shape, dt, 124),
                   uniform({h}, DType::F32, 125)};
  };
  s.call = [](Tensors& t) { ops::rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]); };
  s.read = outs({{4, "dx"}, {5, "dweight"}});
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]), x = values(t[1]), w = values(t[2]), rstd = values(t[3]);
    V dx(x.size()), dw = values(t[5]);
    for (int64_t r = 0; r < rows; r++) {
      double mgx = 0;
      for (int64_t i = 0; i < h; i++) {
        const double xh = x[r * h + i] * rstd[r];
        mgx += dy[r * h + i] * w[i] * xh;
        dw[i] += dy[r * h + i] * xh;
      }
      mgx /= static_cast<double>(h);
      for (int64_t i = 0; i < h; i++)
        dx[r * h + i] = rstd[r] * (dy[r * h + i] * w[i] - x[r * h + i] * rstd[r] * mgx);
    }
    return Outputs{rounded("dx", dt, dx), rounded("dweight", DType::F32, dw)};
  };
  return row("rmsnorm_backward", dt, dims(shape), fmt::format("weight {}; rstd/dweight fp32", dn(w_dt)), tol,
             cuda_default(tol), s);
}

// ---- residual add fused with its neighbours ----------------------------------------------------
//
// Inputs on a grid of multiples of 1/64 in [-1, 1] and p in {0, 0.5} (scale 2): every sum
// residual + dropout(branch) is then exact in bf16, fp16 and fp32, so the sums are checked
// bitwise and the norm's reference starts from the same stored sum the kernel normalises.

inline Tensor grid_values(const Shape& shape, DType dt, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = static_cast<float>(k(gen)) / 64.0f;
  return Tensor::from_floats(v, shape, dt);
}
inline V residual_exact(const V& residual, const V& branch, float p, uint64_t seed, uint64_t offset) {
  V s = dropout_exact(branch, p, seed, offset);
  for (size_t i = 0; i < s.size(); i++) s[i] += residual[i];
  return s;
}
// y (and the statistics) of the norm of x [rows, h]: layernorm with w, b, or rmsnorm with w.
inline V norm_exact(const V& x, const V& w, const V* b, const V& mean, const V& rstd, int64_t rows,
                    int64_t h) {
  V y(x.size());
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < h; i++)
      y[r * h + i] = (x[r * h + i] - mean[r]) * rstd[r] * w[i] + (b ? (*b)[i] : 0.0);
  return y;
}
// dx of the norm of x [rows, h] for dy, and the accumulated weight (and bias) gradients.
inline V norm_grad_exact(const V& dy, const V& x, const V& w, const V& mean, const V& rstd, int64_t rows,
                         int64_t h, bool layernorm, V& dw, V& db) {
  V dx(x.size());
  for (int64_t r = 0; r < rows; r++) {
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < h; i++) {
      const double xh = (x[r * h + i] - mean[r]) * rstd[r], g = dy[r * h + i] * w[i];
      mg += g;
      mgx += g * xh;
      dw[i] += dy[r * h + i] * xh;
      if (layernorm) db[i] += dy[r * h + i];
    }
    mg /= static_cast<double>(h);
    mgx /= static_cast<double>(h);
    for (int64_t i = 0; i < h; i++) {
      const double xh = (x[r * h + i] - mean[r]) * rstd[r], g = dy[r * h + i] * w[i];
      dx[r * h + i] = rstd[r] * (g - (layernorm ? mg : 0.0) - xh * mgx);
    }
  }
  return dx;
}

// out = residual + dropout(branch); alias: out is branch itself (as the transformer layer calls it).
inline Row dropout_add(DType dt, Shape shape, float p, bool alias) {
  constexpr uint64_t seed = 4321, offset = 99;
  Spec s;
  s.make = [=] {
    return Tensors{grid_values(shape, dt, 141), grid_values(shape, dt, 142), uniform(shape, dt, 143)};
  };
  s.call = [=](Tensors& t) { ops::dropout_add(t[0], t[1], alias ? t[0] : t[2], {p, seed, offset}); };
  s.read = outs({{alias ? 0 : 2, "out"}});
  s.reference = [=](const Tensors& t) {
    return Outputs{rounded("out", dt, residual_exact(values(t[1]), values(t[0]), p, seed, offset))};
  };
  return row("dropout_add", dt, fmt::format("{} p {}{}", dims(shape), p, alias ? " out=branch" : ""),
             "seed, offset", Tol{}, Tol{}, s);
}

// sum = residual + dropout(branch), y = norm(sum); alias: sum is branch itself.
inline Row residual_norm_forward(DType dt, Shape shape, DType w_dt, bool layernorm, float p, bool alias,
                                 Tol tol) {
  constexpr uint64_t seed = 777, offset = 5;
  const int64_t h = shape.back(), rows = rows_of(shape);
  Spec s;
  // 0 residual, 1 branch, 2 weight, 3 bias, 4 sum, 5 y, 6 mean, 7 rstd (3 and 6 unused by rmsnorm).
  s.make = [=] {
    return Tensors{grid_values(shape, dt, 151),
                   grid_values(shape, dt, 152),
                   uniform({h}, w_dt, 153, 0.5f, 1.5f),
                   uniform({h}, w_dt, 154),
                   uniform(shape, dt, 155),
                   uniform(shape, dt, 156),
                   uniform({rows}, DType::F32, 157),
                   uniform({rows}, DType::F32, 158)};
  };
  s.call = [=](Tensors& t) {
    Tensor none;
    Tensor& sum = alias ? t[1] : t[4];
    ops::residual_norm_forward(t[0], t[1], {p, seed, offset}, t[2], layernorm ? t[3] : none, sum, t[5],
                               layernorm ? t[6] : none, t[7], kEps);
  };
  std::vector<std::pair<int, std::string>> read = {{alias ? 1 : 4, "sum"}, {5, "y"}, {7, "rstd"}};
  if (layernorm) read.push_back({6, "mean"});
  s.read = outs(read);
  s.reference = [=](const Tensors& t) {
    const V sum = residual_exact(values(t[0]), values(t[1]), p, seed, offset);  // exact in dt (grid inputs)
    const V w = values(t[2]), b = values(t[3]);
    const auto [mean, rstd] = norm_stats(sum, rows, h, !layernorm);
    Outputs o{rounded("sum", dt, sum),
              rounded("y", dt, norm_exact(sum, w, layernorm ? &b : nullptr, mean, rstd, rows, h)),
              rounded("rstd", DType::F32, rstd)};
    if (layernorm) o.push_back(rounded("mean", DType::F32, mean));
    return o;
  };
  return row("residual_norm_forward", dt,
             fmt::format("{} {} p {}{}", dims(shape), layernorm ? "layernorm" : "rmsnorm", p,
                         alias ? " sum=branch" : ""),
             fmt::format("weight{} {}; stats fp32; seed, offset", layernorm ? "/bias" : "", dn(w_dt)), tol,
             cuda_default(tol), s);
}

// dx = norm'(dy) + dresidual, dbranch = dropout'(dx); alias: dx is dresidual itself.
inline Row norm_backward_residual(DType dt, Shape shape, DType w_dt, bool layernorm, float p, bool alias,
                                  Tol tol) {
  constexpr uint64_t seed = 31337, offset = 12;
  const int64_t h = shape.back(), rows = rows_of(shape);
  Spec s;
  // 0 dy, 1 dresidual, 2 x, 3 weight, 4 mean, 5 rstd, 6 dx, 7 dweight, 8 dbias, 9 dbranch.
  s.make = [=] {
    Tensor x = uniform(shape, dt, 161, -1.5f, 2.5f);
    const auto [mean, rstd] = norm_stats(values(x), rows, h, !layernorm);
    return Tensors{uniform(shape, dt, 162),
                   uniform(shape, dt, 163),
                   x,
                   uniform({h}, w_dt, 164, 0.5f, 1.5f),
                   f32_tensor(mean),
                   f32_tensor(rstd),
                   uniform(shape, dt, 165),
                   uniform({h}, DType::F32, 166),
                   uniform({h}, DType::F32, 167),
                   uniform(shape, dt, 168)};
  };
  s.call = [=](Tensors& t) {
    Tensor none;
    Tensor& dx = alias ? t[1] : t[6];
    ops::norm_backward_residual(t[0], t[1], t[2], t[3], layernorm ? t[4] : none, t[5], dx, t[7],
                                layernorm ? t[8] : none, {p, seed, offset}, p > 0.0f ? t[9] : none);
  };
  std::vector<std::pair<int, std::string>> read = {{alias ? 1 : 6, "dx"}, {7, "dweight"}};
  if (layernorm) read.push_back({8, "dbias"});
  if (p > 0.0f) read.push_back({9, "dbranch"});
  s.read = outs(read);
  s.reference = [=](const Tensors& t) {
    const V dy = values(t[0]), dres = values(t[1]), x = values(t[2]), w = values(t[3]);
    const V mean = values(t[4]), rstd = values(t[5]);
    V dw = values(t[7]), db = values(t[8]);
    V dx = norm_grad_exact(dy, x, w, mean, rstd, rows, h, layernorm, dw, db);
    for (size_t i = 0; i < dx.size(); i++) dx[i] += dres[i];
    Outputs o{rounded("dx", dt, dx), rounded("dweight", DType::F32, dw)};
    if (layernorm) o.push_back(rounded("dbias", DType::F32, db));
    if (p > 0.0f) o.push_back(rounded("dbranch", dt, dropout_exact(dx, p, seed, offset)));
    return o;
  };
  return row(
      "norm_backward_residual", dt,
      fmt::format("{} {} p {}{}", dims(shape), layernorm ? "layernorm" : "rmsnorm", p,
                  alias ? " dx=dresidual" : ""),
      fmt::format("weight {}; stats, dweight{} fp32; seed, offset", dn(w_dt), layernorm ? ", dbias" : ""),
      tol, cuda_default(tol), s);
}

// ---- attention --------------------------------------------------------------------------------

// YaRN's frequencies and cos/sin factor written out as transformers' _compute_yarn_parameters
// computes them (modeling_rope_utils.py), independently of parallel/rope.hpp: pair i of d.
struct YarnReference {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;
};
inline YarnReference yarn_reference(double base, const RopeScaling& sc, int64_t d) {
  auto get_mscale = [](double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
  };
  YarnReference r;
  if (sc.attention_factor > 0)
    r.attention_factor = sc.attention_factor;
  else if (sc.mscale != 0 && sc.mscale_all_dim != 0)
    r.attention_factor = get_mscale(sc.factor, sc.mscale) / get_mscale(sc.factor, sc.mscale_all_dim);
  else
    r.attention_factor = get_mscale(sc.factor, 1.0);
  const double dim = static_cast<double>(d), pi = std::acos(-1.0);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(sc.original_max_position_embeddings / (rotations * 2 * pi)) / (2 * std::log(base));
  };
  double low = correction_dim(sc.beta_fast), high = correction_dim(sc.beta_slow);
  if (sc.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < d / 2; i++) {
    const double pos_freq = std::pow(base, static_cast<double>(2 * i) / dim);
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (sc.factor * pos_freq);
    const double extrapolation_factor =
        1.0 - std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    r.inv_freq.push_back(interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor);
  }
  return r;
}

// x [s, b, heads, d] rotated in place: pairs (i, i + d/2) by direction * (offset + s) theta^(-2i/d),
// or under yarn (`yarn` set) by YaRN's frequencies with cos and sin times its attention factor.
inline Row rope(DType dt, Shape shape, int64_t offset, bool backward, Tol tol,
                std::optional<RopeScaling> yarn = std::nullopt) {
  constexpr float theta = 10000.0f;
  const Rope rope_arg(theta, yarn.value_or(RopeScaling{}));
  Spec s;
  s.make = [=] { return Tensors{uniform(shape, dt, backward ? 131 : 132)}; };
  s.call = [=](Tensors& t) {
    if (backward)
      ops::rope_backward(t[0], offset, rope_arg);
    else
      ops::rope_forward(t[0], offset, rope_arg);
  };
  s.read = outs({{0, backward ? "dx" : "x"}});
  s.reference = [=](const Tensors& t) {
    V x = values(t[0]);
    const int64_t d = shape[3], half = d / 2, per_pos = shape[1] * shape[2];
    const YarnReference y = yarn ? yarn_reference(theta, *yarn, d) : YarnReference{};
    const double factor = yarn ? y.attention_factor : 1.0;
    for (int64_t p = 0; p < shape[0]; p++)
      for (int64_t v = 0; v < per_pos; v++)
        for (int64_t i = 0; i < half; i++) {
          const double inv_freq =
              yarn ? y.inv_freq[static_cast<size_t>(i)]
                   : std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / d);
          const double angle = static_cast<double>(offset + p) * inv_freq * (backward ? -1.0 : 1.0);
          const double c = factor * std::cos(angle), sn = factor * std::sin(angle);
          double& a = x[(p * per_pos + v) * d + i];
          double& b = x[(p * per_pos + v) * d + half + i];
          const double na = a * c - b * sn, nb = b * c + a * sn;
          a = na;
          b = nb;
        }
    return Outputs{rounded(backward ? "dx" : "x", dt, x)};
  };
  std::string what = fmt::format("{} offset {}", dims(shape), offset);
  if (yarn)
    what += fmt::format(
        " yarn x{} L{} beta {}/{}{}", yarn->factor, yarn->original_max_position_embeddings, yarn->beta_fast,
        yarn->beta_slow,
        yarn->mscale != 0 ? fmt::format(" mscale {}/{}", yarn->mscale, yarn->mscale_all_dim) : "");
  if (yarn && !yarn->truncate) what += " untruncated";
  if (yarn && yarn->attention_factor > 0) what += fmt::format(" attention factor {}", yarn->attention_factor);
  return row(backward ? "rope_backward" : "rope_forward", dt, what, "-", tol, cuda_default(tol), s);
}

struct AttnShape {
  int64_t s, b, hq, hkv, d;
  bool causal;
  // The mask beyond causal (attention_mask.hpp): a window, documents and block offsets. docs: the
  // document lengths, repeated along the sequence; batch element bb starts bb * 5 tokens into the
  // pattern, so its boundaries differ from the others'.
  int64_t window = 0;
  std::vector<int64_t> docs = {};
  int64_t q_pos0 = 0, k_pos0 = 0;
  // The value head size (0: d). MLA's differs from the query/key one: v [s, b, hkv, dv], out
  // [s, b, hq, dv].
  int64_t dv = 0;
  int64_t vd() const { return dv > 0 ? dv : d; }
  bool masked() const { return window > 0 || !docs.empty() || q_pos0 != 0 || k_pos0 != 0; }
  int64_t positions() const { return std::max(q_pos0, k_pos0) + s; }
  std::string str() const {
    std::string out = fmt::format("s{} b{} hq{} hkv{} d{}{}", s, b, hq, hkv, d, causal ? " causal" : "");
    if (dv > 0) out += fmt::format(" dv{}", dv);
    if (window > 0) out += fmt::format(" window{}", window);
    if (!docs.empty()) out += fmt::format(" docs{}", fmt::join(docs, "+"));
    if (q_pos0 != 0 || k_pos0 != 0) out += fmt::format(" at q{} k{}", q_pos0, k_pos0);
    return out;
  }
  // doc_start [b, positions()] (empty without documents).
  std::vector<int32_t> doc_start() const {
    std::vector<int32_t> out;
    if (docs.empty()) return out;
    const int64_t S = positions();
    for (int64_t bb = 0; bb < b; bb++) {
      int64_t start = 0, shift = bb * 5, k = 0;
      // Walk the pattern from `shift` tokens in: the first document is cut short.
      int64_t left = docs[0];
      while (shift >= left) {
        shift -= left;
        k = (k + 1) % static_cast<int64_t>(docs.size());
        left = docs[k];
      }
      left -= shift;
      for (int64_t p = 0; p < S; p++) {
        if (left == 0) {
          k = (k + 1) % static_cast<int64_t>(docs.size());
          left = docs[k];
          start = p;
        }
        out.push_back(static_cast<int32_t>(start));
        left--;
      }
    }
    return out;
  }
  // The visible key rows [lo, hi) of query row i of batch element bb, from the rule itself.
  std::pair<int64_t, int64_t> visible(int64_t bb, int64_t i, const std::vector<int32_t>& ds) const {
    const int64_t p = q_pos0 + i;
    int64_t lo = s, hi = 0;
    for (int64_t j = 0; j < s; j++) {
      const int64_t t = k_pos0 + j;
      bool see = !causal || t <= p;
      if (window > 0) see = see && t > p - window;
      if (!ds.empty()) see = see && t >= ds[static_cast<size_t>(bb * positions() + p)];
      if (see) {
        lo = std::min(lo, j);
        hi = j + 1;
      }
    }
    return {std::min(lo, hi), hi};
  }
  ops::AttentionMask mask(const Tensor& ds) const {
    ops::AttentionMask m = ops::AttentionMask::plain(causal);
    m.window = window;
    m.q_pos0 = q_pos0;
    m.k_pos0 = k_pos0;
    if (!docs.empty()) m.doc_start = ds;
    return m;
  }
  Tensor doc_start_tensor() const {
    std::vector<int32_t> ds = doc_start();
    if (ds.empty()) return Tensor::zeros({1}, DType::I32);  // a placeholder the mask leaves out
    return Tensor::from_vector(ds, {b, positions()});
  }
};

// The exact forward: out [s, b, hq, dv] and lse [b, hq, s] from q, k, v as stored; a row that sees
// no key has out 0 and lse -inf.
inline std::pair<V, V> attention_exact(const AttnShape& a, const V& q, const V& k, const V& v) {
  const double scale = static_cast<double>(1.0f / std::sqrt(static_cast<float>(a.d)));
  const int64_t dv = a.vd();
  V out(static_cast<size_t>(a.s * a.b * a.hq * dv), 0.0), lse(static_cast<size_t>(a.b * a.hq * a.s));
  V p(static_cast<size_t>(a.s));
  const int64_t g = a.hq / a.hkv;
  const std::vector<int32_t> ds = a.doc_start();
  for (int64_t bb = 0; bb < a.b; bb++)
    for (int64_t h = 0; h < a.hq; h++)
      for (int64_t i = 0; i < a.s; i++) {
        const double* qi = &q[((i * a.b + bb) * a.hq + h) * a.d];
        const auto [first, end] = a.visible(bb, i, ds);
        if (first >= end) {
          lse[(bb * a.hq + h) * a.s + i] = -INFINITY;
          continue;
        }
        double m = -INFINITY;
        for (int64_t j = first; j < end; j++) {
          const double* kj = &k[((j * a.b + bb) * a.hkv + h / g) * a.d];
          double dot = 0;
          for (int64_t e = 0; e < a.d; e++) dot += qi[e] * kj[e];
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int64_t j = first; j < end; j++) sum += p[j] = std::exp(p[j] - m);
        lse[(bb * a.hq + h) * a.s + i] = m + std::log(sum);
        double* oi = &out[((i * a.b + bb) * a.hq + h) * dv];
        for (int64_t j = first; j < end; j++) {
          const double* vj = &v[((j * a.b + bb) * a.hkv + h / g) * dv];
          for (int64_t e = 0; e < dv; e++) oi[e] += p[j] / sum * vj[e];
        }
      }
  return {out, lse};
}

inline float attn_scale(const AttnShape& a) { return 1.0f / std::sqrt(static_cast<float>(a.d)); }
inline double attn_flops(const AttnShape& a) {  // q k^T (d) and p v (dv) over the visible pairs
  if (!a.masked()) return 2.0 * a.b * a.hq * a.s * a.s * (a.d + a.vd()) * (a.causal ? 0.5 : 1.0);
  const std::vector<int32_t> ds = a.doc_start();
  double pairs = 0;
  for (int64_t bb = 0; bb < a.b; bb++)
    for (int64_t i = 0; i < a.s; i++) {
      const auto [first, end] = a.visible(bb, i, ds);
      pairs += static_cast<double>(end - first);
    }
  return 2.0 * a.hq * (a.d + a.vd()) * pairs;
}

inline Row attention_forward(DType dt, AttnShape a, Tol tol, Tol cuda_tol) {
  Spec s;
  s.make = [=] {
    return Tensors{
        uniform({a.s, a.b, a.hq, a.d}, dt, 141, -2, 2), uniform({a.s, a.b, a.hkv, a.d}, dt, 142, -2, 2),
        uniform({a.s, a.b, a.hkv, a.vd()}, dt, 143),    uniform({a.s, a.b, a.hq, a.vd()}, dt, 144),
        uniform({a.b, a.hq, a.s}, DType::F32, 145),     a.doc_start_tensor()};
  };
  s.call = [=](Tensors& t) {
    ops::attention_forward(t[0], t[1], t[2], t[3], t[4], a.mask(t[5]), attn_scale(a));
  };
  s.read = outs({{3, "out"}, {4, "lse"}});
  s.reference = [=](const Tensors& t) {
    const auto [out, lse] = attention_exact(a, values(t[0]), values(t[1]), values(t[2]));
    return Outputs{rounded("out", dt, out), rounded("lse", DType::F32, lse)};
  };
  s.flops = attn_flops(a);
  return row("attention_forward", dt, a.str(), "lse fp32", tol, cuda_tol, s);
}

// out and lse are the exact forward's, stored as the op would store them.
inline Row attention_backward(DType dt, AttnShape a, Tol tol, Tol cuda_tol) {
  Spec s;
  s.make = [=] {
    Tensor q = uniform({a.s, a.b, a.hq, a.d}, dt, 151, -2, 2),
           k = uniform({a.s, a.b, a.hkv, a.d}, dt, 152, -2, 2),
           v = uniform({a.s, a.b, a.hkv, a.vd()}, dt, 153);
    const auto [out, lse] = attention_exact(a, values(q), values(k), values(v));
    const Shape out_shape{a.s, a.b, a.hq, a.vd()};
    Tensor out_t = Tensor::from_floats(std::vector<float>(out.begin(), out.end()), out_shape, dt);
    Tensor lse_t = f32_tensor(lse).view({a.b, a.hq, a.s});
    return Tensors{uniform(out_shape, dt, 154),
                   q,
                   k,
                   v,
                   out_t,
                   lse_t,
                   uniform(q.shape(), dt, 155),
                   uniform(k.shape(), dt, 156),
                   uniform(v.shape(), dt, 157),
                   a.doc_start_tensor()};
  };
  s.call = [=](Tensors& t) {
    ops::attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], a.mask(t[9]),
                            attn_scale(a));
  };
  s.read = outs({{6, "dq"}, {7, "dk"}, {8, "dv"}});
  s.reference = [=](const Tensors& t) {
    const V dout = values(t[0]), q = values(t[1]), k = values(t[2]), v = values(t[3]), out = values(t[4]),
            lse = values(t[5]);
    const double scale = attn_scale(a);
    const int64_t g = a.hq / a.hkv, d = a.d, dvh = a.vd();
    const std::vector<int32_t> ds = a.doc_start();
    V dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
    for (int64_t bb = 0; bb < a.b; bb++)
      for (int64_t h = 0; h < a.hq; h++)
        for (int64_t i = 0; i < a.s; i++) {
          const int64_t qo = ((i * a.b + bb) * a.hq + h) * d, oo = ((i * a.b + bb) * a.hq + h) * dvh;
          double D = 0;
          for (int64_t e = 0; e < dvh; e++) D += dout[oo + e] * out[oo + e];
          const auto [first, end] = a.visible(bb, i, ds);
          for (int64_t j = first; j < end; j++) {
            const int64_t ko = ((j * a.b + bb) * a.hkv + h / g) * d,
                          vo = ((j * a.b + bb) * a.hkv + h / g) * dvh;
            double dot = 0, dp = 0;
            for (int64_t e = 0; e < d; e++) dot += q[qo + e] * k[ko + e];
            for (int64_t e = 0; e < dvh; e++) dp += dout[oo + e] * v[vo + e];
            const double p = std::exp(dot * scale - lse[(bb * a.hq + h) * a.s + i]), ds = p * (dp - D);
            for (int64_t e = 0; e < d; e++) {
              dq[qo + e] += scale * ds * k[ko + e];
              dk[ko + e] += scale * ds * q[qo + e];
            }
            for (int64_t e = 0; e < dvh; e++) dv[vo + e] += p * dout[oo + e];
          }
        }
    return Outputs{rounded("dq", dt, dq), rounded("dk", dt, dk), rounded("dv", dt, dv)};
  };
  s.flops = 2.5 * attn_flops(a);
  return row("attention_backward", dt, a.str(), "lse fp32", tol, cuda_tol, s);
}

// Ring attention's merge: rows [q0, q0 + n) of the fp32 accumulators take one block's result.
// Every 5th accumulator lse starts at -inf (a row that has seen no key yet) and, with `masked`,
// every 7th block lse is -inf (a row whose keys the block masks entirely): both conventions of
// the contract, and rows where both are -inf, are covered.
struct MergeShape {
  int64_t S, b, h, d, n, q0;
  bool masked;
  std::string str() const {
    return fmt::format("S{} b{} h{} d{} rows {}..{}{}", S, b, h, d, q0, q0 + n, masked ? " masked" : "");
  }
};

inline Row attention_merge(DType dt, MergeShape m, Tol tol) {
  Spec s;
  s.make = [=] {
    std::vector<float> la = uniform_floats(m.b * m.h * m.S, 161, -3, 3),
                       lb = uniform_floats(m.b * m.h * m.n, 162, -3, 3);
    for (size_t i = 0; i < la.size(); i += 5) la[i] = -INFINITY;
    if (m.masked)
      for (size_t i = 3; i < lb.size(); i += 7) lb[i] = -INFINITY;
    return Tensors{uniform({m.S, m.b, m.h, m.d}, DType::F32, 163),
                   f32_tensor(V(la.begin(), la.end())).view({m.b, m.h, m.S}),
                   uniform({m.n, m.b, m.h, m.d}, dt, 164),
                   f32_tensor(V(lb.begin(), lb.end())).view({m.b, m.h, m.n})};
  };
  s.call = [=](Tensors& t) { ops::attention_merge(t[0], t[1], t[2], t[3], m.q0); };
  s.read = outs({{0, "out_acc"}, {1, "lse_acc"}});
  s.reference = [=](const Tensors& t) {
    V out = values(t[0]), lse = values(t[1]);
    const V blk = values(t[2]), lb = values(t[3]);
    for (int64_t bh = 0; bh < m.b * m.h; bh++)
      for (int64_t r = 0; r < m.n; r++) {
        const double l_blk = lb[bh * m.n + r];
        double& l_acc = lse[bh * m.S + m.q0 + r];
        if (l_blk == -INFINITY) continue;
        double wa = 0, wb = 1, l = l_blk;
        if (l_acc != -INFINITY) {
          l = std::max(l_acc, l_blk) + std::log1p(std::exp(-std::fabs(l_acc - l_blk)));
          wa = std::exp(l_acc - l);
          wb = std::exp(l_blk - l);
        }
        l_acc = l;
        const int64_t bi = bh / m.h, hi = bh % m.h;
        double* o = &out[(((m.q0 + r) * m.b + bi) * m.h + hi) * m.d];
        const double* x = &blk[((r * m.b + bi) * m.h + hi) * m.d];
        for (int64_t e = 0; e < m.d; e++) o[e] = wa * o[e] + wb * x[e];
      }
    return Outputs{rounded("out_acc", DType::F32, out), rounded("lse_acc", DType::F32, lse)};
  };
  return row("attention_merge", dt, m.str(), "out_acc, lse_acc, lse_blk fp32", tol, cuda_default(tol), s);
}

// ---- embedding and loss -----------------------------------------------------------------------

// tokens [b, s] with ids in [0, vocab_start + rows + 7): some below and some above this rank's rows.
inline Row embedding_forward(DType dt, int64_t b, int64_t sq, int64_t rows, int64_t h, DType w_dt, Tol tol) {
  constexpr int64_t vs = 5;
  Spec s;
  s.make = [=] {
    return Tensors{int_tensor({b, sq}, 161, 0, static_cast<int32_t>(vs + rows + 7)),
                   uniform({rows, h}, w_dt, 162), uniform({sq, b, h}, dt, 163)};
  };
  s.call = [](Tensors& t) { ops::embedding_forward(t[0], t[1], vs, t[2]); };
  s.read = outs({{2, "out"}});
  s.reference = [=](const Tensors& t) {
    const std::vector<int32_t> tok = ints(t[0]);
    const V w = values(t[1]);
    V out(static_cast<size_t>(sq * b * h), 0.0);
    for (int64_t bi = 0; bi < b; bi++)
      for (int64_t si = 0; si < sq; si++) {
        const int64_t id = tok[bi * sq + si] - vs;
        if (id < 0 || id >= rows) continue;
        for (int64_t e = 0; e < h; e++) out[(si * b + bi) * h + e] = w[id * h + e];
      }
    return Outputs{rounded("out", dt, out)};
  };
  return row("embedding_forward", dt, fmt::format("tokens {}x{} weight {}x{}", b, sq, rows, h),
             fmt::format("tokens int32; weight {}", dn(w_dt)), tol, tol, s);
}

inline Row embedding_backward(DType dt, int64_t b, int64_t sq, int64_t rows, int64_t h, Tol tol) {
  constexpr int64_t vs = 5;
  Spec s;
  s.make = [=] {
    return Tensors{int_tensor({b, sq}, 171, 0, static_cast<int32_t>(vs + rows + 7)),
                   uniform({sq, b, h}, dt, 172), uniform({rows, h}, DType::F32, 173)};
  };
  s.call = [](Tensors& t) { ops::embedding_backward(t[0], t[1], vs, t[2]); };
  s.read = outs({{2, "dweight"}});
  s.reference = [=](const Tensors& t) {
    const std::vector<int32_t> tok = ints(t[0]);
    const V dout = values(t[1]);
    V dw = values(t[2]);
    for (int64_t bi = 0; bi < b; bi++)
      for (int64_t si = 0; si < sq; si++) {
        const int64_t id = tok[bi * sq + si] - vs;
        if (id < 0 || id >= rows) continue;
        for (int64_t e = 0; e < h; e++) dw[id * h + e] += dout[(si * b + bi) * h + e];
      }
    return Outputs{rounded("dweight", DType::F32, dw)};
  };
  return row("embedding_backward", dt, fmt::format("tokens {}x{} dweight {}x{}", b, sq, rows, h),
             "tokens int32; dweight fp32", tol, cuda_default(tol), s);
}

// ---- rows by index (mixture of experts) ---------------------------------------------------------

// n int64 row indices in [-1, rows) (when `zeros`) or [0, rows): repeats once n exceeds rows, and
// every pattern the MoE layer makes (zero rows for padding, a row read many times).
inline Tensor row_indices(Shape shape, int64_t rows, bool zeros, int64_t salt) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
  const int64_t span = rows + (zeros ? 1 : 0);
  for (size_t i = 0; i < v.size(); i++)
    v[i] = span == 0 ? -1 : (static_cast<int64_t>(i) * 7 + salt) % span - (zeros ? 1 : 0);
  return Tensor::from_vector(v, shape);
}
inline std::vector<int64_t> longs(const Tensor& t) {
  const Tensor c = t.to(Device::cpu());
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

// out [n, h] = src [rows, h] at index (zero rows at -1); with `scaled`, times scale [n] fp32.
inline Row gather_rows(DType dt, int64_t rows, int64_t n, int64_t h, bool scaled, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t{uniform({rows, h}, dt, 181), row_indices({n}, rows, true, 3), uniform({n, h}, dt, 182)};
    if (scaled) t.push_back(uniform({n}, DType::F32, 183));
    return t;
  };
  s.call = [=](Tensors& t) {
    if (scaled)
      ops::gather_rows_scaled(t[0], t[1], t[3], t[2]);
    else
      ops::gather_rows(t[0], t[1], t[2]);
  };
  s.read = outs({{2, "out"}});
  s.reference = [=](const Tensors& t) {
    const V src = values(t[0]);
    const std::vector<int64_t> idx = longs(t[1]);
    const V sc = scaled ? values(t[3]) : V(static_cast<size_t>(n), 1.0);
    V out(static_cast<size_t>(n * h), 0.0);
    for (int64_t i = 0; i < n; i++)
      if (idx[i] >= 0)
        for (int64_t c = 0; c < h; c++) out[i * h + c] = sc[i] * src[idx[i] * h + c];
    return Outputs{rounded("out", dt, out)};
  };
  return row(
      scaled ? "gather_rows_scaled" : "gather_rows", dt, fmt::format("src {}x{} -> {} rows", rows, h, n),
      scaled ? "index int64 (-1 and repeats); scale fp32" : "index int64 (-1 and repeats)", tol, tol, s);
}

// out [T, h] (out_dt) = sum_j weight[t, j] src[index[t, j]] over index [T, k] with -1 entries and
// repeated rows; unweighted when `weighted` is false.
inline Row gather_sum_rows(DType dt, int64_t rows, int64_t T, int64_t k, int64_t h, DType out_dt,
                           bool weighted, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t{uniform({rows, h}, dt, 191), row_indices({T, k}, rows, true, 5), uniform({T, h}, out_dt, 192)};
    if (weighted) t.push_back(uniform({T, k}, DType::F32, 193, 0.0f, 1.0f));
    return t;
  };
  s.call = [=](Tensors& t) { ops::gather_sum_rows(t[0], t[1], weighted ? t[3] : Tensor(), t[2]); };
  s.read = outs({{2, "out"}});
  s.reference = [=](const Tensors& t) {
    const V src = values(t[0]);
    const std::vector<int64_t> idx = longs(t[1]);
    const V w = weighted ? values(t[3]) : V(static_cast<size_t>(T * k), 1.0);
    V out(static_cast<size_t>(T * h), 0.0);
    for (int64_t r = 0; r < T; r++)
      for (int64_t j = 0; j < k; j++) {
        const int64_t i = idx[r * k + j];
        if (i < 0) continue;
        for (int64_t c = 0; c < h; c++) out[r * h + c] += w[r * k + j] * src[i * h + c];
      }
    return Outputs{rounded("out", out_dt, out)};
  };
  return row("gather_sum_rows", dt, fmt::format("src {}x{} -> {}x{} rows", rows, h, T, k),
             fmt::format("index int64 (-1 and repeats); {}; out {}", weighted ? "weight fp32" : "no weight",
                         dn(out_dt)),
             tol, cuda_default(tol), s);
}

// out [n] fp32 = <a[i], b[index[i]]>, index with repeats.
inline Row row_dot(DType dt, int64_t n, int64_t m, int64_t h, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform({n, h}, dt, 201), uniform({m, h}, dt, 202), row_indices({n}, m, false, 1),
                   uniform({n}, DType::F32, 203)};
  };
  s.call = [](Tensors& t) { ops::row_dot(t[0], t[1], t[2], t[3]); };
  s.read = outs({{3, "out"}});
  s.reference = [=](const Tensors& t) {
    const V a = values(t[0]), b = values(t[1]);
    const std::vector<int64_t> idx = longs(t[2]);
    V out(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < h; c++) out[i] += a[i * h + c] * b[idx[i] * h + c];
    return Outputs{rounded("out", DType::F32, out)};
  };
  s.flops = 2.0 * n * h;
  return row("row_dot", dt, fmt::format("{}x{} . {}x{}", n, h, m, h), "index int64 (repeats); out fp32", tol,
             cuda_default(tol), s);
}

// Cross-entropy over logits [n, vl] of a rank whose columns are ids [vs, vs + vl); ids >= vocab are
// padding (their logits set high, so using them would show). Targets in [0, vocab).
struct CeShape {
  int64_t n, vl, vs, vocab;
  std::string str() const { return fmt::format("{}x{} ids {}..{} vocab {}", n, vl, vs, vs + vl, vocab); }
};

inline Tensors ce_inputs(DType dt, const CeShape& c, uint32_t seed) {
  std::vector<float> l = uniform_floats(c.n * c.vl, seed, -4.0f, 4.0f);
  for (int64_t i = 0; i < c.n; i++)
    for (int64_t j = 0; j < c.vl; j++)
      if (c.vs + j >= c.vocab) l[i * c.vl + j] = 9.0f;
  return {Tensor::from_floats(l, {c.n, c.vl}, dt),
          int_tensor({c.n}, seed + 1, 0, static_cast<int32_t>(c.vocab))};
}
inline bool ce_valid(const CeShape& c, int64_t j) { return c.vs + j < c.vocab; }
// Per-row max over the valid columns, exact (-inf where none).
inline V ce_row_max(const CeShape& c, const V& l) {
  V m(static_cast<size_t>(c.n), -INFINITY);
  for (int64_t i = 0; i < c.n; i++)
    for (int64_t j = 0; j < c.vl; j++)
      if (ce_valid(c, j)) m[i] = std::max(m[i], l[i * c.vl + j]);
  return m;
}
inline V ce_sum_exp(const CeShape& c, const V& l, const V& m) {
  V s(static_cast<size_t>(c.n), 0.0);
  for (int64_t i = 0; i < c.n; i++)
    for (int64_t j = 0; j < c.vl; j++)
      if (ce_valid(c, j)) s[i] += std::exp(l[i * c.vl + j] - m[i]);
  return s;
}

inline Row cross_entropy_local_stats(DType dt, CeShape c, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t = ce_inputs(dt, c, 181);
    t.push_back(uniform({c.n}, DType::F32, 183));
    t.push_back(uniform({c.n}, DType::F32, 184));
    return t;
  };
  s.call = [=](Tensors& t) { ops::cross_entropy_local_stats(t[0], t[1], c.vs, c.vocab, t[2], t[3]); };
  s.read = outs({{2, "row_max"}, {3, "target_logit"}});
  s.reference = [=](const Tensors& t) {
    const V l = values(t[0]);
    const std::vector<int32_t> tg = ints(t[1]);
    V tl(static_cast<size_t>(c.n), 0.0);
    for (int64_t i = 0; i < c.n; i++)
      if (tg[i] >= c.vs && tg[i] < c.vs + c.vl) tl[i] = l[i * c.vl + (tg[i] - c.vs)];
    return Outputs{rounded("row_max", DType::F32, ce_row_max(c, l)), rounded("target_logit", DType::F32, tl)};
  };
  return row("cross_entropy_local_stats", dt, c.str(), "targets int32; row_max/target_logit fp32", tol,
             cuda_default(tol), s);
}

inline Row cross_entropy_sum_exp(DType dt, CeShape c, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t = ce_inputs(dt, c, 191);
    t[1] = f32_tensor(ce_row_max(c, values(t[0])));  // row_max in place of the targets
    t.push_back(uniform({c.n}, DType::F32, 193));
    return t;
  };
  s.call = [=](Tensors& t) { ops::cross_entropy_sum_exp(t[0], t[1], c.vs, c.vocab, t[2]); };
  s.read = outs({{2, "sum_exp"}});
  s.reference = [=](const Tensors& t) {
    return Outputs{rounded("sum_exp", DType::F32, ce_sum_exp(c, values(t[0]), values(t[1])))};
  };
  return row("cross_entropy_sum_exp", dt, c.str(), "row_max/sum_exp fp32", tol, cuda_default(tol), s);
}

// Both local pieces in one op (one rank holds the vocabulary): row_max, target_logit, and sum_exp
// against the op's own row_max.
inline Row cross_entropy_stats(DType dt, CeShape c, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t = ce_inputs(dt, c, 185);
    for (uint32_t seed : {186u, 187u, 188u}) t.push_back(uniform({c.n}, DType::F32, seed));
    return t;
  };
  s.call = [=](Tensors& t) { ops::cross_entropy_stats(t[0], t[1], c.vs, c.vocab, t[2], t[3], t[4]); };
  s.read = outs({{2, "row_max"}, {3, "target_logit"}, {4, "sum_exp"}});
  s.reference = [=](const Tensors& t) {
    const V l = values(t[0]), m = ce_row_max(c, l);
    const std::vector<int32_t> tg = ints(t[1]);
    V tl(static_cast<size_t>(c.n), 0.0);
    for (int64_t i = 0; i < c.n; i++)
      if (tg[i] >= c.vs && tg[i] < c.vs + c.vl) tl[i] = l[i * c.vl + (tg[i] - c.vs)];
    return Outputs{rounded("row_max", DType::F32, m), rounded("target_logit", DType::F32, tl),
                   rounded("sum_exp", DType::F32, ce_sum_exp(c, l, m))};
  };
  return row("cross_entropy_stats", dt, c.str(), "targets int32; row_max/target_logit/sum_exp fp32", tol,
             cuda_default(tol), s);
}

inline Row cross_entropy_backward(DType dt, CeShape c, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t = ce_inputs(dt, c, 201);
    const V l = values(t[0]), m = ce_row_max(c, l);
    t.push_back(f32_tensor(m));
    t.push_back(f32_tensor(ce_sum_exp(c, l, m)));
    t.push_back(uniform({c.n}, DType::F32, 203, 0.01f, 0.2f));
    t.push_back(uniform({c.n, c.vl}, dt, 204));
    return t;
  };
  s.call = [=](Tensors& t) {
    ops::cross_entropy_backward(t[0], t[1], t[2], t[3], t[4], c.vs, c.vocab, t[5]);
  };
  s.read = outs({{5, "dlogits"}});
  s.reference = [=](const Tensors& t) {
    const V l = values(t[0]), m = values(t[2]), se = values(t[3]), gs = values(t[4]);
    const std::vector<int32_t> tg = ints(t[1]);
    V dl(l.size(), 0.0);
    for (int64_t i = 0; i < c.n; i++)
      for (int64_t j = 0; j < c.vl; j++)
        if (ce_valid(c, j))
          dl[i * c.vl + j] =
              gs[i] * (std::exp(l[i * c.vl + j] - m[i]) / se[i] - (c.vs + j == tg[i] ? 1.0 : 0.0));
    return Outputs{rounded("dlogits", dt, dl)};
  };
  return row("cross_entropy_backward", dt, c.str(), "targets i32; row_max/sum_exp/grad_scale fp32", tol,
             cuda_default(tol), s);
}

// loss = log(sum_exp) + row_max - target_logit, all fp32 [n] (no activation: the row's dtype is fp32).
inline Row cross_entropy_loss(int64_t n, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform({n}, DType::F32, 205, -5.0f, 5.0f), uniform({n}, DType::F32, 206, 1.0f, 1000.0f),
                   uniform({n}, DType::F32, 207, -5.0f, 5.0f), uniform({n}, DType::F32, 208)};
  };
  s.call = [](Tensors& t) { ops::cross_entropy_loss(t[0], t[1], t[2], t[3]); };
  s.read = outs({{3, "loss"}});
  s.reference = [=](const Tensors& t) {
    const V m = values(t[0]), se = values(t[1]), tl = values(t[2]);
    V loss(m.size());
    for (size_t i = 0; i < m.size(); i++) loss[i] = std::log(se[i]) + m[i] - tl[i];
    return Outputs{rounded("loss", DType::F32, loss)};
  };
  return row("cross_entropy_loss", DType::F32, std::to_string(n), "row_max/sum_exp/target_logit/loss fp32",
             tol, cuda_default(tol), s);
}

// ---- reductions and optimizer -----------------------------------------------------------------

inline Row sum_of_squares(DType dt, int64_t n, Tol tol) {
  Spec s;
  auto result = std::make_shared<double>(0.0);
  s.make = [=] { return Tensors{uniform({n}, dt, 211, -3.0f, 3.0f)}; };
  s.call = [result](Tensors& t) { *result = ops::sum_of_squares(t[0]); };
  s.read = [result](const Tensors&) { return Outputs{{"sum", DType::F32, {*result}}}; };
  s.reference = [](const Tensors& t) {
    double sum = 0;
    for (double x : values(t[0])) sum += x * x;
    return Outputs{{"sum", DType::F32, {sum}}};
  };
  return row("sum_of_squares", dt, std::to_string(n), "result double", tol, cuda_default(tol), s);
}

// acc [1] (fp32) += sum of squares of x (fp32), the sum formed in double.
inline Row sum_of_squares_accumulate(int64_t n, Tol tol) {
  Spec s;
  s.make = [=] {
    return Tensors{uniform({n}, DType::F32, 212, -3.0f, 3.0f), Tensor::from_floats({1.25f}, {1}, DType::F32)};
  };
  s.call = [](Tensors& t) { ops::sum_of_squares_accumulate(t[0], t[1]); };
  s.read = outs({{1, "acc"}});
  s.reference = [](const Tensors& t) {
    double acc = values(t[1])[0];
    for (double x : values(t[0])) acc += x * x;
    return Outputs{rounded("acc", DType::F32, {acc})};
  };
  return row("sum_of_squares_accumulate", DType::F32, std::to_string(n), "x fp32; acc fp32 [1]", tol,
             cuda_default(tol), s);
}

inline ops::AdamWStep adamw_step() {
  ops::AdamWStep h;
  h.lr = 3e-3;
  h.weight_decay = 0.1;
  h.step = 3;
  h.grad_scale = 0.5f;
  return h;
}
// param, grad, exp_avg, exp_avg_sq: fp32 [n].
inline Tensors adamw_inputs(int64_t n) {
  return Tensors{uniform({n}, DType::F32, 221), uniform({n}, DType::F32, 222, -2, 2),
                 uniform({n}, DType::F32, 223, -0.1f, 0.1f), uniform({n}, DType::F32, 224, 0.0f, 0.01f)};
}
// The updated param, exp_avg, exp_avg_sq from adamw_inputs' tensors (the first four of t).
inline Outputs adamw_exact(const Tensors& t, const ops::AdamWStep& h) {
  V p = values(t[0]), m = values(t[2]), v = values(t[3]);
  const V grad = values(t[1]);
  const double bc1 = 1 - std::pow(h.beta1, h.step), bc2 = 1 - std::pow(h.beta2, h.step);
  for (size_t i = 0; i < p.size(); i++) {
    const double g = grad[i] * h.grad_scale;
    p[i] *= 1 - h.lr * h.weight_decay;
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
    p[i] -= h.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + h.eps);
  }
  return Outputs{rounded("param", DType::F32, p), rounded("exp_avg", DType::F32, m),
                 rounded("exp_avg_sq", DType::F32, v)};
}

// fp32 only (the optimizer's state is fp32 whatever the training precision).
inline Row adamw_update(int64_t n, Tol tol) {
  const ops::AdamWStep h = adamw_step();
  Spec s;
  s.make = [=] { return adamw_inputs(n); };
  s.call = [=](Tensors& t) { ops::adamw_update_(t[0], t[1], t[2], t[3], h); };
  s.read = outs({{0, "param"}, {2, "exp_avg"}, {3, "exp_avg_sq"}});
  s.reference = [=](const Tensors& t) { return adamw_exact(t, h); };
  return row("adamw_update_", DType::F32, std::to_string(n), "param/grad/exp_avg/exp_avg_sq fp32", tol, tol,
             s);
}

// The overload that also writes model_copy (bf16/fp16 [n], the row's dtype) = the updated param
// rounded: param and the fp32 buffers against the reference as above, and model_copy bitwise equal
// to the op's own updated param rounded to its dtype (the output "model_copy - round(param)", all 0).
inline Row adamw_update_model_copy(DType copy_dt, int64_t n, Tol tol) {
  const ops::AdamWStep h = adamw_step();
  Spec s;
  s.make = [=] {
    Tensors t = adamw_inputs(n);
    t.push_back(uniform({n}, copy_dt, 225));
    return t;
  };
  s.call = [=](Tensors& t) { ops::adamw_update_(t[0], t[1], t[2], t[3], t[4], h); };
  s.read = [=](const Tensors& t) {
    Outputs o = outs({{0, "param"}, {2, "exp_avg"}, {3, "exp_avg_sq"}})(t);
    const V p = values(t[0]);
    V diff = values(t[4]);
    for (size_t i = 0; i < diff.size(); i++) diff[i] -= round_to(p[i], copy_dt);
    o.push_back({"model_copy - round(param)", copy_dt, diff});
    return o;
  };
  s.reference = [=](const Tensors& t) {
    Outputs o = adamw_exact(t, h);
    o.push_back({"model_copy - round(param)", copy_dt, V(static_cast<size_t>(n), 0.0)});
    return o;
  };
  return row("adamw_update_", copy_dt, std::to_string(n),
             fmt::format("param/grad/exp_avg/exp_avg_sq fp32; model_copy {}", dn(copy_dt)), tol, tol, s);
}

// The multi-tensor ops: tensors of `sizes` in one call (one above the CPU's 65536-element
// threshold), each against the single-tensor reference.
// acc [1] += each x's sum of squares in turn; the op rounds acc to fp32 after every tensor.
inline Row sum_of_squares_accumulate_multi(std::vector<int64_t> sizes, Tol tol) {
  Spec s;
  s.make = [=] {
    Tensors t{Tensor::from_floats({1.25f}, {1}, DType::F32)};
    for (size_t i = 0; i < sizes.size(); i++)
      t.push_back(uniform({sizes[i]}, DType::F32, static_cast<uint32_t>(231 + i), -3.0f, 3.0f));
    return t;
  };
  s.call = [](Tensors& t) { ops::sum_of_squares_accumulate_multi(Tensors(t.begin() + 1, t.end()), t[0]); };
  s.read = outs({{0, "acc"}});
  s.reference = [](const Tensors& t) {
    double acc = values(t[0])[0];
    for (size_t i = 1; i < t.size(); i++)
      for (double x : values(t[i])) acc += x * x;
    return Outputs{rounded("acc", DType::F32, {acc})};
  };
  std::string shape;
  for (int64_t n : sizes) shape += (shape.empty() ? "" : ",") + std::to_string(n);
  return row("sum_of_squares_accumulate_multi", DType::F32, shape, "xs fp32; acc fp32 [1]", tol,
             cuda_default(tol), s);
}

// adamw_update_multi_ over tensors of `sizes` in one call (one above the CPU's 65536-element
// threshold; weight decay on every other one), with 16-bit model copies of copy_dt (F32: none):
// each tensor's outputs against adamw_exact with its own decay.
inline Row adamw_update_multi(DType copy_dt, std::vector<int64_t> sizes, Tol tol) {
  const ops::AdamWStep h = adamw_step();
  const size_t per = copy_dt == DType::F32 ? 4 : 5;
  const auto decay = [h](size_t i) { return i % 2 == 0 ? h.weight_decay : 0.0; };
  Spec s;
  s.make = [=] {
    Tensors t;
    for (size_t i = 0; i < sizes.size(); i++) {
      for (Tensor& x : adamw_inputs(sizes[i])) t.push_back(x);
      if (copy_dt != DType::F32) t.push_back(uniform({sizes[i]}, copy_dt, 225));
    }
    return t;
  };
  s.call = [=](Tensors& t) {
    std::vector<ops::AdamWTensors> list;
    for (size_t i = 0; i < sizes.size(); i++) {
      const size_t b = i * per;
      list.push_back({t[b], t[b + 1], t[b + 2], t[b + 3], per == 5 ? t[b + 4] : Tensor(), decay(i)});
    }
    ops::adamw_update_multi_(list, h);
  };
  s.read = [=](const Tensors& t) {
    Outputs o;
    for (size_t i = 0; i < sizes.size(); i++) {
      const size_t b = i * per;
      const std::string n = std::to_string(i);
      o.push_back(output("param " + n, t[b]));
      o.push_back(output("exp_avg " + n, t[b + 2]));
      o.push_back(output("exp_avg_sq " + n, t[b + 3]));
      if (per == 5) {
        const V p = values(t[b]);
        V diff = values(t[b + 4]);
        for (size_t j = 0; j < diff.size(); j++) diff[j] -= round_to(p[j], copy_dt);
        o.push_back({"model_copy - round(param) " + n, copy_dt, diff});
      }
    }
    return o;
  };
  s.reference = [=](const Tensors& t) {
    Outputs o;
    for (size_t i = 0; i < sizes.size(); i++) {
      const size_t b = i * per;
      ops::AdamWStep hi = h;
      hi.weight_decay = decay(i);
      Outputs one = adamw_exact(
          Tensors(t.begin() + static_cast<std::ptrdiff_t>(b), t.begin() + static_cast<std::ptrdiff_t>(b + 4)),
          hi);
      const std::string n = std::to_string(i);
      for (auto& x : one) {
        x.name += " " + n;
        o.push_back(std::move(x));
      }
      if (per == 5)
        o.push_back({"model_copy - round(param) " + n, copy_dt, V(static_cast<size_t>(sizes[i]), 0.0)});
    }
    return o;
  };
  std::string shape;
  for (int64_t n : sizes) shape += (shape.empty() ? "" : ",") + std::to_string(n);
  return row("adamw_update_multi_", copy_dt, shape,
             copy_dt == DType::F32 ? std::string("fp32 state, decay on every other")
                                   : fmt::format("fp32 state; model_copy {}", dn(copy_dt)),
             tol, tol, s);
}

// ---- the table --------------------------------------------------------------------------------

// Every row. speed = false: small shapes with odd sizes (vector remainders, uneven thread splits,
// tile edges), checked against the references. speed = true: one larger shape per op and dtype
// for the speed mode (references not used).
inline std::vector<Row> op_rows(bool speed = false) {
  const DType F32 = DType::F32, BF16 = DType::BF16, F16 = DType::F16;
  std::vector<Row> t;
  for (DType dt : {F32, BF16, F16}) {
    const bool half = dt != F32;
    const Tol exact = half ? Tol{1, 0} : Tol{};                  // one rounding (twice for 16-bit: via fp32)
    const Tol elementwise = half ? Tol{1, 1e-7} : Tol{4, 1e-7};  // + rel: outputs near 0 by cancellation
    const Tol sums = half ? Tol{1, 2e-6} : Tol{2, 2e-6};
    const Shape ew = speed ? Shape{2048, 2048} : Shape{3, 5, 67};
    const Shape ew2 = {200, 201};  // crosses the 16K-element chunks of the 16-bit kernels
    const Shape norm = speed ? Shape{2048, 2, 1024} : Shape{7, 2, 96};
    const Shape norm2 = {3, 1, 1000};

    if (speed) {
      t.push_back(gemm(dt, {1024, 1024, 1024}, dt, sums));
    } else {
      t.push_back(gemm(dt, {37, 29, 41}, dt, sums));
      t.push_back(gemm(dt, {24, 64, 16, false, true, 0.5f}, dt, sums));
      t.push_back(
          gemm(dt, {19, 33, 17, true, false, 1.0f, 1.0f}, F32, sums));  // weight gradient: fp32 c, beta 1
    }
    if (speed) {
      t.push_back(gemm_bias(dt, {1024, 1024, 1024, false, true}, dt, sums));
    } else {
      for (DType b : half ? std::vector<DType>{F32, dt} : std::vector<DType>{F32}) {
        t.push_back(gemm_bias(dt, {37, 29, 41}, b, sums));
        t.push_back(gemm_bias(dt, {24, 64, 16, false, true}, b, sums));  // a linear layer: x W^T + bias
      }
    }
    t.push_back(add_bias(dt, ew, dt, exact));
    if (half && !speed) t.push_back(add_bias(dt, ew, F32, exact));
    t.push_back(bias_backward(dt, ew, sums));
    for (const Shape& s : speed ? std::vector<Shape>{ew} : std::vector<Shape>{ew, ew2}) {
      t.push_back(add(dt, s, exact));
      t.push_back(add_inplace(dt, s, exact));
      t.push_back(scale_inplace(dt, s, exact));
      t.push_back(gelu_forward(dt, s, elementwise));
      // fp32: the kernel's s (1 - s) cancels for s = sigmoid(2u) near 1, ~30 fp32 ulps of dx.
      t.push_back(gelu_backward(dt, s, half ? elementwise : Tol{4, 4e-6}));
      t.push_back(gelu_backward_bias(dt, s, false, half ? elementwise : Tol{4, 4e-6}));
      // dbias: the rows' dx errors (fp32 ~30 ulps by cancellation, 16-bit one rounding) summed.
      t.push_back(gelu_backward_bias(dt, s, true, half ? Tol{1, 1e-2} : Tol{4, 1e-4}));
    }
    if (half) t.push_back(round_to_precision(dt, speed ? 1 << 22 : 4099));
    t.push_back(swiglu_forward(dt, speed ? 2048 : 13, speed ? 2048 : 67, elementwise));
    t.push_back(swiglu_backward(dt, speed ? 2048 : 13, speed ? 2048 : 67, elementwise));
    t.push_back(dropout(dt, speed ? 1 << 22 : 40001, 0.3f, exact));
    if (!speed) t.push_back(dropout(dt, 1001, 0.0f, Tol{}));

    for (const Shape& s : speed ? std::vector<Shape>{norm} : std::vector<Shape>{norm, norm2}) {
      for (DType w : half && !speed ? std::vector<DType>{dt, F32} : std::vector<DType>{dt}) {
        t.push_back(layernorm_forward(dt, s, w, sums));
        t.push_back(layernorm_backward(dt, s, w, Tol{sums.ulps, 1e-5}));
        t.push_back(rmsnorm_forward(dt, s, w, sums));
        t.push_back(rmsnorm_backward(dt, s, w, Tol{sums.ulps, 1e-5}));
      }
    }
    // qk-norm (Qwen3): one RMSNorm over each head of q or k, many short rows (s b heads) sharing one
    // [head_dim] weight, whose gradient sums them all.
    if (!speed) {
      const Shape heads = {4 * 2 * 6, 12};
      t.push_back(rmsnorm_forward(dt, heads, dt, sums));
      t.push_back(rmsnorm_backward(dt, heads, dt, Tol{sums.ulps, 1e-5}));
    }
    for (bool layernorm : {true, false}) {
      for (float p : speed ? std::vector<float>{0.5f} : std::vector<float>{0.0f, 0.5f}) {
        t.push_back(residual_norm_forward(dt, norm, dt, layernorm, p, false, sums));
        t.push_back(norm_backward_residual(dt, norm, dt, layernorm, p, false, Tol{sums.ulps, 1e-5}));
      }
      if (!speed) {  // the in-place forms the transformer layer uses, an odd h, fp32 weights
        t.push_back(residual_norm_forward(dt, norm2, F32, layernorm, 0.5f, true, sums));
        t.push_back(norm_backward_residual(dt, norm2, F32, layernorm, 0.5f, true, Tol{sums.ulps, 1e-5}));
      }
    }
    t.push_back(dropout_add(dt, speed ? ew : ew2, 0.5f, false));
    if (!speed) {
      t.push_back(dropout_add(dt, ew2, 0.0f, false));
      t.push_back(dropout_add(dt, ew, 0.5f, true));
    }
    const Shape rope_shape = speed ? Shape{512, 4, 12, 64} : Shape{9, 2, 3, 16};
    for (bool backward : {false, true}) {
      t.push_back(rope(dt, rope_shape, 5, backward, sums));
      if (!speed) t.push_back(rope(dt, rope_shape, 40000, backward, sums));
    }
    if (!speed) {
      // YaRN (Qwen's long-context configs: factor 4 over 32768; DeepSeek-V3's: factor 40 over 4096,
      // mscale = mscale_all_dim = 1, its 64-wide rope heads) on pairs that span the ramp.
      RopeScaling qwen;
      qwen.type = RopeScalingType::Yarn;
      qwen.factor = 4;
      qwen.original_max_position_embeddings = 32768;
      RopeScaling deepseek = qwen;
      deepseek.factor = 40;
      deepseek.original_max_position_embeddings = 4096;
      deepseek.mscale = deepseek.mscale_all_dim = 1.0;
      RopeScaling untruncated = qwen;  // and an attention factor given outright
      untruncated.truncate = false;
      untruncated.attention_factor = 1.25;
      for (bool backward : {false, true}) {
        t.push_back(rope(dt, Shape{9, 2, 3, 64}, 70000, backward, sums, qwen));
        t.push_back(rope(dt, Shape{9, 2, 3, 64}, 3, backward, sums, deepseek));
        t.push_back(rope(dt, Shape{9, 2, 3, 32}, 100000, backward, sums, untruncated));
      }
    }

    // Attention: CUDA's 16-bit kernels and the CPU's bf16 kernel (AVX512-BF16) round the
    // probabilities and dS to 16 bits before their products (ops.hpp), so their tolerance is that of
    // one 16-bit rounding inside a sum: 2^-8 of the largest output. fp16 on the CPU widens to fp32.
    const Tol attn = dt == DType::BF16 ? Tol{2, 4e-3} : half ? Tol{1, 1e-5} : Tol{2, 1e-6};
    const Tol attn_cuda = half ? Tol{2, 2e-2} : Tol{4, 1e-5};
    const std::vector<AttnShape> attn_shapes =
        speed ? std::vector<AttnShape>{{512, 2, 8, 8, 64, true},
                                       // MLA at DeepSeek-V3's head sizes (query/key 192, value 128)
                                       {512, 2, 8, 8, 192, true, 0, {}, 0, 0, 128}}
              : std::vector<AttnShape>{{13, 2, 4, 2, 16, true},    // GQA
                                       {13, 2, 4, 4, 16, false},   // MHA, not causal
                                       {70, 1, 2, 1, 64, true},    // MQA, crosses a 64-row tile
                                       {131, 1, 4, 2, 128, true},  // 3 tiles, odd rows, d 128
                                       // Varlen (packed documents), windows and context-parallel
                                       // blocks (attention_mask.hpp), each tile skip exercised:
                                       {150, 2, 4, 2, 16, true, 0, {40, 7, 1, 90}},  // docs across tiles
                                       {200, 1, 2, 1, 64, true, 0, {64, 64, 72}},    // on tile edges
                                       {131, 1, 2, 2, 128, true, 0, {17, 100, 30}},  // d 128
                                       {150, 2, 4, 2, 16, true, 37},                 // window < tile
                                       {200, 1, 2, 1, 64, true, 100},                // window > tile
                                       {140, 1, 2, 1, 32, true, 50, {30, 95, 15}},   // window + docs
                                       // The CPU products' bands (each row's visible columns, in
                                       // register blocks of 6 rows x 16 columns) at mask edges:
                                       // a last query block of 5 rows, a window narrower than a
                                       // register block, documents of 1 to 5 tokens and document
                                       // boundaries inside tiles and register blocks.
                                       {197, 1, 2, 1, 64, true},
                                       {100, 2, 2, 2, 64, true, 6},
                                       {200, 1, 3, 1, 64, true, 0, {5, 3, 61, 1, 70, 60}},
                                       {190, 1, 2, 1, 32, true, 17, {23, 64, 9}},
                                       // a cp block: queries after the keys, rows without a key
                                       {100, 2, 2, 1, 16, true, 60, {45, 80}, 130, 20},
                                       {70, 1, 2, 2, 16, true, 0, {30, 50}, 70, 0},
                                       // A value head size other than the query/key one (MLA):
                                       // DeepSeek-V3's 192 / 128, smaller and larger dv, with GQA,
                                       // documents, a window and a cp block.
                                       {70, 1, 2, 1, 192, true, 0, {}, 0, 0, 128},
                                       {37, 2, 4, 2, 24, true, 0, {}, 0, 0, 16},
                                       {13, 2, 4, 4, 16, false, 0, {}, 0, 0, 40},
                                       {150, 2, 4, 2, 24, true, 37, {40, 7, 1, 90}, 0, 0, 8},
                                       {100, 2, 2, 1, 24, true, 60, {45, 80}, 130, 20, 16},
                                       // DeepSeek-V3's sizes on a cp block with documents (ring
                                       // attention's blocks under MLA)
                                       {70, 1, 2, 1, 192, true, 0, {30, 50}, 70, 0, 128}};
    for (const AttnShape& a : attn_shapes) {
      t.push_back(attention_forward(dt, a, attn, attn_cuda));
      t.push_back(attention_backward(dt, a, dt == DType::BF16 ? attn : Tol{attn.ulps, 1e-5}, attn_cuda));
    }
    // The merge computes in fp32 whatever the block's dtype: exp / log within a few fp32 ulps, and
    // the weighted sum of two rows, small through cancellation in places (hence rel).
    const std::vector<MergeShape> merge_shapes =
        speed ? std::vector<MergeShape>{{4096, 2, 16, 128, 2048, 2048, false}}
              : std::vector<MergeShape>{{13, 2, 3, 16, 13, 0, false},  // the whole accumulator
                                        {24, 1, 2, 64, 12, 12, true},  // its second half, masked rows
                                        {20, 2, 1, 33, 7, 5, true},    // odd d (> one warp), offset rows
                                        // MLA: the merge runs on out [.., dv], DeepSeek-V3's 128
                                        {24, 1, 2, 128, 12, 12, true}};
    for (const MergeShape& m : merge_shapes) t.push_back(attention_merge(dt, m, Tol{4, 5e-7}));

    const int64_t eb = speed ? 8 : 3, es = speed ? 1024 : 5, erows = speed ? 8192 : 20, eh = speed ? 768 : 24;
    t.push_back(embedding_forward(dt, eb, es, erows, eh, dt, Tol{}));
    if (half && !speed) t.push_back(embedding_forward(dt, eb, es, erows, eh, F32, Tol{}));
    t.push_back(embedding_backward(dt, eb, es, erows, eh, Tol{1, 1e-6}));

    // Rows by index (MoE): odd widths, more output rows than source rows (repeats), zero rows, an
    // empty group (no rows at all), and fp32 sums of 16-bit rows.
    if (speed) {
      t.push_back(gather_rows(dt, 8192, 16384, 1024, false, Tol{}));
      t.push_back(gather_rows(dt, 8192, 16384, 1024, true, exact));
      t.push_back(gather_sum_rows(dt, 16384, 8192, 2, 1024, dt, true, sums));
      t.push_back(row_dot(dt, 16384, 8192, 1024, Tol{1, 0}));
    } else {
      for (int64_t n : {int64_t{29}, int64_t{0}}) {
        t.push_back(gather_rows(dt, 11, n, 37, false, Tol{}));
        t.push_back(gather_rows(dt, 11, n, 37, true, exact));
        t.push_back(row_dot(dt, n, 9, 37, Tol{1, 0}));
      }
      t.push_back(gather_rows(dt, 0, 5, 37, false, Tol{}));  // only zero rows: nothing to read
      for (DType out : half ? std::vector<DType>{dt, F32} : std::vector<DType>{F32}) {
        t.push_back(gather_sum_rows(dt, 13, 17, 3, 37, out, true, sums));
        t.push_back(gather_sum_rows(dt, 13, 17, 3, 37, out, false, sums));
      }
      t.push_back(gather_sum_rows(dt, 0, 7, 2, 37, dt, true, sums));  // every assignment dropped
    }

    const CeShape ce = speed ? CeShape{2048, 8192, 0, 8192} : CeShape{11, 37, 20, 50};
    t.push_back(cross_entropy_local_stats(dt, ce, Tol{}));
    t.push_back(cross_entropy_sum_exp(dt, ce, Tol{4, 0}));
    t.push_back(cross_entropy_stats(dt, ce, Tol{4, 0}));  // row_max, target_logit exact; sum_exp as above
    t.push_back(cross_entropy_backward(dt, ce, half ? Tol{1, 1e-7} : Tol{4, 1e-7}));
    if (!speed) t.push_back(cross_entropy_backward(dt, {9, 64, 0, 64}, half ? Tol{1, 1e-7} : Tol{4, 1e-7}));

    t.push_back(sum_of_squares(dt, speed ? 1 << 22 : 10007, Tol{0, 1e-12}));
  }
  // fp32 only: the loss pieces are statistics, the gradient norm's inputs parameter gradients.
  t.push_back(cross_entropy_loss(speed ? 1 << 20 : 1001, Tol{4, 1e-7}));  // log, and + - cancels
  t.push_back(
      sum_of_squares_accumulate(speed ? 1 << 22 : 10007, Tol{1, 0}));  // double sum, one fp32 rounding
  t.push_back(adamw_update(speed ? 1 << 22 : 1003, Tol{4, 1e-7}));     // m, v: b1 m + (1 - b1) g cancels
  for (DType copy : {BF16, F16})
    t.push_back(adamw_update_model_copy(copy, speed ? 1 << 22 : 1003, Tol{4, 1e-7}));
  const std::vector<int64_t> lists =
      speed ? std::vector<int64_t>{1 << 22, 1 << 20, 384} : std::vector<int64_t>{1003, 7, 70001};
  t.push_back(sum_of_squares_accumulate_multi(lists, Tol{3, 0}));  // one fp32 rounding per tensor
  for (DType copy : {F32, BF16, F16}) t.push_back(adamw_update_multi(copy, lists, Tol{4, 1e-7}));
  return t;
}

// ---- rejections -------------------------------------------------------------------------------

// Wrong dtype combinations, each refused naming the op and the argument.
inline std::vector<Rejection> rejection_rows() {
  const DType F32 = DType::F32, BF16 = DType::BF16, F16 = DType::F16, I32 = DType::I32;
  auto z = [](Shape s, DType d) { return Tensor::zeros(s, d); };
  std::vector<Rejection> r;
  r.push_back({"gemm", "b", "bf16 a with fp16 b", [=] {
                 Tensor c = z({4, 4}, BF16);
                 ops::gemm(z({4, 4}, BF16), false, z({4, 4}, F16), false, c);
               }});
  r.push_back({"gemm", "c", "bf16 a, b with fp16 c", [=] {
                 Tensor c = z({4, 4}, F16);
                 ops::gemm(z({4, 4}, BF16), false, z({4, 4}, BF16), false, c);
               }});
  r.push_back({"gemm_bias", "bias", "bf16 a, b with fp16 bias", [=] {
                 Tensor c = z({4, 4}, BF16);
                 ops::gemm_bias(z({4, 4}, BF16), false, z({4, 4}, BF16), false, z({4}, F16), c);
               }});
  r.push_back({"gemm_bias", "c", "bf16 a, b with fp32 c", [=] {
                 Tensor c = z({4, 4}, F32);
                 ops::gemm_bias(z({4, 4}, BF16), false, z({4, 4}, BF16), false, z({4}, F32), c);
               }});
  r.push_back({"add", "out", "bf16 a, b with fp32 out", [=] {
                 Tensor out = z({8}, F32);
                 ops::add(z({8}, BF16), z({8}, BF16), out);
               }});
  r.push_back({"bias_backward", "dbias", "bf16 dbias", [=] {
                 Tensor db = z({8}, BF16);
                 ops::bias_backward(z({2, 8}, BF16), db);
               }});
  r.push_back({"gelu_forward", "x", "int32 x", [=] {
                 Tensor y = z({8}, F32);
                 ops::gelu_forward(z({8}, I32), y);
               }});
  r.push_back({"round_to_precision_", "x", "bf16 x", [=] {
                 Tensor x = z({8}, BF16);
                 ops::round_to_precision_(x, BF16);
               }});
  r.push_back({"layernorm_forward", "mean", "fp16 mean", [=] {
                 Tensor y = z({2, 8}, F16), mean = z({2}, F16), rstd = z({2}, F32);
                 ops::layernorm_forward(z({2, 8}, F16), z({8}, F32), z({8}, F32), y, mean, rstd, 1e-5f);
               }});
  r.push_back({"layernorm_forward", "weight", "fp16 weight with bf16 activations", [=] {
                 Tensor y = z({2, 8}, BF16), mean = z({2}, F32), rstd = z({2}, F32);
                 ops::layernorm_forward(z({2, 8}, BF16), z({8}, F16), z({8}, F32), y, mean, rstd, 1e-5f);
               }});
  r.push_back({"layernorm_backward", "dweight", "bf16 dweight", [=] {
                 Tensor dx = z({2, 8}, BF16), dw = z({8}, BF16), db = z({8}, F32);
                 ops::layernorm_backward(z({2, 8}, BF16), z({2, 8}, BF16), z({8}, BF16), z({2}, F32),
                                         z({2}, F32), dx, dw, db);
               }});
  r.push_back({"rmsnorm_backward", "rstd", "bf16 rstd", [=] {
                 Tensor dx = z({2, 8}, BF16), dw = z({8}, F32);
                 ops::rmsnorm_backward(z({2, 8}, BF16), z({2, 8}, BF16), z({8}, F32), z({2}, BF16), dx, dw);
               }});
  r.push_back({"attention_forward", "lse", "bf16 lse", [=] {
                 Tensor out = z({4, 1, 2, 8}, BF16), lse = z({1, 2, 4}, BF16);
                 ops::attention_forward(z({4, 1, 2, 8}, BF16), z({4, 1, 2, 8}, BF16), z({4, 1, 2, 8}, BF16),
                                        out, lse, true, 0.35f);
               }});
  r.push_back({"attention_backward", "dk", "fp16 dk with bf16 activations", [=] {
                 const Shape s{4, 1, 2, 8};
                 Tensor dq = z(s, BF16), dk = z(s, F16), dv = z(s, BF16);
                 ops::attention_backward(z(s, BF16), z(s, BF16), z(s, BF16), z(s, BF16), z(s, BF16),
                                         z({1, 2, 4}, F32), dq, dk, dv, true, 0.35f);
               }});
  r.push_back({"attention_merge", "out_acc", "bf16 out_acc", [=] {
                 Tensor acc = z({4, 1, 2, 8}, BF16), lse = z({1, 2, 4}, F32);
                 ops::attention_merge(acc, lse, z({4, 1, 2, 8}, BF16), z({1, 2, 4}, F32), 0);
               }});
  r.push_back({"attention_merge", "lse_blk", "bf16 lse_blk", [=] {
                 Tensor acc = z({4, 1, 2, 8}, F32), lse = z({1, 2, 4}, F32);
                 ops::attention_merge(acc, lse, z({4, 1, 2, 8}, F32), z({1, 2, 4}, BF16), 0);
               }});
  r.push_back({"embedding_forward", "weight", "fp16 weight with bf16 out", [=] {
                 Tensor out = z({3, 2, 8}, BF16);
                 ops::embedding_forward(z({2, 3}, I32), z({10, 8}, F16), 0, out);
               }});
  r.push_back({"embedding_backward", "dweight", "bf16 dweight", [=] {
                 Tensor dw = z({10, 8}, BF16);
                 ops::embedding_backward(z({2, 3}, I32), z({3, 2, 8}, BF16), 0, dw);
               }});
  r.push_back({"gather_rows", "index", "int32 index", [=] {
                 Tensor out = z({3, 8}, BF16);
                 ops::gather_rows(z({4, 8}, BF16), z({3}, I32), out);
               }});
  r.push_back({"gather_rows", "out", "fp16 out from bf16 src", [=] {
                 Tensor out = z({3, 8}, F16);
                 ops::gather_rows(z({4, 8}, BF16), z({3}, DType::I64), out);
               }});
  r.push_back({"gather_rows_scaled", "scale", "bf16 scale", [=] {
                 Tensor out = z({3, 8}, BF16);
                 ops::gather_rows_scaled(z({4, 8}, BF16), z({3}, DType::I64), z({3}, BF16), out);
               }});
  r.push_back({"gather_sum_rows", "out", "fp16 out from bf16 src", [=] {
                 Tensor out = z({3, 8}, F16);
                 ops::gather_sum_rows(z({4, 8}, BF16), z({3, 2}, DType::I64), z({3, 2}, F32), out);
               }});
  r.push_back({"gather_sum_rows", "weight", "bf16 weight", [=] {
                 Tensor out = z({3, 8}, F32);
                 ops::gather_sum_rows(z({4, 8}, BF16), z({3, 2}, DType::I64), z({3, 2}, BF16), out);
               }});
  r.push_back({"row_dot", "out", "bf16 out", [=] {
                 Tensor out = z({3}, BF16);
                 ops::row_dot(z({3, 8}, BF16), z({4, 8}, BF16), z({3}, DType::I64), out);
               }});
  r.push_back({"cross_entropy_local_stats", "targets", "fp32 targets", [=] {
                 Tensor m = z({4}, F32), tl = z({4}, F32);
                 ops::cross_entropy_local_stats(z({4, 8}, BF16), z({4}, F32), 0, 8, m, tl);
               }});
  r.push_back({"cross_entropy_sum_exp", "sum_exp", "bf16 sum_exp", [=] {
                 Tensor se = z({4}, BF16);
                 ops::cross_entropy_sum_exp(z({4, 8}, BF16), z({4}, F32), 0, 8, se);
               }});
  r.push_back({"cross_entropy_backward", "grad_scale", "fp16 grad_scale", [=] {
                 Tensor dl = z({4, 8}, F16);
                 ops::cross_entropy_backward(z({4, 8}, F16), z({4}, I32), z({4}, F32), z({4}, F32),
                                             z({4}, F16), 0, 8, dl);
               }});
  r.push_back({"cross_entropy_loss", "sum_exp", "bf16 sum_exp", [=] {
                 Tensor loss = z({4}, F32);
                 ops::cross_entropy_loss(z({4}, F32), z({4}, BF16), z({4}, F32), loss);
               }});
  r.push_back({"sum_of_squares_accumulate", "x", "bf16 x", [=] {
                 Tensor acc = z({1}, F32);
                 ops::sum_of_squares_accumulate(z({8}, BF16), acc);
               }});
  r.push_back({"gelu_backward_bias", "dbias", "bf16 dbias", [=] {
                 Tensor dx = z({4, 8}, F32), db = z({8}, BF16);
                 ops::gelu_backward_bias(z({4, 8}, F32), z({4, 8}, F32), dx, db);
               }});
  r.push_back({"sum_of_squares_accumulate_multi", "x", "bf16 x", [=] {
                 Tensor acc = z({1}, F32);
                 ops::sum_of_squares_accumulate_multi({z({8}, F32), z({8}, BF16)}, acc);
               }});
  r.push_back(
      {"adamw_update_multi_", "grad", "bf16 grad", [=] {
         ops::adamw_update_multi_({{z({8}, F32), z({8}, BF16), z({8}, F32), z({8}, F32)}}, ops::AdamWStep{});
       }});
  r.push_back({"adamw_update_", "grad", "bf16 grad", [=] {
                 Tensor p = z({8}, F32), m = z({8}, F32), v = z({8}, F32);
                 ops::adamw_update_(p, z({8}, BF16), m, v, ops::AdamWStep{});
               }});
  r.push_back({"adamw_update_", "model_copy", "fp32 model_copy", [=] {
                 Tensor p = z({8}, F32), m = z({8}, F32), v = z({8}, F32), copy = z({8}, F32);
                 ops::adamw_update_(p, z({8}, F32), m, v, copy, ops::AdamWStep{});
               }});
  return r;
}

}  // namespace parallel::testing::op_table
