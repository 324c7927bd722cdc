#include "parallel/tensor.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "cuda_backend.hpp"
#include "parallel/allocator.hpp"
#include "parallel/conversion_passes.hpp"
#include "parallel/meta.hpp"
#include "parallel/op_times.hpp"

namespace parallel {

// ---- shapes ---------------------------------------------------------------------------------

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

namespace {

std::atomic<int64_t> g_conversion_passes{0}, g_conversion_elements{0}, g_conversion_bytes{0};

void count_conversion_pass(int64_t elements, std::size_t bytes_per_element) {
  g_conversion_passes.fetch_add(1, std::memory_order_relaxed);
  g_conversion_elements.fetch_add(elements, std::memory_order_relaxed);
  g_conversion_bytes.fetch_add(elements * static_cast<int64_t>(bytes_per_element), std::memory_order_relaxed);
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

// The stream a tensor's memory was allocated on ({} for CPU tensors and borrowed memory). The
// copies made on a tensor's behalf (clone, contiguous, to(DType), to_float_vector) are ordered on it:
// the legacy default stream does not wait for non-blocking streams, so a copy there could read the
// tensor before the kernels that write it have run.
Stream own_stream(const std::shared_ptr<Storage>& storage) { return storage ? storage->stream() : Stream{}; }

void check_shape(const Shape& shape) {
  for (int64_t s : shape) PARALLEL_CHECK(s >= 0, "negative dimension in shape {}", shape_str(shape));
}

// A strided tensor as `rows` runs of `width` contiguous elements, run r starting `pitch` elements
// after run r - 1: the form of a narrow() of a contiguous tensor along any one dimension (a column
// block of a matrix, a head group of [s, b, heads, d], a slice of lse [b, h, s]), which a GPU copies
// with one 2-D memcpy. False when the strides are not of that form.
struct Pitched {
  int64_t rows = 1, width = 1, pitch = 1;
};
bool as_pitched(const Shape& shape, const Shape& strides, Pitched& out) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride), size-1 dimensions dropped
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) dims.emplace_back(shape[d], strides[d]);
  out = Pitched{};
  if (dims.empty()) return true;
  size_t k = dims.size();
  // The contiguous inner run; a strided innermost dimension (a column narrowed out of a matrix) is
  // runs of one element at that dimension's stride.
  int64_t width = 1;
  while (k > 0 && dims[k - 1].second == width) width *= dims[--k].first;
  out.width = out.pitch = width;
  if (k == 0) return true;
  out.pitch = dims[k - 1].second;
  int64_t rows = 1, expected = out.pitch;
  while (k > 0) {  // the outer dimensions must walk the runs at one pitch
    if (dims[k - 1].second != expected) return false;
    rows *= dims[k - 1].first;
    expected *= dims[--k].first;
  }
  out.rows = rows;
  return out.pitch >= out.width;
}

// ---- element access on the host, for conversions and the strided paths -----------------------

double load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(base)[i];
    case DType::BF16:
      return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::F16:
      return f16_to_float(static_cast<const f16*>(base)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(base)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::U8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::F8E4M3:
      break;
  }
  PARALLEL_FAIL("no host arithmetic for dtype {}", dtype_name(t));
}

void store(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::BF16:
      static_cast<bf16*>(base)[i] = float_to_bf16(static_cast<float>(v));
      return;
    case DType::F16:
      static_cast<f16*>(base)[i] = float_to_f16(static_cast<float>(v));
      return;
    case DType::I32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    case DType::I64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      return;
    case DType::U8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      return;
    case DType::F8E4M3:
      break;
  }
  PARALLEL_FAIL("no host arithmetic for dtype {}", dtype_name(t));
}

