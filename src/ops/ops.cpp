// parallel::ops: argument checks and device dispatch (see include/parallel/ops.hpp).
//
// Every op validates here, once, what its kernels assume: tensors defined, contiguous, on one
// device, the dtypes the op's contract allows (ops.hpp, "Precision"), with the shapes of the
// contract. Kernels then read raw pointers.
// CUDA tensors go to the kernels of kernels/cuda/cuda_ops.hpp: one PARALLEL_ON_CUDA line per op.
// Meta tensors (meta.hpp) pass the same checks, then record the op's event instead of running it:
// one meta::record_op line per op, with its FLOPs and the tensors it reads and writes.
#include "parallel/ops.hpp"

#include <omp.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "cpu/cpu_ops.hpp"
#include "parallel/build_config.hpp"
#include "parallel/error.hpp"
#include "parallel/meta.hpp"
#include "parallel/op_times.hpp"
#if PARALLEL_HAVE_CUDA
#include "cuda/cuda_loss_ops.hpp"
#include "cuda/cuda_ops.hpp"
#include "cuda/cuda_optim_ops.hpp"
#endif

namespace parallel::ops {
namespace {

// What dtype an argument may have (ops.hpp, "Precision"):
//   Act   - fp32, bf16 or fp16, the same for every Act argument of the op (its activation dtype)
//   Param - a parameter value: fp32, or the op's activation dtype
//   F32   - fp32 only (statistics, parameter gradients)
//   I32   - int32 (token ids, targets)
//   I64   - int64 (row indices)
enum class Want { Act, Param, F32, I32, I64 };

// How an argument's elements may lie:
//   Contiguous - packed row-major (every op's default)
//   HeadRows   - [s, b, heads, e] with each (position, batch element)'s heads side by side (strides
//                e and 1) and any position and batch strides: a view into a fused tensor, as
//                attention's q, k, v (and dq, dk, dv) are into the qkv projection's output (and its
//                gradient). CPU kernels only: on CUDA it must be contiguous.
enum class Layout { Contiguous, HeadRows };

struct Arg {
  const Tensor& t;
  const char* name;
  Want want = Want::Act;
  Layout layout = Layout::Contiguous;
};

bool has_head_rows(const Tensor& t) {
  return t.dim() == 4 && (t.size(3) <= 1 || t.strides()[3] == 1) &&
         (t.size(2) <= 1 || t.strides()[2] == t.size(3));
}

bool is_float_dtype(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

struct Checked {
  Device device;
  DType act = DType::F32;  // the op's activation dtype (fp32 when it has no Act argument)
};

// Checks the common conditions; returns the device of the tensors and the op's activation dtype.
Checked check_args(const char* op, std::initializer_list<Arg> args) {
  Checked out{args.begin()->t.device()};
  const Arg* first_act = nullptr;
  for (const Arg& a : args) {
    PARALLEL_CHECK(a.t.defined(), "ops::{}: {} is undefined", op, a.name);
    if (a.layout == Layout::HeadRows && !a.t.device().is_cuda() && a.t.dim() == 4)
      PARALLEL_CHECK(has_head_rows(a.t),
                     "ops::{}: {} {} with strides {} must hold each position's heads side by side "
                     "(strides [.., .., {}, 1]; call .contiguous())",
                     op, a.name, shape_str(a.t.shape()), shape_str(a.t.strides()), a.t.size(3));
    else
      PARALLEL_CHECK(a.t.is_contiguous(), "ops::{}: {} {} must be contiguous (call .contiguous())", op,
                     a.name, shape_str(a.t.shape()));
    PARALLEL_CHECK(a.t.device() == out.device, "ops::{}: {} is on {} but {} is on {}", op, a.name,
                   a.t.device().str(), args.begin()->name, out.device.str());
    if (a.want == Want::Act) {
      PARALLEL_CHECK(is_float_dtype(a.t.dtype()), "ops::{}: {} is {}, expected fp32, bf16 or fp16", op,
                     a.name, dtype_name(a.t.dtype()));
      if (first_act == nullptr) {
        first_act = &a;
        out.act = a.t.dtype();
      }
      PARALLEL_CHECK(a.t.dtype() == out.act, "ops::{}: {} is {} but {} is {} (activations share one dtype)",
                     op, a.name, dtype_name(a.t.dtype()), first_act->name, dtype_name(out.act));
    }
  }
  for (const Arg& a : args) {
    const DType d = a.t.dtype();
    switch (a.want) {
      case Want::Act:
        break;
      case Want::Param:
        PARALLEL_CHECK(d == DType::F32 || d == out.act,
                       "ops::{}: {} is {}, expected fp32 or {} (the activations')", op, a.name, dtype_name(d),
                       dtype_name(out.act));
        break;
      case Want::F32:
        PARALLEL_CHECK(d == DType::F32, "ops::{}: {} is {}, expected fp32", op, a.name, dtype_name(d));
        break;
      case Want::I32:
        PARALLEL_CHECK(d == DType::I32, "ops::{}: {} is {}, expected int32", op, a.name, dtype_name(d));
        break;
      case Want::I64:
        PARALLEL_CHECK(d == DType::I64, "ops::{}: {} is {}, expected int64", op, a.name, dtype_name(d));
        break;
    }
  }
  return out;
}

// `call` is the op's CUDA kernel (kernels/cuda/cuda_ops.hpp) with the op's own arguments.
#if PARALLEL_HAVE_CUDA
#define PARALLEL_ON_CUDA(call) return ::parallel::cuda::call
#else
[[noreturn]] void no_cuda_kernel(const char* call) {
  PARALLEL_FAIL("no CUDA kernel for ops::{}: this build has no CUDA backend (move the tensors to the CPU)",
                call);
}
#define PARALLEL_ON_CUDA(call) no_cuda_kernel(#call)
#endif

void check_same_shape(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  PARALLEL_CHECK(a.shape() == b.shape(), "ops::{}: {} {} and {} {} must have the same shape", op, an,
                 shape_str(a.shape()), bn, shape_str(b.shape()));
}

// x is [..., h] with h = n (the normalised / bias dimension), at least 1-D.
void check_last_dim(const char* op, const Tensor& x, const char* xn, int64_t n, const char* what) {
  PARALLEL_CHECK(x.dim() >= 1 && x.size(-1) == n, "ops::{}: {} {} must end in {} = {}", op, xn,
                 shape_str(x.shape()), what, n);
}

// r is [rows] for x = [..., h]: the per-row statistics of the norms.
void check_rows(const char* op, const Tensor& r, const char* rn, const Tensor& x) {
  const int64_t rows = x.size(-1) == 0 ? 0 : x.numel() / x.size(-1);
  PARALLEL_CHECK(r.dim() == 1 && r.size(0) == rows, "ops::{}: {} {} must be [{}] (one per row of {})", op, rn,
                 shape_str(r.shape()), rows, shape_str(x.shape()));
}

void check_1d(const char* op, const Tensor& w, const char* wn) {
  PARALLEL_CHECK(w.dim() == 1, "ops::{}: {} {} must be 1-D", op, wn, shape_str(w.shape()));
}

}  // namespace

// ---- dense algebra ----------------------------------------------------------------------------

namespace {
// a, b, c 2-D with op(a) [M, K] @ op(b) [K, N] -> c [M, N].
void check_gemm_shapes(const char* op, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                       const Tensor& c) {
  PARALLEL_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2,
                 "ops::{}: operands must be 2-D, got a {} b {} c {}", op, shape_str(a.shape()),
                 shape_str(b.shape()), shape_str(c.shape()));
  const int64_t m = trans_a ? a.size(1) : a.size(0), ka = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  PARALLEL_CHECK(ka == kb && c.size(0) == m && c.size(1) == n,
                 "ops::{}: op(a) [{}, {}] @ op(b) [{}, {}] -> c {} does not fit (a {}{}, b {}{})", op, m, ka,
                 kb, n, shape_str(c.shape()), shape_str(a.shape()), trans_a ? "^T" : "", shape_str(b.shape()),
                 trans_b ? "^T" : "");
}
}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
          Stream stream) {
  const OpTimeSpan op_time("gemm");
  const Checked k = check_args("gemm", {{a, "a"}, {b, "b"}, {c, "c", Want::Param}});
  check_gemm_shapes("gemm", a, trans_a, b, trans_b, c);
  if (k.device.is_meta())
    return meta::record_op(
        "gemm", 2.0 * static_cast<double>(c.numel()) * static_cast<double>(trans_a ? a.size(0) : a.size(1)),
        {&a, &b}, {&c});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(gemm(a, trans_a, b, trans_b, c, alpha, beta, stream));
  }
  cpu::gemm(a, trans_a, b, trans_b, c, alpha, beta);
}

void gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias, Tensor& c,
               Stream stream) {
  const OpTimeSpan op_time("gemm_bias");
  const Checked k = check_args("gemm_bias", {{a, "a"}, {b, "b"}, {bias, "bias", Want::Param}, {c, "c"}});
  check_1d("gemm_bias", bias, "bias");
  check_last_dim("gemm_bias", c, "c", bias.numel(), "bias size");
  if (k.device.is_meta()) {
    check_gemm_shapes("gemm_bias", a, trans_a, b, trans_b, c);  // the CPU's check; CUDA's gemm checks
    return meta::record_op(
        "gemm_bias",
        (2.0 * static_cast<double>(trans_a ? a.size(0) : a.size(1)) + 1.0) * static_cast<double>(c.numel()),
        {&a, &b, &bias}, {&c});
  }
  if (k.device.is_cuda()) {
    // The bias in the GEMM's epilogue for 16-bit operands (cuda_ops.hpp); the shapes checked by the
    // CUDA GEMM as for gemm().
    PARALLEL_ON_CUDA(gemm_bias(a, trans_a, b, trans_b, bias, c, stream));
  }
  check_gemm_shapes("gemm_bias", a, trans_a, b, trans_b, c);
  cpu::gemm_bias(a, trans_a, b, trans_b, bias, c);
}

WeightPackingScope::WeightPackingScope(const std::vector<Tensor>& buffers) {
  std::vector<std::pair<const void*, int64_t>> ranges;
  for (const Tensor& t : buffers)
    if (t.defined() && t.device().is_cpu())
      ranges.emplace_back(t.data_ptr(), t.numel() * static_cast<int64_t>(dtype_size(t.dtype())));
  cpu::open_weight_packing(ranges);
}

WeightPackingScope::~WeightPackingScope() { cpu::close_weight_packing(); }

int64_t WeightPackingScope::packs_made() { return cpu::weight_packs_made(); }

bool WeightPackingScope::enabled() {
  const char* v = std::getenv("PARALLEL_PACK_WEIGHTS");
  return v == nullptr || std::string(v) != "0";
}

bool WeightPackingScope::packs(DType dtype) { return dtype != DType::F32 && cpu::native_gemm(dtype); }

std::string gemm_implementation(DType dtype) { return cpu::gemm_implementation(dtype); }

void add_bias(Tensor& y, const Tensor& bias, Stream stream) {
  const OpTimeSpan op_time("add_bias");
  const Checked k = check_args("add_bias", {{y, "y"}, {bias, "bias", Want::Param}});
  check_1d("add_bias", bias, "bias");
  check_last_dim("add_bias", y, "y", bias.numel(), "bias size");
  if (k.device.is_meta())
    return meta::record_op("add_bias", static_cast<double>(y.numel()), {&y, &bias}, {&y});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(add_bias(y, bias, stream));
  }
  cpu::add_bias(y, bias);
}

void bias_backward(const Tensor& dy, Tensor& dbias, Stream stream) {
  const OpTimeSpan op_time("bias_backward");
  const Checked k = check_args("bias_backward", {{dy, "dy"}, {dbias, "dbias", Want::F32}});
  check_1d("bias_backward", dbias, "dbias");
  check_last_dim("bias_backward", dy, "dy", dbias.numel(), "dbias size");
  if (k.device.is_meta())
    return meta::record_op("bias_backward", static_cast<double>(dy.numel()), {&dy}, {&dbias});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(bias_backward(dy, dbias, stream));
  }
  cpu::bias_backward(dy, dbias);
}

// ---- element-wise -----------------------------------------------------------------------------

void add(const Tensor& a, const Tensor& b, Tensor& out, Stream stream) {
  const OpTimeSpan op_time("add");
  const Checked k = check_args("add", {{a, "a"}, {b, "b"}, {out, "out"}});
  check_same_shape("add", a, "a", b, "b");
  check_same_shape("add", a, "a", out, "out");
  if (k.device.is_meta()) return meta::record_op("add", static_cast<double>(out.numel()), {&a, &b}, {&out});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(add(a, b, out, stream));
  }
  cpu::add(a, b, out);
}

void add_(Tensor& a, const Tensor& b, Stream stream) {
  const OpTimeSpan op_time("add_");
  const Checked k = check_args("add_", {{a, "a"}, {b, "b"}});
  check_same_shape("add_", a, "a", b, "b");
  if (k.device.is_meta()) return meta::record_op("add_", static_cast<double>(a.numel()), {&a, &b}, {&a});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(add_(a, b, stream));
  }
  cpu::add_(a, b);
}

void scale_(Tensor& a, float alpha, Stream stream) {
  const OpTimeSpan op_time("scale_");
  const Checked k = check_args("scale_", {{a, "a"}});
  if (k.device.is_meta()) return meta::record_op("scale_", static_cast<double>(a.numel()), {&a}, {&a});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(scale_(a, alpha, stream));
  }
  cpu::scale_(a, alpha);
}

void round_to_precision_(Tensor& x, DType precision, Stream stream) {
  PARALLEL_CHECK(precision == DType::F32 || precision == DType::BF16 || precision == DType::F16,
                 "ops::round_to_precision_: precision must be fp32, bf16 or fp16, got {}",
                 dtype_name(precision));
  const OpTimeSpan op_time("round_to_precision_");
  const Checked k = check_args("round_to_precision_", {{x, "x", Want::F32}});
  if (precision == DType::F32) return;
  if (k.device.is_meta())
    return meta::record_op("round_to_precision_", static_cast<double>(x.numel()), {&x}, {&x});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(round_to_precision_(x, precision, stream));
  if (precision == DType::BF16)
    cpu::round_to_bf16_(x);
  else
    cpu::round_to_f16_(x);
}

void gelu_forward(const Tensor& x, Tensor& y, Stream stream) {
  const OpTimeSpan op_time("gelu_forward");
  const Checked k = check_args("gelu_forward", {{x, "x"}, {y, "y"}});
  check_same_shape("gelu_forward", x, "x", y, "y");
  if (k.device.is_meta())
    return meta::record_op("gelu_forward", 8.0 * static_cast<double>(y.numel()), {&x}, {&y});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(gelu_forward(x, y, stream));
  }
  cpu::gelu_forward(x, y);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream) {
  const OpTimeSpan op_time("gelu_backward");
  const Checked k = check_args("gelu_backward", {{dy, "dy"}, {x, "x"}, {dx, "dx"}});
  check_same_shape("gelu_backward", dy, "dy", x, "x");
  check_same_shape("gelu_backward", dx, "dx", x, "x");
  if (k.device.is_meta())
    return meta::record_op("gelu_backward", 12.0 * static_cast<double>(dx.numel()), {&dy, &x}, {&dx});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(gelu_backward(dy, x, dx, stream));
  }
  cpu::gelu_backward(dy, x, dx);
}

void gelu_backward_bias(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& dbias, Stream stream) {
  const OpTimeSpan op_time("gelu_backward_bias");
  const Checked k =
      check_args("gelu_backward_bias", {{dy, "dy"}, {x, "x"}, {dx, "dx"}, {dbias, "dbias", Want::F32}});
  check_same_shape("gelu_backward_bias", dy, "dy", x, "x");
  check_same_shape("gelu_backward_bias", dx, "dx", x, "x");
  check_1d("gelu_backward_bias", dbias, "dbias");
  check_last_dim("gelu_backward_bias", dx, "dx", dbias.numel(), "dbias size");
  // Off the CPU (and on meta, which records them): the two ops.
  if (!k.device.is_cpu()) {
    gelu_backward(dy, x, dx, stream);
    bias_backward(dx, dbias, stream);
    return;
  }
  cpu::gelu_backward_bias(dy, x, dx, dbias);
}

