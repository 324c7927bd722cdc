#!/usr/bin/env bash
# Configures and builds libparallel into build/ (or $BUILD_DIR). Extra arguments go to cmake;
# BUILD_TARGETS="a b" builds only those targets. CUDA is picked up automatically when nvcc is present
# (PARALLEL_WITH_CUDA=AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
# CMake keeps the compiler a folder was first configured with and ignores CXX after that: stop
# rather than silently build with the other compiler (CXX=clang++ wants a BUILD_DIR of its own).
if [[ -n "${CXX:-}" && -f "$build_dir/CMakeCache.txt" ]]; then
  cached=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
  wanted=$(command -v "${CXX%% *}" || echo "${CXX%% *}")
  if [[ -n "$cached" && "$(readlink -f "$cached")" != "$(readlink -f "$wanted")" ]]; then
    echo "build.sh: $build_dir is configured with $cached, not CXX=$CXX; set BUILD_DIR to a folder of its own" >&2
    exit 1
  fi
fi
launcher=()
# ccache (when installed) makes rebuilds in a second build folder, or after a branch switch, cheap.
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
