#!/usr/bin/env bash
# Builds here everything the GPU check runs and packs it into one archive for a bare GPU machine
# (issue 23, item 1; docs/gpu.md says what to do with it):
#   scripts/gpu_bundle.sh [BUILD_DIR]          # default BUILD_DIR: build-gpu-bundle
# The last line of output is the archive's path (default dist/libparallel-gpu-bundle.tar.xz, an
# ignored folder; at most GPU_BUNDLE_MAX_MIB = 40 MiB, else exit 1). xz, because gzip does not fit
# oneDNN, MPICH and the CUDA kernels into 40 MiB; a machine without xz unpacks it with
# python3 -m tarfile -e. The CPU-only bundle (GPU_BUNDLE_CUDA=OFF) is a .tar.gz (quicker to pack).
#
# What it holds (libparallel-gpu-bundle/):
#   gpu_check.sh     the check (scripts/gpu_check.sh), run on the device: gpu_check.sh OUT_DIR
#   bin/             pretrain_gpt, the CUDA tests (tests/cuda), test_backend_ops (the op table's
#                    CUDA column), test_moe (the MoE fixture on CUDA), bench_cuda_kernels,
#                    bench_cuda_attention
#   lib/             libparallel and every shared library those need that is not glibc's or CUDA's
#                    (ldd, followed to the end): MPICH, UCX, oneDNN, yaml-cpp, fmt, spdlog,
#                    Google Benchmark, OpenMP, libstdc++ ...; each binary finds them through its
#                    RPATH ($ORIGIN/../lib, $ORIGIN), set with patchelf
#   share/           configs and the PyTorch fixtures the tests read (PARALLEL_SOURCE_DIR)
#   reference/       the CPU runs the GPU trainer runs are compared with (metrics.jsonl of the tiny
#                    config, fp32 and bf16, dense and MoE), made here with the bundle's pretrain_gpt
#   bundle.json      commit, architectures, toolkit, NCCL and cuBLAS versions built against, the
#                    CUDA libraries the device must provide (cudart, cuBLAS, cuBLASLt, NCCL), the
#                    newest GLIBC symbol version needed, sizes
#
# MPI is MPICH: a process started without a launcher is a world of one (singleton start, no daemon,
# no flag), and it is one library without plugin folders or help files to relocate (docs/gpu.md).
#
# Environment:
#   GPU_BUNDLE_CUDA=ON|OFF   ON (default): the CUDA build for the GPU; OFF: a CPU-only bundle (the
#                            same packing and check, for the rehearsal in the test suite)
#   GPU_BUNDLE_ARCHS         CUDA architectures (default "90-real;80-real": SASS for H100/H200 and A100)
#   GPU_BUNDLE_OUT           the archive's path (.tar.gz or .tar.xz)
#   GPU_BUNDLE_BUILD=0       pack BUILD_DIR as it is built (build nothing)
#   GPU_BUNDLE_MAX_MIB       size limit (40)
# BUILD_DIR already configured is used as it is (it must be an MPICH build); otherwise it is
# configured here with MPICH's compiler wrapper, ccache when installed.
set -euo pipefail
trap 'echo "gpu_bundle: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(readlink -m "${1:-$src/build-gpu-bundle}")
cuda=${GPU_BUNDLE_CUDA:-ON}
archs=${GPU_BUNDLE_ARCHS:-90-real;80-real}
max_mib=${GPU_BUNDLE_MAX_MIB:-40}
name="libparallel-gpu-bundle"
[[ $cuda == OFF ]] && name="libparallel-cpu-bundle"
ext=tar.xz
[[ $cuda == OFF ]] && ext=tar.gz
out=$(readlink -m "${GPU_BUNDLE_OUT:-$src/dist/$name.$ext}")
case $out in
  *.tar.gz) compress=(gzip -9) ;;
  *.tar.xz) compress=(xz -T"$(nproc)" -9) ;;
  *) echo "gpu_bundle: GPU_BUNDLE_OUT must end in .tar.gz or .tar.xz" >&2; exit 2 ;;