namespace {
// x [..., 2f] and y [..., f] with the same leading dimensions.
void check_swiglu(const char* op, const Tensor& x, const Tensor& y, const char* yn) {
  bool ok = x.dim() >= 1 && x.dim() == y.dim() && x.size(-1) % 2 == 0 && y.size(-1) * 2 == x.size(-1);
  for (int64_t d = 0; ok && d + 1 < x.dim(); d++) ok = x.size(d) == y.size(d);
  PARALLEL_CHECK(ok, "ops::{}: x {} must be [..., 2f] and {} {} [..., f] with the same leading dimensions",
                 op, shape_str(x.shape()), yn, shape_str(y.shape()));
}
}  // namespace

void swiglu_forward(const Tensor& x, Tensor& y, Stream stream) {
  const OpTimeSpan op_time("swiglu_forward");
  const Checked k = check_args("swiglu_forward", {{x, "x"}, {y, "y"}});
  check_swiglu("swiglu_forward", x, y, "y");
  if (k.device.is_meta())
    return meta::record_op("swiglu_forward", 5.0 * static_cast<double>(y.numel()), {&x}, {&y});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(swiglu_forward(x, y, stream));
  }
  cpu::swiglu_forward(x, y);
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream stream) {
  const OpTimeSpan op_time("swiglu_backward");
  const Checked k = check_args("swiglu_backward", {{dy, "dy"}, {x, "x"}, {dx, "dx"}});
  check_swiglu("swiglu_backward", x, dy, "dy");
  check_same_shape("swiglu_backward", dx, "dx", x, "x");
  if (k.device.is_meta())
    return meta::record_op("swiglu_backward", 5.0 * static_cast<double>(dx.numel()), {&dy, &x}, {&dx});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(swiglu_backward(dy, x, dx, stream));
  }
  cpu::swiglu_backward(dy, x, dx);
}

void dropout_forward(const Tensor& x, Tensor& y, float p, uint64_t seed, uint64_t offset, Stream stream) {
  const OpTimeSpan op_time("dropout_forward");
  const Checked k = check_args("dropout_forward", {{x, "x"}, {y, "y"}});
  check_same_shape("dropout_forward", x, "x", y, "y");
  PARALLEL_CHECK(p >= 0.0f && p <= 1.0f, "ops::dropout_forward: p = {} must be in [0, 1]", p);
  if (k.device.is_meta())
    return meta::record_op("dropout_forward", 2.0 * static_cast<double>(y.numel()), {&x}, {&y});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(dropout_forward(x, y, p, seed, offset, stream));
  }
  cpu::dropout_forward(x, y, p, seed, offset);
}

void dropout_backward(const Tensor& dy, Tensor& dx, float p, uint64_t seed, uint64_t offset, Stream stream) {
  const OpTimeSpan op_time("dropout_backward");
  const Checked k = check_args("dropout_backward", {{dy, "dy"}, {dx, "dx"}});
  check_same_shape("dropout_backward", dy, "dy", dx, "dx");
  PARALLEL_CHECK(p >= 0.0f && p <= 1.0f, "ops::dropout_backward: p = {} must be in [0, 1]", p);
  if (k.device.is_meta())
    return meta::record_op("dropout_backward", 2.0 * static_cast<double>(dx.numel()), {&dy}, {&dx});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(dropout_backward(dy, dx, p, seed, offset, stream));
  }
  cpu::dropout_backward(dy, dx, p, seed, offset);
}

// ---- normalisation ----------------------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                       Tensor& rstd, float eps, Stream stream) {
  const char* op = "layernorm_forward";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{x, "x"},
                                    {weight, "weight", Want::Param},
                                    {bias, "bias", Want::Param},
                                    {y, "y"},
                                    {mean, "mean", Want::F32},
                                    {rstd, "rstd", Want::F32}});
  check_1d(op, weight, "weight");
  check_last_dim(op, x, "x", weight.numel(), "weight size");
  check_same_shape(op, bias, "bias", weight, "weight");
  check_same_shape(op, y, "y", x, "x");
  check_rows(op, mean, "mean", x);
  check_rows(op, rstd, "rstd", x);
  if (k.device.is_meta())
    return meta::record_op("layernorm_forward", 8.0 * static_cast<double>(x.numel()), {&x, &weight, &bias},
                           {&y, &mean, &rstd});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(layernorm_forward(x, weight, bias, y, mean, rstd, eps, stream));
  }
  cpu::layernorm_forward(x, weight, bias, y, mean, rstd, eps);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias, Stream stream) {
  const char* op = "layernorm_backward";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{dy, "dy"},
                                    {x, "x"},
                                    {weight, "weight", Want::Param},
                                    {mean, "mean", Want::F32},
                                    {rstd, "rstd", Want::F32},
                                    {dx, "dx"},
                                    {dweight, "dweight", Want::F32},
                                    {dbias, "dbias", Want::F32}});
  check_1d(op, weight, "weight");
  check_last_dim(op, x, "x", weight.numel(), "weight size");
  check_same_shape(op, dy, "dy", x, "x");
  check_same_shape(op, dx, "dx", x, "x");
  check_same_shape(op, dweight, "dweight", weight, "weight");
  check_same_shape(op, dbias, "dbias", weight, "weight");
  check_rows(op, mean, "mean", x);
  check_rows(op, rstd, "rstd", x);
  if (k.device.is_meta())
    return meta::record_op("layernorm_backward", 12.0 * static_cast<double>(x.numel()),
                           {&dy, &x, &weight, &mean, &rstd}, {&dx, &dweight, &dbias});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias, stream));
  }
  cpu::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
}

void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                     Stream stream) {
  const char* op = "rmsnorm_forward";
  const OpTimeSpan op_time(op);
  const Checked k =
      check_args(op, {{x, "x"}, {weight, "weight", Want::Param}, {y, "y"}, {rstd, "rstd", Want::F32}});
  check_1d(op, weight, "weight");
  check_last_dim(op, x, "x", weight.numel(), "weight size");
  check_same_shape(op, y, "y", x, "x");
  check_rows(op, rstd, "rstd", x);
  if (k.device.is_meta())
    return meta::record_op("rmsnorm_forward", 5.0 * static_cast<double>(x.numel()), {&x, &weight},
                           {&y, &rstd});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(rmsnorm_forward(x, weight, y, rstd, eps, stream));
  }
  cpu::rmsnorm_forward(x, weight, y, rstd, eps);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight, Stream stream) {
  const char* op = "rmsnorm_backward";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{dy, "dy"},
                                    {x, "x"},
                                    {weight, "weight", Want::Param},
                                    {rstd, "rstd", Want::F32},
                                    {dx, "dx"},
                                    {dweight, "dweight", Want::F32}});
  check_1d(op, weight, "weight");
  check_last_dim(op, x, "x", weight.numel(), "weight size");
  check_same_shape(op, dy, "dy", x, "x");
  check_same_shape(op, dx, "dx", x, "x");
  check_same_shape(op, dweight, "dweight", weight, "weight");
  check_rows(op, rstd, "rstd", x);
  if (k.device.is_meta())
    return meta::record_op("rmsnorm_backward", 9.0 * static_cast<double>(x.numel()),
                           {&dy, &x, &weight, &rstd}, {&dx, &dweight});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(rmsnorm_backward(dy, x, weight, rstd, dx, dweight, stream));
  }
  cpu::rmsnorm_backward(dy, x, weight, rstd, dx, dweight);
}

// ---- residual add fused with its neighbours ----------------------------------------------------

namespace {

void check_dropout(const char* op, const DropoutSpec& drop) {
  PARALLEL_CHECK(drop.p >= 0.0f && drop.p <= 1.0f, "ops::{}: dropout p = {} must be in [0, 1]", op, drop.p);
}

}  // namespace

