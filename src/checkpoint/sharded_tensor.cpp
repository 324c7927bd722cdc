// ShardedTensors from Parameters, and who writes each replicated copy.
#include <algorithm>

#include "checkpoint/internal.hpp"

namespace parallel::checkpoint {

bool is_optimizer_state(const std::string& name) { return name.starts_with(kOptimizerPrefix); }

bool is_replica_writer(const Parameter& param, const Coord& coord) {
  // An expert (stored under its global index) lives on one ep rank, split over etp (each etp rank
  // writes its slice) and replicated over expert-dp: expert-dp rank 0 writes it, whatever its tp,
  // cp or dp coordinates.
  if (param.expert) return coord.edp == 0 && (coord.etp == 0 || param.partition_dim >= 0);
  // Data and context parallel replicas hold identical copies of every dense parameter.
  if (coord.dp != 0 || coord.cp != 0) return false;
  if (param.is_replicated_over_tp() && coord.tp != 0) return false;
  // The tied word embedding's copy on the last stage equals the first stage's one (which in the V
  // placement sits on the same rank).
  if (param.shared_across_pipeline && (coord.pp != 0 || param.pipeline_copy)) return false;
  return true;
}

namespace {
// Drops the vocabulary-padding rows (global rows >= rows) from the tensor's box.
void clip_to_unpadded_rows(ShardedTensor& t, int64_t rows) {
  PARALLEL_CHECK(rows <= t.global_shape[0], "checkpoint: '{}' has {} unpadded rows of {}", t.name, rows,
                 t.global_shape[0]);
  const int64_t begin = std::min(t.global_offset[0], rows);
  const int64_t kept = std::min(t.global_offset[0] + t.local.size(0), rows) - begin;
  t.global_shape[0] = rows;
  t.global_offset[0] = begin;
  t.local = t.local.narrow(0, 0, kept);
}
}  // namespace

ShardedTensor from_parameter(const Parameter& param, bool replica_writer) {
  PARALLEL_CHECK(param.value.defined(), "checkpoint: parameter '{}' has no value", param.name);
  const int64_t dims = static_cast<int64_t>(param.global_shape.size());
  PARALLEL_CHECK(param.value.dim() == dims, "checkpoint: parameter '{}': value {} for global shape {}",
                 param.name, shape_str(param.value.shape()), shape_str(param.global_shape));
  PARALLEL_CHECK(param.partition_dim < dims, "checkpoint: parameter '{}': partition_dim {} of a {}-d tensor",
                 param.name, param.partition_dim, dims);
  ShardedTensor t;
  t.name = param.name;
  t.local = param.value;
  t.global_shape = param.global_shape;
  t.global_offset.assign(static_cast<std::size_t>(dims), 0);
  if (param.partition_dim >= 0)
    t.global_offset[static_cast<std::size_t>(param.partition_dim)] = param.partition_offset;
  t.replica_writer = replica_writer;
  if (param.unpadded_rows >= 0) clip_to_unpadded_rows(t, param.unpadded_rows);
  return t;
}

ShardedTensor optimizer_state(const Parameter& param, const std::string& state, const Tensor& value,
                              bool replica_writer) {
  PARALLEL_CHECK(!state.empty() && state.find('.') == std::string::npos,
                 "checkpoint: optimizer state name '{}' must be non-empty and contain no '.'", state);
  PARALLEL_CHECK(value.defined() && value.shape() == param.value.shape(),
                 "checkpoint: optimizer state '{}' of '{}' has shape {}, the parameter's slice {}", state,
                 param.name, value.defined() ? shape_str(value.shape()) : "undefined",
                 shape_str(param.value.shape()));
  ShardedTensor t = from_parameter(param, replica_writer);
  t.name = std::string(kOptimizerPrefix) + state + "." + param.name;
  t.local = value.narrow(0, 0, t.local.size(0));  // the rows from_parameter kept
  return t;
}

}  // namespace parallel::checkpoint

namespace parallel::checkpoint::detail {

Box box_of(const ShardedTensor& t, const char* op) {
  PARALLEL_CHECK(!t.name.empty() && t.name != "__metadata__", "checkpoint {}: invalid tensor name '{}'", op,
                 t.name);
  PARALLEL_CHECK(t.local.defined(), "checkpoint {}: tensor '{}' has no local tensor", op, t.name);
  const std::size_t dims = t.global_shape.size();
  PARALLEL_CHECK(static_cast<std::size_t>(t.local.dim()) == dims && t.global_offset.size() == dims,
                 "checkpoint {}: tensor '{}': local {} and global_offset {} for global shape {}", op, t.name,
                 shape_str(t.local.shape()), shape_str(t.global_offset), shape_str(t.global_shape));
  for (std::size_t d = 0; d < dims; ++d)
    PARALLEL_CHECK(t.global_offset[d] >= 0 && t.global_offset[d] + t.local.shape()[d] <= t.global_shape[d],
                   "checkpoint {}: tensor '{}': the box at offset {} with shape {} lies outside the global "
                   "shape {}",
                   op, t.name, shape_str(t.global_offset), shape_str(t.local.shape()),
                   shape_str(t.global_shape));
  return Box{t.global_offset, t.local.shape()};
}

}  // namespace parallel::checkpoint::detail
