// Training state checkpoints: parameters + optimizer state + progress over checkpoint::save/load.
#include "parallel/train_state.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "parallel/checkpoint.hpp"
#include "parallel/config.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {

using nlohmann::json;

constexpr const char* kExpAvg = "exp_avg";
constexpr const char* kExpAvgSq = "exp_avg_sq";
constexpr const char* kMainParam = "main_param";
constexpr const char* kMomentum = "momentum_buffer";  // Muon's (torch.optim.Muon's state key)

// The parameters by name, first occurrence first. A rank may hold two Parameter objects with one
// name (the tied embedding on the first and last virtual stage of one rank); the checkpoint has
// one tensor per name, so the first one is saved and loaded and the others copied from it.
struct NamedParams {
  std::vector<Parameter*> unique;
  std::vector<std::pair<Parameter*, Parameter*>> duplicates;  // (copy, the unique one it mirrors)
};

// The parameters the optimizer updates: all but the frozen ones (LoRA's base weights), which have
// no optimizer state to save or load.
std::vector<Parameter*> trained(const std::vector<Parameter*>& params) {
  std::vector<Parameter*> out;
  for (Parameter* p : params)
    if (!p->frozen) out.push_back(p);
  return out;
}

bool is_lora_adapter(const Parameter& p) {
  return p.name.ends_with(".lora_A.weight") || p.name.ends_with(".lora_B.weight");
}

NamedParams by_name(const std::vector<Parameter*>& params) {
  NamedParams out;
  std::unordered_map<std::string, Parameter*> first;
  for (Parameter* p : params) {
    PARALLEL_CHECK(p != nullptr, "train state: null parameter");
    auto [it, fresh] = first.try_emplace(p->name, p);
    if (fresh) {
      out.unique.push_back(p);
    } else if (it->second != p) {
      PARALLEL_CHECK(it->second->value.shape() == p->value.shape(),
                     "train state: two parameters named '{}' with different shapes {} and {}", p->name,
                     shape_str(it->second->value.shape()), shape_str(p->value.shape()));
      out.duplicates.emplace_back(p, it->second);
    }
  }
  return out;
}

// The optimizer's state slices grouped by parameter name (every copy of a name: see NamedParams).
std::map<std::string, std::vector<Optimizer::StateSlice>> slices_by_name(const Optimizer& optimizer) {
  std::map<std::string, std::vector<Optimizer::StateSlice>> out;
  for (const Optimizer::StateSlice& s : optimizer.state_slices()) out[s.param->name].push_back(s);
  return out;
}

bool has_main_params(const Optimizer& optimizer) { return optimizer.main_params().defined(); }

// The distributed optimizer keeps state only for this rank's shard of each bucket (of the dense
// replica and, MoE, of the experts' over expert-dp: the optimizer shards both or neither).
bool is_sharded(Optimizer& optimizer) {
  const std::vector<DataParallel*> replicas = optimizer.data_parallels();
  return !replicas.empty() && replicas.front()->options().distributed_optimizer;
}

// One parameter's full local state, shaped like the parameter.
struct ParamState {
  Tensor exp_avg, exp_avg_sq;  // AdamW's parameters
  Tensor momentum;             // Muon's
  Tensor main;                 // undefined for fp32
};

// One kind of per-element optimizer state: its name in the checkpoint and where it sits in a
// slice and in a ParamState.
struct StateKind {
  const char* name;
  Tensor Optimizer::StateSlice::*slice;
  Tensor ParamState::*full;
};

// The kinds this optimizer keeps, alike on every rank (the gathers below are collective): Adam's
// moments, Muon's momentum (optimizer.type muon), the fp32 main params (low precision).
std::vector<StateKind> state_kinds(const Optimizer& optimizer) {
  using S = Optimizer::StateSlice;
  std::vector<StateKind> kinds{{kExpAvg, &S::exp_avg, &ParamState::exp_avg},
                               {kExpAvgSq, &S::exp_avg_sq, &ParamState::exp_avg_sq}};
  if (optimizer.uses_muon()) kinds.push_back({kMomentum, &S::momentum, &ParamState::momentum});
  if (has_main_params(optimizer)) kinds.push_back({kMainParam, &S::main, &ParamState::main});
  return kinds;
}

