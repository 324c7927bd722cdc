// checkpoint::load: fills requested boxes from saved boxes of any other layout (resharding by box
// intersection), reading each needed file once and verifying it against the index first.
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/internal.hpp"

namespace parallel::checkpoint {
namespace {

namespace fs = std::filesystem;

// A tensor's place inside a verified safetensors file.
struct FileTensor {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // file offset of the first byte
};

// The file passed its CRC, so it is byte for byte what safetensors::save wrote: only the checks
// that keep a bad index from reading out of bounds are needed here.
std::map<std::string, FileTensor> parse_safetensors(const detail::MappedFile& file, const std::string& path) {
  PARALLEL_CHECK(file.size() >= 8, "checkpoint: {} is too short for a safetensors file", path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  PARALLEL_CHECK(header_len <= file.size() - 8, "checkpoint: {}: header length {} past the end", path,
                 header_len);
  const uint64_t data_start = 8 + header_len;
  std::map<std::string, FileTensor> out;
  try {
    const auto header = nlohmann::json::parse(reinterpret_cast<const char*>(file.data()) + 8,
                                              reinterpret_cast<const char*>(file.data()) + data_start);
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      FileTensor t;
      t.dtype = detail::parse_dtype(info.at("dtype").get<std::string>(), path);
      t.shape = info.at("shape").get<Shape>();
      const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
      PARALLEL_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] &&
                         offsets[1] <= file.size() - data_start &&
                         offsets[1] - offsets[0] == shape_numel(t.shape) * dtype_size(t.dtype),
                     "checkpoint: {}: tensor '{}' has a bad byte range", path, name);
      t.begin = data_start + offsets[0];
      out[name] = std::move(t);
    }
  } catch (const nlohmann::json::exception& e) {
    PARALLEL_FAIL("checkpoint: {}: bad safetensors header: {}", path, e.what());
  }
  return out;
}

// `t` restricted to the global box `part`, given that `t` holds the global box starting at `origin`.
Tensor sub_box(Tensor t, const std::vector<int64_t>& origin, const Box& part) {
  for (std::size_t d = 0; d < part.shape.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), part.offset[d] - origin[d], part.shape[d]);
  return t;
}

struct Request {
  const ShardedTensor* tensor = nullptr;
  Box box;
  Tensor target;  // `local` itself on the CPU, else a CPU staging copy
};

// One copy: the part `part` of shard `shard` into request `request`.
struct Piece {
  std::size_t request = 0;
  const detail::ShardEntry* shard = nullptr;
  Box part;
};

}  // namespace