esac
t0=$(date +%s)
say() { echo "gpu_bundle: $*" >&2; }
die() {
  echo "gpu_bundle: $*" >&2
  exit 1
}
for tool in patchelf ldd objdump "${compress[0]}"; do
  command -v $tool >/dev/null || die "$tool is missing (Debian: apt-get install patchelf binutils; scripts/install-deps.sh)"
done

# ---- configure and build -------------------------------------------------------------------
if [[ ! -f $build/CMakeCache.txt ]]; then
  mpicc=$(command -v mpicc.mpich || true)
  [[ -n $mpicc ]] || die "MPICH is not installed (Debian: libmpich-dev mpich; scripts/install-deps.sh)"
  args=(-S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER="$mpicc"
    -DMPIEXEC_EXECUTABLE="$(command -v mpiexec.mpich || echo mpiexec.mpich)" -DPARALLEL_WITH_CUDA="$cuda"
    -DPARALLEL_BUILD_TESTS=ON -DPARALLEL_BUILD_BENCHMARKS=ON -DPARALLEL_BUILD_EXAMPLES=ON)
  [[ $cuda == ON ]] && args+=("-DPARALLEL_CUDA_ARCHITECTURES=$archs")
  command -v ccache >/dev/null && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  say "configuring $build ($([[ $cuda == ON ]] && echo "CUDA $archs" || echo "CPU only"), MPICH)"
  mkdir -p "$build"
  cmake "${args[@]}" >"$build/bundle-configure.log" 2>&1 || {
    tail -20 "$build/bundle-configure.log" >&2
    die "configure failed (log: $build/bundle-configure.log)"
  }
fi
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1; }
have_cuda=OFF
grep -q '^#define PARALLEL_HAVE_CUDA 1' "$build/include/parallel/build_config.hpp" 2>/dev/null && have_cuda=ON
[[ $cuda == ON && $have_cuda == OFF ]] && die "$build is configured without the CUDA backend (GPU_BUNDLE_CUDA=OFF for a CPU bundle)"

cuda_tests=()
if [[ $have_cuda == ON ]]; then
  for f in "$src"/tests/cuda/test_*.cpp; do cuda_tests+=("$(basename "$f" .cpp)"); done
fi
programs=(pretrain_gpt "${cuda_tests[@]}" test_backend_ops test_moe bench_cuda_kernels bench_cuda_attention)
if [[ ${GPU_BUNDLE_BUILD:-1} != 0 ]]; then
  targets=()
  for t in "${programs[@]}"; do targets+=(--target "$t"); done
  say "building ${programs[*]} in $build (-j$(nproc))"
  cmake --build "$build" -j"$(nproc)" "${targets[@]}" >"$build/bundle-build.log" 2>&1 || {
    grep -E 'error|Error' "$build/bundle-build.log" | head -20 >&2
    die "build failed (log: $build/bundle-build.log)"
  }
fi
for t in "${programs[@]}"; do [[ -x $build/bin/$t ]] || die "$build/bin/$t is not built"; done
libparallel=$(find "$build/lib" -maxdepth 1 -name 'libparallel.so.*' -type f | head -1)
[[ -n $libparallel ]] || die "no shared libparallel in $build/lib (the bundle needs BUILD_SHARED_LIBS=ON)"
grep -q 'libmpich\.so' <<<"$(ldd "$libparallel")" ||
  die "$build links another MPI than MPICH: the bundle needs MPICH's singleton start (configure with -DMPI_C_COMPILER=mpicc.mpich, or let this script configure a fresh folder)"