// Whether `p`'s state is Muon's momentum (else Adam's moments).
bool muon_state(const Optimizer& optimizer, const Parameter& p) {
  return optimizer.uses_muon() && muon_parameter(p);
}

// Distributed optimizer: every rank of a replica's sharding group owns a contiguous shard of each
// of its buckets. Each rank scatters its slices into a zeroed buffer-shaped tensor at the
// parameters' buffer offsets, then every bucket is all-gathered from the owners' shards: all ranks
// of the group end up with the state of every parameter laid out exactly like the parameter
// buffer. Only the slices and the shard rule are used, not the optimizer's internal flat layout.
// A kind a parameter does not have (Muon's momentum for an AdamW one, or the reverse) stays 0.
std::vector<Tensor> gather_over_dp(Optimizer& optimizer, DataParallel& ddp,
                                   const std::vector<StateKind>& kinds) {
  ParamAndGradBuffer& buf = ddp.buffer();
  const std::size_t states = kinds.size();
  std::vector<Tensor> full;
  for (std::size_t k = 0; k < states; ++k) full.push_back(Tensor::zeros({buf.numel()}, DType::F32));
  for (const Optimizer::StateSlice& s : optimizer.state_slices()) {
    if (!buf.contains(s.param)) continue;  // the other replica's
    const int64_t at = buf.offset_of(s.param) + s.param_offset, n = s.numel();
    for (std::size_t k = 0; k < states; ++k) {
      const Tensor& src = s.*kinds[k].slice;
      if (src.defined()) full[k].narrow(0, at, n).copy_(src);
    }
  }
  Communicator& dp = ddp.shard_group();  // HSDP: the other groups hold the same shards
  if (dp.size() == 1) return full;
  for (const Bucket& b : buf.buckets()) {
    const BucketShard sh = ddp.shard(b);
    for (std::size_t k = 0; k < states; ++k) {
      // The shard already sits in its slot of the bucket: an in-place all-gather, as DDP's.
      const Tensor mine = full[k].narrow(0, b.offset + sh.offset, sh.count).clone();
      Tensor bucket = full[k].narrow(0, b.offset, b.numel);
      dp.all_gather(mine, bucket);
    }
  }
  return full;
}

// Every parameter's full state (collective over each replica's sharding group for the
// distributed optimizer).
std::map<std::string, ParamState> full_state(Optimizer& optimizer, const std::vector<Parameter*>& params) {
  const std::vector<StateKind> kinds = state_kinds(optimizer);
  std::map<std::string, ParamState> out;
  if (is_sharded(optimizer)) {
    const std::vector<DataParallel*> replicas = optimizer.data_parallels();
    std::vector<std::vector<Tensor>> full;
    for (DataParallel* d : replicas) full.push_back(gather_over_dp(optimizer, *d, kinds));
    for (Parameter* p : params) {
      std::size_t r = 0;
      while (r < replicas.size() && !replicas[r]->buffer().contains(p)) ++r;
      PARALLEL_CHECK(r < replicas.size(),
                     "save_train_state: parameter '{}' is not in the optimizer's DDP buffers", p->name);
      const int64_t at = replicas[r]->buffer().offset_of(p), n = p->numel();
      ParamState s;
      for (std::size_t k = 0; k < kinds.size(); ++k)
        s.*kinds[k].full = full[r][k].narrow(0, at, n).view(p->value.shape());
      out[p->name] = s;
    }
    return out;
  }
  const auto slices = slices_by_name(optimizer);
  for (Parameter* p : params) {
    auto it = slices.find(p->name);
    PARALLEL_CHECK(it != slices.end(), "save_train_state: the optimizer does not update parameter '{}'",
                   p->name);
    // AdamW: one slice spans the whole parameter (of the copy it updates).
    const Optimizer::StateSlice& s = it->second.front();
    PARALLEL_CHECK(s.param_offset == 0 && s.numel() == p->numel(),
                   "save_train_state: the optimizer holds only part of '{}'", p->name);
    ParamState st;
    for (const StateKind& k : kinds) {
      const Tensor& src = s.*k.slice;
      if (src.defined()) st.*k.full = src.view(p->value.shape());
    }
    out[p->name] = st;
  }
  return out;
}

