#!/usr/bin/env bash
# Muon through the trainer (optimizer.type muon; docs/optimizer.md#muon), on the tiny model with
# gradient clipping active (clip_grad 0.05), constant LR, fp32:
#  1. parity: tp2 x dp2 under optim (ZeRO-1) and optim_grads_params (ZeRO-3), dp2 under
#     optim_grads, HSDP (dp4 in groups of 2, ZeRO-3) and MoE with experts split by etp2 x ep2
#     (each expert's matrices gathered over etp) log the single-rank losses (relative 1e-5);
#  2. checkpoints: ZeRO-3 at dp4 saves Muon's momentum at step 5 and one rank resumes; ZeRO-1 at
#     tp2 x dp2 saves and ZeRO-3 at dp4 resumes; both continue like the uninterrupted run;
#  3. Muon and AdamW state do not mix: an AdamW checkpoint refuses to resume under Muon, naming the
#     key.
#   trainer_muon.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.lr_decay=constant
  --set optimizer.warmup_steps=0 --set optimizer.clip_grad=0.05 --set optimizer.type=muon
  --set optimizer.lr=0.01)

# run, field and compare; this script compares the losses alone (as it always has).
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"
parity_norms=()

z1=(--set optimizer.sharding=optim)
z2=(--set optimizer.sharding=optim_grads)
z3=(--set optimizer.sharding=optim_grads_params)
run single 1 --set train.steps=10
# Muon updated the matrices (the trainer logs its split of the state).
grep -q "optimizer: muon for the 2-D hidden weights" "$work/single.log" ||
  { echo "single: no Muon in the log"; exit 1; }
run tp2dp2_z1 4 --set train.steps=10 "${z1[@]}" --set parallel.tensor=2
run tp2dp2_z3 4 --set train.steps=10 "${z3[@]}" --set parallel.tensor=2
run dp2_z2 2 --set train.steps=10 "${z2[@]}"
run dp4_hsdp2_z3 4 --set train.steps=10 "${z3[@]}" --set optimizer.sharding_group_size=2
for name in tp2dp2_z1 tp2dp2_z3 dp2_z2 dp4_hsdp2_z3; do compare single $name 1e-5 1e-5 10; done

moe=(--set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=96)
run moe_single 1 --set train.steps=6 "${moe[@]}"
run moe_etp2ep2_z1 4 --set train.steps=6 "${moe[@]}" --set parallel.expert=2 --set parallel.expert_tensor=2 "${z1[@]}"
compare moe_single moe_etp2ep2_z1 1e-5 1e-5 6

# Checkpoints: Muon's momentum reshards.
run z3_saver 4 --set train.steps=5 --set checkpoint.dir="$work/ckpt_z3" "${z3[@]}"
run z3_on_one_rank 1 --set train.steps=10 --set checkpoint.load="$work/ckpt_z3"
compare single z3_on_one_rank 1e-5 1e-5 5
run z1_saver 4 --set train.steps=5 --set checkpoint.dir="$work/ckpt_z1" --set parallel.tensor=2 "${z1[@]}"
run z1_to_z3 4 --set train.steps=10 --set checkpoint.load="$work/ckpt_z1" "${z3[@]}"
compare single z1_to_z3 1e-5 1e-5 5

# An AdamW checkpoint does not resume under Muon.
run adamw_saver 1 --set train.steps=2 --set checkpoint.dir="$work/ckpt_adamw" --set optimizer.type=adamw
if "${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.output_dir="$work/mixed" --set train.steps=4 \
  --set checkpoint.load="$work/ckpt_adamw" >"$work/mixed.log" 2>&1; then
  echo "an AdamW checkpoint resumed under optimizer.type muon"; exit 1
fi
grep -q "holds adamw optimizer state and this run's optimizer.type is muon" "$work/mixed.log" ||
  { echo "mixed: unexpected error:"; tail -5 "$work/mixed.log"; exit 1; }
echo "trainer_muon: all checks passed"
