#!/usr/bin/env bash
# The DeepSeek-V3-shaped model through the trainer (configs/deepseek_v3_tiny.yaml: MLA with a query
# bottleneck and a shared rope key head, value heads narrower than query/key heads, sigmoid
# group-limited routing scaled by 2.5, the expert bias, the sequence-wise aux loss, a shared expert,
# layer 0 dense). Every layout logs the losses and gradient norms of one rank over 6 steps:
#  fp32, relative 1e-5: ep2 x etp2 (4 ranks), ep2 x tp2 + sp, tp2 + sp, cp2 (a2a; trainer_mla.sh runs
#    MLA alone under every exchange type), pp2 with 1F1B and zb-v, dp2 with ZeRO-3; and the expert
#    bias (moe_expert_bias in metrics.jsonl) equal to one rank's at every step, on every rank;
#  bf16, relative 2e-4 on the losses and 3e-3 on the gradient norms (below): tp2 + sp, cp2 with p2p,
#    a2a and allgather, pp2 with 1F1B and zb-v, dp2 with ZeRO-3, ep2 x etp2.
#   trainer_deepseek.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/deepseek_v3_tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set train.steps=6)

# run, field, compare and same_bias.
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"

layouts=("ep2_etp2 4 --set parallel.expert=2 --set parallel.expert_tensor=2"
  "ep2_tp2_sp 2 --set parallel.expert=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true"
  "tp2_sp 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true"
  "cp2_a2a 2 --set parallel.context=2 --set parallel.context_comm=a2a"
  "pp2_1f1b 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=1f1b"
  "pp2_zbv 2 --set parallel.pipeline=2 --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=zb-v"
  "dp2_zero3 2 --set optimizer.sharding=optim_grads_params")
run ref 1
bias ref | tail -1 | grep -q '[1-9]' || { echo "the expert bias did not move: $(bias ref | tail -1)"; exit 1; }
for layout in "${layouts[@]}"; do
  read -r -a args <<<"$layout"
  run "${args[@]}"
  compare ref "${args[0]}" 1e-5
  same_bias ref "${args[0]}"
done

# bf16: a layout moves rounding boundaries (trainer_parity.sh explains its 2e-4 on the losses); the
# gradient norm, a sum of squares over bf16 gradients, moves more (trainer_context_parallel.sh).
# Measured over seeds 1234, 1, 2 and 3 (2026-11-27): at most 1.0e-4 on the losses (cp2, seed 1) and
# 1.7e-3 on the gradient norms (ep2 x etp2). The expert bias is not compared: a bf16 layout can
# flip a choice near a tie, and one expert's load then crosses the mean (dp2 ZeRO-3 did at step 2
# with 4 experts in 2 groups), which the losses absorb within the tolerance.
run ref_bf16 1 --set train.precision=bf16
for layout in "tp2_sp_bf16 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true" \
  "cp2_p2p_bf16 2 --set parallel.context=2 --set parallel.context_comm=p2p" \
  "cp2_a2a_bf16 2 --set parallel.context=2 --set parallel.context_comm=a2a" \
  "cp2_allgather_bf16 2 --set parallel.context=2 --set parallel.context_comm=allgather" \
  "pp2_1f1b_bf16 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=1f1b" \
  "pp2_zbv_bf16 2 --set parallel.pipeline=2 --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=zb-v" \
  "dp2_zero3_bf16 2 --set optimizer.sharding=optim_grads_params" \
  "ep2_etp2_bf16 4 --set parallel.expert=2 --set parallel.expert_tensor=2"; do
  read -r -a args <<<"$layout"
  run "${args[@]}" --set train.precision=bf16
  compare ref_bf16 "${args[0]}" 2e-4 3e-3
done
