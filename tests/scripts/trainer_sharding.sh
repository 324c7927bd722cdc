#!/usr/bin/env bash
# Fully sharded data parallelism through the trainer (docs/optimizer.md), on the tiny model with 4
# layers, gradient clipping active (clip_grad 0.05 is below every step's norm), constant LR:
#  1. parity: optimizer.sharding optim_grads / optim_grads_params (with and without
#     reshard_after_forward, without prefetch), HSDP (8 ranks in groups of 4), tp2 x dp4 and
#     tp2 (sp) x pp2 x dp2 and interleaved pp2 x 2 virtual stages x dp2 with optim_grads_params, all log the single-rank losses (relative 1e-5);
#     in bf16, dp2 ZeRO-3 and tp2 x dp2 ZeRO-2 against one rank in bf16, in fp16 dp2 ZeRO-3 (2e-4; measured 1.4e-5, 3.7e-5, 2.1e-6);
#  2. checkpoints: ZeRO-3 at dp4 saves at step 5 and one rank (plain AdamW) resumes; ZeRO-1 at
#     tp2 x dp2 saves and ZeRO-3 at dp4 resumes; both continue like the uninterrupted run.
#   trainer_sharding.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set model.num_layers=4 --set optimizer.clip_grad=0.05)

# run, field and compare; this script compares the losses alone (as it always has).
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"
parity_norms=()

run single 1 --set train.steps=10
# Clipping is active: every logged gradient norm is above clip_grad.
field single grad_norm | awk '$1 <= 0.05 { print "clip_grad 0.05 does not clip step " NR " (norm " $1 ")"; bad = 1 } END { exit bad }'

z2=(--set optimizer.sharding=optim_grads)
z3=(--set optimizer.sharding=optim_grads_params)
run dp2_z2 2 --set train.steps=10 "${z2[@]}"
run dp4_z3 4 --set train.steps=10 "${z3[@]}"
run dp4_z3_keep 4 --set train.steps=10 "${z3[@]}" --set optimizer.reshard_after_forward=false
run dp2_z3_noprefetch 2 --set train.steps=10 "${z3[@]}" --set optimizer.prefetch_units=0
run dp8_hsdp4_z3 8 --set train.steps=10 "${z3[@]}" --set optimizer.sharding_group_size=4 --set train.micro_batch_size=1
run tp2dp4_z3 8 --set train.steps=10 "${z3[@]}" --set parallel.tensor=2
run tp2pp2dp2_z3 8 --set train.steps=10 "${z3[@]}" --set parallel.tensor=2 --set parallel.pipeline=2 \
  --set parallel.sequence_parallel=true
run pp2vp2dp2_z3 4 --set train.steps=10 "${z3[@]}" --set parallel.pipeline=2 --set parallel.virtual_stages=2
for name in dp2_z2 dp4_z3 dp4_z3_keep dp2_z3_noprefetch dp8_hsdp4_z3 tp2dp4_z3 tp2pp2dp2_z3 pp2vp2dp2_z3; do
  compare single $name 1e-5 1e-5 10
done
# The runs really were sharded as asked (the trainer logs what its DDP does).
sharded() {  # sharded NAME "RANKS MODE SHARD_RANKS"
  grep -q "data parallel: $2 ranks, sharding $3 over $4 ranks" "$work/$1.log" ||
    { echo "$1: expected 'data parallel: $2 ranks, sharding $3 over $4 ranks'"; grep "data parallel" "$work/$1.log"; exit 1; }
}
sharded dp2_z2 2 optim_grads 2
sharded dp4_z3 4 optim_grads_params 4
sharded dp8_hsdp4_z3 8 optim_grads_params 4
sharded tp2pp2dp2_z3 2 optim_grads_params 2

# bf16 (16-bit parameter shards, gathered in 16 bits; fp32 gradient shards and main weights)
# against one rank in bf16, with trainer_parity.sh's bf16 tolerance (2e-4: layouts reorder
# reductions whose results are rounded to bf16).
bf16=(--set train.precision=bf16)
run single_bf16 1 --set train.steps=10 "${bf16[@]}"
run dp2_z3_bf16 2 --set train.steps=10 "${z3[@]}" "${bf16[@]}"
run tp2dp2_z2_bf16 4 --set train.steps=10 "${z2[@]}" "${bf16[@]}" --set parallel.tensor=2
compare single_bf16 dp2_z3_bf16 2e-4 2e-4 10
compare single_bf16 tp2dp2_z2_bf16 2e-4 2e-4 10
# fp16: the loss scaler unscales and checks the gradient shards.
fp16=(--set train.precision=fp16)
run single_fp16 1 --set train.steps=10 "${fp16[@]}"
run dp2_z3_fp16 2 --set train.steps=10 "${z3[@]}" "${fp16[@]}"
compare single_fp16 dp2_z3_fp16 2e-4 2e-4 10

# Checkpoints through the resharding format, to and from ZeRO-3.
run z3_saver 4 --set train.steps=5 --set checkpoint.dir="$work/ckpt_z3" "${z3[@]}"
run z3_on_one_rank 1 --set train.steps=10 --set checkpoint.load="$work/ckpt_z3"
compare single z3_on_one_rank 1e-5 1e-5 5
run z1_saver 4 --set train.steps=5 --set checkpoint.dir="$work/ckpt_z1" --set parallel.tensor=2 \
  --set optimizer.distributed=true
run z1_to_z3 4 --set train.steps=10 --set checkpoint.load="$work/ckpt_z1" "${z3[@]}"
compare single z1_to_z3 1e-5 1e-5 5
