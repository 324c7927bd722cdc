#!/usr/bin/env bash
# Installs this build into a temporary prefix, builds a consumer project against the *installed*
# package and runs it on 2 ranks:
#   cmake: examples/consumer with find_package(parallel), setting no C++ standard of its own;
#   make:  examples/consumer_make, a plain Makefile using `pkg-config --cflags --libs parallel`.
# The consumer is compiled with the compiler that built the library.
#   consumer_test.sh cmake|make BUILD_DIR SOURCE_DIR CXX MPIEXEC...
set -euo pipefail
mode=$1 build_dir=$2 source_dir=$3 cxx=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
libdirs="$work/prefix/lib:$work/prefix/lib64"
# The restart supervisor (docs/restart.md) is installed with the examples, and runs from the prefix
# alone: its RUNPATH finds the installed libparallel, not the build tree's.
if [[ -x $build_dir/bin/train_supervisor ]]; then
  supervisor=$work/prefix/bin/train_supervisor
  [[ -x $supervisor ]] || { echo "train_supervisor is not installed in bin/"; exit 1; }
  if ldd "$supervisor" | grep -q 'libparallel\.so'; then  # a shared libparallel
    env -u LD_LIBRARY_PATH ldd "$supervisor" | grep 'libparallel\.so' | grep -q "$work/prefix" || {
      echo "the installed train_supervisor does not use the installed libparallel"
      exit 1
    }
  fi
  env -u LD_LIBRARY_PATH "$supervisor" --help | grep -q -- "--max-restarts" || { echo "train_supervisor --help failed"; exit 1; }
fi
case $mode in
  cmake)
    cmake -S "$source_dir/examples/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
    cmake --build "$work/build" -j2 >/dev/null
    exe=$work/build/consumer
    ;;
  make)
    pcdir=$(dirname "$(find "$work/prefix" -name parallel.pc | head -1)")
    cp -r "$source_dir/examples/consumer_make" "$work/build"
    # A static libparallel needs its private dependencies too.
    pkg_config="pkg-config"
    if ! ls "$work"/prefix/lib*/libparallel.so >/dev/null 2>&1; then pkg_config="pkg-config --static"; fi
    PKG_CONFIG_PATH="$pcdir" make -C "$work/build" CXX="$cxx" PKG_CONFIG="$pkg_config"
    exe=$work/build/consumer_make
    ;;
  *)
    echo "consumer_test.sh: unknown mode '$mode' (cmake or make)"
    exit 2
    ;;
esac
# The consumer must use the installed library, not the build tree.
if ldd "$exe" | grep -q 'libparallel\.so'; then
  LD_LIBRARY_PATH="$libdirs" ldd "$exe" | grep 'libparallel\.so' | grep -q "$work/prefix" || {
    echo "consumer does not use the installed libparallel"
    exit 1
  }
fi
LD_LIBRARY_PATH="$libdirs:${LD_LIBRARY_PATH:-}" "$@" -np 2 "$exe"