# ---- stage ---------------------------------------------------------------------------------
stage=$build/bundle-stage
dir=$stage/$name
rm -rf "$stage"
mkdir -p "$dir/bin" "$dir/lib" "$dir/share/configs" "$dir/share/tests/reference/fixtures" "$dir/reference"
for t in "${programs[@]}"; do cp "$build/bin/$t" "$dir/bin/"; done
cp -P "$build"/lib/libparallel.so* "$dir/lib/"
cp "$src/scripts/gpu_check.sh" "$dir/gpu_check.sh"
cp "$src"/configs/tiny.yaml "$src"/configs/gpt2_124m.yaml "$dir/share/configs/"
cp "$src"/tests/reference/fixtures/moe_*.safetensors "$dir/share/tests/reference/fixtures/"

# Libraries the device provides: glibc's (the loader's own set) and CUDA's (the driver; the
# toolkit's or the PyTorch wheels' cudart, cuBLAS, cuBLASLt, NCCL). Everything else is packed.
provided_glibc='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libanl\.so|libmvec\.so)'
provided_cuda='^(libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvrtc|libnvJitLink\.so|libnvidia-)'
# The CUDA library folders of this build, so that ldd resolves what the device provides.
cuda_dirs=()
if [[ $have_cuda == ON ]]; then
  for d in "$(cache_get CUDAToolkit_LIBRARY_DIR)" "$(dirname "$(cache_get NCCL_LIBRARY)")"; do
    [[ -n $d && -d $d ]] && cuda_dirs+=("$d")
  done
