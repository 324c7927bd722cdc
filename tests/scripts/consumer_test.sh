#!/usr/bin/env bash
# Installs this build into a temporary prefix, builds a consumer project against the *installed*
# package and runs it on 2 ranks:
#   cmake: examples/consumer with find_package(parallel), setting no C++ standard of its own;
#   make:  examples/consumer_make, a plain Makefile using `pkg-config --cflags --libs parallel`; and
#          every installed header compiled on its own with those flags.
# Both check that the programs (pretrain_gpt, convert_checkpoint, preprocess_data, train_supervisor)
# are installed and run from the prefix; cmake also plans a run of the installed trainer.
# The consumer is compiled with the compiler that built the library.
#   consumer_test.sh cmake|make BUILD_DIR SOURCE_DIR CXX MPIEXEC...
set -euo pipefail
mode=$1 build_dir=$2 source_dir=$3 cxx=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
libdirs="$work/prefix/lib:$work/prefix/lib64"
# The programs of the package (examples/CMakeLists.txt) are installed in bin/ and run from the
# prefix alone: their RUNPATH finds the installed libparallel, not the build tree's.
for prog in pretrain_gpt convert_checkpoint preprocess_data train_supervisor; do
  [[ -x $build_dir/bin/$prog ]] || continue  # examples not built (PARALLEL_BUILD_EXAMPLES=OFF)
  installed=$work/prefix/bin/$prog
  [[ -x $installed ]] || { echo "$prog is not installed in bin/"; exit 1; }
  if ldd "$installed" | grep -q 'libparallel\.so'; then  # a shared libparallel
    env -u LD_LIBRARY_PATH ldd "$installed" | grep 'libparallel\.so' | grep -q "$work/prefix" || {
      echo "the installed $prog does not use the installed libparallel"
      exit 1
    }
  fi
  env -u LD_LIBRARY_PATH "$installed" --help >"$work/help.txt" 2>&1 || { echo "$prog --help failed"; cat "$work/help.txt"; exit 1; }
done
if [[ -x $build_dir/bin/train_supervisor ]]; then
  env -u LD_LIBRARY_PATH "$work/prefix/bin/train_supervisor" --help | grep -q -- "--max-restarts" ||
    { echo "train_supervisor --help failed"; exit 1; }
fi
# The installed trainer with an installed example config: its memory plan, no training.
if [[ $mode == cmake && -x $build_dir/bin/pretrain_gpt ]]; then
  config=$work/prefix/share/parallel/configs/tiny.yaml
  [[ -f $config ]] || { echo "configs are not installed in share/parallel/configs"; exit 1; }
  env -u LD_LIBRARY_PATH "$@" -np 1 "$work/prefix/bin/pretrain_gpt" --config "$config" --plan \
    --set train.output_dir="$work/plan" >"$work/plan.log" 2>&1 || { echo "installed pretrain_gpt --plan failed"; tail -5 "$work/plan.log"; exit 1; }
  [[ -s $work/plan/plan.json ]] || { echo "installed pretrain_gpt --plan wrote no plan.json"; exit 1; }
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
    # The installed headers are the public API (docs/api.md): each one compiles on its own, with the
    # package's flags only, so none needs an internal header (src/, kernels/) or another include first.
    cflags=$(PKG_CONFIG_PATH="$pcdir" $pkg_config --cflags parallel)
    headers=("$work"/prefix/include/parallel/*.hpp)
    [[ ${#headers[@]} -gt 40 ]] || { echo "only ${#headers[@]} headers installed"; exit 1; }
    printf '%s\n' "${headers[@]##*/}" | xargs -P 2 -I{} bash -c \
      'echo "#include <parallel/{}>" | '"$cxx $cflags"' -fsyntax-only -x c++ - 2>"'"$work"'/{}.err" ||
       { echo "installed header parallel/{} does not compile on its own:"; head -5 "'"$work"'/{}.err"; exit 255; }'
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