void residual_norm_forward(const Tensor& residual, const Tensor& branch, const DropoutSpec& drop,
                           const Tensor& weight, const Tensor& bias, Tensor& sum, Tensor& y, Tensor& mean,
                           Tensor& rstd, float eps, Stream stream) {
  const char* op = "residual_norm_forward";
  const bool layernorm = bias.defined();
  PARALLEL_CHECK(layernorm == mean.defined(),
                 "ops::{}: bias and mean must both be defined (LayerNorm) or both undefined (RMSNorm)", op);
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{residual, "residual"},
                                    {branch, "branch"},
                                    {weight, "weight", Want::Param},
                                    {sum, "sum"},
                                    {y, "y"},
                                    {rstd, "rstd", Want::F32}});
  if (layernorm) {
    (void)check_args(op, {{mean, "mean", Want::F32}});
    PARALLEL_CHECK(bias.is_contiguous() && bias.device() == k.device,
                   "ops::{}: bias must be contiguous, on {}", op, k.device.str());
    PARALLEL_CHECK(bias.dtype() == DType::F32 || bias.dtype() == k.act,
                   "ops::{}: bias is {}, expected fp32 or {} (the activations')", op,
                   dtype_name(bias.dtype()), dtype_name(k.act));
    check_same_shape(op, bias, "bias", weight, "weight");
    check_rows(op, mean, "mean", residual);
  }
  check_1d(op, weight, "weight");
  check_last_dim(op, residual, "residual", weight.numel(), "weight size");
  check_same_shape(op, branch, "branch", residual, "residual");
  check_same_shape(op, sum, "sum", residual, "residual");
  check_same_shape(op, y, "y", residual, "residual");
  check_rows(op, rstd, "rstd", residual);
  check_dropout(op, drop);
  if (k.device.is_meta())
    return meta::record_op("residual_norm_forward", 10.0 * static_cast<double>(sum.numel()),
                           {&residual, &branch, &weight, &bias}, {&sum, &y, &mean, &rstd});
  if (k.device.is_cuda()) {
    // The unfused ops in sequence (ops.hpp): dropout and add (dropout_add's CUDA form), then the norm.
    dropout_add(branch, residual, sum, drop, stream);
    if (layernorm)
      layernorm_forward(sum, weight, bias, y, mean, rstd, eps, stream);
    else
      rmsnorm_forward(sum, weight, y, rstd, eps, stream);
    return;
  }
  cpu::residual_norm_forward(residual, branch, drop.p, drop.seed, drop.offset, weight, bias, sum, y, mean,
                             rstd, eps);
}

void norm_backward_residual(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                            Tensor& dbias, const DropoutSpec& drop, Tensor& dbranch, Stream stream) {
  const char* op = "norm_backward_residual";
  const bool layernorm = mean.defined();
  PARALLEL_CHECK(layernorm == dbias.defined(),
                 "ops::{}: mean and dbias must both be defined (LayerNorm) or both undefined (RMSNorm)", op);
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{dy, "dy"},
                                    {dresidual, "dresidual"},
                                    {x, "x"},
                                    {weight, "weight", Want::Param},
                                    {rstd, "rstd", Want::F32},
                                    {dx, "dx"},
                                    {dweight, "dweight", Want::F32}});
  if (layernorm) {
    (void)check_args(op, {{mean, "mean", Want::F32}, {dbias, "dbias", Want::F32}});
    check_rows(op, mean, "mean", x);
    check_same_shape(op, dbias, "dbias", weight, "weight");
  }
  if (dbranch.defined()) {
    (void)check_args(op, {{dbranch, "dbranch"}});
    PARALLEL_CHECK(dbranch.dtype() == k.act && dbranch.device() == k.device,
                   "ops::{}: dbranch is {} on {}, expected {} on {} (dx's)", op, dtype_name(dbranch.dtype()),
                   dbranch.device().str(), dtype_name(k.act), k.device.str());
    check_same_shape(op, dbranch, "dbranch", x, "x");
  }
  check_1d(op, weight, "weight");
  check_last_dim(op, x, "x", weight.numel(), "weight size");
  check_same_shape(op, dy, "dy", x, "x");
  check_same_shape(op, dresidual, "dresidual", x, "x");
  check_same_shape(op, dx, "dx", x, "x");
  check_same_shape(op, dweight, "dweight", weight, "weight");
  check_rows(op, rstd, "rstd", x);
  check_dropout(op, drop);
  if (k.device.is_meta())
    return meta::record_op("norm_backward_residual", 14.0 * static_cast<double>(x.numel()),
                           {&dy, &dresidual, &x, &weight, &mean, &rstd}, {&dx, &dweight, &dbias, &dbranch});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(norm_backward_residual(dy, dresidual, x, weight, mean, rstd, dx, dweight, dbias, drop.p,
                                            drop.seed, drop.offset, dbranch, stream));
    return;
  }
  cpu::norm_backward_residual(dy, dresidual, x, weight, mean, rstd, dx, dweight, dbias, drop.p, drop.seed,
                              drop.offset, dbranch);
}

void dropout_add(const Tensor& branch, const Tensor& residual, Tensor& out, const DropoutSpec& drop,
                 Stream stream) {
  const char* op = "dropout_add";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{branch, "branch"}, {residual, "residual"}, {out, "out"}});
  check_same_shape(op, residual, "residual", branch, "branch");
  check_same_shape(op, out, "out", branch, "branch");
  check_dropout(op, drop);
  if (k.device.is_meta())
    return meta::record_op("dropout_add", 3.0 * static_cast<double>(out.numel()), {&branch, &residual},
                           {&out});
  if (k.device.is_cuda()) {
    // Dropout into a temporary, then the add: the unfused kernels (ops.hpp).
    if (drop.p > 0.0f) {
      Tensor dropped = Tensor::empty(branch.shape(), branch.dtype(), branch.device());
      dropout_forward(branch, dropped, drop.p, drop.seed, drop.offset, stream);
      add(residual, dropped, out, stream);
    } else {
      add(residual, branch, out, stream);
    }
    return;
  }
  cpu::dropout_add(branch, residual, out, drop.p, drop.seed, drop.offset);
}

// ---- attention --------------------------------------------------------------------------------

namespace {
void check_rope(const char* op, const Tensor& x, const Rope& rope) {
  PARALLEL_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "ops::{}: x {} must be [s, b, heads, d] with d even", op,
                 shape_str(x.shape()));
  PARALLEL_CHECK(rope.theta > 0.0, "ops::{}: theta = {} must be positive", op, rope.theta);
  const RopeScaling& sc = rope.scaling;
  PARALLEL_CHECK(sc.type == RopeScalingType::None || sc.factor > 0.0,
                 "ops::{}: rope scaling factor = {} must be positive", op, sc.factor);
  PARALLEL_CHECK(sc.type != RopeScalingType::Llama3 ||
                     (sc.low_freq_factor > 0.0 && sc.high_freq_factor > sc.low_freq_factor &&
                      sc.original_max_position_embeddings > 0.0),
                 "ops::{}: llama3 rope scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({}) and "
                 "original_max_position_embeddings ({}) > 0",
                 op, sc.low_freq_factor, sc.high_freq_factor, sc.original_max_position_embeddings);
  PARALLEL_CHECK(sc.type != RopeScalingType::Yarn ||
                     (sc.beta_fast > 0.0 && sc.beta_slow > 0.0 && sc.original_max_position_embeddings > 0.0 &&
                      sc.attention_factor >= 0.0),
                 "ops::{}: yarn rope scaling needs beta_fast ({}) > 0, beta_slow ({}) > 0, "
                 "original_max_position_embeddings ({}) > 0 and attention_factor ({}) >= 0 (0: derived)",
                 op, sc.beta_fast, sc.beta_slow, sc.original_max_position_embeddings, sc.attention_factor);
}

