// index.json: the table of contents of one step directory (format in docs/checkpoints.md), the
// per-rank manifests save() gathers to build it, and file verification against it.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/internal.hpp"
#include "io/json_unique.hpp"

namespace parallel::checkpoint::detail {
namespace {

using nlohmann::json;

std::string crc_hex(uint32_t crc) { return fmt::format("{:08x}", crc); }

uint32_t parse_crc_hex(const std::string& s, const std::string& where) {
  PARALLEL_CHECK(s.size() == 8 && s.find_first_not_of("0123456789abcdef") == std::string::npos,
                 "checkpoint: {}: crc32c '{}' is not 8 lowercase hex digits", where, s);
  return static_cast<uint32_t>(std::stoul(s, nullptr, 16));
}

json shard_to_json(const ShardEntry& s) {
  return {{"file", s.file},
          {"dtype", safetensors::format_name(s.dtype)},
          {"offset", s.box.offset},
          {"shape", s.box.shape}};
}

// An integer field in [lo, hi]. nlohmann's get<int>() would convert 1e300 or -1 without a word
// (a float out of range is even undefined behaviour).
int64_t json_int(const json& v, const std::string& where, const std::string& what, int64_t lo, int64_t hi) {
  const bool in_int64 = v.is_number_integer() &&
                        (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
  if (!in_int64) PARALLEL_FAIL("checkpoint: {}: {} is not a 64-bit integer: {}", where, what, v.dump());
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi) PARALLEL_FAIL("checkpoint: {}: {} = {} is outside [{}, {}]", where, what, x, lo, hi);
  return x;
}

std::vector<int64_t> json_dims(const json& v, const std::string& where, const std::string& what) {
  if (!v.is_array()) PARALLEL_FAIL("checkpoint: {}: {} is not an array: {}", where, what, v.dump());
  std::vector<int64_t> dims;
  for (const json& d : v) dims.push_back(json_int(d, where, what + " entry", 0, INT64_MAX));
  return dims;
}

ShardEntry shard_from_json(const json& j, const std::string& where) {
  ShardEntry s;
  s.file = j.at("file").get<std::string>();
  s.dtype = parse_dtype(j.at("dtype").get<std::string>(), where);
  s.box.offset = json_dims(j.at("offset"), where, "shard offset");
  s.box.shape = json_dims(j.at("shape"), where, "shard shape");
  return s;
}

// The element count of `shape`, refusing shapes whose non-zero dimensions multiply past int64 (a
// tensor's strides are such products, so they must fit even when a zero makes it empty).
int64_t checked_numel(const Shape& shape, const std::string& where, const std::string& name) {
  int64_t extent = 1;
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(extent, d, &extent))
      PARALLEL_FAIL("checkpoint: {}: tensor '{}': shape {} overflows a 64-bit element count", where, name,
                    shape_str(shape));
  }
  return empty ? 0 : extent;
}

}  // namespace

DType parse_dtype(const std::string& s, const std::string& where) {
  DType t;
  if (safetensors::parse_format_name(s, t)) return t;
  PARALLEL_FAIL("checkpoint: {}: unknown dtype '{}'", where, s);
}

std::string normalize_json_object(const std::string& text, const std::string& what) {
  if (text.empty()) return "{}";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    PARALLEL_FAIL("checkpoint: {} is not valid JSON: {}", what, e.what());
  }
  PARALLEL_CHECK(j.is_object(), "checkpoint: {} must be a JSON object, got: {}", what, text.substr(0, 200));
  return j.dump();
}

std::string manifest_to_json(const RankManifest& m) {
  json tensors = json::array();
  for (const auto& [name, t] : m.tensors)
    tensors.push_back(
        {{"name", name}, {"global_shape", t.global_shape}, {"shard", shard_to_json(t.shards.at(0))}});
  json j = {{"file", m.file},         {"rank", m.entry.rank},
            {"bytes", m.entry.bytes}, {"crc32c", crc_hex(m.entry.crc32c)},
            {"tensors", tensors},     {"replicas", m.replicas}};
  return j.dump();
}

