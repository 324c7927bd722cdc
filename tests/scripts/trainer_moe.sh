#!/usr/bin/env bash
# Mixture of experts through the trainer (pretrain_gpt, tiny model with every layer a MoE layer,
# dropless, aux and z losses on, fp32): expert-parallel layouts equal one rank, and checkpoints
# saved with experts split reshard.
#  1. parity, 6 steps, losses and global gradient norms relative 1e-5 against one rank:
#     4 experts top-2 at ep2 (dp2), ep4 (dp4), ep2 on 4 ranks (experts replicated over expert-dp 2),
#     ep2 x tp2 (+sp) x pp2 (8 ranks), the allgather dispatcher at ep2, ep2 over cp2 (the experts
#     split across the context-parallel ranks), ep2 x pp2 under zb-h1 (the MoE layers' split
#     backward); 8 experts top-1 at ep4;
#     tensor parallelism inside experts: etp2 (2 ranks), etp2 x ep2 (4 ranks), etp2 x ep2 with
#     tp2 (+sp), and with pp2 as well (8 ranks), the allgather dispatcher at etp2 x ep2, 8 experts
#     top-1 at etp2 x ep2, SwiGLU experts (gate and up split alike) at etp2 x ep2 x tp2 (+sp),
#     etp2 x ep2 x tp2 (+sp) on 8 ranks (expert-dp 2) under optim_grads;
#     sharded data parallelism, experts sharded over expert-dp (overlap_grad_reduce on): ep2 x edp2
#     (4 ranks) under optimizer.sharding optim, optim_grads and optim_grads_params (also against
#     the unsharded ep2 x edp2 run), ep2 at edp 1 with optim, ep2 x tp2 (+sp) x pp2 with
#     optim_grads_params, ep2 x pp2 x edp2 with optim (the last micro-batch's backward starting
#     both replicas' reductions), HSDP on 8 ranks (dense shards over 4, experts over 2 of
#     expert-dp 4);
#  2. checkpoints: 3 steps at ep2 x dp2 (4 ranks, each expert on 2 ranks, stored under its global
#     index), then continue to step 6 on one rank and at tp2 (+sp) x ep2 (2 ranks); 3 steps at
#     etp2 x ep2 (each rank a half of its experts, stored whole), then continue on one rank and at
#     ep2 (etp 1); the same with the distributed optimizer saving at ep2 x dp2 (experts' state
#     gathered over expert-dp), resumed on one rank and at tp2 (+sp) x ep2 under
#     optim_grads_params, and the plain checkpoint resumed at ep2 x dp2 under optim_grads; each
#     matching the uninterrupted single-rank run;
#  3. metrics.jsonl carries the aux / z losses and tokens per expert, summing to tokens x topk.
# The learning rate is constant so that a 3-step run follows the same schedule as a 6-step one.
#   trainer_moe.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set model.moe_aux_loss_coeff=0.01 --set model.moe_z_loss_coeff=0.001
  --set model.moe_ffn_hidden_size=96)
e4=(--set model.num_experts=4 --set model.moe_router_topk=2)
e8=(--set model.num_experts=8 --set model.moe_router_topk=1)

# run, field, compare and compare_field.
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"

# 1. Parity.
run ref4 1 --set train.steps=6 "${e4[@]}"
run ep2 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2
run ep4 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=4
run ep2_edp2 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=2
run ep2tp2pp2 8 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true --set parallel.pipeline=2
run ep2_allgather 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set model.moe_token_dispatcher=allgather
run ep2cp2 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.context=2
run ep2pp2_zbh1 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.pipeline=2 \
  --set parallel.pipeline_schedule=zb-h1
for r in ep2 ep4 ep2_edp2 ep2tp2pp2 ep2_allgather ep2cp2 ep2pp2_zbh1; do
  compare ref4 $r 1e-5
done
# Sharded: the experts' DataParallel shards over expert-dp like the dense one over dp.
z1=(--set optimizer.sharding=optim --set optimizer.overlap_grad_reduce=true)
z2=(--set optimizer.sharding=optim_grads --set optimizer.overlap_grad_reduce=true)
z3=(--set optimizer.sharding=optim_grads_params --set optimizer.overlap_grad_reduce=true)
run ep2_edp2_z1 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 "${z1[@]}"
run ep2_edp2_z2 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 "${z2[@]}"
run ep2_edp2_z3 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 "${z3[@]}"
run ep2_z1 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 "${z1[@]}"
run ep2tp2pp2_z3 8 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true --set parallel.pipeline=2 "${z3[@]}"
run ep2pp2_edp2_z1 8 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.pipeline=2 "${z1[@]}" \
  --set train.micro_batch_size=1