// Calls fn(dst_index, src_index) for the elements [begin, end) of the row-major order of `shape`:
// the starting index is decomposed once, so that disjoint ranges can run on different threads.
template <typename Fn>
void for_each_element_in(const Shape& shape, const Shape& dst_strides, const Shape& src_strides,
                         int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  const size_t rank = shape.size();
  std::vector<int64_t> index(rank, 0);
  int64_t di = 0, si = 0;
  for (int64_t d = static_cast<int64_t>(rank) - 1, rest = begin; d >= 0; --d) {
    index[d] = rest % shape[d];
    rest /= shape[d];
    di += index[d] * dst_strides[d];
    si += index[d] * src_strides[d];
  }
  for (int64_t k = begin; k < end; ++k) {
    fn(di, si);
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < shape[d]) {
        di += dst_strides[d];
        si += src_strides[d];
        break;
      }
      di -= dst_strides[d] * (shape[d] - 1);
      si -= src_strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

// Calls fn(dst_index, src_index) for every element in row-major order of `shape`.
template <typename Fn>
void for_each_element(const Shape& shape, const Shape& dst_strides, const Shape& src_strides, Fn&& fn) {
  for_each_element_in(shape, dst_strides, src_strides, 0, shape_numel(shape), std::forward<Fn>(fn));
}

// Row copies of at least this many bytes in all are split over the OpenMP threads: the q / k / v
// split of the fused qkv projection and its backward merge move ~9 MB per layer and step of the
// mini GPT in fp32 (0.8 MB per tensor in bf16), and one thread alone leaves the other core idle for
// the whole copy. A fork costs ~10 us; 256 KiB take ~25 us on one core.
constexpr int64_t kParallelCopyBytes = 256 << 10;

// Host-to-host copy with conversion; both tensors on the CPU, any strides.
void copy_host(const Tensor& dst, const Tensor& src) {
  void* d = dst.data_ptr();
  const void* s = src.data_ptr();
  if (dst.is_contiguous() && src.is_contiguous()) {
    if (dst.dtype() == src.dtype()) {
      if (dst.nbytes() > 0) std::memcpy(d, s, dst.nbytes());
      return;
    }
    const int64_t n = dst.numel();
    auto half = [](DType t) { return t == DType::BF16 || t == DType::F16; };
    if (dst.dtype() == DType::F32 && half(src.dtype()))
      return convert_to_f32(s, src.dtype(), static_cast<float*>(d), n);
    if (half(dst.dtype()) && src.dtype() == DType::F32)
      return convert_from_f32(static_cast<const float*>(s), dst.dtype(), d, n);
    for (int64_t i = 0; i < n; ++i) store(d, dst.dtype(), i, load(s, src.dtype(), i));
    return;
  }
  const DType dt = dst.dtype(), st = src.dtype();
  const std::size_t es = dtype_size(dt);
  // Rows contiguous on both sides (narrow() along a last-but-one dimension, e.g. q/k/v split out of
  // a fused projection): one memcpy or block conversion per row instead of per element.
  const int64_t rank = dst.dim();
  if (rank >= 2 && dst.strides().back() == 1 && src.strides().back() == 1) {
    const int64_t row = dst.shape().back();
    Shape outer(dst.shape().begin(), dst.shape().end() - 1);
    Shape dst_outer(dst.strides().begin(), dst.strides().end() - 1);
    Shape src_outer(src.strides().begin(), src.strides().end() - 1);
    const std::size_t ss = dtype_size(st);
    auto half = [](DType t) { return t == DType::BF16 || t == DType::F16; };
    auto copy_row = [&](int64_t di, int64_t si) {
      char* to = static_cast<char*>(d) + di * static_cast<int64_t>(es);
      const char* from = static_cast<const char*>(s) + si * static_cast<int64_t>(ss);
      if (dt == st)
        std::memcpy(to, from, static_cast<std::size_t>(row) * es);
      else if (dt == DType::F32 && half(st))
        convert_block_to_f32(from, st, reinterpret_cast<float*>(to), row);
      else if (half(dt) && st == DType::F32)
        convert_block_from_f32(reinterpret_cast<const float*>(from), dt, to, row);
      else
        for (int64_t i = 0; i < row; ++i) store(to, dt, i, load(from, st, i));
    };
    // Every row is copied or converted on its own, so splitting the rows changes no result.
    const int64_t rows = shape_numel(outer);
    const bool split = rows > 1 && rows * row * static_cast<int64_t>(std::max(es, ss)) >= kParallelCopyBytes;
#pragma omp parallel if (split)
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      for_each_element_in(outer, dst_outer, src_outer, rows * t / threads, rows * (t + 1) / threads,
                          copy_row);
    }
    return;
  }
  for_each_element(dst.shape(), dst.strides(), src.strides(), [&](int64_t di, int64_t si) {
    if (dt == st)
      std::memcpy(static_cast<char*>(d) + di * es, static_cast<const char*>(s) + si * es, es);
    else
      store(d, dt, di, load(s, st, si));
  });
}

}  // namespace