RankManifest manifest_from_json(const std::string& text) {
  const json j = json::parse(text);
  RankManifest m;
  m.file = j.at("file").get<std::string>();
  m.entry.rank = j.at("rank").get<int>();
  m.entry.bytes = j.at("bytes").get<uint64_t>();
  m.entry.crc32c = parse_crc_hex(j.at("crc32c").get<std::string>(), "rank manifest");
  for (const json& t : j.at("tensors")) {
    TensorEntry e;
    e.global_shape = t.at("global_shape").get<Shape>();
    e.shards.push_back(shard_from_json(t.at("shard"), "rank manifest"));
    m.tensors.emplace_back(t.at("name").get<std::string>(), std::move(e));
  }
  m.replicas = j.at("replicas").get<std::vector<std::string>>();
  return m;
}

std::string index_to_json(const Index& index) {
  json files = json::object();
  for (const auto& [name, f] : index.files)
    files[name] = {{"rank", f.rank}, {"bytes", f.bytes}, {"crc32c", crc_hex(f.crc32c)}};
  json tensors = json::object();
  for (const auto& [name, t] : index.tensors) {
    json shards = json::array();
    for (const ShardEntry& s : t.shards) shards.push_back(shard_to_json(s));
    tensors[name] = {{"global_shape", t.global_shape}, {"shards", shards}};
  }
  const json j = {{"format", kFormat},
                  {"version", kFormatVersion},
                  {"step", index.step},
                  {"world_size", index.world_size},
                  {"layout", json::parse(index.layout_json)},
                  {"extras", json::parse(index.extras_json)},
                  {"files", files},
                  {"tensors", tensors}};
  return j.dump(1) + "\n";
}

void validate_index(const Index& index, const std::string& where) {
  for (const auto& [name, t] : index.tensors) {
    for (int64_t d : t.global_shape)
      PARALLEL_CHECK(d >= 0, "checkpoint: {}: tensor '{}' has a negative dimension in global shape {}", where,
                     name, shape_str(t.global_shape));
    const int64_t numel = checked_numel(t.global_shape, where, name);
    for (const ShardEntry& s : t.shards) {
      PARALLEL_CHECK(index.files.count(s.file) == 1, "checkpoint: {}: tensor '{}' names unlisted file '{}'",
                     where, name, s.file);
      const Box& b = s.box;
      PARALLEL_CHECK(
          b.offset.size() == t.global_shape.size() && b.shape.size() == t.global_shape.size(),
          "checkpoint: {}: tensor '{}': a shard in {} has offset {} / shape {} for global shape {}", where,
          name, s.file, shape_str(b.offset), shape_str(b.shape), shape_str(t.global_shape));
      for (std::size_t d = 0; d < b.shape.size(); ++d)
        PARALLEL_CHECK(b.offset[d] >= 0 && b.shape[d] >= 0 && b.offset[d] <= t.global_shape[d] &&
                           b.shape[d] <= t.global_shape[d] - b.offset[d],
                       "checkpoint: {}: tensor '{}': shard in {} at offset {} shape {} lies outside global "
                       "shape {}",
                       where, name, s.file, shape_str(b.offset), shape_str(b.shape),
                       shape_str(t.global_shape));
    }
    // Pairwise: the shards of one tensor are its tensor-parallel pieces (few), not one per rank.
    for (std::size_t i = 0; i < t.shards.size(); ++i)
      for (std::size_t j = i + 1; j < t.shards.size(); ++j) {
        Box common;
        PARALLEL_CHECK(
            !intersect(t.shards[i].box, t.shards[j].box, common),
            "checkpoint: {}: tensor '{}': the shards in {} (offset {}) and {} (offset {}) overlap at "
            "offset {} shape {}: is replica_writer set on more than one copy?",
            where, name, t.shards[i].file, shape_str(t.shards[i].box.offset), t.shards[j].file,
            shape_str(t.shards[j].box.offset), shape_str(common.offset), shape_str(common.shape));
      }
    // Disjoint boxes inside the tensor tile it exactly when their volumes add up (and, disjoint
    // inside it, their sum cannot pass its element count).
    int64_t covered = 0;
    for (const ShardEntry& s : t.shards) covered += s.box.numel();
    PARALLEL_CHECK(covered == numel,
                   "checkpoint: {}: tensor '{}' of shape {}: its shards cover {} of {} elements: is "
                   "replica_writer false on every copy of some piece?",
                   where, name, shape_str(t.global_shape), covered, numel);
  }
}

