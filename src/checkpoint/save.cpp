// checkpoint::save: every rank writes its pieces into a hidden directory, rank 0 writes the index
// and publishes the directory with one rename (protocol in docs/checkpoints.md).
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/internal.hpp"
#include "parallel/log.hpp"
#include "parallel/safetensors.hpp"

namespace parallel::checkpoint::detail {
namespace {

namespace fs = std::filesystem;

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

detail::Index build_index(int64_t step, int world_size, const std::vector<std::string>& manifests,
                          const std::string& extras_json, const std::string& layout_json) {
  detail::Index index;
  index.step = step;
  index.world_size = world_size;
  index.extras_json = detail::normalize_json_object(extras_json, "the extras");
  index.layout_json = detail::normalize_json_object(layout_json, "SaveOptions::layout_json");
  std::map<std::string, int> first_rank;  // tensor -> the rank that first wrote it (for messages)
  std::set<std::string> replicas;
  for (int r = 0; r < world_size; ++r) {
    RankManifest m = detail::manifest_from_json(manifests[static_cast<std::size_t>(r)]);
    if (!m.file.empty()) index.files[m.file] = m.entry;
    for (auto& [name, entry] : m.tensors) {
      auto [it, fresh] = index.tensors.try_emplace(name);
      if (fresh) {
        it->second.global_shape = entry.global_shape;
        first_rank[name] = r;
      }
      PARALLEL_CHECK(it->second.global_shape == entry.global_shape,
                     "checkpoint save: tensor '{}' has global shape {} on rank {} but {} on rank {}", name,
                     shape_str(it->second.global_shape), first_rank[name], shape_str(entry.global_shape), r);
      it->second.shards.push_back(std::move(entry.shards.at(0)));
    }
    replicas.insert(m.replicas.begin(), m.replicas.end());
  }
  for (const std::string& name : replicas)
    PARALLEL_CHECK(index.tensors.count(name) == 1,
                   "checkpoint save: tensor '{}' has replica_writer false on every rank that holds it", name);
  return index;
}

}  // namespace

void prepare_root(const std::string& root_dir, const std::string& staging) {
  const fs::path root(root_dir);
  fs::create_directories(root);
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && (name.starts_with(".tmp_step_") || name.starts_with(".trash_"))) {
      logger().info("checkpoint: removing {} left by an interrupted save", e.path().string());
      fs::remove_all(e.path());
    }
  }
  fs::create_directory(staging);
  detail::fsync_directory(root.string());
}

RankPieces rank_pieces(const std::vector<ShardedTensor>& tensors, int rank) {
  RankPieces pieces;
  std::set<std::string> seen;
  for (const ShardedTensor& t : tensors) {
    detail::box_of(t, "save");
    PARALLEL_CHECK(seen.insert(t.name).second,
                   "checkpoint save: tensor '{}' is given twice on rank {} (a rank holds one box per tensor; "
                   "with tied embeddings on one rank pass only one copy)",
                   t.name, rank);
    if (t.replica_writer)
      pieces.written.push_back(t);
    else
      pieces.replicas.push_back(t.name);
  }
  return pieces;
}

RankManifest write_rank_file(const std::string& staging, int rank, const RankPieces& pieces) {
  RankManifest manifest;
  manifest.entry.rank = rank;
  manifest.replicas = pieces.replicas;
  std::map<std::string, Tensor> data;
  std::map<std::string, std::string> metadata;
  const std::string file = rank_file_name(rank);
  for (const ShardedTensor& t : pieces.written) {
    data[t.name] = t.local;
    // The file describes itself too, so that a single rank file is usable without the index.
    metadata[t.name] =
        nlohmann::json{{"global_shape", t.global_shape}, {"global_offset", t.global_offset}}.dump();
    detail::TensorEntry entry;
    entry.global_shape = t.global_shape;
    entry.shards.push_back({file, t.local.dtype(), Box{t.global_offset, t.local.shape()}});
    manifest.tensors.emplace_back(t.name, std::move(entry));
  }
  if (data.empty()) return manifest;  // nothing to write: no file

  const std::string path = (fs::path(staging) / file).string();
  safetensors::save(path, data, metadata);  // fsyncs the file and the staging directory
  detail::MappedFile written(path);
  manifest.file = file;
  manifest.entry.bytes = written.size();
  manifest.entry.crc32c = crc32c(written.data(), written.size());
  return manifest;
}