// ---- storage --------------------------------------------------------------------------------

Storage::Storage(std::size_t bytes, Device device, Stream stream)
    : bytes_(bytes), device_(device), stream_(stream), owned_(true) {
  data_ = allocator_for(device).allocate(bytes, stream);
}

Storage::Storage(void* external, std::size_t bytes, Device device)
    : data_(external), bytes_(bytes), device_(device), owned_(false) {}

Storage::~Storage() {
  if (owned_ && data_ != nullptr) allocator_for(device_).deallocate(data_, bytes_, stream_);
}

// ---- construction ---------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, Stream stream) {
  check_shape(shape);
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device, stream);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, Stream stream) {
  Tensor t = empty(shape, dtype, device, stream);
  t.zero_(stream);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device);
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  PARALLEL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "{} values for shape {}",
                 values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype);
  copy_host(t, from_blob(const_cast<float*>(values.data()), shape, DType::F32));
  return t;
}

// ---- properties -----------------------------------------------------------------------------

int64_t Tensor::size(int64_t d) const {
  const int64_t r = dim();
  PARALLEL_CHECK(d >= -r && d < r, "dimension {} out of range for {}", d, str());
  return shape_[d < 0 ? d + r : d];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  if (!storage_ || device_.is_meta()) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

std::string Tensor::str() const {
  return fmt::format("Tensor{} {} {}", shape_str(shape_), dtype_name(dtype_), device_.str());
}

// ---- views ----------------------------------------------------------------------------------

namespace {
// The strides of `shape` over the elements of a tensor (old_shape, old_strides), when each new
// dimension lies inside one run of old dimensions that are contiguous with each other (PyTorch's
// view rule): a run may be merged or split, never mixed with its neighbours. Empty when no such
// strides exist.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  Shape strides(shape.size());
  if (shape_numel(old_shape) == 0) return contiguous_strides(shape);
  int64_t nd = static_cast<int64_t>(shape.size()) - 1;
  // Walk the old dimensions from the innermost, one contiguous run [d, run_end] at a time.
  int64_t run_numel = 1;
  int64_t run_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t new_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    run_numel *= old_shape[d];
    const bool run_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != run_numel * run_stride);
    if (!run_ends) continue;
    while (nd >= 0 && (new_numel < run_numel || shape[nd] == 1)) {
      strides[nd] = new_numel * run_stride;
      new_numel *= shape[nd];
      --nd;
    }
    if (new_numel != run_numel) return std::nullopt;
    if (d > 0) {
      run_stride = old_strides[d - 1];
      run_numel = 1;
      new_numel = 1;
    }
  }
  if (nd != -1) return std::nullopt;
  return strides;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d] == -1) {
      PARALLEL_CHECK(infer < 0, "view {}: only one dimension may be -1", shape_str(shape));
      infer = static_cast<int64_t>(d);
    } else {
      PARALLEL_CHECK(s[d] >= 0, "view {}: negative dimension", shape_str(shape));
      known *= s[d];
    }
  }
  if (infer >= 0) {
    PARALLEL_CHECK(known > 0 && numel() % known == 0, "cannot view {} as {}", str(), shape_str(shape));
    s[infer] = numel() / known;
  }
  PARALLEL_CHECK(shape_numel(s) == numel(), "cannot view {} as {}", str(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  if (is_contiguous()) {
    t.strides_ = contiguous_strides(s);
    return t;
  }
  std::optional<Shape> strides = view_strides(shape_, strides_, s);
  PARALLEL_CHECK(strides.has_value(),
                 "view {} of a non-contiguous {} (strides {}) would mix non-adjacent elements: call "
                 "contiguous() first",
                 shape_str(s), str(), shape_str(strides_));
  t.strides_ = *strides;
  return t;
}

Tensor Tensor::narrow(int64_t dim_, int64_t start, int64_t length) const {
  const int64_t d = dim_ < 0 ? dim_ + dim() : dim_;
  PARALLEL_CHECK(d >= 0 && d < dim(), "narrow: dimension {} out of range for {}", dim_, str());
  PARALLEL_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d],
                 "narrow: [{}, {}) out of range for dimension {} of {}", start, start + length, d, str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::select(int64_t index) const {
  PARALLEL_CHECK(dim() >= 1, "select on a 0-d tensor");
  Tensor t = narrow(0, index, 1);
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  return t;
}

// ---- copies ---------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  const Stream stream = own_stream(storage_);
  Tensor t = empty(shape_, dtype_, device_, stream);
  t.copy_(*this, stream);
  return t;
}

