#pragma once
// The GPT model's internal building blocks (not part of the public API) live one per header in
// src/model; this one holds what every layer of a model chunk shares. Names, shapes and init
// follow docs/model.md; what every layer is, in layer.hpp.
#include <cstdint>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/tensor_parallel.hpp"

namespace parallel::model {

// What every layer of one model chunk shares.
struct LayerEnv {
  const ModelConfig* config = nullptr;
  Communicator* tp = nullptr;
  bool sequence_parallel = false;  // only meaningful when tp->size() > 1
  // Context parallelism (context_parallel.hpp): null or size 1 without it. This rank's activations
  // hold chunks cp.rank() and 2 cp - 1 - cp.rank() of every sample.
  Communicator* cp = nullptr;
  ContextComm context_comm = ContextComm::P2P;
  uint64_t seed = 0;
  int64_t hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
  bool training = true;  // false: dropout is the identity (evaluation)
  // The precision policy's compute dtype (precision.hpp): the model's parameter copy and so every
  // activation and activation gradient. Layers follow their inputs' dtype; this is for the odd
  // tensor a layer creates from nothing.
  DType activation_dtype = DType::F32;
  // Expert parallelism: the ranks that split a MoE layer's experts (null: this rank holds all),
  // and the ranks that split each expert's inner width (tensor parallelism inside experts; null:
  // whole experts).
  Communicator* ep = nullptr;
  Communicator* etp = nullptr;
  // d(objective) / d(sum of this rank's MoE aux and z losses over the step's micro-batches): the
  // trainer sets it to loss scale / micro-batches per rank, as Megatron's MoEAuxLossAutoScaler does.
  double moe_loss_scale = 1.0;
  int cp_rank() const { return cp != nullptr ? cp->rank() : 0; }
  int cp_size() const { return cp != nullptr ? cp->size() : 1; }
  // The sizes of the communicators this chunk was given, as check_layout (layout_rules.hpp) reads
  // them; dp is not known here (data 0).
  ParallelConfig layout() const {
    ParallelConfig p;
    p.tensor = tp->size();
    p.sequence_parallel = sequence_parallel && tp->size() > 1;
    p.context = cp_size();
    p.context_comm = context_comm;
    p.expert = ep != nullptr ? ep->size() : 1;
    p.expert_tensor = etp != nullptr ? etp->size() : 1;
    p.data = 0;
    return p;
  }
  // Global sequence positions of the rows of this rank's activations [s_local, b, h]: its s-shard
  // under sequence parallelism of its cp chunks (layout: the micro-batch's, null: the zigzag).
  // Dropout masks and learned positions are keyed by them, so they do not depend on tp or cp.
  std::vector<cp::Segment> positions(int64_t s_local, const cp::Layout* layout = nullptr) const {
    const bool sharded = sequence_parallel && tp->size() > 1;
    const int64_t local_seq = sharded ? s_local * tp->size() : s_local,
                  row0 = sharded ? tp->rank() * s_local : 0;
    if (layout != nullptr) return layout->segments(cp_rank(), row0, s_local);
    return cp::segments(local_seq, cp_rank(), cp_size(), row0, s_local);
  }
};

}  // namespace parallel::model