std::string layout_json(ParallelState& state, Optimizer* optimizer) {
  const ParallelSizes& s = state.grid().sizes();
  json j = {{"tensor", s.tensor}, {"pipeline", s.pipeline}, {"data", s.data}};
  if (s.context != 1) j["context"] = s.context;
  if (s.expert != 1) j["expert"] = s.expert;
  if (s.expert_tensor != 1) j["expert_tensor"] = s.expert_tensor;
  j["optimizer"] = optimizer == nullptr ? "none" : is_sharded(*optimizer) ? "distributed" : "adamw";
  return j.dump();
}

// The extras hold everything scalar: the progress, the optimizer's counters and what it saved.
std::string extras_json(const TrainProgress& progress, Optimizer* optimizer) {
  json j;
  j["step"] = progress.step;
  j["consumed_samples"] = progress.consumed_samples;
  j["seed"] = progress.seed;
  j["rng"] = "counter-based (seed, step, micro-batch): no state beyond seed and step";
  j["config_yaml"] = progress.config_yaml;
  if (optimizer != nullptr) {
    DynamicLossScaler* scaler = optimizer->loss_scaler();
    j["optimizer"] = {
        {"updates", optimizer->updates()},
        {"loss_scale", scaler != nullptr ? scaler->scale() : 0.0},
        {"loss_scale_clean_steps", scaler != nullptr ? scaler->clean_steps() : 0},
        {"main_params", has_main_params(*optimizer)},
        {"type", optimizer->uses_muon() ? "muon" : "adamw"},
    };
  } else {
    j["optimizer"] = {{"updates", progress.optimizer_updates},
                      {"loss_scale", progress.loss_scale},
                      {"loss_scale_clean_steps", progress.loss_scale_clean_steps},
                      {"main_params", false}};
  }
  return j.dump();
}

TrainProgress progress_from_json(const json& j, int64_t index_step, bool& main_params);

// Tolerates missing keys (a checkpoint written by checkpoint::save directly): defaults then. Values
// of the wrong type or out of range (a hand-edited or corrupt index) are refused naming `where`
// (the checkpoint's index file) and the key, instead of failing later far from the cause.
TrainProgress progress_from(const std::string& extras, int64_t index_step, bool& main_params,
                            const std::string& where, int saved_world_size) {
  TrainProgress p;
  try {
    p = progress_from_json(json::parse(extras.empty() ? "{}" : extras), index_step, main_params);
  } catch (const json::exception& e) {
    PARALLEL_FAIL("checkpoint {}: extras: {}", where, e.what());
  }
  auto require = [&](bool ok, const char* key, auto value, const char* rule) {
    if (!ok) PARALLEL_FAIL("checkpoint {}: extras.{} = {}: {}", where, key, value, rule);
  };
  require(p.step >= 0, "step", p.step, "must be >= 0");
  require(p.consumed_samples >= 0, "consumed_samples", p.consumed_samples, "must be >= 0");
  require(p.optimizer_updates >= 0, "optimizer.updates", p.optimizer_updates, "must be >= 0");
  require(std::isfinite(p.loss_scale) && p.loss_scale >= 0, "optimizer.loss_scale", p.loss_scale,
          "must be finite and >= 0");
  require(p.loss_scale_clean_steps >= 0, "optimizer.loss_scale_clean_steps", p.loss_scale_clean_steps,
          "must be >= 0");
  // The saved config must read back as a config of the saving job, and the data position must be
  // where its steps put it: a hand-edited or corrupt value would otherwise pass unseen.
  if (!p.config_yaml.empty()) {
    Config saved;
    try {
      saved = parse_config(p.config_yaml, {}, std::max(saved_world_size, 1), "extras.config_yaml");
    } catch (const ConfigError& e) {
      PARALLEL_FAIL(
          "checkpoint {}: extras.config_yaml is not a valid config of the saving job ({} ranks): {}", where,
          saved_world_size, e.what());
    }
    const int64_t expected = p.step * saved.train.global_batch_size;
    if (p.consumed_samples != expected)
      PARALLEL_FAIL(
          "checkpoint {}: extras.consumed_samples = {}: must be extras.step * train.global_batch_size of "
          "extras.config_yaml ({} * {} = {})",
          where, p.consumed_samples, p.step, saved.train.global_batch_size, expected);
  }
  return p;
}

