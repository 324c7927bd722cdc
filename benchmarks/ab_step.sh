#!/usr/bin/env bash
# The same pretrain_gpt binary against two builds of libparallel, alternating rounds: what a kernel
# change does to the whole step, side by side on the same machine at the same moment.
#
#   benchmarks/ab_step.sh BUILD BASE_LIB NEW_LIB
#     BUILD     build folder whose bin/pretrain_gpt runs both rounds (linked against libparallel.so)
#     BASE_LIB  folder holding the baseline libparallel.so (e.g. a copy of main's build/lib)
#     NEW_LIB   folder holding the changed libparallel.so (e.g. BUILD/lib)
#   MODEL=mini|gpt2 (mini), PREC=fp32|bf16 (fp32), ROUNDS (3), ORDER=base-first|new-first
#
# Prints one line a round: the load average, then the median tokens/s of steps 3 and on for each
# library (mini 12 steps, GPT-2 124M shape 6), with compare_pytorch2.sh's model settings.
set -euo pipefail
build=${1:?usage: ab_step.sh BUILD BASE_LIB NEW_LIB}
base=${2:?usage: ab_step.sh BUILD BASE_LIB NEW_LIB}
new=${3:?usage: ab_step.sh BUILD BASE_LIB NEW_LIB}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() { # lib layers hidden heads vocab steps precision
  LD_LIBRARY_PATH=$1 OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive "$build/bin/pretrain_gpt" \
    --config "$root/configs/tiny.yaml" --set model.num_layers=$2 --set model.hidden_size=$3 \
    --set model.num_attention_heads=$4 --set model.vocab_size=$5 --set model.seq_length=256 \
    --set train.micro_batch_size=4 --set train.global_batch_size=4 --set train.steps=$6 \
    --set train.log_interval=1 --set train.precision=$7 --set optimizer.warmup_steps=0 \
    --set train.output_dir="$work/run" >"$work/log" 2>&1 || { tail -3 "$work/log" >&2; exit 1; }
  grep -o '"tokens_per_sec":[^,}]*' "$work/run/metrics.jsonl" | cut -d: -f2 | tail -n +3 | sort -g |
    awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
  rm -rf "$work/run"
}

model=${MODEL:-mini}
prec=${PREC:-fp32}
case $model in
  mini) args="6 384 6 8192 12" ;;
  gpt2) args="12 768 12 50257 6" ;;
  *) echo "ab_step.sh: MODEL must be mini or gpt2, got '$model'" >&2; exit 2 ;;
esac
for r in $(seq "${ROUNDS:-3}"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  if [[ ${ORDER:-base-first} == new-first ]]; then
    n=$(run "$new" $args "$prec"); b=$(run "$base" $args "$prec")
  else
    b=$(run "$base" $args "$prec"); n=$(run "$new" $args "$prec")
  fi
  echo "round $r $model $prec load $load base $b new $n ratio $(awk -v a="$n" -v b="$b" 'BEGIN {printf "%.3f", a / b}')"
done