Tensor Tensor::to(Device device, Stream stream) const {
  if (device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device, stream);
  t.copy_(*this, stream);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  const Stream stream = own_stream(storage_);
  Tensor t = empty(shape_, dtype, device_, stream);
  t.copy_(*this, stream);
  return t;
}

void Tensor::copy_(const Tensor& src, Stream stream) {
  const ops::OpTimeSpan op_time("copy_");
  PARALLEL_CHECK(shape_ == src.shape_, "copy_: shape {} from {}", shape_str(shape_), shape_str(src.shape_));
  if (numel() == 0) return;
  if (device_.is_meta() || src.device_.is_meta()) return meta::copy(*this, src);
  if (dtype_ != src.dtype_) count_conversion_pass(numel(), dtype_size(src.dtype_) + dtype_size(dtype_));
  if (device_.is_cpu() && src.device_.is_cpu()) return copy_host(*this, src);

  // Across devices or on a GPU: bytes move contiguously or as one 2-D copy (a narrowed view on
  // either side); conversions happen on the GPU when both sides are there, else on the host side.
  if (!is_contiguous() || !src.is_contiguous()) {
    if (dtype_ != src.dtype_) {  // pack (same dtype), convert (contiguous), then place
      // Packed on `stream`, not src's own: every step of this copy is ordered on the one stream.
      Tensor packed = src;
      if (!src.is_contiguous()) {
        packed = empty(src.shape_, src.dtype_, src.device_, stream);
        packed.copy_(src, stream);
      }
      if (is_contiguous()) return copy_(packed, stream);
      Tensor converted = empty(shape_, dtype_, src.device_, stream);
      converted.copy_(packed, stream);
      return copy_(converted, stream);
    }
    Pitched d, s;
    const bool ok = as_pitched(shape_, strides_, d) && as_pitched(src.shape_, src.strides_, s);
    // A contiguous side takes the other side's runs.
    if (ok && is_contiguous()) d = {s.rows, s.width, s.width};
    if (ok && src.is_contiguous()) s = {d.rows, d.width, d.width};
    PARALLEL_CHECK(ok && d.rows == s.rows && d.width == s.width,
                   "copy_ between {} and {}: off the CPU, a strided side must be a narrow() of a contiguous "
                   "tensor (rows of contiguous runs at one pitch), with the other side matching",
                   str(), src.str());
    const std::size_t esize = dtype_size(dtype_);
    cuda_backend::memcpy_2d(data_ptr(), d.pitch * esize, device_, src.data_ptr(), s.pitch * esize,
                            src.device_, d.width * esize, d.rows, stream);
    return;
  }
  if (device_.is_cuda() && src.device_.is_cuda()) {
    if (dtype_ == src.dtype_)
      cuda_backend::memcpy(data_ptr(), device_, src.data_ptr(), src.device_, nbytes(), stream);
    else if (device_ == src.device_)
      cuda_backend::convert(data_ptr(), dtype_, src.data_ptr(), src.dtype_, numel(), device_, stream);
    else
      copy_(src.to(device_, stream), stream);
    return;
  }
  if (dtype_ == src.dtype_) {
    cuda_backend::memcpy(data_ptr(), device_, src.data_ptr(), src.device_, nbytes(), stream);
  } else if (device_.is_cuda()) {  // host -> device with conversion: convert on the host first
    Tensor staged = src.to(dtype_);
    cuda_backend::memcpy(data_ptr(), device_, staged.data_ptr(), staged.device_, nbytes(), stream);
  } else {  // device -> host with conversion: move the bytes, then convert on the host
    Tensor staged = empty(shape_, src.dtype_);
    cuda_backend::memcpy(staged.data_ptr(), staged.device_, src.data_ptr(), src.device_, src.nbytes(),
                         stream);
    copy_host(*this, staged);
  }
}

