#!/usr/bin/env bash
# Multi-head latent attention through the trainer (configs/mla_tiny.yaml; docs/model.md): every
# layout logs the losses and gradient norms of one rank (fp32, relative 1e-5, 6 steps):
#   tp 2 + sp; cp 2 with p2p, a2a and allgather; pp 2 with 1F1B and zb-v; dp 2 with ZeRO-3
#   (optimizer.sharding optim_grads_params); selective and full recompute; the plain query projection
#   (q_lora_rank 0) with yarn rope scaling at tp 2 x cp 2; and bf16 at tp 2 + sp (tolerance below).
#   trainer_mla.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/mla_tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set train.steps=6)

# run, field and compare.
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"

run ref 1
for layout in "tp2_sp 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true" \
  "cp2_p2p 2 --set parallel.context=2 --set parallel.context_comm=p2p" \
  "cp2_a2a 2 --set parallel.context=2 --set parallel.context_comm=a2a" \
  "cp2_allgather 2 --set parallel.context=2 --set parallel.context_comm=allgather" \
  "pp2_1f1b 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=1f1b" \
  "pp2_zbv 2 --set parallel.pipeline=2 --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=zb-v" \
  "dp2_zero3 2 --set optimizer.sharding=optim_grads_params" \
  "tp2_selective 2 --set parallel.tensor=2 --set train.recompute=selective" \
  "tp2_sp_full 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set train.recompute=full"; do
  read -r -a args <<<"$layout"
  run "${args[@]}"
  compare ref "${args[0]}" 1e-5
done

# The plain query projection and yarn (DeepSeek's softmax-scale correction) across tp 2 + sp x cp 2.
plain_yarn=(--set model.q_lora_rank=0 --set model.rope_scaling=yarn --set model.rope_scaling_factor=4
  --set model.rope_original_max_position_embeddings=8 --set model.rope_mscale=0.707
  --set model.rope_mscale_all_dim=0.707)
run ref_plain_yarn 1 "${plain_yarn[@]}"
run tp2_sp_cp2_plain_yarn 4 "${plain_yarn[@]}" --set parallel.tensor=2 --set parallel.sequence_parallel=true \
  --set parallel.context=2
compare ref_plain_yarn tp2_sp_cp2_plain_yarn 1e-5

# bf16: a layout moves rounding boundaries (trainer_parity.sh explains its 2e-4 on the losses); the
# gradient norm, a sum of squares over bf16 gradients, moves more (trainer_context_parallel.sh).
run ref_bf16 1 --set train.precision=bf16
run tp2_sp_bf16 2 --set train.precision=bf16 --set parallel.tensor=2 --set parallel.sequence_parallel=true
compare ref_bf16 tp2_sp_bf16 2e-4 3e-3
