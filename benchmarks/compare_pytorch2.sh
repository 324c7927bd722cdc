#!/usr/bin/env bash
# Side by side, one rank, the same threads: tokens/s of one GPT training step, ours (pretrain_gpt,
# fp32 and bf16) against PyTorch 2.x (benchmarks/pytorch2_gpt_step.py: eager and torch.compile,
# fp32 and bf16 autocast), rounds alternating so every side sees the same machine load.
#   benchmarks/compare_pytorch2.sh [BUILD_DIR] [ROUNDS] [mini|gpt2|both]
# PRECISIONS=fp32 (or bf16) runs only that precision's three columns; default both.
# MODES=compile (or eager) runs only that PyTorch mode (the other column reads 0), MODES=none ours
# only; default both.
# THEIR_STEPS=N times N steps on the PyTorch side instead of ours's count (its warm-up unchanged):
# without AVX512-BF16 a bf16 autocast step takes 30 s (mini) to minutes (GPT-2) on 2 cores.
# PyTorch 2.x comes from $TORCH2_DIR (default /tmp/torch2; ../shared/tools/torch2_setup.sh puts it
# there). Models (issue 12): "mini" 6 layers x 384, 6 heads, vocab 8192, seq 256, batch 4;
# "gpt2" the GPT-2 124M shape, 12 x 768, 12 heads, vocab 50257, seq 256, batch 4.
# Prints the machine, the ISA and GEMM kernel our library picked, a row per round and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} rounds=${2:-3} which=${3:-both}
torch_dir=${TORCH2_DIR:-/tmp/torch2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}  # both sides use libgomp; see compare_pytorch.sh
THREADS=${THREADS:-2}
PRECISIONS=${PRECISIONS:-fp32 bf16}
MODES=${MODES:-eager compile}
want() { [[ " $PRECISIONS " == *" $1 "* ]]; }
mode() { [[ " $MODES " == *" $1 "* ]]; }
PYTHONPATH=$torch_dir python3 -c 'import torch' 2>/dev/null ||
  { echo "compare_pytorch2: no PyTorch 2 in $torch_dir (run ../shared/tools/torch2_setup.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "date: $(date -u +%Y-%m-%d)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; flags: $(grep -o -w -E 'avx512f|avx512_bf16|avx512_fp16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "torch: $(PYTHONPATH=$torch_dir python3 -c 'import torch; print(torch.__version__)'), threads $THREADS, OMP_WAIT_POLICY=$OMP_WAIT_POLICY, precisions: $PRECISIONS, modes: $MODES, their timed steps: ${THEIR_STEPS:-ours}"

source benchmarks/ours_step.sh

# ours L H HEADS V S B STEPS PRECISION: median tokens/s over the timed steps; their median MFU (the
# clock moves: this 2-core VM's probe read 80-95 GFLOP/s within minutes) kept for the summary line.
ours() {
  local r
  r=$(ours_step "$build" "$work" "$@") || exit 1
  echo "${r%% *}"
  echo "${r##* }" >>"$work/mfu_$8"
}
theirs() {  # theirs L H HEADS V S B STEPS THREADS eager|compile fp32|bf16 (0 when MODES leaves it out)
  local args=("$@")
  mode "${args[8]}" || { echo 0; return; }
  args[6]=${THEIR_STEPS:-${args[6]}}
  PYTHONPATH=$torch_dir python3 benchmarks/pytorch2_gpt_step.py "${args[@]}" 2>/dev/null | tail -1
}

bench() {  # bench NAME L H HEADS V S B STEPS
  local name=$1
  shift
  local model=("$@")
  local shape=("${model[@]:0:7}")  # with STEPS: pytorch2_gpt_step.py's first seven arguments
  echo
  echo "== $name: ${model[0]} layers x ${model[1]}, ${model[2]} heads, vocab ${model[3]}, seq ${model[4]}, batch ${model[5]}"
  local ours_f=() ours_b=() ef=() cf=() eb=() cb=()
  printf "%-5s %10s %10s %10s %10s %10s %10s\n" round ours-fp32 eager-fp32 compile-fp32 ours-bf16 eager-bf16 compile-bf16
  for r in $(seq 1 "$rounds"); do
    local a b c d e f
    a=0 b=0 c=0 d=0 e=0 f=0  # 0: precision not run (PRECISIONS)
    if want fp32; then
      a=$(ours "${model[@]}" fp32)
      b=$(theirs "${shape[@]}" "$THREADS" eager fp32)
      c=$(theirs "${shape[@]}" "$THREADS" compile fp32)
    fi
    if want bf16; then
      d=$(ours "${model[@]}" bf16)
      e=$(theirs "${shape[@]}" "$THREADS" eager bf16)
      f=$(theirs "${shape[@]}" "$THREADS" compile bf16)
    fi
    printf "%-5s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n" "$r" "$a" "$b" "$c" "$d" "$e" "$f"
    ours_f+=("$a") ef+=("$b") cf+=("$c") ours_b+=("$d") eb+=("$e") cb+=("$f")
  done
  local mf me mc mb mbe mbc
  mf=$(echo "${ours_f[*]}" | median) me=$(echo "${ef[*]}" | median) mc=$(echo "${cf[*]}" | median)
  mb=$(echo "${ours_b[*]}" | median) mbe=$(echo "${eb[*]}" | median) mbc=$(echo "${cb[*]}" | median)
  printf "%-5s %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n" median "$mf" "$me" "$mc" "$mb" "$mbe" "$mbc"
  awk -v a="$mf" -v b="$me" -v c="$mc" -v d="$mb" -v e="$mbe" -v f="$mbc" 'function r(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }
    BEGIN { printf "ratios: fp32 ours/eager %s, ours/compile %s; bf16 ours/eager %s, ours/compile %s; ours bf16/fp32 %s\n",
      r(a, b), r(a, c), r(d, e), r(d, f), r(d, a) }'
  local p
  for p in fp32 bf16; do
    [[ -s $work/mfu_$p ]] || continue
    echo "ours $p, % of the peak its run measured at start (rounds; median): $(awk '{printf "%.1f ", 100 * $1}' "$work/mfu_$p");" \
      "$(median <"$work/mfu_$p" | awk '{printf "%.1f", 100 * $1}')"
  done
  rm -f "$work"/mfu_*
}

# Our GEMM kernel and ISA for the record (the trainer logs them at start).
OMP_NUM_THREADS=$THREADS "$build/bin/pretrain_gpt" --config configs/tiny.yaml --set train.steps=2 \
  --set train.precision=bf16 --set train.output_dir="$work/probe" 2>&1 | grep -E "CPU GEMM|CPU peak" | sed -E 's/^(\[[^]]*\] )+//'
[[ $which == mini || $which == both ]] && bench mini 6 384 6 8192 256 4 10
[[ $which == gpt2 || $which == both ]] && bench gpt2-124M 12 768 12 50257 256 4 4
exit 0
