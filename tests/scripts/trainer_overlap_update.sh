#!/usr/bin/env bash
# The overlapped optimizer update through the trainer (docs/optimizer.md#the-overlapped-update): the
# tiny model with 4 layers, no clipping, small buckets (many per model), 2 micro-batches per data-
# parallel rank, 6 steps, checkpoint at the end. Each layout runs with optimizer.overlap_update
# true and false; the two must log the same losses and gradient norms (the same decimal strings)
# and write byte-identical checkpoint shards (weights, fp32 main weights, exp_avg, exp_avg_sq):
#   one rank; dp2 plain AdamW (all-reduce); dp2 ZeRO-1 with overlap_param_gather, fp32 and bf16;
#   dp2 ZeRO-3; pp2 x dp2 ZeRO-1 (updated after the rank's last backward); MoE ep2 with ZeRO-1.
# A guard that stops behaves alike. The log says where the update ran, and auto turns it off
# (naming why) where it would not be exact.
#   trainer_overlap_update.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.log_interval=1 --set optimizer.warmup_steps=1
  --set model.num_layers=4 --set optimizer.clip_grad=0 --set optimizer.bucket_size=12000
  --set optimizer.overlap_grad_reduce=true --set train.steps=6 --set train.global_batch_size=8)

# run and field (the checkpoints are compared too: run_saving is run with one in $work/NAME/ckpt).
# shellcheck source=parity_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/parity_common.sh"
run_saving() {  # run_saving NAME RANKS [--set ...]
  run "$1" "$2" --set checkpoint.dir="$work/$1/ckpt" "${@:3}"
}
said() {  # said NAME TEXT: the run logged TEXT
  grep -qF "$2" "$work/$1.log" || { echo "$1: expected '$2' in its log:"; grep "overlapped update" "$work/$1.log"; exit 1; }
}
# same NAME: NAME_on and NAME_off logged the same losses and norms and wrote the same shards.
same() {
  local a=$1_on b=$1_off
  for f in loss grad_norm; do
    if ! diff <(field "$a" $f) <(field "$b" $f) >/dev/null; then
      echo "$1: ${f} differs with the overlapped update:"
      paste <(field "$a" $f) <(field "$b" $f)
      exit 1
    fi
  done
  local shards
  shards=$(cd "$work/$a/ckpt" && find . -name 'rank_*.safetensors' | sort)
  [[ -n "$shards" ]] || { echo "$1: no checkpoint shards"; exit 1; }
  for s in $shards; do
    cmp -s "$work/$a/ckpt/$s" "$work/$b/ckpt/$s" || { echo "$1: checkpoint shard $s differs"; exit 1; }
  done
  echo "$1: $(field "$a" loss | wc -l) losses and norms equal, $(echo "$shards" | wc -l) checkpoint shards byte-identical"
}
pair() {  # pair NAME RANKS [--set ...]: the layout with the overlapped update on and off
  local name=$1 ranks=$2
  shift 2
  run_saving "${name}_on" "$ranks" --set optimizer.overlap_update=true "$@"
  run_saving "${name}_off" "$ranks" --set optimizer.overlap_update=false "$@"
  same "$name"
}

z1=(--set optimizer.sharding=optim --set optimizer.overlap_param_gather=true)
pair single 1
said single_on "optimizer: overlapped update on (during the backward)"
said single_off "optimizer: overlapped update off (optimizer.overlap_update false)"
pair dp2 2
pair dp2_z1 2 "${z1[@]}"
pair dp2_z1_bf16 2 "${z1[@]}" --set train.precision=bf16
pair dp2_z3 2 --set optimizer.sharding=optim_grads_params
pair pp2_dp2_z1 4 "${z1[@]}" --set parallel.pipeline=2
# MoE: the expert replica (over expert-dp) is updated bucket by bucket as well.
pair moe_ep2_z1 2 "${z1[@]}" --set model.num_experts=4 --set model.moe_router_topk=2 --set parallel.expert=2
said pp2_dp2_z1_on "optimizer: overlapped update on (after the pipeline schedule)"

# A guard that stops (train.nonfinite_policy stop, the default) after buckets were already updated:
# a NaN loss injected on rank 1 at step 3. Both runs stop there (exit 3) with the same message and
# the same metrics (the step counted as skipped), and neither saves a checkpoint.
stop_run() {  # stop_run NAME OVERLAP
  local status=0
  PARALLEL_INJECT_LOSS_SCALE=3:nan:1 "${mpiexec[@]}" -np 2 "$pretrain" "${common[@]}" \
    --set train.output_dir="$work/$1" --set checkpoint.dir="$work/$1/ckpt" --set optimizer.overlap_update="$2" \
    >"$work/$1.log" 2>&1 || status=$?
  [[ $status == 3 ]] || { echo "$1: exit $status, expected 3"; tail -5 "$work/$1.log"; exit 1; }
  [[ ! -e "$work/$1/ckpt/latest" ]] || { echo "$1: saved a checkpoint after the guard stopped it"; exit 1; }
}
stop_run stop_on true
stop_run stop_off false
for f in step loss grad_norm skipped skip_reason nonfinite_steps; do
  diff <(field stop_on $f) <(field stop_off $f) >/dev/null ||
    { echo "guard stop: metrics field $f differs with the overlapped update"; exit 1; }
done
[[ "$(grep -o 'train: step 3: .*' "$work/stop_on.log" | sort -u)" == "$(grep -o 'train: step 3: .*' "$work/stop_off.log" | sort -u)" ]] ||
  { echo "guard stop: the messages differ"; grep 'train: step 3' "$work"/stop_o*.log; exit 1; }
grep -q '"skip_reason":"nonfinite"' "$work/stop_on/metrics.jsonl" || { echo "guard stop: step 3 not logged as skipped"; exit 1; }
echo "guard stop: same exit, message and metrics with the overlapped update"

# auto: on where exact, off with the reason where not.
run_saving auto_on 1 --set optimizer.overlap_update=auto --set train.steps=1
said auto_on "optimizer: overlapped update on (during the backward)"
run_saving auto_clip 1 --set optimizer.overlap_update=auto --set optimizer.clip_grad=1 --set train.steps=1
said auto_clip "optimizer: overlapped update off (clipping scales every gradient by the global norm"
run_saving auto_fp16 1 --set optimizer.overlap_update=auto --set train.precision=fp16 --set train.steps=1
said auto_fp16 "optimizer: overlapped update off (fp16's loss scaler"
run_saving auto_guard 1 --set optimizer.overlap_update=auto --set train.nonfinite_policy=skip --set train.steps=1
said auto_guard "optimizer: overlapped update off (the training guard may skip"
# true where it cannot be exact: refused with the key and the rule.
if "${mpiexec[@]}" -np 1 "$pretrain" "${common[@]}" --set train.output_dir="$work/refused" \
  --set optimizer.overlap_update=true --set optimizer.clip_grad=1 >"$work/refused.log" 2>&1; then
  echo "overlap_update true with clip_grad 1 was accepted"
  exit 1
fi
grep -q "optimizer.overlap_update = true: requires optimizer.clip_grad = 0" "$work/refused.log" ||
  { echo "refusal does not name the rule:"; tail -3 "$work/refused.log"; exit 1; }
echo "trainer_overlap_update: all layouts bitwise equal"