// q [s, b, hq, d]; k [s, b, hkv, d]; v [s, b, hkv, dv]; hq % hkv == 0; lse [b, hq, s]; out (and
// dout) [s, b, hq, dv]: the value head size dv may differ from the query/key head size d (MLA).
void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse) {
  PARALLEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                 "ops::{}: q {}, k {} and v {} must be [s, b, heads, d]", op, shape_str(q.shape()),
                 shape_str(k.shape()), shape_str(v.shape()));
  const int64_t s = q.size(0), b = q.size(1), hq = q.size(2), d = q.size(3), hkv = k.size(2), dv = v.size(3);
  PARALLEL_CHECK(k.size(0) == s && k.size(1) == b && k.size(3) == d && hkv > 0 && hq % hkv == 0,
                 "ops::{}: k {} does not match q {} (same s, b, d; hq a multiple of hkv)", op,
                 shape_str(k.shape()), shape_str(q.shape()));
  PARALLEL_CHECK(v.size(0) == s && v.size(1) == b && v.size(2) == hkv && dv > 0,
                 "ops::{}: v {} does not match k {} (same s, b, heads; any value head size > 0)", op,
                 shape_str(v.shape()), shape_str(k.shape()));
  PARALLEL_CHECK(out.shape() == (Shape{s, b, hq, dv}), "ops::{}: out {} must be [s, b, hq, dv] = {}", op,
                 shape_str(out.shape()), shape_str(Shape{s, b, hq, dv}));
  PARALLEL_CHECK(lse.shape() == (Shape{b, hq, s}), "ops::{}: lse {} must be [b, hq, s] = {}", op,
                 shape_str(lse.shape()), shape_str(Shape{b, hq, s}));
}

// Score and value products of attention over q [s, b, hq, d], k [s_k, b, hkv, d] and v
// [s_k, b, hkv, dv]: GEMMs of 2 s s_k d (scores) and 2 s s_k dv (values) per head and sample, half
// of them under a causal mask (meta.hpp's FLOP counting).
// Meta: the CPU attention kernel's own figure for one call (ops::attention_workspace_bytes).
int64_t attention_workspace(const Tensor& q, const Tensor& k, const Tensor& v, bool backward) {
  return attention_workspace_bytes(q.dtype(), q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), backward,
                                   v.size(3));
}

double attention_flops(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask) {
  const double per_pair = 2.0 * static_cast<double>(q.size(1) * q.size(2) * (q.size(3) + v.size(3)));
  if (mask.window == 0 && mask.q_pos0 == mask.k_pos0) {
    const double full = static_cast<double>(q.size(0)) * static_cast<double>(k.size(0)) * per_pair;
    return mask.causal ? full / 2.0 : full;
  }
  return attention_visible_pairs(mask, q.size(0), k.size(0)) * per_pair;
}

// The mask's checks (the rule of attention_mask.hpp), then the kernels' view of it. doc_start
// must be int32 [b, S] on q's device with S past every row's position.
AttentionBounds attention_bounds(const char* op, const Tensor& q, const Tensor& k,
                                 const AttentionMask& mask) {
  PARALLEL_CHECK(mask.window >= 0, "ops::{}: window = {} must be >= 0 (0: none)", op, mask.window);
  PARALLEL_CHECK(mask.q_pos0 >= 0 && mask.k_pos0 >= 0, "ops::{}: q_pos0 = {} and k_pos0 = {} must be >= 0",
                 op, mask.q_pos0, mask.k_pos0);
  PARALLEL_CHECK(mask.causal || (mask.window == 0 && !mask.has_documents()),
                 "ops::{}: a window or documents need a causal mask", op);
  AttentionBounds bounds;
  bounds.causal = mask.causal;
  bounds.window = mask.window;
  bounds.q_pos0 = mask.q_pos0;
  bounds.k_pos0 = mask.k_pos0;
  if (mask.has_documents()) {
    const Tensor& ds = mask.doc_start;
    const int64_t end = std::max(mask.q_pos0 + q.size(0), mask.k_pos0 + k.size(0));
    PARALLEL_CHECK(ds.dtype() == DType::I32 && ds.dim() == 2 && ds.size(0) == q.size(1) && ds.size(1) >= end,
                   "ops::{}: doc_start {} {} must be int32 [b = {}, S >= {}]", op, dtype_name(ds.dtype()),
                   shape_str(ds.shape()), q.size(1), end);
    PARALLEL_CHECK(ds.device() == q.device(), "ops::{}: doc_start is on {}, q on {}", op, ds.device().str(),
                   q.device().str());
    PARALLEL_CHECK(ds.strides()[1] == 1, "ops::{}: doc_start's rows must be contiguous", op);
    if (!ds.device().is_meta()) {
      bounds.doc_start = static_cast<const int32_t*>(ds.data_ptr());
      bounds.doc_stride = ds.strides()[0];
    }
  }
  return bounds;
}
}  // namespace

void rope_forward(Tensor& x, int64_t position_offset, const Rope& rope, Stream stream) {
  const OpTimeSpan op_time("rope_forward");
  const Checked k = check_args("rope_forward", {{x, "x"}});
  check_rope("rope_forward", x, rope);
  if (k.device.is_meta())
    return meta::record_op("rope_forward", 3.0 * static_cast<double>(x.numel()), {&x}, {&x});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(rope_forward(x, position_offset, rope, stream));
  }
  cpu::rope_forward(x, position_offset, rope);
}

void rope_backward(Tensor& dx, int64_t position_offset, const Rope& rope, Stream stream) {
  const OpTimeSpan op_time("rope_backward");
  const Checked k = check_args("rope_backward", {{dx, "dx"}});
  check_rope("rope_backward", dx, rope);
  if (k.device.is_meta())
    return meta::record_op("rope_backward", 3.0 * static_cast<double>(dx.numel()), {&dx}, {&dx});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(rope_backward(dx, position_offset, rope, stream));
  }
  cpu::rope_backward(dx, position_offset, rope);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionMask& mask, float softmax_scale, Stream stream) {
  const char* op = "attention_forward";
  const OpTimeSpan op_time(op);
  const Checked c = check_args(op, {{q, "q", Want::Act, Layout::HeadRows},
                                    {k, "k", Want::Act, Layout::HeadRows},
                                    {v, "v", Want::Act, Layout::HeadRows},
                                    {out, "out"},
                                    {lse, "lse", Want::F32}});
  check_attention(op, q, k, v, out, lse);
  const AttentionBounds bounds = attention_bounds(op, q, k, mask);
  if (c.device.is_meta())
    return meta::record_op("attention_forward", attention_flops(q, k, v, mask), {&q, &k, &v}, {&out, &lse},
                           attention_workspace(q, k, v, false));
  if (c.device.is_cuda()) {
    PARALLEL_ON_CUDA(attention_forward(q, k, v, out, lse, bounds, softmax_scale, stream));
  }
  cpu::attention_forward(q, k, v, out, lse, bounds, softmax_scale);
}

void attention_merge(Tensor& out_acc, Tensor& lse_acc, const Tensor& out_blk, const Tensor& lse_blk,
                     int64_t q0, Stream stream) {
  const char* op = "attention_merge";
  const OpTimeSpan op_time(op);
  const Checked c = check_args(op, {{out_blk, "out_blk"},
                                    {out_acc, "out_acc", Want::F32},
                                    {lse_acc, "lse_acc", Want::F32},
                                    {lse_blk, "lse_blk", Want::F32}});
  PARALLEL_CHECK(out_acc.dim() == 4 && out_blk.dim() == 4,
                 "ops::{}: out_acc {} and out_blk {} must be [s, b, h, d]", op, shape_str(out_acc.shape()),
                 shape_str(out_blk.shape()));
  const int64_t S = out_acc.size(0), b = out_acc.size(1), h = out_acc.size(2), d = out_acc.size(3);
  const int64_t n = out_blk.size(0);
  PARALLEL_CHECK(out_blk.size(1) == b && out_blk.size(2) == h && out_blk.size(3) == d,
                 "ops::{}: out_blk {} does not match out_acc {} (same b, h, d)", op,
                 shape_str(out_blk.shape()), shape_str(out_acc.shape()));
  PARALLEL_CHECK(q0 >= 0 && q0 + n <= S, "ops::{}: rows [{}, {}) of out_blk fall outside out_acc's {} rows",
                 op, q0, q0 + n, S);
  PARALLEL_CHECK(lse_acc.shape() == (Shape{b, h, S}), "ops::{}: lse_acc {} must be [b, h, S] = {}", op,
                 shape_str(lse_acc.shape()), shape_str(Shape{b, h, S}));
  PARALLEL_CHECK(lse_blk.shape() == (Shape{b, h, n}), "ops::{}: lse_blk {} must be [b, h, n] = {}", op,
                 shape_str(lse_blk.shape()), shape_str(Shape{b, h, n}));
  if (c.device.is_meta())
    return meta::record_op("attention_merge", 6.0 * static_cast<double>(out_blk.numel()),
                           {&out_acc, &lse_acc, &out_blk, &lse_blk}, {&out_acc, &lse_acc});
  if (c.device.is_cuda()) {
    PARALLEL_ON_CUDA(attention_merge(out_acc, lse_acc, out_blk, lse_blk, q0, stream));
  }
  cpu::attention_merge(out_acc, lse_acc, out_blk, lse_blk, q0);
}

