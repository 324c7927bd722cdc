#pragma once
// Distributed checkpoints that load into any parallel layout (docs/checkpoints.md).
//
// The unit of state is a ShardedTensor: this rank's box of a named global tensor. save() writes
// each global element once (from the rank marked replica_writer among the ranks holding identical
// copies), plus an index of which file holds which box. load() fills any requested boxes from the
// saved ones by N-d box intersection, so the saving and the loading layouts (tensor, pipeline and
// data parallel sizes, world size) may differ arbitrarily.
//
// On disk, under a checkpoint root:
//   <root>/step_00001200/index.json              files, checksums, tensor -> boxes, step, extras
//   <root>/step_00001200/rank_00003.safetensors  the boxes rank 3 wrote (plain safetensors)
//   <root>/latest                                "step_00001200\n", replaced atomically
// A step directory only ever appears complete: it is written as <root>/.tmp_step_00001200 and
// renamed once every file and the index are on disk.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/parameter.hpp"
#include "parallel/tensor.hpp"

namespace parallel::checkpoint {

// ---- the unit of state ------------------------------------------------------------------------

// This rank's box of a global tensor. `local` holds the box (any dtype, any device, any strides);
// the box spans [global_offset[d], global_offset[d] + local.size(d)) in every dimension d.
struct ShardedTensor {
  std::string name;
  Tensor local;
  Shape global_shape;
  std::vector<int64_t> global_offset;  // one per dimension
  // Exactly one of the ranks that hold an identical copy of this box writes it on save (ignored by
  // load). The boxes written by all ranks together must tile the global tensor.
  bool replica_writer = true;
};

// Name conventions (docs/checkpoints.md):
//   model weights:    the Parameter's name, e.g. "layers.3.attention.query.weight"
//   optimizer state:  "optimizer." + state + "." + parameter name, e.g.
//                     "optimizer.exp_avg.layers.3.attention.query.weight", sharing the parameter's
//                     box; scalars such as the step count belong in the extras.
inline constexpr const char* kOptimizerPrefix = "optimizer.";
bool is_optimizer_state(const std::string& name);

// Whether this rank writes `param` on save: the first data-parallel (and context/expert) replica;
// for tensors replicated over tensor parallelism the tp rank 0 copy; for the tied word embedding
// (shared_across_pipeline) the embedding's copy on the first pipeline stage, never the output layer's
// (pipeline_copy).
bool is_replica_writer(const Parameter& param, const Coord& coord);

// The parameter's value as a ShardedTensor (box from partition_dim / partition_offset).
ShardedTensor from_parameter(const Parameter& param, bool replica_writer);
// Optimizer state `state` (e.g. "exp_avg") of `param`: same box and writer rule as the parameter,
// `value` must have the parameter's local shape (its dtype may differ, e.g. fp32 moments).
ShardedTensor optimizer_state(const Parameter& param, const std::string& state, const Tensor& value,
                              bool replica_writer);

// ---- save -------------------------------------------------------------------------------------

struct SaveOptions {
  int keep_last = 0;  // > 0: afterwards remove the oldest step directories beyond this many
  // Optional JSON object describing the layout that saved (e.g. {"tensor": 2, "pipeline": 1,
  // "data": 2}); stored as "layout" in the index for people and tools. Empty: {}.
  std::string layout_json;
};

// Collective over `world` (every rank calls it with its own tensors). Writes
// <root>/step_<8 digits> atomically, points <root>/latest at it, then prunes per keep_last.
// `extras_json` is a JSON object (rank 0's is stored; e.g. the config YAML, data position, RNG
// seeds); empty means {}. Returns the step directory. Any rank's failure (an invalid box, boxes that
// overlap or leave a hole, an I/O error) throws parallel::Error on every rank, and nothing becomes
// visible. `world` must accept CPU tensors (an MpiCommunicator).
std::string save(const std::string& root, int64_t step, const std::vector<ShardedTensor>& tensors,
                 const std::string& extras_json, Communicator& world, const SaveOptions& options = {});

// ---- asynchronous save ------------------------------------------------------------------------

// A save whose writing overlaps training (docs/checkpoints.md, "Asynchronous saves"). start()
// copies this rank's written boxes into host memory and returns; a background thread then writes
// and fsyncs the rank's file. The thread touches no communicator (MPI is initialised
// MPI_THREAD_FUNNELED: only the main thread may call it), so the agreement that every rank's file
// is durable, and the publication (index, rename, `latest`), happen in finish(), which the main
// thread calls at a step boundary: when all_written() says every rank is done, or at the next save
// or the end of training, where it waits. Until then `latest` names the previous checkpoint, and a
// crash leaves only a hidden staging directory that the next save removes.
//
// At most one save is in flight: start() requires !pending(). Not thread-safe itself: one thread
// (the one that calls the communicator) uses it.
class AsyncSave {
 public:
  AsyncSave();
  // Waits for the background write (not collective: nothing is published); the staging directory
  // stays for the next save to remove.
  ~AsyncSave();
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;