run ep2_hsdp_z3 8 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 "${z3[@]}" \
  --set optimizer.sharding_group_size=4 --set train.micro_batch_size=1
for r in ep2_edp2_z1 ep2_edp2_z2 ep2_edp2_z3 ep2_z1 ep2tp2pp2_z3; do
  compare ref4 $r 1e-5
done
# Micro-batches of one sample (dp 8; two per rank at pp2 x dp4): the aux loss balances each
# micro-batch's tokens, so the reference runs micro-batches of one sample too.
run ref4_mbs1 1 --set train.steps=6 "${e4[@]}" --set train.micro_batch_size=1
for r in ep2_hsdp_z3 ep2pp2_edp2_z1; do
  compare ref4_mbs1 $r 1e-5
done
for r in ep2_edp2_z1 ep2_edp2_z2 ep2_edp2_z3; do
  compare ep2_edp2 $r 1e-5
done
# The experts really were sharded as asked (the trainer logs what each DataParallel does).
expert_sharding() {  # expert_sharding NAME MODE SHARD_RANKS
  grep -q "expert data parallel [0-9]*, sharding $2 over $3 ranks" "$work/$1.log" ||
    { echo "$1: expected experts 'sharding $2 over $3 ranks'"; grep "experts:" "$work/$1.log"; exit 1; }
}
expert_sharding ep2_edp2_z1 optim 2
expert_sharding ep2_edp2_z2 optim_grads 2
expert_sharding ep2_edp2_z3 optim_grads_params 2
expert_sharding ep2_z1 optim 1
expert_sharding ep2tp2pp2_z3 optim_grads_params 2
expert_sharding ep2pp2_edp2_z1 optim 2
expert_sharding ep2_hsdp_z3 optim_grads_params 2
grep -q "data parallel: 8 ranks, sharding optim_grads_params over 4 ranks" "$work/ep2_hsdp_z3.log" ||
  { echo "ep2_hsdp_z3: dense replica not sharded over 4 ranks"; exit 1; }
echo "sharded MoE runs: experts sharded over expert-dp as configured"

run ref8 1 --set train.steps=6 "${e8[@]}"
run ep4_e8 4 --set train.steps=6 "${e8[@]}" --set parallel.expert=4
compare ref8 ep4_e8 1e-5

# Tensor parallelism inside experts (moe_ffn_hidden_size 96: 48 per etp rank).
etp2=(--set parallel.expert_tensor=2)
run etp2 2 --set train.steps=6 "${e4[@]}" "${etp2[@]}"
run ep2etp2 4 --set train.steps=6 "${e4[@]}" "${etp2[@]}" --set parallel.expert=2
run ep2etp2tp2 4 --set train.steps=6 "${e4[@]}" "${etp2[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true
run ep2etp2tp2pp2 8 --set train.steps=6 "${e4[@]}" "${etp2[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true --set parallel.pipeline=2
run ep2etp2_allgather 4 --set train.steps=6 "${e4[@]}" "${etp2[@]}" --set parallel.expert=2 \
  --set model.moe_token_dispatcher=allgather
for r in etp2 ep2etp2 ep2etp2tp2 ep2etp2tp2pp2 ep2etp2_allgather; do
  compare ref4 $r 1e-5
done
grep -q "expert tensor parallel 2" "$work/ep2etp2.log" || { echo "ep2etp2: no 'expert tensor parallel 2' line"; exit 1; }
run ep2etp2_e8 4 --set train.steps=6 "${e8[@]}" "${etp2[@]}" --set parallel.expert=2
compare ref8 ep2etp2_e8 1e-5
swiglu=(--set model.activation=swiglu)
run ref4_swiglu 1 --set train.steps=6 "${e4[@]}" "${swiglu[@]}"
run ep2etp2tp2_swiglu 4 --set train.steps=6 "${e4[@]}" "${swiglu[@]}" "${etp2[@]}" --set parallel.expert=2 \
  --set parallel.tensor=2 --set parallel.sequence_parallel=true
compare ref4_swiglu ep2etp2tp2_swiglu 1e-5
# Experts split over etp and sharded over expert-dp 2 (tp2 sp x dp4 = etp2 x ep2 x edp2), ZeRO-2.
run ep2etp2tp2_edp2_z2 8 --set train.steps=6 "${e4[@]}" "${etp2[@]}" --set parallel.expert=2 \
  --set parallel.tensor=2 --set parallel.sequence_parallel=true "${z2[@]}"