double attention_visible_pairs(const AttentionMask& mask, int64_t sq, int64_t sk) {
  if (!mask.causal) return static_cast<double>(sq) * static_cast<double>(sk);
  double pairs = 0.0;
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t p = mask.q_pos0 + i;
    const int64_t hi = std::clamp<int64_t>(p - mask.k_pos0 + 1, 0, sk);
    const int64_t lo = mask.window > 0 ? std::clamp<int64_t>(p - mask.window + 1 - mask.k_pos0, 0, hi) : 0;
    pairs += static_cast<double>(hi - lo);
  }
  return pairs;
}

std::string attention_implementation(DType dtype, int64_t head_dim) {
  if (dtype == DType::F32) return "fp32";
#ifdef PARALLEL_EMULATE_AVX512_BF16
  constexpr const char* bf16_dots = "bf16 on avx512_bf16 dot products (emulated in AVX-512F)";
#else
  constexpr const char* bf16_dots = "bf16 on avx512_bf16 dot products";
#endif
  return cpu::attention_bf16_supported(dtype, head_dim) ? bf16_dots : "widened to fp32";
}

int64_t attention_workspace_bytes(DType dtype, int64_t s, int64_t b, int64_t hq, int64_t hkv,
                                  int64_t head_dim, bool backward, int64_t v_head_dim) {
  return cpu::attention_workspace_bytes(dtype, s, b, hq, hkv, head_dim,
                                        v_head_dim > 0 ? v_head_dim : head_dim, backward,
                                        std::max(1, omp_get_max_threads()));
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionMask& mask, float softmax_scale, Stream stream) {
  const char* op = "attention_backward";
  const OpTimeSpan op_time(op);
  const Checked c = check_args(op, {{dout, "dout"},
                                    {q, "q", Want::Act, Layout::HeadRows},
                                    {k, "k", Want::Act, Layout::HeadRows},
                                    {v, "v", Want::Act, Layout::HeadRows},
                                    {out, "out"},
                                    {lse, "lse", Want::F32},
                                    {dq, "dq", Want::Act, Layout::HeadRows},
                                    {dk, "dk", Want::Act, Layout::HeadRows},
                                    {dv, "dv", Want::Act, Layout::HeadRows}});
  check_attention(op, q, k, v, out, lse);
  check_same_shape(op, dout, "dout", out, "out");
  check_same_shape(op, dq, "dq", q, "q");
  check_same_shape(op, dk, "dk", k, "k");
  check_same_shape(op, dv, "dv", v, "v");
  const AttentionBounds bounds = attention_bounds(op, q, k, mask);
  if (c.device.is_meta())
    return meta::record_op("attention_backward", 2.5 * attention_flops(q, k, v, mask),
                           {&dout, &q, &k, &v, &out, &lse}, {&dq, &dk, &dv},
                           attention_workspace(q, k, v, true));
  if (c.device.is_cuda()) {
    PARALLEL_ON_CUDA(attention_backward(dout, q, k, v, out, lse, dq, dk, dv, bounds, softmax_scale, stream));
  }
  cpu::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, bounds, softmax_scale);
}

// ---- embedding and loss -----------------------------------------------------------------------

namespace {
// tokens [b, s]; weight-like [rows, h]; activations [s, b, h].
void check_embedding(const char* op, const Tensor& tokens, const Tensor& w, const char* wn, const Tensor& act,
                     const char* an) {
  PARALLEL_CHECK(tokens.dim() == 2, "ops::{}: tokens {} must be [b, s]", op, shape_str(tokens.shape()));
  PARALLEL_CHECK(w.dim() == 2, "ops::{}: {} {} must be [rows, h]", op, wn, shape_str(w.shape()));
  const Shape want{tokens.size(1), tokens.size(0), w.size(1)};
  PARALLEL_CHECK(act.shape() == want, "ops::{}: {} {} must be [s, b, h] = {} for tokens {} and {} {}", op, an,
                 shape_str(act.shape()), shape_str(want), shape_str(tokens.shape()), wn,
                 shape_str(w.shape()));
}

// logits [n, v_local]; targets and per-row vectors [n].
void check_ce(const char* op, const Tensor& logits, std::initializer_list<Arg> rows, int64_t vocab_start,
              int64_t vocab_size) {
  PARALLEL_CHECK(logits.dim() == 2, "ops::{}: logits {} must be [n, v_local]", op, shape_str(logits.shape()));
  for (const Arg& r : rows)
    PARALLEL_CHECK(r.t.dim() == 1 && r.t.size(0) == logits.size(0),
                   "ops::{}: {} {} must be [{}] for logits {}", op, r.name, shape_str(r.t.shape()),
                   logits.size(0), shape_str(logits.shape()));
  PARALLEL_CHECK(vocab_start >= 0 && vocab_size >= 0,
                 "ops::{}: vocab_start = {} and vocab_size = {} must be >= 0", op, vocab_start, vocab_size);
}
}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out,
                       Stream stream) {
  const char* op = "embedding_forward";
  const OpTimeSpan op_time(op);
  const Checked k =
      check_args(op, {{tokens, "tokens", Want::I32}, {weight, "weight", Want::Param}, {out, "out"}});
  check_embedding(op, tokens, weight, "weight", out, "out");
  if (k.device.is_meta()) return meta::record_op("embedding_forward", 0.0, {&tokens, &weight}, {&out});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(embedding_forward(tokens, weight, vocab_start, out, stream));
  }
  cpu::embedding_forward(tokens, weight, vocab_start, out);
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight,
                        Stream stream) {
  const char* op = "embedding_backward";
  const OpTimeSpan op_time(op);
  const Checked k =
      check_args(op, {{tokens, "tokens", Want::I32}, {dout, "dout"}, {dweight, "dweight", Want::F32}});
  check_embedding(op, tokens, dweight, "dweight", dout, "dout");
  if (k.device.is_meta())
    return meta::record_op("embedding_backward", static_cast<double>(dout.numel()), {&tokens, &dout},
                           {&dweight});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(embedding_backward(tokens, dout, vocab_start, dweight, stream));
  }
  cpu::embedding_backward(tokens, dout, vocab_start, dweight);
}

void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               int64_t vocab_size, Tensor& row_max, Tensor& target_logit, Stream stream) {
  const char* op = "cross_entropy_local_stats";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{logits, "logits"},
                                    {targets, "targets", Want::I32},
                                    {row_max, "row_max", Want::F32},
                                    {target_logit, "target_logit", Want::F32}});
  check_ce(op, logits, {{targets, "targets"}, {row_max, "row_max"}, {target_logit, "target_logit"}},
           vocab_start, vocab_size);
  if (k.device.is_meta())
    return meta::record_op("cross_entropy_local_stats", static_cast<double>(logits.numel()),
                           {&logits, &targets}, {&row_max, &target_logit});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(
        cross_entropy_local_stats(logits, targets, vocab_start, vocab_size, row_max, target_logit, stream));
  }
  cpu::cross_entropy_local_stats(logits, targets, vocab_start, vocab_size, row_max, target_logit);
}

void cross_entropy_sum_exp(const Tensor& logits, const Tensor& row_max, int64_t vocab_start,
                           int64_t vocab_size, Tensor& sum_exp, Stream stream) {
  const char* op = "cross_entropy_sum_exp";
  const OpTimeSpan op_time(op);
  const Checked k =
      check_args(op, {{logits, "logits"}, {row_max, "row_max", Want::F32}, {sum_exp, "sum_exp", Want::F32}});
  check_ce(op, logits, {{row_max, "row_max"}, {sum_exp, "sum_exp"}}, vocab_start, vocab_size);
  if (k.device.is_meta())
    return meta::record_op("cross_entropy_sum_exp", 3.0 * static_cast<double>(logits.numel()),
                           {&logits, &row_max}, {&sum_exp});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(cross_entropy_sum_exp(logits, row_max, vocab_start, vocab_size, sum_exp, stream));
  }
  cpu::cross_entropy_sum_exp(logits, row_max, vocab_start, vocab_size, sum_exp);
}

