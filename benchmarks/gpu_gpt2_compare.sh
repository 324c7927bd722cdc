#!/usr/bin/env bash
# GPT-2 124M training steps on one GPU: pretrain_gpt from an unpacked GPU bundle against PyTorch
# (eager and torch.compile, bf16 autocast) on the same machine, in one run (docs/benchmarks.md,
# "GPU: GPT-2 124M step"). Run on the GPU machine after gpu_check.sh (which writes env.sh):
#   benchmarks/gpu_gpt2_compare.sh [BUNDLE_DIR] > OUT_FILE
# BUNDLE_DIR defaults to /tmp/libparallel-gpu-bundle. Every run is the same step: 32 sequences of
# 1024 tokens (32,768 tokens), as MICRO-batches with gradient accumulation, AdamW, clipping at 1.0,
# bf16 (ours: 16-bit tensors with fp32 master weights; PyTorch: autocast over fp32 weights). Ours:
# median tokens/s of steps 3..STEPS (the first ones pick GEMM algorithms and warm the allocator).
# PyTorch: median of STEPS timed steps after 2 (eager) or 3 (compile) warm-up steps.
# Environment: MICROS (default "4 16"), STEPS (12), COMPILE_LIMIT_S (120 per torch.compile run).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=${1:-/tmp/libparallel-gpu-bundle}
steps=${STEPS:-12}
micros=${MICROS:-4 16}
# shellcheck disable=SC1091
source "$here/gpu_gpt2_args.sh"
# shellcheck disable=SC1091
source "$bundle/env.sh" || {
  echo "gpu_gpt2_compare: no $bundle/env.sh (run gpu_check.sh first)" >&2
  exit 2
}
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ours() { # ours MICRO -> median tokens/s of steps 3..
  gpt2_cuda_args "$bundle" "$steps" "$1" "$work/ours_$1"
  "$bundle/bin/pretrain_gpt" "${gpt2_args[@]}" >"$work/ours_$1.log" 2>&1 || {
    echo "failed: $(tail -2 "$work/ours_$1.log" | tr '\n' ' ')"
    return
  }
  grep '"tokens_per_sec"' "$work/ours_$1/metrics.jsonl" | tail -n +3 |
    sed 's/.*"tokens_per_sec":\([0-9.e+]*\).*/\1/' | sort -g | awk '{ v[n++] = $1 } END { printf "%.0f\n", v[int(n / 2)] }'
}
torch_step() { # torch_step eager|compile MICRO -> tokens/s
  local lim=60
  [[ $1 == compile ]] && lim=${COMPILE_LIMIT_S:-120}
  timeout "$lim" python3 "$here/pytorch2_gpt_step.py" 12 768 12 50304 1024 32 "$steps" 8 "$1" bf16 cuda "$2" \
    >"$work/torch_$1_$2.log" 2>&1 && tail -1 "$work/torch_$1_$2.log" || echo "failed (exit $?): $(tail -1 "$work/torch_$1_$2.log")"
}

echo "# GPT-2 124M bf16 step, 32 x 1024 tokens, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
printf '%-6s %-12s %-14s %-14s %-10s %-10s\n' micro ours_tok_s torch_eager torch_compile vs_eager vs_compile
for m in $micros; do
  o=$(ours "$m")
  e=$(torch_step eager "$m")
  c=$(torch_step compile "$m")
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }
  printf '%-6s %-12s %-14s %-14s %-10s %-10s\n' "$m" "$o" "$e" "$c" "$(ratio "$o" "$e")" "$(ratio "$o" "$c")"
done
