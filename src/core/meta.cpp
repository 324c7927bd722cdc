// The meta device's op events and value refusals (meta.hpp).
#include "parallel/meta.hpp"

#include <numeric>

#include "parallel/meta_timeline.hpp"

namespace parallel {
namespace {
thread_local MetaOpRecorder* g_recorder = nullptr;  // the innermost live recorder (per thread)

[[noreturn]] void fail_read(const Tensor& t, const std::string& what) {
  PARALLEL_FAIL(
      "{} of {}: a meta tensor has shape and dtype but no values (meta.hpp); code that needs a value "
      "must state an assumption for meta instead of reading it",
      what, t.str());
}
}  // namespace

MetaOpRecorder::MetaOpRecorder() : outer_(g_recorder) { g_recorder = this; }
MetaOpRecorder::~MetaOpRecorder() { g_recorder = outer_; }

double MetaOpRecorder::total_flops() const {
  return std::accumulate(events_.begin(), events_.end(), 0.0,
                         [](double sum, const OpEvent& e) { return sum + e.flops; });
}

namespace meta {

void record_op(const char* op, double flops, std::initializer_list<const Tensor*> reads,
               std::initializer_list<const Tensor*> writes, int64_t workspace) {
  // The workspace is taken and given back whether or not anyone records: the peak sees it.
  if (workspace > 0) (void)Tensor::empty({workspace}, DType::U8, Device::meta());
  MetaTimeline* timeline = live_timeline();
  if (g_recorder == nullptr && timeline == nullptr) return;
  OpEvent e;
  e.workspace_bytes = workspace;
  e.op = op;
  e.flops = flops;
  for (const Tensor* t : reads) {
    if (t == nullptr || !t->defined()) continue;
    e.shapes.push_back(t->shape());
    e.dtypes.push_back(t->dtype());
    e.bytes_read += static_cast<int64_t>(t->nbytes());
  }
  for (const Tensor* t : writes) {
    if (t == nullptr || !t->defined()) continue;
    e.shapes.push_back(t->shape());
    e.dtypes.push_back(t->dtype());
    e.bytes_written += static_cast<int64_t>(t->nbytes());
  }
  if (timeline != nullptr) timeline->add_op(e);
  if (g_recorder != nullptr) g_recorder->add(std::move(e));
}

void copy(const Tensor& dst, const Tensor& src) {
  if (!dst.device().is_meta()) fail_read(src, "copy_ into a " + dst.device().str() + " tensor");
  // A conversion costs one operation per element; a plain copy none.
  record_op("copy_", dst.dtype() == src.dtype() ? 0.0 : static_cast<double>(dst.numel()), {&src}, {&dst});
}

[[noreturn]] void refuse_read(const Tensor& t, const char* what) { fail_read(t, what); }

}  // namespace meta
}  // namespace parallel