void cross_entropy_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t vocab_size,
                         Tensor& row_max, Tensor& target_logit, Tensor& sum_exp, Stream stream) {
  const char* op = "cross_entropy_stats";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{logits, "logits"},
                                    {targets, "targets", Want::I32},
                                    {row_max, "row_max", Want::F32},
                                    {target_logit, "target_logit", Want::F32},
                                    {sum_exp, "sum_exp", Want::F32}});
  check_ce(op, logits,
           {{targets, "targets"}, {row_max, "row_max"}, {target_logit, "target_logit"}, {sum_exp, "sum_exp"}},
           vocab_start, vocab_size);
  // Off the CPU (and on meta, which records them): the two ops.
  if (!k.device.is_cpu()) {
    cross_entropy_local_stats(logits, targets, vocab_start, vocab_size, row_max, target_logit, stream);
    cross_entropy_sum_exp(logits, row_max, vocab_start, vocab_size, sum_exp, stream);
    return;
  }
  cpu::cross_entropy_stats(logits, targets, vocab_start, vocab_size, row_max, target_logit, sum_exp);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            const Tensor& sum_exp, const Tensor& grad_scale, int64_t vocab_start,
                            int64_t vocab_size, Tensor& dlogits, Stream stream) {
  const char* op = "cross_entropy_backward";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{logits, "logits"},
                                    {targets, "targets", Want::I32},
                                    {row_max, "row_max", Want::F32},
                                    {sum_exp, "sum_exp", Want::F32},
                                    {grad_scale, "grad_scale", Want::F32},
                                    {dlogits, "dlogits"}});
  check_ce(op, logits,
           {{targets, "targets"}, {row_max, "row_max"}, {sum_exp, "sum_exp"}, {grad_scale, "grad_scale"}},
           vocab_start, vocab_size);
  check_same_shape(op, dlogits, "dlogits", logits, "logits");
  if (k.device.is_meta())
    return meta::record_op("cross_entropy_backward", 4.0 * static_cast<double>(logits.numel()),
                           {&logits, &targets, &row_max, &sum_exp, &grad_scale}, {&dlogits});
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(cross_entropy_backward(logits, targets, row_max, sum_exp, grad_scale, vocab_start,
                                            vocab_size, dlogits, stream));
  }
  cpu::cross_entropy_backward(logits, targets, row_max, sum_exp, grad_scale, vocab_start, vocab_size,
                              dlogits);
}

void cross_entropy_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        Tensor& loss, Stream stream) {
  const char* op = "cross_entropy_loss";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{row_max, "row_max", Want::F32},
                                    {sum_exp, "sum_exp", Want::F32},
                                    {target_logit, "target_logit", Want::F32},
                                    {loss, "loss", Want::F32}});
  PARALLEL_CHECK(loss.dim() == 1, "ops::{}: loss {} must be [n]", op, shape_str(loss.shape()));
  check_same_shape(op, row_max, "row_max", loss, "loss");
  check_same_shape(op, sum_exp, "sum_exp", loss, "loss");
  check_same_shape(op, target_logit, "target_logit", loss, "loss");
  if (k.device.is_meta())
    return meta::record_op("cross_entropy_loss", 3.0 * static_cast<double>(loss.numel()),
                           {&row_max, &sum_exp, &target_logit}, {&loss});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(cross_entropy_loss(row_max, sum_exp, target_logit, loss, stream));
  cpu::cross_entropy_loss(row_max, sum_exp, target_logit, loss);
}

// ---- rows by index ----------------------------------------------------------------------------

namespace {
void check_2d(const char* op, const Tensor& t, const char* tn) {
  PARALLEL_CHECK(t.dim() == 2, "ops::{}: {} {} must be 2-D [rows, h]", op, tn, shape_str(t.shape()));
}
// index [n] for the n rows of out [n, h] gathered from src [R, h].
void check_gather(const char* op, const Tensor& src, const Tensor& index, const Tensor& out) {
  check_2d(op, src, "src");
  check_2d(op, out, "out");
  PARALLEL_CHECK(index.dim() == 1 && index.size(0) == out.size(0) && src.size(1) == out.size(1),
                 "ops::{}: index {} must be [n] and out {} [n, h] for src {} [R, h]", op,
                 shape_str(index.shape()), shape_str(out.shape()), shape_str(src.shape()));
}
}  // namespace

void gather_rows(const Tensor& src, const Tensor& index, Tensor& out, Stream stream) {
  const char* op = "gather_rows";
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{src, "src"}, {index, "index", Want::I64}, {out, "out"}});
  check_gather(op, src, index, out);
  if (out.numel() == 0) return;
  if (k.device.is_meta()) return meta::record_op("gather_rows", 0.0, {&src, &index}, {&out});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(gather_rows(src, index, out, stream));
  cpu::gather_rows(src, index, out);
}

void gather_rows_scaled(const Tensor& src, const Tensor& index, const Tensor& scale, Tensor& out,
                        Stream stream) {
  const char* op = "gather_rows_scaled";
  const OpTimeSpan op_time(op);
  const Checked k =
      check_args(op, {{src, "src"}, {index, "index", Want::I64}, {scale, "scale", Want::F32}, {out, "out"}});
  check_gather(op, src, index, out);
  check_same_shape(op, scale, "scale", index, "index");
  if (out.numel() == 0) return;
  if (k.device.is_meta())
    return meta::record_op("gather_rows_scaled", static_cast<double>(out.numel()), {&src, &index, &scale},
                           {&out});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(gather_rows_scaled(src, index, scale, out, stream));
  cpu::gather_rows_scaled(src, index, scale, out);
}

void gather_sum_rows(const Tensor& src, const Tensor& index, const Tensor& weight, Tensor& out,
                     Stream stream) {
  const char* op = "gather_sum_rows";
  // out is fp32 or src's dtype: checked as a statistic-like argument apart from the activations.
  const OpTimeSpan op_time(op);
  const Checked k = check_args(op, {{src, "src"}, {index, "index", Want::I64}});
  PARALLEL_CHECK(out.defined() && out.is_contiguous() && out.device() == k.device,
                 "ops::{}: out must be defined, contiguous and on {}", op, k.device.str());
  PARALLEL_CHECK(out.dtype() == DType::F32 || out.dtype() == k.act,
                 "ops::{}: out is {}, expected fp32 or {} (src's)", op, dtype_name(out.dtype()),
                 dtype_name(k.act));
  check_2d(op, src, "src");
  check_2d(op, out, "out");
  PARALLEL_CHECK(index.dim() == 2 && index.size(0) == out.size(0) && src.size(1) == out.size(1),
                 "ops::{}: index {} must be [T, k] and out {} [T, h] for src {} [N, h]", op,
                 shape_str(index.shape()), shape_str(out.shape()), shape_str(src.shape()));
  if (weight.defined()) {
    check_args(op, {{index, "index", Want::I64}, {weight, "weight", Want::F32}});
    check_same_shape(op, weight, "weight", index, "index");
  }
  if (out.numel() == 0) return;
  if (k.device.is_meta())
    return meta::record_op("gather_sum_rows",
                           2.0 * static_cast<double>(index.numel()) * static_cast<double>(src.size(1)),
                           {&src, &index, &weight}, {&out});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(gather_sum_rows(src, index, weight, out, stream));
  cpu::gather_sum_rows(src, index, weight, out);
}

void row_dot(const Tensor& a, const Tensor& b, const Tensor& index, Tensor& out, Stream stream) {
  const char* op = "row_dot";
  const OpTimeSpan op_time(op);
  const Checked k =
      check_args(op, {{a, "a"}, {b, "b"}, {index, "index", Want::I64}, {out, "out", Want::F32}});
  check_2d(op, a, "a");
  check_2d(op, b, "b");
  PARALLEL_CHECK(index.dim() == 1 && index.size(0) == a.size(0) && out.dim() == 1 &&
                     out.size(0) == a.size(0) && b.size(1) == a.size(1),
                 "ops::{}: index {} and out {} must be [n], b {} [m, h] for a {} [n, h]", op,
                 shape_str(index.shape()), shape_str(out.shape()), shape_str(b.shape()),
                 shape_str(a.shape()));
  if (out.numel() == 0) return;
  if (k.device.is_meta())
    return meta::record_op("row_dot", 2.0 * static_cast<double>(a.numel()), {&a, &b, &index}, {&out});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(row_dot(a, b, index, out, stream));
  cpu::row_dot(a, b, index, out);
}

