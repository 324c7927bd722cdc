#!/usr/bin/env bash
# Installs this build into a temporary prefix, builds examples/consumer against the *installed*
# package with find_package(parallel), and runs it on 2 ranks.
#   consumer_test.sh BUILD_DIR SOURCE_DIR MPIEXEC...
set -euo pipefail
build_dir=$1 source_dir=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/examples/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" -j2 >/dev/null
# The consumer must have been linked against the installed library, not the build tree.
ldd "$work/build/consumer" | grep -q "$work/prefix" || {
  LD_LIBRARY_PATH="$work/prefix/lib" ldd "$work/build/consumer" | grep -q "$work/prefix" || { echo "consumer does not use the installed libparallel"; exit 1; }
}
LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}" "$@" -np 2 "$work/build/consumer"
