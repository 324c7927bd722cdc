#pragma once
// Pieces shared by the checkpoint sources (src/checkpoint/*.cpp); not part of the public API.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/checkpoint.hpp"
#include "parallel/safetensors.hpp"

namespace parallel::checkpoint::detail {

// ---- files (fs.cpp) -----------------------------------------------------------------------------

std::string read_text_file(const std::string& path);
// Writes PATH.tmp.<pid>, fsyncs it, renames it over PATH and fsyncs the directory: readers see the
// old content or the new, never a mix.
void write_file_atomic(const std::string& path, const std::string& text);
void fsync_directory(const std::string& dir);
// Renames `dir` to a hidden name in its parent, then deletes it: a crash midway leaves a dot
// directory that load ignores and the next save removes, never a partial step_X. Errors are logged,
// not thrown (the caller's checkpoint is already safe).
void remove_directory_safely(const std::string& dir);

// A whole file mapped read-only.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// ---- boxes (sharded_tensor.cpp) -----------------------------------------------------------------

// The box `t` covers, after checking it: a name, a defined local tensor of the global rank, an
// offset per dimension, inside the global shape. `op` ("save", "load") prefixes messages.
Box box_of(const ShardedTensor& t, const char* op);

// ---- the index (index.cpp) ----------------------------------------------------------------------

inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kFormat = "libparallel-checkpoint";
inline constexpr int kFormatVersion = 1;

struct ShardEntry {
  std::string file;
  DType dtype = DType::F32;
  Box box;
};

struct TensorEntry {
  Shape global_shape;
  std::vector<ShardEntry> shards;
};

struct FileEntry {
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct Index {
  int64_t step = 0;
  int world_size = 0;
  std::map<std::string, FileEntry> files;
  std::map<std::string, TensorEntry> tensors;
  std::string extras_json = "{}";
  std::string layout_json = "{}";
};

std::string index_to_json(const Index& index);
// Parses and validates (validate_index) the index file of `step_dir`.
Index read_index(const std::string& step_dir);
// Every shard names a listed file, lies inside its tensor, and the shards of each tensor tile it
// exactly (no overlap, no hole). Throws naming `where` and the tensor.
void validate_index(const Index& index, const std::string& where);
// Throws unless `text` is empty or a JSON object; returns its compact form ("{}" when empty).
std::string normalize_json_object(const std::string& text, const std::string& what);

// One rank's contribution to the index, as gathered by save().
struct RankManifest {
  std::string file;  // empty: the rank wrote nothing
  FileEntry entry;
  std::vector<std::pair<std::string, TensorEntry>> tensors;  // one shard each
  std::vector<std::string> replicas;  // tensors this rank holds but another copy writes
};
std::string manifest_to_json(const RankManifest& manifest);
RankManifest manifest_from_json(const std::string& text);

DType parse_dtype(const std::string& s, const std::string& where);

// Checks a file of the step directory against its index entry (size, then CRC32C) and returns it
// mapped. Throws parallel::Error naming the file.
std::unique_ptr<MappedFile> open_verified(const std::string& path, const FileEntry& entry);

// ---- the phases of a save (save.cpp), shared by save() and AsyncSave (async_save.cpp) ----------

// Rank 0, before anyone writes: creates the root, removes leftovers of crashed saves and
// interrupted removals, creates the empty staging directory.
void prepare_root(const std::string& root, const std::string& staging);
// This rank's part of a save, checked (valid boxes, each name once): the pieces it writes and the
// names it holds while another rank writes them.
struct RankPieces {
  std::vector<ShardedTensor> written;
  std::vector<std::string> replicas;
};
RankPieces rank_pieces(const std::vector<ShardedTensor>& tensors, int rank);
// Writes (and fsyncs) this rank's file of `pieces` into `staging`, reads it back for its size and
// CRC32C. Touches no communicator: AsyncSave runs it on its background thread.
RankManifest write_rank_file(const std::string& staging, int rank, const RankPieces& pieces);
// Rank 0, after every rank's file is durable: builds and checks the index from every rank's
// manifest, writes it, renames the staging directory to `final_name` and replaces `latest`.
void publish(const std::string& root, const std::string& staging, const std::string& final_name, int64_t step,
             int world_size, const std::vector<std::string>& manifests, const std::string& extras_json,
             const std::string& layout_json);
// Rank 0: removes the oldest complete steps beyond keep_last, never `step`.
void prune(const std::string& root, int64_t step, int keep_last);

// ---- collectives (collective.cpp) ---------------------------------------------------------------

// Runs `body` on every rank, then exchanges the results: when any rank's body threw, every rank
// throws (the failing rank its own error, the others one naming that rank and its message), so no
// rank goes on to a collective that a failed rank will never reach. Otherwise returns every rank's
// result, indexed by rank.
std::vector<std::string> run_collectively(Communicator& world, const std::string& what,
                                          const std::function<std::string()>& body);
std::string broadcast_string(Communicator& world, const std::string& value, int root);

}  // namespace parallel::checkpoint::detail