Index read_index(const std::string& step_dir) {
  const std::string path = (std::filesystem::path(step_dir) / kIndexFile).string();
  const std::string text = read_text_file(path);
  Index index;
  try {
    // A key given twice (a hand-edited extras.step, say) would silently keep the last value.
    io::DuplicateKey duplicate;
    const json j = io::parse_unique_keys(text, &duplicate);
    if (!duplicate.key.empty())
      PARALLEL_FAIL("checkpoint: {}: key '{}' appears twice in one object (keys must be unique)", path,
                    duplicate.key);
    PARALLEL_CHECK(j.at("format").get<std::string>() == kFormat, "checkpoint: {}: format is '{}', not '{}'",
                   path, j.at("format").get<std::string>(), kFormat);
    const json& version = j.at("version");
    if (!version.is_number_integer() || version.get<int64_t>() != kFormatVersion)
      PARALLEL_FAIL("checkpoint: {}: format version {}, this build reads {}", path, version.dump(),
                    kFormatVersion);
    index.step = json_int(j.at("step"), path, "step", 0, INT64_MAX);
    index.world_size = static_cast<int>(json_int(j.at("world_size"), path, "world_size", 1, INT32_MAX));
    index.layout_json = j.at("layout").dump();
    index.extras_json = j.at("extras").dump();
    for (const auto& [name, f] : j.at("files").items()) {
      // A data file lies in the step directory: a name with a path in it would reach outside.
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
          name.find('\0') != std::string::npos)
        PARALLEL_FAIL("checkpoint: {}: file name '{}' is not a plain file name in the step directory", path,
                      name);
      const int rank = static_cast<int>(
          json_int(f.at("rank"), path, "files['" + name + "'].rank", 0, index.world_size - 1));
      const auto bytes =
          static_cast<uint64_t>(json_int(f.at("bytes"), path, "files['" + name + "'].bytes", 0, INT64_MAX));
      index.files[name] = {rank, bytes, parse_crc_hex(f.at("crc32c").get<std::string>(), path)};
    }
    for (const auto& [name, t] : j.at("tensors").items()) {
      TensorEntry e;
      e.global_shape = json_dims(t.at("global_shape"), path, "tensor '" + name + "' global_shape");
      for (const json& s : t.at("shards")) e.shards.push_back(shard_from_json(s, path));
      index.tensors[name] = std::move(e);
    }
  } catch (const json::exception& e) {
    PARALLEL_FAIL("checkpoint: {} is not a valid index: {}", path, e.what());
  }
  validate_index(index, path);
  return index;
}

std::unique_ptr<MappedFile> open_verified(const std::string& path, const FileEntry& entry) {
  auto file = std::make_unique<MappedFile>(path);
  PARALLEL_CHECK(file->size() == entry.bytes,
                 "checkpoint: {} is {} bytes, the index records {}: the file is truncated or was altered",
                 path, file->size(), entry.bytes);
  const uint32_t crc = crc32c(file->data(), file->size());
  PARALLEL_CHECK(crc == entry.crc32c, "checkpoint: {} is corrupt: its CRC32C is {}, the index records {}",
                 path, crc_hex(crc), crc_hex(entry.crc32c));
  return file;
}

}  // namespace parallel::checkpoint::detail

namespace parallel::checkpoint {

CheckpointInfo read_info(const std::string& path, const std::string& default_root) {
  CheckpointInfo info;
  info.step_dir = resolve(path, default_root);
  const detail::Index index = detail::read_index(info.step_dir);
  info.step = index.step;
  info.saved_world_size = index.world_size;
  info.extras_json = index.extras_json;
  info.layout_json = index.layout_json;
  for (const auto& [name, t] : index.tensors) {
    info.has_optimizer_state = info.has_optimizer_state || is_optimizer_state(name);
    info.tensors.push_back({name, t.global_shape, static_cast<int>(t.shards.size())});
  }
  return info;
}

void verify(const std::string& step_dir) {
  const detail::Index index = detail::read_index(step_dir);
  for (const auto& [name, entry] : index.files)
    detail::open_verified((std::filesystem::path(step_dir) / name).string(), entry);
}

}  // namespace parallel::checkpoint
