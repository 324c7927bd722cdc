#pragma once
// A small owning tensor: shape, dtype, device, row-major storage shared between views.
//
// Storage is reference counted; views (view, narrow, flatten) share it and never copy. Kernels
// require contiguous tensors (check is_contiguous()) unless their contract says otherwise (the CPU
// attention's q, k, v: ops.hpp); narrow() along a dimension other than the first gives a strided
// view, and contiguous() makes a packed copy of it.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "parallel/device.hpp"
#include "parallel/dtype.hpp"
#include "parallel/error.hpp"

namespace parallel {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

// Bytes owned by an allocator (or borrowed from the caller, with no deleter), on one device.
class Storage {
 public:
  Storage(std::size_t bytes, Device device, Stream stream);   // allocates via allocator_for(device)
  Storage(void* external, std::size_t bytes, Device device);  // borrows; never freed by us
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Stream stream() const { return stream_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  Stream stream_;
  bool owned_ = false;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor; defined() is false

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(), Stream stream = {});
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(), Stream stream = {});
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  // Wraps memory the caller keeps alive; nothing is copied or freed.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
  // Copies host values into a new CPU tensor of dtype_of<T>.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  // Copies fp32 host values into a new CPU tensor of `dtype`, converting (round to nearest even).
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr || numel() == 0; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_contiguous() const;

  void* data_ptr() const;  // first element (storage + offset); nullptr on meta (meta.hpp)
  template <typename T>
  T* data() const {
    if (device_.is_meta()) refuse_meta_read("data<T>()");
    PARALLEL_CHECK(dtype_ == dtype_of<T>::value, "tensor is {}, accessed as {}", dtype_name(dtype_),
                   dtype_name(dtype_of<T>::value));
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  int64_t storage_offset() const { return offset_; }  // in elements

  // Views: share storage, copy nothing.
  // One dimension may be -1. A non-contiguous tensor can be viewed where each new dimension lies
  // within a run of adjacent elements (PyTorch's rule: split [s, b, h] rows of a fused tensor
  // into [s, b, heads, d]); other shapes are refused (call contiguous()).
  Tensor view(const Shape& shape) const;
  Tensor flatten() const { return view({numel()}); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t index) const;  // narrow(0, index, 1) without the leading dimension

  // Copies.
  Tensor contiguous() const;  // *this if already contiguous
  Tensor clone() const;       // copies on the storage's own stream, as contiguous() and to(DType) do
  Tensor to(Device device, Stream stream = {}) const;
  Tensor to(DType dtype) const;
  // Copies src into *this (same shape); any combination of dtypes, devices and strides on the CPU,
  // contiguous tensors across devices. Stream-ordered on CUDA.
  void copy_(const Tensor& src, Stream stream = {});
  void fill_(double value, Stream stream = {});
  void zero_(Stream stream = {}) { fill_(0.0, stream); }

  // Host copy of the values as fp32 (or exact for integers that fit); for tests and checkpoints.
  std::vector<float> to_float_vector() const;
  std::string str() const;  // "Tensor[2, 3] bf16 cpu"

 private:
  [[noreturn]] void refuse_meta_read(const char* what) const;  // meta.hpp's error
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
  Device device_;
};

// Host reads: how often tensor values were turned into host numbers - Tensor::to_float_vector()
// and ops that return a host value (ops::sum_of_squares) - counted the same on every device,
// process-wide. On a GPU each one is a device-to-host transfer that makes the host wait, so the
// training path reads values only through these (never through data<T>() of a copied tensor); the
// trainer logs the count per step (metrics.jsonl "host_reads") and a test holds it at <= 3.
int64_t host_reads();
void count_host_read();

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  PARALLEL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "{} values for shape {}",
                 values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>::value);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace parallel
