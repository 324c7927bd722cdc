// LoRA adapters' shared pieces: the adapter dropout (keyed by global element index, so every layout
// draws the same mask) and the adapter Parameters. The forward and backward GEMMs live with their
// linear (column_parallel_linear.cpp, row_parallel_linear.cpp), next to the base layer's.
#include "parallel/ops.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::tp::lora {
namespace {

enum class Pass { Forward, Backward };

// Runs ops' dropout over each run of rows of x [s, ..., in_local] as if x were the whole global
// input [s, ..., in_global]: the columns outside this rank's slice are zero-filled and dropped
// again, so the mask of every element is that of its global index.
Tensor apply(const Tensor& x_in, const LoraDropout& drop, int64_t in_offset, int64_t in_global, Pass pass) {
  if (drop.p == 0.0f || drop.runs.empty()) return x_in;
  const Tensor x = x_in.contiguous();
  const int64_t in_local = x.size(-1), s = x.size(0);
  const int64_t middle = x.numel() / std::max<int64_t>(s * in_local, 1);
  const Tensor x3 = x.view({s, middle, in_local});
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor y3 = y.view({s, middle, in_local});
  const bool sliced = in_local != in_global;
  for (const LoraDropout::Run& run : drop.runs) {
    const Tensor in = x3.narrow(0, run.row, run.rows);
    Tensor wide = in;
    if (sliced) {
      wide = Tensor::zeros({run.rows, middle, in_global}, x.dtype(), x.device());
      Tensor slot = wide.narrow(2, in_offset, in_local);
      slot.copy_(in);
    }
    Tensor out = Tensor::empty(wide.shape(), x.dtype(), x.device());
    const uint64_t offset = static_cast<uint64_t>(run.position * middle * in_global);
    if (pass == Pass::Forward)
      ops::dropout_forward(wide.contiguous(), out, drop.p, drop.seed, offset);
    else
      ops::dropout_backward(wide.contiguous(), out, drop.p, drop.seed, offset);
    Tensor dst = y3.narrow(0, run.row, run.rows);
    dst.copy_(sliced ? out.narrow(2, in_offset, in_local) : out);
  }
  return y;
}

}  // namespace

Tensor dropout_forward(const Tensor& x, const LoraDropout& drop, int64_t in_offset, int64_t in_global) {
  return apply(x, drop, in_offset, in_global, Pass::Forward);
}

Tensor dropout_backward(const Tensor& dx, const LoraDropout& drop, int64_t in_offset, int64_t in_global) {
  return apply(dx, drop, in_offset, in_global, Pass::Backward);
}

Parameter make_a(const std::string& name, int64_t rank, int64_t in_local, int64_t in_global,
                 int64_t in_offset) {
  Parameter a;
  a.name = name + ".lora_A.weight";
  a.value = Tensor::zeros({rank, in_local}, DType::F32, parameter_device());
  a.grad = Tensor::zeros({rank, in_local}, DType::F32, parameter_device());
  a.global_shape = {rank, in_global};
  if (in_local != in_global) {
    a.partition_dim = 1;
    a.partition_offset = in_offset;
  }
  return a;
}

Parameter make_b(const std::string& name, int64_t out_local, int64_t out_global, int64_t out_offset,
                 int64_t rank) {
  Parameter b;
  b.name = name + ".lora_B.weight";
  b.value = Tensor::zeros({out_local, rank}, DType::F32, parameter_device());
  b.grad = Tensor::zeros({out_local, rank}, DType::F32, parameter_device());
  b.global_shape = {out_global, rank};
  if (out_local != out_global) {
    b.partition_dim = 0;
    b.partition_offset = out_offset;
  }
  return b;
}

}  // namespace parallel::tp::lora