TrainProgress progress_from_json(const json& j, int64_t index_step, bool& main_params) {
  TrainProgress p;
  p.step = j.value("step", index_step);
  p.consumed_samples = j.value("consumed_samples", int64_t{0});
  p.seed = j.value("seed", uint64_t{0});
  // "config" as in the examples of docs/checkpoints.md; converters (HF GPT-2) write "config_yaml".
  p.config_yaml = j.value("config_yaml", j.value("config", std::string()));
  main_params = false;
  if (j.contains("optimizer") && j["optimizer"].is_object()) {
    const json& o = j["optimizer"];
    p.optimizer_updates = o.value("updates", int64_t{0});
    p.loss_scale = o.value("loss_scale", 0.0);
    p.loss_scale_clean_steps = o.value("loss_scale_clean_steps", int64_t{0});
    main_params = o.value("main_params", false);
  }
  return p;
}

// The parameters' full values are read and written below: a pending all-gather is finished, and
// sharded parameters (ZeRO-3) are gathered and kept until release_params.
void finish_pending_gather(Optimizer* optimizer) {
  if (optimizer != nullptr && is_sharded(*optimizer))
    for (DataParallel* d : optimizer->data_parallels()) d->unshard();
}
// ZeRO-3: frees the gathered parameters again; after a load, the loaded values become the shards.
void release_params(Optimizer* optimizer, bool loaded) {
  if (optimizer != nullptr && is_sharded(*optimizer))
    for (DataParallel* d : optimizer->data_parallels()) d->reshard(loaded);
}

}  // namespace

namespace {

// Builds the save's tensors (collective over dp for the distributed optimizer, which gathers its
// state) and hands them to `write`, which saves or starts an asynchronous save; the gathered
// state lives until it returns.
using WriteFn = std::function<std::string(const std::vector<checkpoint::ShardedTensor>&, const std::string&,
                                          const checkpoint::SaveOptions&)>;

std::string save_with(const TrainProgress& progress, const std::vector<Parameter*>& params,
                      const std::vector<Parameter*>& buffers, Optimizer* optimizer, ParallelState& state,
                      int keep_last, const WriteFn& write) {
  // With overlap_param_gather the last step's all-gather may still be filling the parameters.
  finish_pending_gather(optimizer);
  const NamedParams named = by_name(params);
  const Coord& coord = state.coord();
  std::vector<checkpoint::ShardedTensor> tensors;
  for (Parameter* p : named.unique)
    tensors.push_back(checkpoint::from_parameter(*p, checkpoint::is_replica_writer(*p, coord)));
  for (Parameter* b : buffers)
    tensors.push_back(checkpoint::from_parameter(*b, checkpoint::is_replica_writer(*b, coord)));

  // Kept alive until save() has written them (the gathered state of the distributed optimizer).
  std::map<std::string, ParamState> states;
  if (optimizer != nullptr) {
    const std::vector<Parameter*> updated = trained(named.unique);
    states = full_state(*optimizer, updated);
    for (Parameter* p : updated) {
      const ParamState& s = states.at(p->name);
      // Every dp rank holds the same (gathered) state: the parameter's writer rule applies as is.
      const bool writer = checkpoint::is_replica_writer(*p, coord);
      if (muon_state(*optimizer, *p)) {
        tensors.push_back(checkpoint::optimizer_state(*p, kMomentum, s.momentum, writer));
      } else {
        tensors.push_back(checkpoint::optimizer_state(*p, kExpAvg, s.exp_avg, writer));
        tensors.push_back(checkpoint::optimizer_state(*p, kExpAvgSq, s.exp_avg_sq, writer));
      }
      if (s.main.defined()) tensors.push_back(checkpoint::optimizer_state(*p, kMainParam, s.main, writer));
    }
  }
  checkpoint::SaveOptions options;
  options.keep_last = keep_last;
  options.layout_json = layout_json(state, optimizer);
  std::string dir = write(tensors, extras_json(progress, optimizer), options);
  tensors.clear();
  release_params(optimizer, /*loaded=*/false);
  return dir;
}

}  // namespace

