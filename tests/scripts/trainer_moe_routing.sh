#!/usr/bin/env bash
# The MoE routing options through the trainer (docs/model.md, "Routing"; tiny model, fp32, 6 steps,
# constant learning rate), each layout against one rank:
#  1. DeepSeek-V3 routing: sigmoid scores, 8 experts in 4 groups (best 2 eligible), top-2 normalised
#     and scaled by 2.5, the expert bias at speed 0.01 (large, so that it changes the choices within
#     the run), the sequence-wise aux and z losses, a shared expert, 4 layers of which layer 0 is dense
#     (first_k_dense_replace 1: at pp2 one MoE layer on the first stage, two on the second). Layouts:
#     ep2 (dp2), ep2 x etp2 (4 ranks), ep2 x tp2 (+sp), cp2 x ep2, dp2 under ZeRO-3, pp2. Losses and
#     gradient norms within 1e-5 relative; the expert bias (metrics.jsonl's moe_expert_bias) equal to
#     one rank's at every step and the same on every rank that holds its layer (spread 0);
#  2. Mixtral / Qwen3-MoE routing (softmax, top-2 normalised) at ep2 x tp2 (+sp) and ep2 x pp2 with
#     the two MoE layers on both stages;
#  3. resume: 3 steps at ep2 x dp2 with a checkpoint, continued to step 6 on one rank and at pp2: the
#     losses and the bias of the uninterrupted run (the bias is in the checkpoint, exactly); the
#     checkpoint holds layers.{1,2,3}.mlp.router.e_score_correction_bias and no router for layer 0;
#  4. the bias moves: after 6 steps it is not all zero.
#   trainer_moe_routing.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set model.moe_ffn_hidden_size=96 --set model.activation=swiglu
  --set model.normalization=rmsnorm --set model.position_embedding=rope --set model.add_bias=false
  --set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_norm_topk_prob=true)
ds=(--set model.num_experts=8 --set model.moe_router_score_function=sigmoid --set model.moe_n_group=4 --set model.moe_topk_group=2
  --set model.moe_routed_scaling_factor=2.5 --set model.moe_router_expert_bias=true
  --set model.moe_bias_update_speed=0.01 --set model.moe_seq_aux_loss_coeff=0.01 --set model.moe_z_loss_coeff=0.001
  --set model.moe_shared_expert_ffn_hidden_size=64 --set model.moe_first_k_dense_replace=1 --set model.num_layers=4)
mixtral=(--set model.moe_aux_loss_coeff=0.01)

# run, field, compare and same_bias.
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"
# 1. DeepSeek-V3 routing.
run ref 1 --set train.steps=6 "${ds[@]}"
run ep2 2 --set train.steps=6 "${ds[@]}" --set parallel.expert=2
run ep2etp2 4 --set train.steps=6 "${ds[@]}" --set parallel.expert=2 --set parallel.expert_tensor=2
run ep2tp2 2 --set train.steps=6 "${ds[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true
run ep2cp2 2 --set train.steps=6 "${ds[@]}" --set parallel.expert=2 --set parallel.context=2
run dp2_z3 2 --set train.steps=6 "${ds[@]}" --set optimizer.sharding=optim_grads_params \
  --set optimizer.overlap_grad_reduce=true
run pp2 2 --set train.steps=6 "${ds[@]}" --set parallel.pipeline=2
for r in ep2 ep2etp2 ep2tp2 ep2cp2 dp2_z3 pp2; do
  compare ref $r 1e-5
  same_bias ref $r
done
# A first stage without any MoE layer (first_k_dense_replace 2 of 4 layers, pp2; and with ep2): it
# holds no expert replica but joins the experts' norm reduction, so the runs finish with one rank's
# losses, gradient norms and bias.
run ref_dense2 1 --set train.steps=6 "${ds[@]}" --set model.moe_first_k_dense_replace=2
run pp2_dense_stage 2 --set train.steps=6 "${ds[@]}" --set model.moe_first_k_dense_replace=2 \
  --set parallel.pipeline=2
run pp2ep2_dense_stage 4 --set train.steps=6 "${ds[@]}" --set model.moe_first_k_dense_replace=2 \
  --set parallel.pipeline=2 --set parallel.expert=2
for r in pp2_dense_stage pp2ep2_dense_stage; do
  compare ref_dense2 $r 1e-5
  same_bias ref_dense2 $r
done
# 4. The bias moved.
bias ref 1 | grep -q '[1-9]' || { echo "the expert bias did not move: $(bias ref 1)"; exit 1; }

# 2. Mixtral / Qwen3-MoE routing.
run ref_mixtral 1 --set train.steps=6 "${mixtral[@]}"
run mixtral_ep2tp2 2 --set train.steps=6 "${mixtral[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true
run mixtral_ep2pp2 4 --set train.steps=6 "${mixtral[@]}" --set parallel.expert=2 --set parallel.pipeline=2
for r in mixtral_ep2tp2 mixtral_ep2pp2; do
  compare ref_mixtral $r 1e-5
done

# 3. Resume with the bias.
run saver 4 --set train.steps=3 "${ds[@]}" --set parallel.expert=2 --set checkpoint.dir="$work/ckpt"
for l in 1 2 3; do
  grep -rq "layers.$l.mlp.router.e_score_correction_bias" "$work"/ckpt/step_*/index.json ||
    { echo "checkpoint: no layers.$l.mlp.router.e_score_correction_bias"; exit 1; }
done
grep -rq 'layers.0.mlp.router' "$work"/ckpt/step_*/index.json &&
  { echo "checkpoint: layer 0 should be dense (first_k_dense_replace 1)"; exit 1; }
run on_one_rank 1 --set train.steps=6 "${ds[@]}" --set checkpoint.load="$work/ckpt"
run on_pp2 2 --set train.steps=6 "${ds[@]}" --set parallel.pipeline=2 --set checkpoint.load="$work/ckpt"
for r in on_one_rank on_pp2; do
  compare ref $r 1e-5 1e-5 3
  same_bias ref $r 3
done
