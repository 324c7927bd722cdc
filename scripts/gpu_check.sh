#!/usr/bin/env bash
# The GPU check, run from an unpacked bundle on the GPU machine (issue 23, item 2; docs/gpu.md):
#   tar -xf libparallel-gpu-bundle.tar.xz -C /tmp && /tmp/libparallel-gpu-bundle/gpu_check.sh OUT_DIR
# scripts/gpu_bundle.sh builds the bundle (this script is its gpu_check.sh). Nothing is built or
# installed here and nothing needs a network or mpirun: every run is one process (MPI singleton).
#
#   1. cuda_libraries  finds the CUDA libraries the bundle needs (bundle.json: cudart, cuBLAS,
#                      cuBLASLt, NCCL) in the CUDA toolkit's folders or the PyTorch wheels'
#                      nvidia/*/lib folders, names each file and version, sets LD_LIBRARY_PATH
#   2. load            every binary and library resolves every dependency (ldd, the GLIBC version
#                      against bundle.json's) and starts (--help / --gtest_list_tests /
#                      --benchmark_list_tests); says exactly what is missing
#   3. the CUDA tests, each binary directly with its own timeout; the op table's CUDA column
#      (test_backend_ops); the MoE layer on CUDA against the PyTorch fixtures (test_moe). With a
#      GPU a skipped test is a failure (PARALLEL_REQUIRE_GPU=1 makes REQUIRE_GPU() fail, and any
#      "[  SKIPPED ]" test fails the step).
#   4. trainer_gpu, trainer_gpu_plain: pretrain_gpt on the GPU (tiny config, 10 steps, fp32 and
#      bf16, dense and MoE) against the CPU runs packed in reference/ (made when the bundle was
#      built): losses within 1e-4 (fp32) / 5e-3 (bf16) relative per step; grad norms reported (a
#      warning beyond 1e-3 / 5e-2). Default op paths, then PARALLEL_GEMM=cublaslt PARALLEL_ATTENTION=plain.
#   5. bench_gemm (ours vs cuBLASLt), bench_attention, bench_memory_bound: short Google Benchmark runs;
#      gpt2_step: GPT-2 124M (configs/gpt2_124m.yaml, synthetic tokens, bf16) training steps,
#      tokens/s and MFU against the GPU's published dense peak (989 TFLOP/s bf16 on H100 / H200).
#   6. sanitizer: compute-sanitizer memcheck on a few small tests, when found and time remains.
# Each step has its own time limit; the limits add up to 360 s (6 minutes, GPU_CHECK_BUDGET caps
# the whole). A failing step is recorded and the next one runs.
#
# OUT_DIR gets at most 8 files: report.md, results.json, logs.tar.gz (every log), bench_gemm.json,
# bench_attention.json, bench_memory_bound.json, gpt2_step.json. A short table is printed last.
# Exit status: 0 when every step passed, 1 otherwise, 2 on a usage error.
# GPU_CHECK_ONLY=step,step,... runs only those steps (and the library and load checks), for a
# second run after a fix; GPU_CHECK_BUDGET (360) caps the seconds of the whole.
#
# Without a GPU it says so in one line and exits 0; it still checks that every binary loads and
# trains the tiny config on the CPU for a few steps (cpu_train), and writes the report (every GPU
# step "not run (no GPU)"). GPU_CHECK_REHEARSAL=1 (scripts/gpu_rehearsal.sh) makes that exit status
# count: 1 when a binary does not load or the CPU run fails.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

gpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  if grep -q '^GPU' <<<"$(nvidia-smi -L 2>/dev/null)"; then gpu=1; else no_gpu_why="nvidia-smi lists no device"; fi
elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  gpu=1 # a driver without nvidia-smi: the programs themselves will say whether CUDA works
else
  no_gpu_why="no nvidia-smi and no /dev/nvidia*"
fi

if [[ ! -f $here/bundle.json ]]; then # scripts/gpu_check.sh in the repository
  if ((!gpu)); then
    echo "gpu_check: no GPU on this machine ($no_gpu_why): nothing to check"
    exit 0
  fi
  echo "gpu_check: run the check from a bundle: scripts/gpu_bundle.sh makes one, docs/gpu.md says how to run it" >&2
  exit 2
