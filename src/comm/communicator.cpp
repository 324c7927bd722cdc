#include "parallel/communicator.hpp"

#include <algorithm>

#include "parallel/error.hpp"

namespace parallel {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkHandle completed_work() {
  // Stateless, so one shared instance serves every caller.
  static const WorkHandle done = std::make_shared<CompletedWork>();
  return done;
}

Chunk chunk_of(int64_t n, int parts, int index) {
  PARALLEL_CHECK(n >= 0, "chunk_of: negative element count {}", n);
  PARALLEL_CHECK(parts > 0, "chunk_of: {} parts", parts);
  PARALLEL_CHECK(index >= 0 && index < parts, "chunk_of: index {} outside [0, {})", index, parts);
  const int64_t base = n / parts;
  const int64_t extra = n % parts;
  Chunk c;
  c.count = base + (index < extra ? 1 : 0);
  c.offset = index * base + std::min<int64_t>(index, extra);
  return c;
}

}  // namespace parallel