  // Collective over `world`, with the arguments of save(). Checks the boxes, copies every box this
  // rank writes into a host buffer (a GPU tensor by a device-to-host copy on its own stream), has
  // rank 0 prepare the staging directory, and starts the background write. Any rank's failure here
  // throws on every rank, as save() does. The tensors may change as soon as it returns.
  //
  // Fault injection for tests (read here): PARALLEL_INJECT_CHECKPOINT_FAIL=STEP[:RANK] makes the
  // background write of step STEP fail on RANK (every rank without one) as a full disk would;
  // PARALLEL_INJECT_CHECKPOINT_DELAY_MS=MS makes every background write sleep MS first.
  void start(const std::string& root, int64_t step, const std::vector<ShardedTensor>& tensors,
             const std::string& extras_json, Communicator& world, const SaveOptions& options = {});

  bool pending() const;  // started and not finished (the same on every rank)
  int64_t step() const;  // the pending save's step
  // Whether this rank's background write has ended (written or failed). Not collective.
  bool written() const;
  // Collective (one all-reduce): whether every rank's background write has ended.
  bool all_written(Communicator& world);
  // Collective. Waits for this rank's write, then: if every rank wrote its file, rank 0 publishes
  // the step (index, rename, `latest`, keep_last) and the step directory is returned; if any
  // failed, the staging directory is removed, `latest` is left as it was, and parallel::Error is
  // thrown on every rank naming the rank and its error. Either way the save is no longer pending
  // and its host buffers are freed.
  std::string finish(Communicator& world);
  // This rank only: waits for the background write and drops the save without publishing it
  // (an error path where the ranks cannot agree any more). Not collective.
  void abandon();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// ---- load -------------------------------------------------------------------------------------

struct LoadOptions {
  // Fill only tensors whose names do not start with "optimizer."; requested optimizer tensors are
  // left untouched and listed in LoadResult::skipped.
  bool weights_only = false;
  // Where "latest" points when load() is given the literal path "latest".
  std::string default_root;
};

struct LoadResult {
  std::string step_dir;  // the resolved step directory
  int64_t step = 0;
  std::string extras_json;           // the saved extras object
  bool has_optimizer_state = false;  // the checkpoint holds any "optimizer." tensor
  int saved_world_size = 0;
  std::string layout_json;           // the saver's SaveOptions::layout_json ({} if none)
  std::vector<std::string> skipped;  // requested tensors not filled (weights_only)
};

// Collective over `world`. `path` is a checkpoint root (its `latest` step, else the highest complete
// step), one step directory, or "latest" (the latest step of options.default_root). Fills each
// requested tensor's local box from the overlapping saved boxes, converting dtypes. Every file read
// is checked against the index's size and CRC32C. Throws parallel::Error on every rank, naming the
// file or tensor, if a file is corrupt or truncated, a tensor is missing or has another global
// shape, or a box is not fully covered.
LoadResult load(const std::string& path, const std::vector<ShardedTensor>& tensors, Communicator& world,
                const LoadOptions& options = {});

// ---- inspection (not collective) ---------------------------------------------------------------

// Resolves `path` as load() does and returns the step directory (throws if there is none).
std::string resolve(const std::string& path, const std::string& default_root = "");

struct TensorInfo {
  std::string name;
  Shape global_shape;
  int num_shards = 0;
};

struct CheckpointInfo {
  std::string step_dir;
  int64_t step = 0;
  int saved_world_size = 0;
  std::string extras_json;
  std::string layout_json;
  bool has_optimizer_state = false;
  std::vector<TensorInfo> tensors;  // sorted by name
};

// Reads the index of the resolved checkpoint (no tensor data).
CheckpointInfo read_info(const std::string& path, const std::string& default_root = "");
// Checks every file of the step directory against the index (size and CRC32C); throws naming the
// first bad file.
void verify(const std::string& step_dir);

// The complete step directories under `root` (name step_<digits> holding index.json), by step.
struct StepDir {
  int64_t step = 0;
  std::string path;
};
std::vector<StepDir> list_steps(const std::string& root);
std::string step_dir_name(int64_t step);  // "step_00001200"

// ---- building blocks (exposed for tests) --------------------------------------------------------

// A box [offset[d], offset[d] + shape[d]) per dimension.
struct Box {
  std::vector<int64_t> offset;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
};
// The common part of two boxes of the same rank, or false when they do not overlap (a box with a
// zero extent overlaps nothing).
bool intersect(const Box& a, const Box& b, Box& out);

// CRC-32C (Castagnoli, as iSCSI / ext4 / RocksDB). Extends `crc` (the CRC of the preceding bytes;
// 0 to start): crc32c(b, n2, crc32c(a, n1)) == crc32c(a ++ b). Uses SSE4.2 when the CPU has it.
uint32_t crc32c(const void* data, std::size_t size, uint32_t crc = 0);
uint32_t crc32c_portable(const void* data, std::size_t size, uint32_t crc = 0);  // table-driven

}  // namespace parallel::checkpoint