fi
if [[ $# -ne 1 ]]; then
  if ((!gpu)); then
    echo "gpu_check: no GPU on this machine ($no_gpu_why): nothing to check (give OUT_DIR to check the bundle loads and trains on the CPU)"
    exit 0
  fi
  echo "usage: gpu_check.sh OUT_DIR" >&2
  exit 2
fi

start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-360}
mkdir -p "$1" || {
  echo "gpu_check: cannot create $1" >&2
  exit 2
}
out=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
logs=$work/logs
mkdir -p "$logs"
trap 'rm -rf "$work"' EXIT
bin=$here/bin
steps=$work/steps.tsv # name, status, seconds, limit, counts as failure (0/1)
: >"$steps"
failed=0
say() { ((gpu)) && echo "gpu_check: $*"; }

# Field of bundle.json (one key per line, written by gpu_bundle.sh).
bundle_field() { sed -n "s/^  \"$1\": \"\{0,1\}\(.*\)\"\{0,1\},\{0,1\}$/\1/p" "$here/bundle.json" | sed 's/",$//;s/"$//;s/,$//' | head -1; }
bundle_list() { sed -n "s/^  \"$1\": \[\(.*\)\],\{0,1\}$/\1/p" "$here/bundle.json" | tr -d '" ' | tr ',' '\n' | grep -v '^$'; }

# ---- step limits (seconds): they add up to at most 360 -----------------------------------------
mapfile -t cuda_tests < <(bundle_list cuda_tests)
declare -A limit=([cuda_libraries]=5 [load]=15 [op_table]=20 [moe_layer_cuda]=15 [trainer_gpu]=35
  [trainer_gpu_plain]=30 [bench_gemm]=20 [bench_attention]=40 [bench_memory_bound]=15 [gpt2_step]=35
  [sanitizer]=25)
# The CUDA test binaries share 105 s (13 s each for today's 8; a new test takes its share from the
# others, so the limits never add up to more than 360 s).
if ((${#cuda_tests[@]})); then
  per_test=$((105 / ${#cuda_tests[@]}))
  ((per_test > 20)) && per_test=20
  for t in "${cuda_tests[@]}"; do limit[$t]=$per_test; done
fi
gpu_steps=("${cuda_tests[@]}" op_table moe_layer_cuda trainer_gpu trainer_gpu_plain bench_gemm bench_attention
  bench_memory_bound gpt2_step sanitizer)
limits_total=0
for k in "${!limit[@]}"; do limits_total=$((limits_total + limit[$k])); done
# Without a GPU (the rehearsal, on 2 busy cores) nothing counts against the device's 6 minutes:
# the load check and the CPU run get a minute each.
if ((!gpu)); then
  limit[load]=60
  limit[cpu_train]=60
fi

remaining() { echo $((budget - ($(date +%s) - start))); }
record() { # record NAME STATUS SECONDS COUNTS
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${limit[$1]:-0}" "$4" >>"$steps"
  (($4)) && failed=1
  say "$1: $2 (${3} s)"
}

# The gtest skips in a log, each test once: on a GPU machine every one is a failure (the no-GPU
# error-path tests pass rather than skip where a GPU is present).
unexpected_skips() {
  awk '/^\[  SKIPPED \] [A-Za-z_]/ { if (!($4 in seen)) { seen[$4] = 1; printf "%s ", $4 } }' "$1"
}

# step NAME CMD...: runs CMD with the step's limit (less when the budget is nearly spent), output to
# logs/NAME.log; passed / FAILED (rc) / TIMED OUT; a gtest skip is a failure (unexpected_skips).
step() {
  local name=$1 lim=${limit[$1]}
  shift
  local left
  left=$(remaining)
  ((left < lim)) && lim=$left
  local log=$logs/$name.log
  if [[ -n ${GPU_CHECK_ONLY:-} && $name != load && ",$GPU_CHECK_ONLY," != *",$name,"* ]]; then
    record "$name" "not run (GPU_CHECK_ONLY)" 0 0
    return 0
  fi
  if ((lim < 3)); then
    echo "not run: the ${budget} s budget was spent" >"$log"
    record "$name" "not run (budget spent)" 0 1
    return 1
  fi
  say "$name (up to ${lim} s)"
  local t0 rc status
  t0=$(date +%s)
  { echo "\$ $*"; timeout -k 5 "$lim" "$@"; } >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=passed ;;
    124 | 137) status="TIMED OUT after ${lim} s" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  local skipped
  skipped=$(unexpected_skips "$log")
  if [[ $status == passed && -n $skipped ]]; then
    status="FAILED (skipped on a GPU machine: ${skipped:0:100})"
  fi
  record "$name" "$status" $(($(date +%s) - t0)) "$([[ $status == passed ]] && echo 0 || echo 1)"
  [[ $status == passed ]]
}

# ---- environment of every run ---------------------------------------------------------------
export PARALLEL_SOURCE_DIR=$here/share     # configs and fixtures the tests read
export UCX_MODULE_DIR=$here/lib/ucx        # MPICH's UCX: no plugins from the machine
export UCX_WARN_UNUSED_ENV_VARS=n
export MPIR_CVAR_ENABLE_GPU=0              # MPI carries host buffers only (NCCL the device ones)
export PARALLEL_LOG_LEVEL=${PARALLEL_LOG_LEVEL:-info}
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc --all)
if ((gpu)); then
  export PARALLEL_REQUIRE_GPU=1 # REQUIRE_GPU() fails instead of skipping (tests/common/gpu.hpp)
  export OMP_NUM_THREADS=$((cores > 8 ? 8 : cores))
else
  export OMP_NUM_THREADS=1
fi

# ---- 1. CUDA libraries: the toolkit's folders, then the PyTorch wheels' ------------------------
t0=$(date +%s)
cuda_dirs=()
for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-[0-9]*; do
  [[ -n $d && -d $d ]] || continue
  for sub in lib64 lib targets/x86_64-linux/lib; do
    [[ -d $d/$sub ]] || continue
    real=$(readlink -f "$d/$sub")
    [[ " ${cuda_dirs[*]:-} " == *" $real "* ]] || cuda_dirs+=("$real")
  done
done
site_dirs=()
if command -v python3 >/dev/null; then
  mapfile -t site_dirs < <(timeout 5 python3 -c 'import site, sys
print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | grep -E 'packages$' | sort -u)
fi
for d in /usr/local/lib/python3*/{dist,site}-packages /usr/lib/python3*/{dist,site}-packages \
  /opt/conda/lib/python3*/site-packages /opt/*/lib/python3*/site-packages /root/.local/lib/python3*/site-packages \
  /home/*/.local/lib/python3*/site-packages /venv/lib/python3*/site-packages; do
  [[ -d $d ]] && site_dirs+=("$d")
done
wheel_dirs=()
for s in "${site_dirs[@]}"; do
  [[ -d $s/nvidia ]] || continue
  while read -r d; do wheel_dirs+=("$d"); done < <(find "$s/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | sort)
done
libs_report=$work/cuda_libraries.tsv # soname, path, version, source
: >"$libs_report"
ld_dirs=()
mapfile -t needed < <(sed -n '/"cuda_libraries_needed"/s/.*{\(.*\)}.*/\1/p' "$here/bundle.json" | tr ',' '\n' |
  sed -n 's/^ *"\([^"]*\)":.*/\1/p')
needed+=(libcuda.so.1)
lib_version() { # the file's version: its name's suffix, the wheel's dist-info, or NCCL's banner
  local f=$1 real v
  real=$(readlink -f "$f")
  v=$(basename "$real" | sed -n 's/^[^.]*\.so\.\([0-9.]*\)$/\1/p')
  # A toolkit's version.json names each component's version (libcublas, cuda_cudart, ...).
  local vj key
  vj=$(dirname "$real")/../version.json
  case $(basename "$f") in
    libcublas*) key=libcublas ;;
    libcudart*) key=cuda_cudart ;;
    libnccl*) key=libnccl ;;
    *) key="" ;;
  esac
  if [[ -n $key && -f $vj ]]; then
    local cv
    cv=$(tr -d '\n' <"$vj" | grep -o "\"$key\" *: *{[^}]*}" | grep -o '"version" *: *"[^"]*"' | cut -d'"' -f4)
    [[ -n $cv ]] && v="$v (toolkit $key $cv)"
  fi
  if [[ $f == */nvidia/* ]]; then # the wheel whose RECORD lists the file names the version
    local pkg info
    pkg=${f%%/nvidia/*}
    info=$(grep -lF "${f#"$pkg"/}," "$pkg"/nvidia*.dist-info/RECORD 2>/dev/null | head -1)
    [[ -n $info ]] && v="$v wheel $(basename "$(dirname "$info")" .dist-info)"
  fi
  if [[ $f == *libnccl* ]]; then
    local banner
    banner=$(grep -ao 'NCCL version [0-9.]*[+a-z0-9.]*' "$real" 2>/dev/null | head -1)
    [[ -n $banner ]] && v="$v ($banner)"
  fi
  echo "${v:-unknown}"
}
for so in "${needed[@]}"; do
  found="" src=""
  for d in "${cuda_dirs[@]}"; do [[ -e $d/$so ]] && { found=$d/$so src=toolkit; break; }; done
  if [[ -z $found ]]; then
    for d in "${wheel_dirs[@]}"; do [[ -e $d/$so ]] && { found=$d/$so src="PyTorch wheel"; break; }; done
  fi
  if [[ -z $found ]]; then
    p=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk -v s="$so" '$1 == s { print $NF; exit }')
    [[ -n $p ]] && found=$p src=system
  fi
  if [[ -z $found ]]; then
    for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
      [[ -e $d/$so ]] && { found=$d/$so src=system; break; }
    done
  fi
  if [[ -n $found ]]; then
    printf '%s\t%s\t%s\t%s\n' "$so" "$(readlink -f "$found")" "$(lib_version "$found")" "$src" >>"$libs_report"
    dir=$(dirname "$found")
    [[ " ${ld_dirs[*]:-} " == *" $dir "* ]] || ld_dirs+=("$dir")
  else
    printf '%s\t%s\t%s\t%s\n' "$so" "NOT FOUND" "-" "searched: ${cuda_dirs[*]:-no toolkit} ${wheel_dirs[*]:-no nvidia wheels} ldconfig" >>"$libs_report"
  fi
done
if ((${#ld_dirs[@]})); then
  LD_LIBRARY_PATH=$(
    IFS=:
    echo "${ld_dirs[*]}"
  )${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
fi
cp "$libs_report" "$logs/cuda_libraries.tsv"
libs_missing=$(awk -F'\t' '$2 == "NOT FOUND" && $1 != "libcuda.so.1" { print $1 }' "$libs_report" | tr '\n' ' ')
driver_missing=$(awk -F'\t' '$2 == "NOT FOUND" && $1 == "libcuda.so.1" { print $1 }' "$libs_report")
if [[ -n $libs_missing ]] || { ((gpu)) && [[ -n $driver_missing ]]; }; then
  record cuda_libraries "FAILED (not found: $libs_missing$driver_missing)" $(($(date +%s) - t0)) 1
else
  record cuda_libraries passed $(($(date +%s) - t0)) 0
fi

# ---- 2. every binary loads ------------------------------------------------------------------
glibc_needed=$(bundle_field glibc_needed)
glibc_here=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
# libstdc++ / libgcc_s: the machine's own when they have every symbol version the bundle needs
# (bundle.json: libstdcxx_needed), else the bundle's lib/fallback copies (which need a newer glibc).
cxx_runtime="the machine's"
for so in libstdc++.so.6 libgcc_s.so.1; do
  sys=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk -v s="$so" '$1 == s && /x86-64/ { print $NF; exit }')
  for tag in $(bundle_field libstdcxx_needed); do
    [[ $so == libgcc_s* && $tag != GCC_* ]] && continue
    [[ $so == libstdc* && $tag == GCC_* ]] && continue
    if [[ -z $sys ]] || ! grep -aq "$tag" "$sys" 2>/dev/null; then
      cxx_runtime="the bundle's (lib/fallback: the machine's ${sys:-none} lacks $tag)"
    fi
  done
done
if [[ $cxx_runtime == "the bundle's"* ]]; then
  export LD_LIBRARY_PATH=$here/lib/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  glibc_needed=$(bundle_field glibc_needed_with_fallback)
fi
load_check() {
  local bad=0 f out
  echo "glibc here: ${glibc_here:-unknown}; the bundle needs ${glibc_needed:-?}; C++ runtime: $cxx_runtime"
  if [[ -n $glibc_here && -n $glibc_needed ]] &&
    [[ $(printf '%s\n%s\n' "${glibc_needed#GLIBC_}" "$glibc_here" | sort -V | head -1) != "${glibc_needed#GLIBC_}" ]]; then
    echo "MISSING: glibc $glibc_here is older than the ${glibc_needed} the bundle needs"
    bad=1
  fi
  for f in "$here"/lib/*.so* "$here"/lib/fallback/*.so* "$bin"/*; do
    [[ -L $f || -d $f ]] && continue
    out=$(ldd "$f" 2>&1)
    if grep -qE 'not found|version .* not found|not a dynamic' <<<"$out"; then
      echo "MISSING for $(basename "$f"):"
      grep -E 'not found|not a dynamic' <<<"$out" | sed 's/^/    /'
      bad=1
    fi
  done
  # Each program starts and exits (MPI singleton, no device work).
  for f in "$bin"/*; do
    local n args
    n=$(basename "$f")
    case $n in
      pretrain_gpt) args=(--help) ;;
      bench_*) args=(--benchmark_list_tests=true --benchmark_filter=NONE_SUCH) ;;
      *) args=(--gtest_list_tests --gtest_filter=NONE_SUCH) ;;
    esac
    if out=$(cd "$work" && timeout 10 "$f" "${args[@]}" 2>&1); then
      echo "starts: $n"
    else
      echo "DOES NOT START: $n ${args[*]} (exit $?):"
      tail -5 <<<"$out" | sed 's/^/    /'
      bad=1
    fi
  done
  return $bad
}
export -f load_check
# The environment of every run, for running one program by hand: source BUNDLE/env.sh.
{
  echo "# written by gpu_check.sh: source it to run the bundle's programs by hand"
  for v in LD_LIBRARY_PATH PARALLEL_SOURCE_DIR UCX_MODULE_DIR UCX_WARN_UNUSED_ENV_VARS MPIR_CVAR_ENABLE_GPU \
    OMP_NUM_THREADS PARALLEL_REQUIRE_GPU; do
    [[ -n ${!v:-} ]] && printf 'export %s=%q\n' "$v" "${!v}"
  done
} >"$here/env.sh" 2>/dev/null || true
export here bin work logs glibc_needed glibc_here cxx_runtime
step load bash -c load_check

# ---- no GPU: the CPU run, the report, one line -----------------------------------------------
# compare_losses NAME RUN_JSONL REF_JSONL TOL GTOL: per-step relative differences of loss (must be
# within TOL) and grad_norm (reported; "WARN" beyond GTOL); one line of result, exit 1 on a loss miss.
compare_losses() {
  field() { grep '"loss"' "$2" | grep -o "\"$1\":[^,}]*" | cut -d: -f2; }
  paste <(field loss "$2") <(field loss "$3") <(field grad_norm "$2") <(field grad_norm "$3") |
    awk -F'\t' -v name="$1" -v tol="$4" -v gtol="$5" -v want=10 '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; s = (b < 0 ? -b : b); return s > 0 ? d / s : d }
    $1 == "" { next }
    { n++; r = rel($1, $2); if (r > worst) worst = r; if (r > tol) { printf "%s: step %d loss %s vs CPU %s\n", name, n, $1, $2; bad = 1 }
      if ($3 != "" && $4 != "") { g = rel($3, $4); if (g > gworst) gworst = g } }
    END { if (n != want) { printf "%s: %d losses, expected %d\n", name, n, want; bad = 1 }
          printf "RESULT %s losses %s (worst relative %.2e, bound %s); grad norms worst relative %.2e%s\n", name,
            (bad ? "DIFFER" : "match"), worst, tol, gworst, (gworst > gtol ? " WARN beyond " gtol : " (within " gtol ")")
          exit bad }'
}
export -f compare_losses
pretrain() { # pretrain NAME ARGS...: the tiny config, 10 steps, into $work/runs/NAME
  local name=$1
  shift
  (cd "$work" && "$bin/pretrain_gpt" --config "$here/share/configs/tiny.yaml" --set train.steps=10 \
    --set train.log_interval=1 --set train.output_dir="$work/runs/$name" "$@") >"$logs/run_$name.log" 2>&1 || {
    echo "$name failed: $(grep -v '\[info\]' "$logs/run_$name.log" | grep . | tail -1 | cut -c1-300)"
    tail -20 "$logs/run_$name.log"
    return 1
  }
}
export -f pretrain

if ((!gpu)); then
  cpu_train() {
    pretrain cpu_check --set train.precision=fp32 || return 1
    compare_losses cpu_check "$work/runs/cpu_check/metrics.jsonl" "$here/reference/cpu_fp32.jsonl" 1e-4 1e-3
  }
  export -f cpu_train
  step cpu_train bash -c cpu_train
  for s in "${gpu_steps[@]}"; do record "$s" "not run (no GPU)" 0 0; done
fi

# ---- 3. tests --------------------------------------------------------------------------------
if ((gpu)); then
  for t in "${cuda_tests[@]}"; do
    step "$t" "$bin/$t" --gtest_color=no
  done
  step op_table "$bin/test_backend_ops" --gtest_filter='OpTableCuda.*' --gtest_color=no
  step moe_layer_cuda "$bin/test_moe" --gtest_filter='MoEPyTorchReference.OnCuda' --gtest_color=no

  # ---- 4. the trainer on the GPU against the packed CPU runs ----------------------------------
  trainer_vs_cpu() { # trainer_vs_cpu TAG
    local tag=$1 bad=0 p
    local moe=(--set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=96
      --set model.moe_aux_loss_coeff=0.01 --set model.moe_z_loss_coeff=0.001)
    echo "paths: PARALLEL_GEMM=${PARALLEL_GEMM:-auto (default)} PARALLEL_ATTENTION=${PARALLEL_ATTENTION:-flash (default)}"
    for p in fp32 bf16; do
      local tol=1e-4 gtol=1e-3
      [[ $p == bf16 ]] && tol=5e-3 gtol=5e-2
      if pretrain "${tag}_$p" --set train.device=cuda --set train.precision=$p; then
        compare_losses "${tag}_$p" "$work/runs/${tag}_$p/metrics.jsonl" "$here/reference/cpu_$p.jsonl" $tol $gtol || bad=1
      else bad=1; fi
      if pretrain "${tag}_moe_$p" --set train.device=cuda --set train.precision=$p "${moe[@]}"; then
        compare_losses "${tag}_moe_$p" "$work/runs/${tag}_moe_$p/metrics.jsonl" "$here/reference/cpu_moe_$p.jsonl" $tol $gtol || bad=1
      else bad=1; fi
    done
    grep -h 'tokens/s' "$logs/run_${tag}_bf16.log" 2>/dev/null | tail -1
    return $bad
  }
  export -f trainer_vs_cpu
  step trainer_gpu bash -c 'trainer_vs_cpu gpu'
  step trainer_gpu_plain env PARALLEL_GEMM=cublaslt PARALLEL_ATTENTION=plain bash -c 'trainer_vs_cpu plain'

  # ---- 5. benchmarks ----------------------------------------------------------------------------
  # bench NAME BINARY FILTER: --benchmark_min_time 0.05 s per case, figures to read. A run without
  # figures, or with error rows, fails the step.
  bench_figures() {
    "$@" || return
    local json=${*: -2:1}
    json=${json#--benchmark_out=}
    local n errors
    n=$(grep -c '"real_time"' "$json" 2>/dev/null)
    errors=$(grep -c '"error_occurred": true' "$json" 2>/dev/null)
    echo "figures: ${n:-0}, error rows: ${errors:-0}"
    ((${n:-0} > 0 && ${errors:-0} == 0))
  }
  export -f bench_figures
  bench() {
    local name=$1
    step "$name" bash -c 'bench_figures "$@"' _ "$2" --benchmark_filter="$3" --benchmark_min_time=0.05 \
      --benchmark_out="$out/$name.json" --benchmark_out_format=json
  }
  # Ours and cuBLASLt side by side (66 cases; "auto" is one of the two by a fixed rule).
  bench bench_gemm "$bin/bench_cuda_kernels" 'BM_GemmBf16/(square/4096|gpt2_124m|gpt_1.3b)/.*/(ours|cublaslt)/'
  bench bench_attention "$bin/bench_cuda_attention" \
    'BM_FlashAttentionBf16/(1024|4096)/|BM_AttentionFp32Baseline|BM_AttentionPlainBf16|BM_AttentionMasked'
  bench bench_memory_bound "$bin/bench_cuda_kernels" \
    '^BM_(LayerNorm|RmsNorm|Gelu|Swiglu|Rope|SoftmaxCrossEntropy|Embedding|AdamW|RoundToPrecision|SumOfSquares)'
  # GPT-2 124M: 32 sequences of 1024 tokens per step (8 micro-batches of 4), bf16, synthetic tokens.
  gpt2_step() {
    (cd "$work" && "$bin/pretrain_gpt" --config "$here/share/configs/gpt2_124m.yaml" --set data.path=synthetic \
      --set train.device=cuda --set train.precision=bf16 --set train.steps=6 --set optimizer.warmup_steps=1 --set train.log_interval=1 \
      --set train.eval_interval=0 --set checkpoint.save_interval=0 --set 'checkpoint.dir=""' \
      --set train.output_dir="$work/runs/gpt2_124m") || return 1
    # Steps 3.. (the first ones time GEMM choices and warm the allocator): median tokens/s and MFU.
    grep '"tokens_per_sec"' "$work/runs/gpt2_124m/metrics.jsonl" | tail -n +3 | awk '
      { match($0, /"tokens_per_sec":[^,}]*/); t[n] = substr($0, RSTART + 17, RLENGTH - 17) + 0
        match($0, /"mfu":[^,}]*/); m[n] = substr($0, RSTART + 6, RLENGTH - 6) + 0
        match($0, /"peak_flops_per_rank":[^,}]*/); p = substr($0, RSTART + 22, RLENGTH - 22) + 0; n++ }
      END { if (n == 0) { print "no steps logged"; exit 1 }
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) { if (t[j] < t[i]) { x = t[i]; t[i] = t[j]; t[j] = x }
                                                               if (m[j] < m[i]) { x = m[i]; m[i] = m[j]; m[j] = x } }
            printf "{\"model\": \"gpt2_124m\", \"precision\": \"bf16\", \"tokens_per_step\": 32768, \"steps_measured\": %d, \"tokens_per_sec_median\": %.1f, \"mfu_median\": %.4f, \"peak_flops\": %.4g}\n", n, t[int(n / 2)], m[int(n / 2)], p }' \
      >"$out/gpt2_step.json"
    cat "$out/gpt2_step.json"
  }
  export -f gpt2_step
  export out
  step gpt2_step bash -c gpt2_step

  # ---- 6. compute-sanitizer on small tests, if time remains -----------------------------------
  sanitizer=$(command -v compute-sanitizer || true)
  for d in "${cuda_dirs[@]}"; do
    [[ -z $sanitizer && -x $d/../bin/compute-sanitizer ]] && sanitizer=$(readlink -f "$d/../bin/compute-sanitizer")
    [[ -z $sanitizer && -x $d/../compute-sanitizer/compute-sanitizer ]] && sanitizer=$(readlink -f "$d/../compute-sanitizer/compute-sanitizer")
  done
  if [[ -n ${GPU_CHECK_ONLY:-} && ",$GPU_CHECK_ONLY," != *,sanitizer,* ]]; then
    record sanitizer "not run (GPU_CHECK_ONLY)" 0 0
  elif [[ -z $sanitizer ]]; then
    record sanitizer "not run (compute-sanitizer not found)" 0 0
  elif (($(remaining) < 15)); then
    record sanitizer "not run (no time left)" 0 0
  else
    export sanitizer
    step sanitizer bash -c '
      "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no "$0/test_cuda_tensor" --gtest_filter="CudaTensor.*" --gtest_color=no &&
      "$sanitizer" --tool memcheck --error-exitcode 99 --leak-check no "$0/test_cuda_ops" --gtest_color=no \
        --gtest_filter="CudaOps.AddScale:CudaOps.GeluForwardBackward:CudaOps.LayerNormForwardBackwardAccumulates:CudaOps.CrossEntropyPiecesWithPadding:CudaOps.AttentionCausalGqaOddSizes"' "$bin"
  fi
fi

# ---- report ------------------------------------------------------------------------------------
if ((gpu)); then
  nvidia-smi >"$logs/nvidia-smi.log" 2>&1
  gpu_line=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>/dev/null | head -1)
  driver_cuda=$(grep -o 'CUDA Version: [0-9.]*' "$logs/nvidia-smi.log" | head -1)
  device="$gpu_line (name, driver, compute capability, memory); driver supports ${driver_cuda:-CUDA ?}; $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') GPU(s)"