void Tensor::fill_(double value, Stream stream) {
  const ops::OpTimeSpan op_time("fill_");
  if (numel() == 0) return;
  if (device_.is_meta()) return meta::record_op("fill_", 0.0, {}, {this});
  if (device_.is_cuda()) {
    PARALLEL_CHECK(is_contiguous(), "fill_ of a non-contiguous CUDA tensor {}", str());
    cuda_backend::fill(data_ptr(), dtype_, value, numel(), device_, stream);
    return;
  }
  void* d = data_ptr();
  if (is_contiguous()) {
    const int64_t n = numel();
    // +0.0 in every dtype is all zero bits: a memset, which glibc streams past the cache for large
    // sizes (the gradient buffer's zeroing each step: 55 MB for the mini GPT, 500 MB for GPT-2,
    // ~41 GB/s against ~15 for a loop of fp32 stores here). Fills of >= kParallelCopyBytes are split
    // over the threads in 64-byte pieces; every element gets the same value either way.
    const bool zero_bits = value == 0.0 && !std::signbit(value);
    const std::size_t es = dtype_size(dtype_);
    auto fill_range = [&](int64_t b, int64_t e) {
      if (zero_bits) {
        std::memset(static_cast<char*>(d) + b * static_cast<int64_t>(es), 0,
                    static_cast<std::size_t>(e - b) * es);
      } else if (dtype_ == DType::F32) {
        std::fill_n(static_cast<float*>(d) + b, e - b, static_cast<float>(value));
      } else {
        for (int64_t i = b; i < e; ++i) store(d, dtype_, i, value);
      }
    };
    // Small fills stay out of OpenMP altogether: even a region with a false `if` costs a call
    // into the runtime, and a step makes several small fills.
    if (static_cast<int64_t>(nbytes()) < kParallelCopyBytes) return fill_range(0, n);
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t piece = std::max<int64_t>(1, 64 / static_cast<int64_t>(es));
      const int64_t pieces = (n + piece - 1) / piece;
      fill_range(std::min(n, pieces * t / threads * piece), std::min(n, pieces * (t + 1) / threads * piece));
    }
    return;
  }
  for_each_element(shape_, strides_, strides_, [&](int64_t di, int64_t) { store(d, dtype_, di, value); });
}

namespace {
std::atomic<int64_t> g_host_reads{0};
}  // namespace

ConversionPasses conversion_passes() {
  return {g_conversion_passes.load(std::memory_order_relaxed),
          g_conversion_elements.load(std::memory_order_relaxed),
          g_conversion_bytes.load(std::memory_order_relaxed)};
}

int64_t host_reads() { return g_host_reads.load(std::memory_order_relaxed); }
void count_host_read() { g_host_reads.fetch_add(1, std::memory_order_relaxed); }

void Tensor::refuse_meta_read(const char* what) const { meta::refuse_read(*this, what); }

std::vector<float> Tensor::to_float_vector() const {
  if (device_.is_meta()) refuse_meta_read("to_float_vector()");
  count_host_read();
  const Tensor host = device_.is_cpu() ? *this : to(Device::cpu(), own_stream(storage_));
  std::vector<float> out(static_cast<size_t>(numel()));
  if (out.empty()) return out;
  Tensor dst = from_blob(out.data(), shape_, DType::F32);
  copy_host(dst, host);
  return out;
}

}  // namespace parallel
