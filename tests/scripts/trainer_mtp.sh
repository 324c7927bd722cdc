#!/usr/bin/env bash
# Multi-token prediction through the trainer (configs/mla_tiny.yaml with model.mtp_num_layers 2;
# docs/model.md, "Multi-token prediction"): every layout logs one rank's losses (the main loss and
# the MTP loss) and gradient norms, fp32 relative 1e-5, 6 steps:
#   tp 2 with and without sp; cp 2 with p2p, a2a and allgather (each depth's targets cut from the whole sequence);
#   pp 2 with 1F1B and zb-v (the MTP layers on the stage that computes the loss, rank 0 of the V,
#   the embedding's gradient summed with the first stage's, untied and tied); dp 2 with ZeRO-3
#   (optimizer.sharding optim_grads_params); full recompute at tp 2 + sp, selective at pp 2; and bf16
#   (tolerance below) at tp 2 + sp, pp 2 with 1F1B and zb-v, cp 2 with each exchange type, dp 2 with
#   ZeRO-3, and the MoE model at ep 2 x etp 2.
#   A DeepSeek-V3-like MoE model (MTP layers with the last layer's MoE) at ep 2 x etp 2 and
#   pp 2 x ep 2.
# Checkpoints: 3 steps at pp 2 saved, resumed on one rank to step 6 equal the uninterrupted run
# (the MTP parameters are saved and loaded). --plan plans the MTP model. metrics.jsonl holds each
# depth's loss (mtp_losses) and their mean (mtp_loss).
#   trainer_mtp.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/mla_tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set train.steps=6 --set model.mtp_num_layers=2)

# run, field and compare; compare holds the MTP loss to the loss's tolerance too.
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"
parity_losses=(loss mtp_loss)

run ref 1
n=$(field ref mtp_loss | wc -l)
[[ $n == 6 ]] || { echo "ref: $n steps with an mtp_loss in metrics.jsonl"; exit 1; }
grep -q '"mtp_losses":\[[^],]*,[^],]*\]' "$work/ref/metrics.jsonl" ||
  { echo "ref: metrics.jsonl has no mtp_losses of two depths"; exit 1; }
for layout in "tp2_sp 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true" \
  "tp2 2 --set parallel.tensor=2" \
  "cp2_p2p 2 --set parallel.context=2 --set parallel.context_comm=p2p" \
  "cp2_a2a 2 --set parallel.context=2 --set parallel.context_comm=a2a" \
  "cp2_allgather 2 --set parallel.context=2 --set parallel.context_comm=allgather" \
  "pp2_1f1b 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=1f1b" \
  "pp2_zbv 2 --set parallel.pipeline=2 --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=zb-v" \
  "dp2_zero3 2 --set optimizer.sharding=optim_grads_params" \
  "tp2_sp_full 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set train.recompute=full" \
  "pp2_selective 2 --set parallel.pipeline=2 --set train.recompute=selective"; do
  read -r -a args <<<"$layout"
  run "${args[@]}"
  compare ref "${args[0]}" 1e-5
done

# Tied embeddings: the last stage's tied copy serves the output layers and the MTP embedding.
run ref_tied 1 --set model.tie_embeddings=true
run pp2_tied 2 --set model.tie_embeddings=true --set parallel.pipeline=2
compare ref_tied pp2_tied 1e-5

# Checkpoints: 3 steps at pp 2 (the MTP layers on the last stage), then steps 4-6 on one rank.
run saver 2 --set parallel.pipeline=2 --set train.steps=3 --set checkpoint.dir="$work/ckpt"
grep -rq 'layers.5.eh_proj.weight' "$work/ckpt" || { echo "checkpoint: no layers.5.eh_proj.weight"; exit 1; }
run resumed 1 --set checkpoint.load="$work/ckpt"
compare ref resumed 1e-5 1e-5 3  # steps 4-6

# bf16: a layout moves rounding boundaries (trainer_parity.sh explains its 2e-4 on the losses); the
# gradient norm, a sum of squares over bf16 gradients, moves more (trainer_context_parallel.sh).
run ref_bf16 1 --set train.precision=bf16
run tp2_sp_bf16 2 --set train.precision=bf16 --set parallel.tensor=2 --set parallel.sequence_parallel=true
compare ref_bf16 tp2_sp_bf16 2e-4 3e-3
for layout in "pp2_bf16 2 --set parallel.pipeline=2" \
  "pp2_zbv_bf16 2 --set parallel.pipeline=2 --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=zb-v" \
  "cp2_p2p_bf16 2 --set parallel.context=2 --set parallel.context_comm=p2p" \
  "cp2_a2a_bf16 2 --set parallel.context=2 --set parallel.context_comm=a2a" \
  "cp2_allgather_bf16 2 --set parallel.context=2 --set parallel.context_comm=allgather" \
  "dp2_zero3_bf16 2 --set optimizer.sharding=optim_grads_params"; do
  read -r -a args <<<"$layout"
  run "${args[@]}" --set train.precision=bf16
  compare ref_bf16 "${args[0]}" 2e-4 3e-3
done

# DeepSeek-V3-like MoE (sigmoid group-limited routing, expert bias, first layer dense): the MTP
# layers take the last layer's MoE at ep 2 x etp 2 (4 ranks, dp 4), and at pp 2 with ep 2.
moe=(--set model.num_experts=8 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=64
  --set model.moe_first_k_dense_replace=1 --set model.moe_router_score_function=sigmoid
  --set model.moe_norm_topk_prob=true --set model.moe_n_group=4 --set model.moe_topk_group=2
  --set model.moe_router_expert_bias=true --set model.moe_bias_update_speed=0.01
  --set model.moe_seq_aux_loss_coeff=0.001)
run ref_moe 1 "${moe[@]}"
run ep2_etp2_moe 4 "${moe[@]}" --set parallel.expert=2 --set parallel.expert_tensor=2
compare ref_moe ep2_etp2_moe 1e-5
run pp2_ep2_moe 4 "${moe[@]}" --set parallel.expert=2 --set parallel.pipeline=2
compare ref_moe pp2_ep2_moe 1e-5
run ref_moe_bf16 1 "${moe[@]}" --set train.precision=bf16
run ep2_etp2_moe_bf16 4 "${moe[@]}" --set parallel.expert=2 --set parallel.expert_tensor=2 --set train.precision=bf16
compare ref_moe_bf16 ep2_etp2_moe_bf16 2e-4 3e-3

# The memory plan of the MTP model (the real step on the meta device).
"${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" --set parallel.pipeline=2 --set train.output_dir="$work/plan" \
  --plan >"$work/plan.out" 2>&1 || { echo "--plan failed:"; tail -20 "$work/plan.out"; exit 1; }
echo "--plan: planned the MTP model at pp 2"