else
  device="no GPU ($no_gpu_why)"
fi
nvcc_here=$( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | grep -o 'release [0-9.]*' || echo "no nvcc")
report=$out/report.md
passed=$(awk -F'\t' '$2 == "passed"' "$steps" | wc -l)
ran=$(awk -F'\t' '$2 !~ /^not run/' "$steps" | wc -l)
{
  echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "- device: $device"
  echo "- host: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), glibc ${glibc_here:-?}, $cores CPUs; nvcc on the machine: $nvcc_here; C++ runtime: $cxx_runtime"
  echo "- bundle: commit $(bundle_field commit), built $(bundle_field built) on $(bundle_field build_os); CUDA $(bundle_field cuda) for $(bundle_field cuda_architectures) with $(bundle_field nvcc); headers NCCL $(bundle_field nccl_built_against), cuBLAS $(bundle_field cublas_built_against); MPI $(bundle_field mpi)"
  echo "- $ran steps run, $passed passed, in $(($(date +%s) - start)) s; step limits add up to $limits_total s (budget $budget s)"
  ((gpu)) || echo "- **no GPU**: every GPU step was not run for that reason only; the bundle's load check and a CPU run of pretrain_gpt (one process) ran instead"
  echo "- op paths: trainer_gpu on the defaults (PARALLEL_GEMM=${PARALLEL_GEMM:-auto}, PARALLEL_ATTENTION=${PARALLEL_ATTENTION:-flash}); trainer_gpu_plain with PARALLEL_GEMM=cublaslt PARALLEL_ATTENTION=plain"
  echo
  echo "## Steps"
  echo
  echo "| step | result | seconds | limit |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r name status secs lim _; do echo "| $name | $status | $secs | $lim |"; done <"$steps"
  echo
  echo "## CUDA libraries used (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
  echo
  echo "| library | file | version | from |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r so path ver src; do echo "| $so | $path | $ver | $src |"; done <"$libs_report"
  echo
  echo "## Load check"
  echo
  echo '```'
  grep -vE '^starts: ' "$logs/load.log" 2>/dev/null | head -60
  echo "$(grep -c '^starts: ' "$logs/load.log" 2>/dev/null || echo 0) programs started"
  echo '```'
  if ((!gpu)); then
    echo
    echo "## CPU run (pretrain_gpt, tiny config, one process) against the packed CPU reference"
    echo
    echo '```'
    grep -hE 'RESULT|failed|error' "$logs/cpu_train.log" 2>/dev/null | head -20
    echo '```'
  fi
  if ((gpu)); then
    echo
    echo "## Tests"
    echo
    for t in "${cuda_tests[@]}" op_table moe_layer_cuda; do
      echo "- $t: $(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$logs/$t.log" 2>/dev/null | tr '\n' ' ')"
      grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/$t.log" 2>/dev/null | sort -u | sed 's/^/  - /' | head -20
    done
    echo
    echo "## Trainer on the GPU vs the packed CPU runs"
    echo
    echo '```'
    grep -h '^RESULT\|^paths\|differ\|vs CPU\|expected\|failed' "$logs/trainer_gpu.log" "$logs/trainer_gpu_plain.log" 2>/dev/null
    echo '```'
    echo
    echo "## Op table on CUDA against the CPU (test_backend_ops)"
    echo
    echo '```'
    grep -E 'FAIL, [0-9]+ CUDA rows missing|^(gather_rows|gather_rows_scaled|gather_sum_rows|row_dot) ' "$logs/op_table.log" 2>/dev/null || echo "no op table summary"
    echo '```'
    echo
    echo "## Op paths: plain (library) vs own kernels (test_attention_plain, test_gemm_dispatch)"
    echo
    echo '```'
    grep -h '^\[op-path\]' "$logs/test_attention_plain.log" "$logs/test_gemm_dispatch.log" 2>/dev/null | sed 's/^\[op-path\] //' || echo "no op-path output"
    echo '```'
    echo
    echo "## GPT-2 124M training step (bf16, one GPU)"
    echo
    echo '```'
    cat "$out/gpt2_step.json" 2>/dev/null || echo "no figures"
    echo '```'
    echo
    echo "## Benchmarks (Google Benchmark, --benchmark_min_time=0.05)"
    for b in bench_gemm bench_attention bench_memory_bound; do
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
    echo
    echo "## compute-sanitizer"
    echo
    echo '```'
    grep -hE 'ERROR SUMMARY|Invalid|out of bounds|^\[  (PASSED|FAILED) ' "$logs/sanitizer.log" 2>/dev/null | head -20 || echo "not run"
    echo '```'
  fi
  echo
  echo "Logs: logs.tar.gz (one file per step, each run's output, nvidia-smi, the CUDA libraries found)."
} >"$report" 2>&1

