#pragma once
// Saving and resuming a training run (docs/checkpoints.md, "Training state"): the model's
// parameters, the optimizer's state and the run's progress, as one resharding checkpoint
// (checkpoint.hpp). A checkpoint saved by one layout (tensor, pipeline, data parallel sizes,
// AdamW or the distributed optimizer) resumes in any other; in the same layout the resumed run is
// bitwise identical to the uninterrupted one.
//
// What is saved:
//   every parameter                 under its own name, each global element written once
//   exp_avg, exp_avg_sq             "optimizer.exp_avg.<name>", "optimizer.exp_avg_sq.<name>"
//   fp32 main params (bf16/fp16)    "optimizer.main_param.<name>"
//   progress, updates(), loss scale the checkpoint's extras (JSON)
// The distributed optimizer's state is gathered over dp into each parameter's box before saving
// and cut back into the rank's own shard on load, so its checkpoints look like AdamW's.
//
// RNG state: there is none to save. Initialisation and dropout draw from a counter-based generator
// keyed by (seed, parameter name or step, micro-batch, element index), so seed + step *is* the
// random state: a run resumed at step N with the same seed draws exactly what the uninterrupted
// run would have drawn.
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/parameter.hpp"

namespace parallel {

namespace checkpoint {
class AsyncSave;  // checkpoint.hpp
}

struct TrainProgress {
  int64_t step = 0;              // optimizer steps taken (iterations, skipped fp16 steps included)
  int64_t consumed_samples = 0;  // the data position: samples of the global stream used so far
  // Written by save_train_state from the optimizer (when one is given), returned by load:
  double loss_scale = 0;               // fp16's dynamic loss scale; 0: none
  int64_t loss_scale_clean_steps = 0;  // the scaler's growth countdown
  int64_t optimizer_updates = 0;       // Optimizer::updates(): the bias-correction step count
  uint64_t seed = 0;                   // with `step`, the whole RNG state (see above)
  std::string config_yaml;             // config_to_yaml() of the run that saved, for people and checks
};

// Collective over state.world() (an MpiCommunicator). Saves every parameter of `params` (this
// rank's, all pipeline chunks; a name given twice, e.g. a tied embedding held by two virtual
// stages of one rank, is saved once) and, if `optimizer` is not null, its state into
// <root>/step_<progress.step>/ atomically, with the progress as extras; then prunes all but the
// newest `keep_last` step directories (0: keep all). The optimizer's own counters
// (updates(), loss scale) are recorded, whatever `progress` says about them. Finishes a pending
// distributed-optimizer parameter all-gather first. Returns the step directory. `buffers`: state
// kept besides the parameters (TrainStep::buffers(): the MoE expert biases), replicated wherever
// their layer is, saved like a replicated dense parameter.
std::string save_train_state(const std::string& root, const TrainProgress& progress,
                             const std::vector<Parameter*>& params, Optimizer* optimizer,
                             ParallelState& state, int keep_last = 0,
                             const std::vector<Parameter*>& buffers = {});

// The same save, written in the background (checkpoint::AsyncSave): collective over state.world()
// like save_train_state up to the copy into host buffers (and, for the distributed optimizer, the
// gather of its state); the parameters and the optimizer may change as soon as it returns. `save`
// must not be pending; save.finish(state.world()) publishes it (docs/checkpoints.md,
// "Asynchronous saves").
void start_save_train_state(checkpoint::AsyncSave& save, const std::string& root,
                            const TrainProgress& progress, const std::vector<Parameter*>& params,
                            Optimizer* optimizer, ParallelState& state, int keep_last = 0,
                            const std::vector<Parameter*>& buffers = {});

struct LoadResult {
  TrainProgress progress;
  bool had_optimizer_state = false;  // optimizer state was loaded into `optimizer`
  std::string path;                  // the step directory loaded
};

// Collective over state.world(). `path` is a checkpoint root (its latest step), a step directory,
// or "latest" (or empty): the latest step under `default_root`. Loads every parameter of `params`
// from any saved layout (padded vocabulary rows keep their values), then:
//   - checkpoint with optimizer state, optimizer given: loads the state (and updates(), the loss
//     scale) so that the next step is the uninterrupted run's next step; returns the progress.
//   - weights-only checkpoint, optimizer given: the optimizer is made fresh (zero moments,
//     updates() 0, main params re-read from the loaded weights); returns the progress with step,
//     consumed_samples and the optimizer counters 0 ("start from these weights").
//   - optimizer null: weights only; returns the saved progress.
// With bf16/fp16 DDP, pass the optimizer: it is what rewrites the low-precision parameter buffer
// from the loaded (fp32 working copy) values. `buffers` (as save_train_state's) are loaded with the
// weights; a checkpoint without them is refused by the loader, naming the missing tensor.
LoadResult load_train_state(const std::string& path, const std::string& default_root,
                            const std::vector<Parameter*>& params, Optimizer* optimizer, ParallelState& state,
                            const std::vector<Parameter*>& buffers = {});

}  // namespace parallel
