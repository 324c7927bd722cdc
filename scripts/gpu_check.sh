#!/usr/bin/env bash
# One call verifies a GPU (issue 12, item 7):
#   scripts/gpu_check.sh OUT_DIR
# builds libparallel for the GPU present, runs every CUDA test (ctest -L cuda), the trainer's
# GPU-vs-CPU test on the default op paths and on the plain ones, the op-path comparison (our own
# kernels vs their plain library-based alternatives) and the CUDA benchmarks, and writes
# OUT_DIR/report.md (device, pass/fail per test, benchmark figures, which path each op took and how
# the paths agree), with every log beside it. Budget: 10 minutes on one H100 (GPU_CHECK_BUDGET
# seconds, default 600); every step has its own timeout, and a failing step is recorded and the
# next one runs. Without a GPU it says so in one line and exits 0.
#
# Environment: GPU_CHECK_BUILD_DIR (default build-gpu-check), GPU_CHECK_BUDGET (600),
# GPU_CHECK_INSTALL=1 to try scripts/install-deps.sh when Debian packages are missing (needs network).
# Exit status: 0 when every step passed, 1 otherwise (the report is written either way).
set -uo pipefail

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu_check: no GPU on this machine (nvidia-smi missing or lists no device): nothing to check"
  exit 0
fi
if [[ $# -ne 1 ]]; then
  echo "usage: scripts/gpu_check.sh OUT_DIR" >&2
  exit 2
fi

start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-600}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || { echo "gpu_check: cannot create $1" >&2; exit 2; }
out=$(cd "$1" && pwd)
logs=$out/logs
mkdir -p "$logs"
build=${GPU_CHECK_BUILD_DIR:-$src/build-gpu-check}
steps=$out/steps.tsv  # name, status, seconds, log
: >"$steps"
failed=0

remaining() { echo $((budget - ($(date +%s) - start))); }

# step NAME SECONDS CMD...: runs CMD with a timeout of min(SECONDS, time left - 20 s), output to
# logs/NAME.log; records passed / FAILED (rc) / TIMED OUT / skipped (exit 77) / not run (no time).
step() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(($(remaining) - 20))
  ((left < limit)) && limit=$left
  local log=$logs/$name.log
  if ((limit < 5)); then
    printf '%s\tnot run (budget spent)\t0\t%s\n' "$name" "logs/$name.log" >>"$steps"
    echo "not run: the ${budget}s budget was spent" >"$log"
    failed=1
    return 1
  fi
  echo "gpu_check: $name (up to ${limit}s)"
  local t0 rc status
  t0=$(date +%s)
  { echo "\$ $*"; timeout -k 10 "$limit" "$@"; } >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=passed ;;
    77) status=skipped ;;
    124 | 137) status="TIMED OUT after ${limit}s"; failed=1 ;;
    *) status="FAILED (exit $rc)"; failed=1 ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" "logs/$name.log" >>"$steps"
  echo "gpu_check: $name: $status"
  return $rc
}

# ---- device -----------------------------------------------------------------------------------
nvidia-smi >"$logs/nvidia-smi.log" 2>&1
gpu_line=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader | head -1)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
[[ $cap =~ ^[0-9]+$ ]] || cap=90
driver_cuda=$(grep -o 'CUDA Version: [0-9.]*' "$logs/nvidia-smi.log" | head -1)
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
nvcc_version=$("$nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo "nvcc not found")
gpus=$(nvidia-smi -L | grep -c '^GPU')

# ---- dependencies -----------------------------------------------------------------------------
# The Debian packages of scripts/install-deps.sh (the list is read from it, not copied). A bare
# machine without network cannot install them: they are reported, and the configure step names
# what CMake could not find.
deps_report=$logs/deps.log
{
  missing=()
  if command -v dpkg-query >/dev/null; then
    mapfile -t pkgs < <(sed -n '/^packages=(/,/^)/p' "$src/scripts/install-deps.sh" | sed '1d;$d' | tr ' ' '\n' |
      grep -v '^$')
    for p in "${pkgs[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    echo "Debian packages missing: ${missing[*]:-none}"
  else
    echo "not a Debian system: package check skipped (CMake's configure step names what is missing)"
  fi
  for tool in cmake make g++ mpirun python3 ccache ninja; do
    printf '%-8s %s\n' "$tool" "$(command -v $tool || echo MISSING)"
  done
  printf '%-8s %s\n' nvcc "$nvcc ($nvcc_version)"
  ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | sed 's/^/nccl.h   /' || true
} >"$deps_report" 2>&1
if grep -q '^Debian packages missing: [^n]' "$deps_report" && [[ ${GPU_CHECK_INSTALL:-0} == 1 ]]; then
  step install_deps 180 "$src/scripts/install-deps.sh"
fi
cat "$deps_report"

# ---- build ------------------------------------------------------------------------------------
# Only what the checks need: the library, the CUDA tests, the trainer, the CUDA benchmarks.
cuda_tests=()
for f in "$src"/tests/cuda/test_*.cpp; do cuda_tests+=("$(basename "$f" .cpp)"); done
targets=(parallel "${cuda_tests[@]}" test_backend_ops test_moe pretrain_gpt bench_cuda_kernels bench_cuda_attention)
cmake_args=(-S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARALLEL_WITH_CUDA=ON
  "-DPARALLEL_CUDA_ARCHITECTURES=$cap" -DPARALLEL_BUILD_TESTS=ON -DPARALLEL_BUILD_BENCHMARKS=ON
  -DPARALLEL_BUILD_EXAMPLES=ON)
[[ -x $nvcc ]] && cmake_args+=("-DCMAKE_CUDA_COMPILER=$nvcc")
# Ninja when present (and the folder is not already configured with another generator).
command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]] && cmake_args+=(-G Ninja)
command -v ccache >/dev/null &&
  cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "$t"); done