compare ref4 ep2etp2tp2_edp2_z2 1e-5
expert_sharding ep2etp2tp2_edp2_z2 optim_grads 2

# 2. Checkpoints: save at ep2 x dp2, load at one rank and at tp2 (+sp) x ep2.
run saver 4 --set train.steps=3 "${e4[@]}" --set parallel.expert=2 --set checkpoint.dir="$work/ckpt"
grep -q '"layers.0.mlp.experts.3.fc1.weight"' "$work"/ckpt/step_*/index.json 2>/dev/null ||
  grep -rq 'layers.0.mlp.experts.3.fc1.weight' "$work/ckpt" ||
  { echo "checkpoint: no expert stored under its global index 3"; exit 1; }
run on_one_rank 1 --set train.steps=6 "${e4[@]}" --set checkpoint.load="$work/ckpt"
run on_tp2_ep2 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true --set checkpoint.load="$work/ckpt"
compare_field ref4 on_one_rank loss 3
compare_field ref4 on_tp2_ep2 loss 3
# Save at etp2 x ep2 (each rank half of each of its experts): the index holds whole experts.
run saver_etp 4 --set train.steps=3 "${e4[@]}" "${etp2[@]}" --set parallel.expert=2 \
  --set checkpoint.dir="$work/ckpt_etp"
tr -d ' \n' <"$(ls "$work"/ckpt_etp/step_*/index.json)" |
  grep -q '"layers.0.mlp.experts.3.fc1.weight":{"global_shape":\[96,64\],"shards":\[{[^}]*"shape":\[48,64\]},{[^}]*"shape":\[48,64\]}\]' ||
  { echo "checkpoint: expert 3's fc1 not stored whole ([96, 64] in two [48, 64] halves)"; exit 1; }
tr -d ' \n' <"$(ls "$work"/ckpt_etp/step_*/index.json)" | grep -q '"expert_tensor":2' ||
  { echo "checkpoint: no expert_tensor in the index's layout"; exit 1; }
run etp_on_one_rank 1 --set train.steps=6 "${e4[@]}" --set checkpoint.load="$work/ckpt_etp"
run etp_on_ep2 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set checkpoint.load="$work/ckpt_etp"
compare_field ref4 etp_on_one_rank loss 3
compare_field ref4 etp_on_ep2 loss 3
# The distributed optimizer's checkpoint (expert state gathered over expert-dp, dense over dp).
run saver_z1 4 --set train.steps=3 "${e4[@]}" --set parallel.expert=2 "${z1[@]}" --set checkpoint.dir="$work/ckpt_z1"
grep -q '"optimizer": *"distributed"' "$work"/ckpt_z1/step_*/index.json ||
  { echo "checkpoint: the sharded run did not save as the distributed optimizer"; exit 1; }
run z1_on_one_rank 1 --set train.steps=6 "${e4[@]}" --set checkpoint.load="$work/ckpt_z1"
run z1_on_tp2_ep2_z3 2 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true "${z3[@]}" --set checkpoint.load="$work/ckpt_z1"
run plain_on_ep2_edp2_z2 4 --set train.steps=6 "${e4[@]}" --set parallel.expert=2 "${z2[@]}" \
  --set checkpoint.load="$work/ckpt"
for r in z1_on_one_rank z1_on_tp2_ep2_z3 plain_on_ep2_edp2_z2; do
  compare ref4 $r 1e-5 1e-5 3
done

# 3. Router statistics in metrics.jsonl: tokens per expert sum to global batch tokens x topk x MoE
#    layers (8 samples x 32 tokens x 2 x 2 layers), the losses are positive.
line=$(head -1 "$work/ep2/metrics.jsonl")
total=$(echo "$line" | grep -o '"moe_tokens_per_expert":\[[^]]*\]' | grep -o '[0-9]\+' | awk '{ s += $1 } END { print s }')
[[ $total == 1024 ]] || { echo "metrics: tokens per expert sum to '$total', expected 1024: $line"; exit 1; }
echo "$line" | grep -q '"moe_aux_loss":[0-9]' || { echo "metrics: no moe_aux_loss: $line"; exit 1; }
echo "$line" | grep -q '"moe_z_loss":[0-9]' || { echo "metrics: no moe_z_loss: $line"; exit 1; }
echo "metrics: aux and z losses and tokens per expert (sum $total) logged"