LoadResult load(const std::string& path, const std::vector<ShardedTensor>& tensors, Communicator& world,
                const LoadOptions& options) {
  // Rank 0 resolves and every rank uses its answer: with a save running beside the load, ranks
  // resolving on their own could pick different steps.
  std::string resolved;
  if (world.rank() == 0) {
    try {
      resolved = resolve(path, options.default_root);
      resolved.insert(resolved.begin(), '+');
    } catch (const std::exception& e) {
      resolved = e.what();
      resolved.insert(resolved.begin(), '-');
    }
  }
  resolved = detail::broadcast_string(world, resolved, 0);
  if (resolved.empty() || resolved[0] != '+')
    throw Error(resolved.empty() ? "checkpoint load failed" : resolved.substr(1));

  LoadResult result;
  result.step_dir = resolved.substr(1);
  detail::run_collectively(world, "checkpoint load from " + result.step_dir, [&] {
    const detail::Index index = detail::read_index(result.step_dir);
    result.step = index.step;
    result.saved_world_size = index.world_size;
    result.extras_json = index.extras_json;
    result.layout_json = index.layout_json;
    for (const auto& [name, entry] : index.tensors)
      result.has_optimizer_state = result.has_optimizer_state || is_optimizer_state(name);

    // Plan every copy before reading anything, so that a missing tensor fails fast.
    std::vector<Request> requests;
    std::map<std::string, std::vector<Piece>> by_file;
    for (const ShardedTensor& t : tensors) {
      if (options.weights_only && is_optimizer_state(t.name)) {
        result.skipped.push_back(t.name);
        continue;
      }
      Request req{&t, detail::box_of(t, "load"), {}};
      const auto it = index.tensors.find(t.name);
      PARALLEL_CHECK(it != index.tensors.end(),
                     "checkpoint load: tensor '{}' is not in {} ({} tensors there)", t.name, result.step_dir,
                     index.tensors.size());
      PARALLEL_CHECK(it->second.global_shape == t.global_shape,
                     "checkpoint load: tensor '{}' has global shape {} in {}, but {} was requested", t.name,
                     shape_str(it->second.global_shape), result.step_dir, shape_str(t.global_shape));
      int64_t covered = 0;
      for (const detail::ShardEntry& shard : it->second.shards) {
        Box part;
        if (!intersect(req.box, shard.box, part)) continue;
        covered += part.numel();
        by_file[shard.file].push_back({requests.size(), &shard, part});
      }
      // The saved shards are disjoint (validate_index), so the volumes add up exactly.
      PARALLEL_CHECK(
          covered == req.box.numel(),
          "checkpoint load: tensor '{}': the saved shards cover {} of the {} elements of the box at "
          "offset {} shape {}",
          t.name, covered, req.box.numel(), shape_str(req.box.offset), shape_str(req.box.shape));
      req.target = t.local.device().is_cpu() ? t.local : Tensor::empty(t.local.shape(), t.local.dtype());
      requests.push_back(std::move(req));
    }

    for (const auto& [file, pieces] : by_file) {
      const std::string file_path = (fs::path(result.step_dir) / file).string();
      const auto mapped = detail::open_verified(file_path, index.files.at(file));
      const std::map<std::string, FileTensor> contents = parse_safetensors(*mapped, file_path);
      for (const Piece& piece : pieces) {
        const Request& req = requests[piece.request];
        const auto found = contents.find(req.tensor->name);
        PARALLEL_CHECK(found != contents.end(),
                       "checkpoint load: {} lacks tensor '{}' that the index places there", file_path,
                       req.tensor->name);
        const FileTensor& ft = found->second;
        PARALLEL_CHECK(ft.dtype == piece.shard->dtype && ft.shape == piece.shard->box.shape,
                       "checkpoint load: {}: tensor '{}' is {} {} but the index says {} {}", file_path,
                       req.tensor->name, safetensors::format_name(ft.dtype), shape_str(ft.shape),
                       safetensors::format_name(piece.shard->dtype), shape_str(piece.shard->box.shape));
        // FP8 is storage-only (no host arithmetic): it can be loaded into FP8 but not converted.
        if ((ft.dtype == DType::F8E4M3) != (req.target.dtype() == DType::F8E4M3))
          PARALLEL_FAIL(
              "checkpoint load: {}: tensor '{}' is stored as {} but requested as {}: fp8 is "
              "storage-only, there is no conversion to or from it",
              file_path, req.tensor->name, safetensors::format_name(ft.dtype),
              dtype_name(req.target.dtype()));
        // Read-only use: the mapping is PROT_READ and the tensor only ever is a copy source.
        const Tensor saved =
            Tensor::from_blob(const_cast<unsigned char*>(mapped->data()) + ft.begin, ft.shape, ft.dtype);
        Tensor dst = sub_box(req.target, req.box.offset, piece.part);
        dst.copy_(sub_box(saved, piece.shard->box.offset, piece.part));  // converts dtypes
      }
    }
    for (const Request& req : requests) {
      if (req.tensor->local.device().is_cpu()) continue;
      Tensor local = req.tensor->local;  // shares the caller's storage
      local.copy_(req.target);
    }
    return std::string();
  });
  return result;
}

}  // namespace parallel::checkpoint
