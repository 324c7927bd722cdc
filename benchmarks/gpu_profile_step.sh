#!/usr/bin/env bash
# Where a GPT-2 124M bf16 training step's GPU time goes, by kernel: Nsight Compute (ncu) times every
# kernel of a 2-step pretrain_gpt run from an unpacked GPU bundle (one pass per kernel, the duration
# metric only, clocks left as the machine has them), and the kernels are summed by name. Run on the
# GPU machine after gpu_check.sh (which writes env.sh):
#   benchmarks/gpu_profile_step.sh [BUNDLE_DIR] > OUT_FILE
# Prints the kernels by total time (calls, total ms, share of the GPU time, mean us), most first,
# and the total. docs/benchmarks.md, "GPU: first figures", says why: the step at micro-batch 16 runs
# at 0.73x torch.compile and the kernels behind it are not known. Written 2026-11-28 without a GPU
# (the session's device time was spent): the ncu invocation follows the device tool's notes
# (--clock-control none) and has not run yet.
# Environment: MICRO (16), NCU (the ncu to use: PATH, then /usr/local/cuda/bin, then
# /opt/nvidia/nsight-compute/*/ncu), TOP (40 rows).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC1091
source "$here/gpu_gpt2_args.sh"
bundle=${1:-/tmp/libparallel-gpu-bundle}
micro=${MICRO:-16}
top=${TOP:-40}
# shellcheck disable=SC1091
source "$bundle/env.sh" || {
  echo "gpu_profile_step: no $bundle/env.sh (run gpu_check.sh first)" >&2
  exit 2
}
ncu=${NCU:-$(command -v ncu || true)}
[[ -z $ncu && -x /usr/local/cuda/bin/ncu ]] && ncu=/usr/local/cuda/bin/ncu
[[ -z $ncu ]] && ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[[ -n $ncu && -x $ncu ]] || {
  echo "gpu_profile_step: no ncu found (set NCU)" >&2
  exit 2
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpt2_cuda_args "$bundle" 2 "$micro" "$work/run"
"$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$work/ncu.csv" \
  "$bundle/bin/pretrain_gpt" "${gpt2_args[@]}" >"$work/run.log" 2>&1 || {
  echo "gpu_profile_step: the profiled run failed: $(tail -3 "$work/run.log" | tr '\n' ' ')" >&2
  exit 1
}
# ncu's CSV: one row per (kernel launch, metric); "Kernel Name" and "Metric Value" columns, the
# duration in the unit of "Metric Unit" (ns, us or ms).
python3 - "$work/ncu.csv" "$top" "$micro" <<'EOF'
import csv, sys
from collections import defaultdict
rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
head, body = rows[0], rows[1:]
name, metric, unit, value = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
total = defaultdict(float)
calls = defaultdict(int)
for r in body:
    if r[metric] != "gpu__time_duration.sum":
        continue
    us = float(r[value].replace(",", "")) * scale.get(r[unit], 1.0)
    k = r[name].split("(")[0].split("<")[0].strip() or r[name]
    total[k] += us
    calls[k] += 1
all_us = sum(total.values())
print(f"# GPT-2 124M bf16, 2 steps of 32 x 1024 tokens, micro-batch {sys.argv[3]}: {sum(calls.values())} kernels, {all_us / 1e3:.1f} ms of GPU time")
print(f"{'kernel':60s} {'calls':>6s} {'total ms':>9s} {'share':>6s} {'mean us':>8s}")
for k, us in sorted(total.items(), key=lambda kv: -kv[1])[: int(sys.argv[2])]:
    print(f"{k[:60]:60s} {calls[k]:6d} {us / 1e3:9.2f} {100 * us / all_us:5.1f}% {us / calls[k]:8.1f}")
EOF