step configure 90 cmake "${cmake_args[@]}"
keep_going=(-k)  # make; ninja wants -k 0
[[ -f $build/build.ninja ]] && keep_going=(-k 0)
# Keep going past a failing target: the tests whose binaries were built still run.
step build 330 cmake --build "$build" -j"$(nproc)" "${build_targets[@]}" -- "${keep_going[@]}"
bin=$build/bin

# ---- tests ------------------------------------------------------------------------------------
# Every test labelled cuda except trainer_gpu, which runs below twice (default and plain paths;
# it also compares a MoE model on the GPU with the CPU, and ep2 over NCCL with two GPUs).
# junit (per-test results for the report) needs CMake 3.21; older ctest: the text summary is parsed.
junit=()
ctest --help 2>/dev/null | grep -q -- --output-junit && junit=(--output-junit "$out/ctest_cuda.xml")
step ctest_cuda 150 bash -c 'cd "$0" && exec ctest "$@"' "$build" -L cuda -E '^trainer_gpu$' \
  --timeout 120 --output-on-failure "${junit[@]}"
# The op-path comparison on its own, so that its lines are in one log whatever ctest keeps.
step op_paths 60 "$bin/test_attention_plain" --gtest_color=no
# The op table's CUDA column: every op row (attention_merge, context parallelism's merge, and the
# MoE row ops gather_rows, gather_rows_scaled, gather_sum_rows, row_dot, included) on the GPU against
# the CPU; the summary table at the end of the log says pass / FAIL / missing.
step op_table 90 "$bin/test_backend_ops" --gtest_filter='OpTableCuda.*' --gtest_color=no
source "$src/scripts/mpi_launcher.sh"  # the launcher flags for one machine, Open MPI's or MPICH's
mapfile -t mpiexec < <(mpi_launcher_flags mpirun)
mpiexec=(mpirun "${mpiexec[@]}")
export OMP_NUM_THREADS=1 PARALLEL_SOURCE_DIR=$src
while read -r var; do [[ -n $var ]] && export "${var?}"; done < <(mpi_launcher_env mpirun)
# One MoE layer on the GPU against the float64 PyTorch fixtures (an MPI test, one rank).
step moe_layer_cuda 60 "${mpiexec[@]}" -np 1 "$bin/test_moe" --gtest_filter='MoEPyTorchReference.*' --gtest_color=no
step trainer_gpu 120 bash "$src/tests/scripts/trainer_gpu.sh" "$src" "$bin/pretrain_gpt" "${mpiexec[@]}"
step trainer_gpu_plain 90 env PARALLEL_ATTENTION=plain PARALLEL_GEMM=cublaslt \
  bash "$src/tests/scripts/trainer_gpu.sh" "$src" "$bin/pretrain_gpt" "${mpiexec[@]}"

# ---- benchmarks -------------------------------------------------------------------------------
# Short runs (--benchmark_min_time 0.05 s per case): figures to read, not to three digits.
bench() {  # bench NAME SECONDS BINARY FILTER
  step "$1" "$2" "$3" --benchmark_filter="$4" --benchmark_min_time=0.05 --benchmark_out="$out/$1.json" \
    --benchmark_out_format=json
}
bench bench_gemm 90 "$bin/bench_cuda_kernels" 'BM_GemmBf16/(square/4096|gpt2_124m|gpt_1.3b)/'
bench bench_memory_bound 45 "$bin/bench_cuda_kernels" \
  '^BM_(LayerNorm|RmsNorm|Gelu|Swiglu|Rope|SoftmaxCrossEntropy|Embedding|AdamW|RoundToPrecision|SumOfSquares)'
bench bench_attention 90 "$bin/bench_cuda_attention" \
  'BM_FlashAttentionBf16/(1024|4096)/|BM_AttentionFp32Baseline|BM_AttentionPlainBf16'