fi
lib_path=$(
  IFS=:
  echo "${cuda_dirs[*]:-}"
)
declare -A cuda_needed=()
missing=()
# Follow ldd from every ELF in bin/ and lib/ until no new library appears.
while :; do
  added=0
  for elf in "$dir"/bin/* "$dir"/lib/*.so*; do
    [[ -L $elf ]] && continue
    while read -r soname arrow path _; do
      [[ $arrow == "=>" ]] || continue
      if [[ $soname =~ $provided_glibc ]]; then continue; fi
      if [[ $soname =~ $provided_cuda ]]; then
        cuda_needed[$soname]=$(readlink -f "$path" 2>/dev/null || echo "$path")
        continue
      fi
      [[ -e $dir/lib/$soname ]] && continue
      if [[ $path == not ]]; then
        missing+=("$soname (needed by $(basename "$elf"))")
        continue
      fi
      cp -L "$path" "$dir/lib/$soname"
      chmod u+w "$dir/lib/$soname"
      added=1
    done < <(LD_LIBRARY_PATH=$dir/lib${lib_path:+:$lib_path} ldd "$elf" 2>/dev/null)
  done
  ((added)) || break
done
((${#missing[@]} == 0)) || die "ldd finds no file for: ${missing[*]}"

# libstdc++ and libgcc_s of this machine need a newer glibc (2.36 on Debian 12: arc4random) than
# our own code (2.34), and every machine with a C++ program has them: they go to lib/fallback/,
# which the check puts on LD_LIBRARY_PATH only when the machine's own copies lack a symbol version
# the bundle needs (bundle.json: libstdcxx_needed).
mkdir -p "$dir/lib/fallback"
for so in libstdc++.so.6 libgcc_s.so.1; do
  [[ -e $dir/lib/$so ]] && mv "$dir/lib/$so" "$dir/lib/fallback/$so"
done

# RPATH (DT_RPATH, searched before LD_LIBRARY_PATH, so the device's own copies of these libraries
# cannot shadow ours): binaries look in ../lib, libraries beside themselves.
for f in "$dir"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$dir"/lib/*.so*; do
  [[ -L $f ]] || patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
done
for f in "$dir"/lib/fallback/*.so*; do patchelf --force-rpath --set-rpath '$ORIGIN:$ORIGIN/..' "$f"; done
# UCX (MPICH's transport) loads plugins from its compiled-in folder; the check points it at this
# empty one so that a UCX installed on the device is never mixed with ours.
mkdir -p "$dir/lib/ucx"

# Every ELF resolves every library from the bundle or the CUDA folders alone.
for elf in "$dir"/bin/* "$dir"/lib/*.so*; do
  [[ -L $elf ]] && continue
  if LD_LIBRARY_PATH=$lib_path${lib_path:+:}$dir/lib/fallback ldd "$elf" 2>&1 | grep -E 'not found'; then
    die "$(basename "$elf") does not resolve from the bundle"
  fi
done

# The newest GLIBC symbol version the packed files need (the device's glibc must be as new), without
# and with the fallback libstdc++; the newest GLIBCXX / CXXABI / GCC versions the rest needs.
symbols() { for f in "$@"; do [[ -L $f ]] || objdump -T "$f" 2>/dev/null; done; }
newest() { grep -o "$1[0-9.]*[0-9]" | sort -u -V | tail -1; }
glibc_needed=$(symbols "$dir"/bin/* "$dir"/lib/*.so* | newest GLIBC_)
glibc_needed_fallback=$(symbols "$dir"/bin/* "$dir"/lib/*.so* "$dir"/lib/fallback/*.so* | newest GLIBC_)
libstdcxx_needed="$(symbols "$dir"/bin/* "$dir"/lib/*.so* | newest GLIBCXX_) $(symbols "$dir"/bin/* "$dir"/lib/*.so* | newest CXXABI_) $(symbols "$dir"/bin/* "$dir"/lib/*.so* | newest GCC_)"

# ---- CPU references: the runs the GPU runs are compared with --------------------------------
# trainer_gpu.sh's CPU side: the tiny config, 10 steps, fp32 and bf16, dense and MoE (4 experts,
# top-2, aux and z losses), one process (MPI singleton), one OpenMP thread, as the test suite runs it.
moe=(--set model.num_experts=4 --set model.moe_router_topk=2 --set model.moe_ffn_hidden_size=96
  --set model.moe_aux_loss_coeff=0.01 --set model.moe_z_loss_coeff=0.001)
ref_run() { # ref_run NAME ARGS...
  local name=$1
  shift
  say "CPU reference $name"
  (cd "$stage" && OMP_NUM_THREADS=1 UCX_MODULE_DIR=$dir/lib/ucx MPIR_CVAR_ENABLE_GPU=0 \
    LD_LIBRARY_PATH=$lib_path "$dir/bin/pretrain_gpt" --config "$dir/share/configs/tiny.yaml" \
    --set train.steps=10 --set train.log_interval=1 --set train.output_dir="$stage/ref-$name" "$@") \
    >"$stage/ref-$name.log" 2>&1 || {
    tail -20 "$stage/ref-$name.log" >&2
    die "the CPU reference run $name failed"
  }
  [[ $(grep -c '"loss"' "$stage/ref-$name/metrics.jsonl") -eq 10 ]] || die "reference $name: not 10 logged steps"
  cp "$stage/ref-$name/metrics.jsonl" "$dir/reference/$name.jsonl"
}
ref_run cpu_fp32 --set train.precision=fp32
ref_run cpu_bf16 --set train.precision=bf16
ref_run cpu_moe_fp32 --set train.precision=fp32 "${moe[@]}"
ref_run cpu_moe_bf16 --set train.precision=bf16 "${moe[@]}"

# ---- manifest and archive ------------------------------------------------------------------
nvcc=$(cache_get CMAKE_CUDA_COMPILER)
for f in "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake; do
  [[ -z $nvcc && -f $f ]] && nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\([^"]*\)").*/\1/p' "$f")