std::string save_train_state(const std::string& root, const TrainProgress& progress,
                             const std::vector<Parameter*>& params, Optimizer* optimizer,
                             ParallelState& state, int keep_last, const std::vector<Parameter*>& buffers) {
  return save_with(progress, params, buffers, optimizer, state, keep_last,
                   [&](const std::vector<checkpoint::ShardedTensor>& tensors, const std::string& extras,
                       const checkpoint::SaveOptions& options) {
                     return checkpoint::save(root, progress.step, tensors, extras, state.world(), options);
                   });
}

void start_save_train_state(checkpoint::AsyncSave& save, const std::string& root,
                            const TrainProgress& progress, const std::vector<Parameter*>& params,
                            Optimizer* optimizer, ParallelState& state, int keep_last,
                            const std::vector<Parameter*>& buffers) {
  save_with(progress, params, buffers, optimizer, state, keep_last,
            [&](const std::vector<checkpoint::ShardedTensor>& tensors, const std::string& extras,
                const checkpoint::SaveOptions& options) {
              save.start(root, progress.step, tensors, extras, state.world(), options);
              return std::string();
            });
}

LoadResult load_train_state(const std::string& path, const std::string& default_root,
                            const std::vector<Parameter*>& params, Optimizer* optimizer, ParallelState& state,
                            const std::vector<Parameter*>& buffers) {
  // A gather still in flight would overwrite the loaded parameters when it lands.
  finish_pending_gather(optimizer);
  const NamedParams named = by_name(params);
  // LoRA adapters that the checkpoint does not hold (a base model imported with convert_checkpoint,
  // or one pretrained without adapters) keep their initial values, and the run starts fresh from
  // the loaded weights: docs/lora.md.
  bool new_adapters = false;
  std::vector<Parameter*> stored = named.unique;
  if (std::any_of(stored.begin(), stored.end(), [](const Parameter* p) { return is_lora_adapter(*p); })) {
    const checkpoint::CheckpointInfo info =
        checkpoint::read_info(path.empty() ? "latest" : path, default_root);
    std::unordered_set<std::string> saved;
    for (const checkpoint::TensorInfo& t : info.tensors) saved.insert(t.name);
    std::erase_if(stored, [&](const Parameter* p) {
      const bool missing = is_lora_adapter(*p) && !saved.count(p->name);
      new_adapters = new_adapters || missing;
      return missing;
    });
  }
  std::vector<checkpoint::ShardedTensor> weights;
  for (Parameter* p : stored) weights.push_back(checkpoint::from_parameter(*p, true));
  for (Parameter* b : buffers) weights.push_back(checkpoint::from_parameter(*b, true));
  checkpoint::LoadOptions options;
  options.default_root = default_root;
  checkpoint::LoadResult loaded =
      checkpoint::load(path.empty() ? "latest" : path, weights, state.world(), options);
  if (new_adapters) loaded.has_optimizer_state = false;  // no state for the new adapters: start fresh

  LoadResult result;
  result.path = loaded.step_dir;
  bool saved_main = false;
  result.progress = progress_from(loaded.extras_json, loaded.step, saved_main,
                                  (std::filesystem::path(loaded.step_dir) / "index.json").string(),
                                  loaded.saved_world_size);
  if (optimizer == nullptr) {
    for (auto [copy, original] : named.duplicates) copy->value.copy_(original->value);
    return result;
  }

  const bool opt_main = has_main_params(*optimizer);
  std::map<std::string, ParamState> states;
  if (loaded.has_optimizer_state) {
    // Adam's moments and Muon's momentum are different state: resuming across types is refused.
    const json extras = json::parse(loaded.extras_json, nullptr, /*allow_exceptions=*/false);
    std::string saved_type = "adamw";  // checkpoints from before optimizer.type
    if (extras.is_object() && extras.contains("optimizer") && extras["optimizer"].contains("type"))
      saved_type = extras["optimizer"]["type"].get<std::string>();
    const std::string type = optimizer->uses_muon() ? "muon" : "adamw";
    PARALLEL_CHECK(saved_type == type,
                   "load_train_state: {} holds {} optimizer state and this run's optimizer.type is {}; "
                   "resume with optimizer.type: {}",
                   loaded.step_dir, saved_type, type, saved_type);
    // Each parameter's full local box of state, filled from whatever boxes were saved. Padded
    // vocabulary rows are not in the checkpoint: their moments stay 0 (they never get a gradient)
    // and their main params follow the loaded weights.
    std::vector<checkpoint::ShardedTensor> tensors;
    for (Parameter* p : trained(named.unique)) {
      ParamState& s = states[p->name];
      if (muon_state(*optimizer, *p)) {
        s.momentum = Tensor::zeros(p->value.shape(), DType::F32);
        tensors.push_back(checkpoint::optimizer_state(*p, kMomentum, s.momentum, true));
      } else {
        s.exp_avg = Tensor::zeros(p->value.shape(), DType::F32);
        s.exp_avg_sq = Tensor::zeros(p->value.shape(), DType::F32);
        tensors.push_back(checkpoint::optimizer_state(*p, kExpAvg, s.exp_avg, true));
        tensors.push_back(checkpoint::optimizer_state(*p, kExpAvgSq, s.exp_avg_sq, true));
      }
      if (!saved_main) continue;
      if (opt_main) {
        s.main = p->value.to(DType::F32).contiguous().clone();
        tensors.push_back(checkpoint::optimizer_state(*p, kMainParam, s.main, true));
      } else {
        // Saved in low precision, resumed in fp32: the fp32 main params are the better weights.
        tensors.push_back(checkpoint::optimizer_state(*p, kMainParam, p->value, true));
      }
    }
    checkpoint::load(loaded.step_dir, tensors, state.world());
  }
  for (auto [copy, original] : named.duplicates) copy->value.copy_(original->value);
  release_params(optimizer, /*loaded=*/true);
  // The main params must follow the loaded weights (or, below, the saved main params): otherwise
  // the next step would write the optimizer's old weights back over the loaded ones.
  optimizer->reset_main_from_params();

  auto slices = slices_by_name(*optimizer);
  // The distributed optimizer holds no state at all for parameters outside this rank's shards.
  if (!is_sharded(*optimizer))
    for (Parameter* p : trained(named.unique))
      PARALLEL_CHECK(slices.count(p->name), "load_train_state: the optimizer does not update parameter '{}'",
                     p->name);
  if (!loaded.has_optimizer_state) {
    // A weights-only checkpoint: start a new run from these weights with a fresh optimizer.
    for (auto& [name, list] : slices)
      for (Optimizer::StateSlice& s : list)
        for (Tensor* t : {&s.exp_avg, &s.exp_avg_sq, &s.momentum})
          if (t->defined()) t->zero_();
    optimizer->set_updates(0);
    result.progress.step = 0;
    result.progress.consumed_samples = 0;
    result.progress.optimizer_updates = 0;
    result.progress.loss_scale =
        optimizer->loss_scaler() != nullptr ? optimizer->loss_scaler()->scale() : 0.0;
    result.progress.loss_scale_clean_steps = 0;
    return result;
  }

  // Cut each parameter's state into the slices this rank's optimizer keeps (all of it for AdamW,
  // the part inside the rank's bucket shards for the distributed optimizer).
  for (auto& [name, list] : slices) {
    auto it = states.find(name);
    PARALLEL_CHECK(it != states.end(),
                   "load_train_state: the optimizer updates '{}', which is not in `params`", name);
    const ParamState& st = it->second;
    for (Optimizer::StateSlice& s : list) {
      const int64_t n = s.numel();
      // Each kind the slice keeps comes from the same kind in the checkpoint (muon_state decided
      // both alike for the parameter).
      const std::pair<Tensor*, const Tensor*> kinds[] = {
          {&s.exp_avg, &st.exp_avg}, {&s.exp_avg_sq, &st.exp_avg_sq}, {&s.momentum, &st.momentum}};
      for (auto [dst, src] : kinds)
        if (dst->defined()) dst->copy_(src->flatten().narrow(0, s.param_offset, n));
      if (opt_main && st.main.defined()) s.main.copy_(st.main.flatten().narrow(0, s.param_offset, n));
    }
  }
  optimizer->set_updates(result.progress.optimizer_updates);
  if (DynamicLossScaler* scaler = optimizer->loss_scaler();
      scaler != nullptr && result.progress.loss_scale > 0)
    scaler->restore(result.progress.loss_scale, static_cast<int>(result.progress.loss_scale_clean_steps));
  result.had_optimizer_state = true;
  return result;
}

}  // namespace parallel