// ---- reductions -------------------------------------------------------------------------------

double sum_of_squares(const Tensor& x, Stream stream) {
  const OpTimeSpan op_time("sum_of_squares");
  const Checked k = check_args("sum_of_squares", {{x, "x"}});
  if (k.device.is_meta()) meta::refuse_read(x, "ops::sum_of_squares (a host value)");
  count_host_read();  // the result is a host value, on any device
  if (k.device.is_cuda()) {
    PARALLEL_ON_CUDA(sum_of_squares(x, stream));
  }
  return cpu::sum_of_squares(x);
}

void sum_of_squares_accumulate(const Tensor& x, Tensor& acc, Stream stream) {
  const OpTimeSpan op_time("sum_of_squares_accumulate");
  const Checked k = check_args("sum_of_squares_accumulate", {{x, "x", Want::F32}, {acc, "acc", Want::F32}});
  PARALLEL_CHECK(acc.numel() == 1, "ops::sum_of_squares_accumulate: acc {} must have one element", acc.str());
  if (k.device.is_meta())
    return meta::record_op("sum_of_squares_accumulate", 2.0 * static_cast<double>(x.numel()), {&x, &acc},
                           {&acc});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(sum_of_squares_accumulate(x, acc, stream));
  cpu::sum_of_squares_accumulate(x, acc);
}

// Timed under the per-tensor op's name: a profile's row then holds the same work before and after.
void sum_of_squares_accumulate_multi(const std::vector<Tensor>& xs, Tensor& acc, Stream stream) {
  const OpTimeSpan op_time("sum_of_squares_accumulate");
  const Checked k = check_args("sum_of_squares_accumulate_multi", {{acc, "acc", Want::F32}});
  PARALLEL_CHECK(acc.numel() == 1, "ops::sum_of_squares_accumulate_multi: acc {} must have one element",
                 acc.str());
  for (const Tensor& x : xs)
    check_args("sum_of_squares_accumulate_multi", {{x, "x", Want::F32}, {acc, "acc", Want::F32}});
  // Off the CPU (and on meta, which records each tensor's op): the per-tensor op, in order.
  if (!k.device.is_cpu()) {
    for (const Tensor& x : xs) sum_of_squares_accumulate(x, acc, stream);
    return;
  }
  cpu::sum_of_squares_accumulate_multi(xs, acc);
}

void normalize_(Tensor& x, float eps, Stream stream) {
  const OpTimeSpan op_time("normalize_");
  const Checked k = check_args("normalize_", {{x, "x", Want::F32}});
  PARALLEL_CHECK(eps > 0.0f, "ops::normalize_: eps {} must be > 0", eps);
  if (k.device.is_meta())
    return meta::record_op("normalize_", 3.0 * static_cast<double>(x.numel()), {&x}, {&x});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(normalize_(x, eps, stream));
  cpu::normalize_(x, eps);
}

// ---- optimizer --------------------------------------------------------------------------------

namespace {
Checked check_adamw(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                    const AdamWStep& h, const char* op = "adamw_update_") {
  const OpTimeSpan op_time("adamw_update_");
  const Checked k = check_args(op, {{param, "param", Want::F32},
                                    {grad, "grad", Want::F32},
                                    {exp_avg, "exp_avg", Want::F32},
                                    {exp_avg_sq, "exp_avg_sq", Want::F32}});
  PARALLEL_CHECK(grad.numel() == param.numel() && exp_avg.numel() == param.numel() &&
                     exp_avg_sq.numel() == param.numel(),
                 "ops::{}: param {}, grad {}, exp_avg {}, exp_avg_sq {} must have one numel", op,
                 param.numel(), grad.numel(), exp_avg.numel(), exp_avg_sq.numel());
  PARALLEL_CHECK(h.step >= 1, "ops::{}: step counts from 1, got {}", op, h.step);
  return k;
}
}  // namespace

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWStep& h,
                   Stream stream) {
  const OpTimeSpan op_time("adamw_update_");
  const Checked k = check_adamw(param, grad, exp_avg, exp_avg_sq, h);
  if (k.device.is_meta())
    return meta::record_op("adamw_update_", 12.0 * static_cast<double>(param.numel()),
                           {&param, &grad, &exp_avg, &exp_avg_sq}, {&param, &exp_avg, &exp_avg_sq});
  if (k.device.is_cuda()) PARALLEL_ON_CUDA(adamw_update_(param, grad, exp_avg, exp_avg_sq, h, stream));
  cpu::adamw_update_(param, grad, exp_avg, exp_avg_sq, h, nullptr);
}

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& model_copy,
                   const AdamWStep& h, Stream stream) {
  const OpTimeSpan op_time("adamw_update_");
  const Checked k = check_adamw(param, grad, exp_avg, exp_avg_sq, h);
  PARALLEL_CHECK(model_copy.dtype() == DType::BF16 || model_copy.dtype() == DType::F16,
                 "ops::adamw_update_: model_copy is {}, expected bf16 or fp16",
                 dtype_name(model_copy.dtype()));
  PARALLEL_CHECK(model_copy.is_contiguous() && model_copy.numel() == param.numel() &&
                     model_copy.device() == param.device(),
                 "ops::adamw_update_: model_copy {} must be contiguous, on {}, with {} elements",
                 model_copy.str(), param.device().str(), param.numel());
  if (k.device.is_meta())
    return meta::record_op("adamw_update_", 13.0 * static_cast<double>(param.numel()),
                           {&param, &grad, &exp_avg, &exp_avg_sq},
                           {&param, &exp_avg, &exp_avg_sq, &model_copy});
  if (k.device.is_cuda()) {
    // No fused CUDA kernel yet: the update, then the rounding copy (stream-ordered).
    adamw_update_(param, grad, exp_avg, exp_avg_sq, h, stream);
    model_copy.copy_(param, stream);
    return;
  }
  cpu::adamw_update_(param, grad, exp_avg, exp_avg_sq, h, &model_copy);
}

// Timed under the per-tensor op's name: a profile's row then holds the same work before and after.
void adamw_update_multi_(const std::vector<AdamWTensors>& tensors, const AdamWStep& h, Stream stream) {
  const OpTimeSpan op_time("adamw_update_");
  bool cpu = true;
  for (const AdamWTensors& t : tensors) {
    Tensor param = t.param, exp_avg = t.exp_avg, exp_avg_sq = t.exp_avg_sq;
    const Checked k = check_adamw(param, t.grad, exp_avg, exp_avg_sq, h, "adamw_update_multi_");
    cpu = cpu && k.device.is_cpu();
    if (t.model_copy.defined())
      PARALLEL_CHECK(
          (t.model_copy.dtype() == DType::BF16 || t.model_copy.dtype() == DType::F16) &&
              t.model_copy.is_contiguous() && t.model_copy.numel() == param.numel() &&
              t.model_copy.device() == param.device(),
          "ops::adamw_update_multi_: model_copy {} must be bf16 or fp16, contiguous, on {}, with {} "
          "elements",
          t.model_copy.str(), param.device().str(), param.numel());
  }
  // Off the CPU (and on meta, which records each tensor's op): the per-tensor op, in order.
  if (!cpu) {
    for (const AdamWTensors& t : tensors) {
      AdamWStep ht = h;
      ht.weight_decay = t.weight_decay;
      Tensor param = t.param, exp_avg = t.exp_avg, exp_avg_sq = t.exp_avg_sq, copy = t.model_copy;
      if (copy.defined())
        adamw_update_(param, t.grad, exp_avg, exp_avg_sq, copy, ht, stream);
      else
        adamw_update_(param, t.grad, exp_avg, exp_avg_sq, ht, stream);
    }
    return;
  }
  cpu::adamw_update_multi_(tensors, h);
}

}  // namespace parallel::ops