done
nvcc_version=none
[[ $have_cuda == ON && -n $nvcc && -x $nvcc ]] && nvcc_version="$nvcc $("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
# The NCCL and cuBLAS headers the build compiled against.
header_version() { # header_version FILE MAJOR_MACRO MINOR_MACRO PATCH_MACRO
  [[ -f $1 ]] || return 0
  local v=() m
  for m in "$2" "$3" "$4"; do v+=("$(sed -n "s/^#define $m *\([0-9]*\).*/\1/p" "$1" | head -1)"); done
  echo "${v[0]}.${v[1]}.${v[2]}"
}
nccl_headers="" cublas_headers=""
if [[ $have_cuda == ON ]]; then
  nccl_headers=$(header_version "$(cache_get NCCL_INCLUDE_DIR)/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)
  cublas_headers=$(header_version "$(dirname "$(dirname "$nvcc")")/include/cublas_api.h" CUBLAS_VER_MAJOR CUBLAS_VER_MINOR CUBLAS_VER_PATCH)
fi
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -n $(git -C "$src" status --porcelain 2>/dev/null) ]] && commit="$commit (working tree modified)"
json_list() {
  local first=1 x
  printf '['
  for x in "$@"; do
    ((first)) || printf ', '
    first=0
    printf '"%s"' "$x"
  done
  printf ']'
}
cuda_json=$(for k in "${!cuda_needed[@]}"; do printf '%s\t%s\n' "$k" "${cuda_needed[$k]}"; done | sort |
  awk -F'\t' 'BEGIN { printf "{" } { printf "%s\"%s\": \"%s\"", (NR > 1 ? ", " : ""), $1, $2 } END { printf "}" }')
{
  echo "{"
  echo "  \"name\": \"$name\","
  echo "  \"commit\": \"$commit\","
  echo "  \"built\": \"$(date -u +%Y-%m-%dT%H:%MZ)\","
  echo "  \"build_os\": \"$(. /etc/os-release && echo "$PRETTY_NAME")\","
  echo "  \"cuda\": \"$have_cuda\","
  echo "  \"cuda_architectures\": \"$([[ $have_cuda == ON ]] && cache_get PARALLEL_CUDA_ARCHITECTURES)\","
  echo "  \"nvcc\": \"$nvcc_version\","
  echo "  \"nccl_built_against\": \"$nccl_headers\","
  echo "  \"cublas_built_against\": \"$cublas_headers\","
  echo "  \"cuda_libraries_needed\": $cuda_json,"
  echo "  \"mpi\": \"$(ldd "$libparallel" | grep -o 'libmpich\.so[.0-9]*' | head -1) (MPICH $(dpkg-query -W -f='${Version}' libmpich12 2>/dev/null || echo '?'))\","
  echo "  \"glibc_needed\": \"$glibc_needed\","
  echo "  \"glibc_needed_with_fallback\": \"$glibc_needed_fallback\","
  echo "  \"libstdcxx_needed\": \"$libstdcxx_needed\","
  # shellcheck disable=SC2046 # one word per file name (no spaces in them)
  echo "  \"fallback_libraries\": $(json_list $(cd "$dir/lib/fallback" && ls)),"
  echo "  \"cuda_tests\": $(json_list "${cuda_tests[@]}"),"
  echo "  \"programs\": $(json_list "${programs[@]}"),"
  # shellcheck disable=SC2046
  echo "  \"libraries\": $(json_list $(cd "$dir/lib" && ls -- *.so* 2>/dev/null)),"
  echo "  \"unpacked_bytes\": $(du -sb "$dir" | cut -f1)"
  echo "}"
} >"$dir/bundle.json"

mkdir -p "$(dirname "$out")"
say "packing $(du -sh "$dir" | cut -f1) into $out"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$stage" -cf - "$name" | "${compress[@]}" >"$out.tmp"
mv "$out.tmp" "$out"
bytes=$(stat -c %s "$out")
say "$(basename "$out"): $((bytes / 1024)) KiB (limit $max_mib MiB), glibc >= ${glibc_needed#GLIBC_} needed (${glibc_needed_fallback#GLIBC_} with the fallback libstdc++), $(($(date +%s) - t0)) s"
((bytes <= max_mib * 1024 * 1024)) || die "$out is $((bytes / 1024 / 1024)) MiB, over the $max_mib MiB limit (drop sm_80: GPU_BUNDLE_ARCHS=90-real)"
echo "$out"
