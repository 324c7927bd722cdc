#pragma once
// Hugging Face GPT-2 weights <-> our global parameters (docs/model.md) and checkpoints
// (docs/checkpoints.md, "Importing and exporting HF GPT-2"). Used by examples/convert_checkpoint.
//
// Name and layout mapping (HF names may carry the "transformer." prefix of GPT2LMHeadModel or not):
//   wte.weight [V, h]                       -> embedding.word.weight [V, h]
//   wpe.weight [P, h]                       -> embedding.position.weight [P, h]
//   h.{i}.ln_1.{weight,bias}                -> layers.{i}.input_norm.*
//   h.{i}.attn.c_attn.weight [h, 3h]        -> layers.{i}.attention.{query,key,value}.weight, each
//                                              [h, h]: columns [0,h), [h,2h), [2h,3h), transposed
//   h.{i}.attn.c_attn.bias [3h]             -> layers.{i}.attention.{query,key,value}.bias
//   h.{i}.attn.c_proj.{weight,bias}         -> layers.{i}.attention.proj.* (weight transposed)
//   h.{i}.ln_2.{weight,bias}                -> layers.{i}.post_attention_norm.*
//   h.{i}.mlp.c_fc.{weight,bias} [h, f]     -> layers.{i}.mlp.fc1.* (weight transposed to [f, h])
//   h.{i}.mlp.c_proj.{weight,bias} [f, h]   -> layers.{i}.mlp.fc2.* (weight transposed to [h, f])
//   ln_f.{weight,bias}                      -> final_norm.*
// HF's Conv1D stores weights as [in, out] (y = x W + b); ours are [out, in], hence the transposes.
// lm_head.weight is tied to wte: accepted on import only if it equals wte, never written on
// export. The attention buffers h.{i}.attn.bias / h.{i}.attn.masked_bias are ignored.
//
// Vocabulary padding: our word embedding has Vp >= V rows in memory (a multiple of 128 * tp), but
// checkpoints store only the V real rows (Parameter::unpadded_rows), so a converted checkpoint
// holds embedding.word.weight as [V, h] and loads at any tensor-parallel size. Export also accepts
// a checkpoint that stored padded rows, and drops every row >= V.
#include <map>
#include <string>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/tensor.hpp"

namespace parallel::hf_gpt2 {

// Throws parallel::Error unless `config` is a GPT-2 architecture: LayerNorm, GeLU (tanh), learned
// positions, biases, tied embeddings, no grouped-query attention. Names the offending key.
void check_config(const ModelConfig& config);

// Our global parameter names and shapes for `config`, with the vocabulary unpadded ([V, h]).
std::map<std::string, Shape> parameter_shapes(const ModelConfig& config);

// HF GPT-2 tensors (F32/F16/BF16) -> our global parameters (F32, contiguous, vocabulary unpadded).
// Every shape is checked against `config`; a missing, unexpected or misshapen tensor throws
// parallel::Error with one line naming it (`source` names the file in messages). So does a tensor
// holding NaN or infinity (a broken download or a diverged run), unless `allow_nonfinite`, and an
// FP8 tensor (storage-only here: it cannot be converted).
std::map<std::string, Tensor> from_hf(const std::map<std::string, Tensor>& hf, const ModelConfig& config,
                                      const std::string& source = "input", bool allow_nonfinite = false);

// Our global parameters (any float dtype; embedding rows beyond V are dropped) -> HF GPT-2 tensors
// (F32, Conv1D layout), named with the "transformer." prefix when `transformer_prefix`, no lm_head.
std::map<std::string, Tensor> to_hf(const std::map<std::string, Tensor>& params, const ModelConfig& config,
                                    bool transformer_prefix = true);

// The model section of a training configuration's YAML, with the parallel section reset to one
// rank: conversion does not depend on the layout the config was written for. Throws ConfigError.
ModelConfig model_config_from_yaml(const std::string& yaml_text, const std::string& file_name);
// The same for a config file (the whole Config, validated for one rank).
Config config_for_conversion(const std::string& path);

// HF safetensors file -> a weights-only checkpoint at step 0 under `root` (step_00000000 and
// `latest`; extras {"config_yaml": config_to_yaml(config), "converted_from": ...}). Collective over
// `world` (rank 0 writes). Refuses a root that already holds checkpoints. Returns the step directory.
std::string import_checkpoint(const std::string& hf_file, const Config& config, const std::string& root,
                              Communicator& world, bool allow_nonfinite = false);

// A checkpoint (root, step directory or "latest" as in checkpoint::load) -> an HF safetensors file
// (metadata {"format": "pt"}). The model config is `config` if given, else the checkpoint's extras
// ("config_yaml", or "config" as a YAML string); neither is an error. Optimizer state is ignored.
// Collective over `world` (every rank loads whole tensors; rank 0 writes).
void export_checkpoint(const std::string& checkpoint_path, const ModelConfig* config,
                       const std::string& hf_file, Communicator& world, bool transformer_prefix = true);

}  // namespace parallel::hf_gpt2
