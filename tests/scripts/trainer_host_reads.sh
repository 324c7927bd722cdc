#!/usr/bin/env bash
# The loss stays on the device (issue 12): every training step reads at most 3 tensor values back to
# host code (metrics.jsonl "host_reads", the maximum over ranks; what counts is defined in
# include/parallel/tensor.hpp), whatever the layout, precision and number of micro-batches. Today a
# step reads 2: the global loss and the gradient norm (which doubles as the fp16 overflow check).
#   trainer_host_reads.sh SOURCE_DIR PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 pretrain=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$src/configs/tiny.yaml" --set train.steps=4 --set train.log_interval=1)

check() {  # check NAME RANKS [--set ...]
  local name=$1 ranks=$2
  shift 2
  "${mpiexec[@]}" -np "$ranks" "$pretrain" "${common[@]}" --set train.output_dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$work/$name.log"; exit 1; }
  local reads
  reads=$(grep -o '"host_reads":[0-9]*' "$work/$name/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
  [[ -n $reads ]] || { echo "$name: no host_reads in metrics.jsonl"; exit 1; }
  for r in $reads; do
    ((r <= 3)) || { echo "$name: a step made $r host reads (limit 3): $reads"; exit 1; }
  done
  echo "$name: host reads per step: $reads"
}

check one_rank_m4 1
check one_rank_m16_bf16 1 --set train.micro_batch_size=1 --set train.global_batch_size=16 --set train.precision=bf16
check tp2pp2_m4 4 --set parallel.tensor=2 --set parallel.pipeline=2
check pp2_interleaved_fp16 2 --set parallel.pipeline=2 --set parallel.virtual_stages=2 --set model.num_layers=4 \
  --set train.precision=fp16
check dp2_distributed_bf16 2 --set optimizer.distributed=true --set train.precision=bf16
echo "1 passed, 0 failed"