void publish(const std::string& root_dir, const std::string& staging_dir, const std::string& final_name,
             int64_t step, int world_size, const std::vector<std::string>& manifests,
             const std::string& extras_json, const std::string& layout_json) {
  const fs::path root(root_dir), staging(staging_dir), final_dir = fs::path(root_dir) / final_name;
  const detail::Index index = build_index(step, world_size, manifests, extras_json, layout_json);
  detail::validate_index(index, "save of " + final_dir.string());
  detail::write_file_atomic((staging / detail::kIndexFile).string(), detail::index_to_json(index));
  detail::fsync_directory(staging.string());
  // Saving a step that already exists (a run resumed from an earlier step): the old directory is
  // moved aside first, because rename() cannot replace a non-empty directory. A crash in between
  // leaves no step_X at all, and load falls back to the highest remaining step.
  if (fs::exists(final_dir)) detail::remove_directory_safely(final_dir.string());
  fs::rename(staging, final_dir);
  detail::fsync_directory(root.string());
  detail::write_file_atomic((root / detail::kLatestFile).string(), final_dir.filename().string() + "\n");
}

void prune(const std::string& root, int64_t step, int keep_last) {
  if (keep_last <= 0) return;
  std::vector<StepDir> others;
  for (const StepDir& s : list_steps(root))
    if (s.step != step) others.push_back(s);
  const std::size_t keep_others = static_cast<std::size_t>(keep_last - 1);
  if (others.size() <= keep_others) return;
  for (std::size_t i = 0; i < others.size() - keep_others; ++i) {
    logger().info("checkpoint: removing {} (keep_last = {})", others[i].path, keep_last);
    detail::remove_directory_safely(others[i].path);
  }
}

}  // namespace parallel::checkpoint::detail

namespace parallel::checkpoint {

namespace fs = std::filesystem;

std::string save(const std::string& root_dir, int64_t step, const std::vector<ShardedTensor>& tensors,
                 const std::string& extras_json, Communicator& world, const SaveOptions& options) {
  const fs::path root(root_dir);
  const std::string name = step_dir_name(step);
  const fs::path staging = root / (".tmp_" + name);
  const fs::path final_dir = root / name;
  const bool leader = world.rank() == 0;
  try {
    detail::run_collectively(world, "checkpoint save (prepare " + staging.string() + ")", [&] {
      PARALLEL_CHECK(!root_dir.empty(), "checkpoint save: empty checkpoint root");
      if (leader) detail::prepare_root(root_dir, staging.string());
      return std::string();
    });
    const std::vector<std::string> manifests =
        detail::run_collectively(world, "checkpoint save (write " + staging.string() + ")", [&] {
          return detail::manifest_to_json(detail::write_rank_file(
              staging.string(), world.rank(), detail::rank_pieces(tensors, world.rank())));
        });
    detail::run_collectively(world, "checkpoint save (publish " + final_dir.string() + ")", [&] {
      if (leader)
        detail::publish(root_dir, staging.string(), name, step, world.size(), manifests, extras_json,
                        options.layout_json);
      return std::string();
    });
  } catch (...) {
    // Every rank is past its writes here (each phase ends in agreement), so the staging directory
    // can go; a crash instead of an exception leaves it for the next save to remove.
    if (leader) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    throw;
  }
  if (leader) detail::prune(root_dir, step, options.keep_last);
  logger().debug("checkpoint: saved step {} to {}", step, final_dir.string());
  return final_dir.string();
}

}  // namespace parallel::checkpoint