# ---- report -----------------------------------------------------------------------------------
report=$out/report.md
{
  echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "- device: $gpu_line (name, driver, compute capability, memory; $gpus GPU(s)); driver supports ${driver_cuda:-CUDA ?}; toolkit nvcc $nvcc_version"
  echo "- commit: $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$src" status --porcelain 2>/dev/null | grep -q . && echo ' (working tree modified)')"
  echo "- built for sm_$cap in $build; total $(($(date +%s) - start)) s of a ${budget} s budget"
  echo "- op paths by default: attention = ${PARALLEL_ATTENTION:-flash} (PARALLEL_ATTENTION), GEMM = ${PARALLEL_GEMM:-auto} (PARALLEL_GEMM); trainer_gpu_plain ran with PARALLEL_ATTENTION=plain PARALLEL_GEMM=cublaslt"
  echo
  echo "## Steps"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r name status secs log; do echo "| $name | $status | $secs | $log |"; done <"$steps"
  echo
  echo "## Dependencies"
  echo
  echo '```'
  cat "$deps_report"
  echo '```'
  echo
  echo "## CUDA tests (ctest -L cuda)"
  echo
  if [[ -f $out/ctest_cuda.xml ]] && command -v python3 >/dev/null; then
    python3 - "$out/ctest_cuda.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
print("| test | result | seconds |\n|---|---|---|")
for tc in root.iter("testcase"):
    status = tc.get("status") or ""
    if tc.find("failure") is not None: status = "FAILED"
    elif tc.find("skipped") is not None or status == "notrun": status = "skipped / not run"
    elif status in ("run", ""): status = "passed"
    print(f"| {tc.get('name')} | {status} | {float(tc.get('time') or 0):.1f} |")
EOF
  else
    echo '```'
    grep -E 'Test +#|tests passed|tests failed' "$logs/ctest_cuda.log" 2>/dev/null || echo "no ctest output"
    echo '```'
  fi
  echo
  echo "## Trainer on the GPU vs the CPU (tests/scripts/trainer_gpu.sh)"
  for t in trainer_gpu trainer_gpu_plain; do
    echo
    echo "$t:"
    echo '```'
    grep -E 'match|step [0-9]+ loss|losses, expected|tokens/s|SKIPPED|GPU|failed' "$logs/$t.log" 2>/dev/null | tail -12 ||
      echo "no output"
    echo '```'
  done
  echo
  echo "## Op table on CUDA against the CPU (test_backend_ops)"
  echo
  echo '```'
  grep -E '^(gather_rows|gather_rows_scaled|gather_sum_rows|row_dot) ' "$logs/op_table.log" 2>/dev/null ||
    echo "no MoE row-op rows"
  grep -E 'FAIL, [0-9]+ CUDA rows missing' "$logs/op_table.log" 2>/dev/null || echo "no op table summary"
  echo '```'
  echo
  echo "## Op paths: plain (library) vs own kernels"
  echo
  echo "Max |diff| / max |ref| per output (lse: absolute); 'cpu' is the definition in double. From"
  echo "tests/cuda/test_attention_plain.cpp, which states the tolerances."
  echo
  echo '```'
  grep -h '^\[op-path\]' "$logs/op_paths.log" 2>/dev/null | sed 's/^\[op-path\] //' || echo "no op-path output"
  grep -hE '^\[  (FAILED|PASSED|SKIPPED) ' "$logs/op_paths.log" 2>/dev/null || true
  echo '```'
  echo
  echo "## Benchmarks (Google Benchmark, --benchmark_min_time=0.05)"
  for b in bench_gemm bench_memory_bound bench_attention; do
    echo
    echo "### $b"
    echo
    if [[ -s $out/$b.json ]] && command -v python3 >/dev/null; then
      python3 - "$out/$b.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("| benchmark | time | figures | label |\n|---|---|---|---|")
for b in d.get("benchmarks", []):
    if b.get("error_occurred"):
        print(f"| {b['name']} | error | | {b.get('error_message', '')} |"); continue
    figs = ", ".join(f"{k} {v:.3g}" for k, v in b.items()
                     if k not in ("real_time", "cpu_time", "iterations", "repetitions", "repetition_index",
                                  "threads", "family_index", "per_family_instance_index")
                     and isinstance(v, (int, float)) and not isinstance(v, bool))
    print(f"| {b['name']} | {b['real_time']:.4g} {b.get('time_unit', '')} | {figs} | {b.get('label', '')} |")
EOF
    else
      echo '```'
      tail -30 "$logs/$b.log" 2>/dev/null || echo "no output"
      echo '```'
    fi
  done
} >"$report" 2>&1

echo "gpu_check: $( ((failed)) && echo "some steps FAILED" || echo "all steps passed"); report: $report"
exit $failed