# results.json: one step per line ("name", "status", "seconds", "limit_s" in that order).
{
  echo "{"
  echo "  \"gpu\": $([[ $gpu == 1 ]] && echo true || echo false),"
  echo "  \"device\": \"${device//\"/\'}\","
  echo "  \"bundle_commit\": \"$(bundle_field commit)\","
  echo "  \"limits_total_s\": $limits_total,"
  echo "  \"seconds\": $(($(date +%s) - start)),"
  echo "  \"cuda_libraries\": ["
  awk -F'\t' '{ printf "%s    {\"soname\": \"%s\", \"file\": \"%s\", \"version\": \"%s\", \"from\": \"%s\"}", (NR > 1 ? ",\n" : ""), $1, $2, $3, $4 } END { print "" }' "$libs_report" | sed 's/\\/\\\\/g'
  echo "  ],"
  echo "  \"trainer\": ["
  grep -h '^RESULT' "$logs/trainer_gpu.log" "$logs/trainer_gpu_plain.log" "$logs/cpu_train.log" 2>/dev/null |
    awk '{ sub(/^RESULT /, ""); gsub(/"/, "'\''"); printf "%s    \"%s\"", (NR > 1 ? ",\n" : ""), $0 } END { print "" }'
  echo "  ],"
  echo "  \"steps\": ["
  awk -F'\t' '{ gsub(/"/, "'\''", $2); printf "%s    {\"name\": \"%s\", \"status\": \"%s\", \"seconds\": %d, \"limit_s\": %d}", (NR > 1 ? ",\n" : ""), $1, $2, $3, $4 } END { print "" }' "$steps"
  echo "  ]"
  echo "}"
} >"$out/results.json"
tar -czf "$out/logs.tar.gz" -C "$work" logs

if ((!gpu)); then
  ok="the bundle loads and trains on the CPU"
  ((failed)) && ok="but the bundle's own checks FAILED: $(awk -F'\t' '$5 == 1 { printf "%s ", $1 }' "$steps")"
  echo "gpu_check: no GPU on this machine ($no_gpu_why): GPU steps not run; $ok; report $report"
  [[ ${GPU_CHECK_REHEARSAL:-0} == 1 ]] && exit $failed
  exit 0
fi
echo
echo "gpu_check: $passed of $ran steps passed in $(($(date +%s) - start)) s; report $report"
printf '%-26s %-7s %s\n' step seconds result
while IFS=$'\t' read -r name status secs _; do printf '%-26s %-7s %s\n' "$name" "$secs" "${status:0:90}"; done <"$steps"
exit $failed
