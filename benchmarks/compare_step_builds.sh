#!/usr/bin/env bash
# compare_step_builds.sh BASE_ROOT NEW_ROOT MODEL ROUNDS STEPS: two checkouts' build/bin/pretrain_gpt
# (e.g. main's and a branch's), alternating within each round, fp32 then bf16, one rank, 2 threads;
# prints the median tokens/s of steps 3 and on. MODEL: mini (6 x 384, vocab 8192) or gpt2 (12 x 768,
# vocab 50257), seq 256, batch 4: the --set list of compare_pytorch2.sh. Run it under
# `flock /work/measure.lock nice -n -5` and note the load it prints.
set -euo pipefail
base=$(realpath "$1"); new=$(realpath "$2"); shift 2
w=$(mktemp -d)
run() { cd $1 && OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive build/bin/pretrain_gpt --config configs/tiny.yaml \
  --set model.num_layers=$2 --set model.hidden_size=$3 --set model.num_attention_heads=$4 --set model.vocab_size=$5 \
  --set model.seq_length=256 --set train.micro_batch_size=4 --set train.global_batch_size=4 --set train.steps=$6 \
  --set train.log_interval=1 --set train.precision=$7 --set optimizer.warmup_steps=0 --set train.output_dir=$w/run >$w/log 2>&1 || { tail -3 $w/log; exit 1; }
  grep -o '"tokens_per_sec":[^,}]*' $w/run/metrics.jsonl | cut -d: -f2 | tail -n +3 | sort -g | awk '{v[NR]=$1} END{printf "%.1f", v[int((NR+1)/2)]}'; rm -rf $w/run; }
if [ "$1" = mini ]; then a="6 384 6 8192"; else a="12 768 12 50257"; fi
for r in $(seq $2); do
  for p in fp32 bf16; do
    echo "round $r $1 $p load $(cut -d' ' -f1 /proc/loadavg) base $(run $base $a $3 $p) new $(run $new $a $3 $p) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
rm -rf $w
