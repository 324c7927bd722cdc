#!/usr/bin/env bash
# libparallel against MPICH, next to this build's MPI: configures a second build of this source in
# BINARY_DIR/mpich with MPICH's compiler wrapper and launcher picked explicitly (Open MPI stays the
# system default), builds the library and test_collectives, checks the library links MPICH and not
# Open MPI, and runs test_collectives on 2 ranks through that build's ctest: MPICH's Hydra mpiexec
# with the flags scripts/mpi_launcher.sh gives it. The runtime checks that the launcher's ranks
# (PMI_RANK, PMI_SIZE) are MPI's, so a wrong launcher fails. Skipped (77) without MPICH
# (Debian: libmpich-dev mpich, which scripts/install-deps.sh installs). The first run compiles the
# library (minutes on 2 cores); ccache makes later ones take seconds.
# The folder is configured with the examples and benchmarks too (only test_collectives is built
# here): the GPU rehearsal (gpu_rehearsal_test.sh) builds its CPU bundle in the same folder.
#   mpich_build.sh SOURCE_DIR BINARY_DIR CXX_COMPILER [configure]   (configure: configure only)
set -euo pipefail
src=$1 bin=$2 cxx=$3 only_configure=${4:-}
source "$src/scripts/mpi_launcher.sh"
mpicc=$(command -v mpicc.mpich || true)
mpiexec=$(command -v mpiexec.mpich || true)
if [[ -z $mpicc || -z $mpiexec ]]; then
  echo "SKIPPED: MPICH is not installed (no mpicc.mpich / mpiexec.mpich; Debian: apt-get install libmpich-dev mpich)"
  exit 77
fi
[[ $(mpi_launcher_kind "$mpiexec") == hydra ]] || { echo "$mpiexec is not a Hydra launcher"; exit 1; }

build=$bin/mpich
log=$bin/mpich.log
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
quiet() { "$@" >>"$log" 2>&1 || { echo "failed: $*"; tail -30 "$log"; exit 1; }; }
: >"$log"
quiet cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DMPI_C_COMPILER="$mpicc" -DMPIEXEC_EXECUTABLE="$mpiexec" -DPARALLEL_WITH_CUDA=OFF \
  -DPARALLEL_BUILD_EXAMPLES=ON -DPARALLEL_BUILD_BENCHMARKS=ON "${launcher[@]}"
[[ $only_configure == configure ]] && exit 0
quiet cmake --build "$build" --target test_collectives -j"$(nproc)"

lib=$(find "$build/lib" -name 'libparallel.so*' -type f | head -1)
[[ -n $lib ]] || { echo "no libparallel.so in $build/lib"; exit 1; }
libs=$(ldd "$lib")
grep -q "libmpich" <<<"$libs" || { echo "$lib does not link MPICH:"; echo "$libs"; exit 1; }
if grep -q "libmpi\.so" <<<"$libs"; then echo "$lib links Open MPI's libmpi too:"; echo "$libs"; exit 1; fi

# The launcher that build's tests use: MPICH's, with the helper's flags for Hydra.
cmd=$(cd "$build" && ctest -R '^test_collectives_np2$' -N -V | grep "Test command:" || true)
grep -q "$mpiexec" <<<"$cmd" || { echo "the MPICH build's test does not run under $mpiexec: $cmd"; exit 1; }
(cd "$build" && ctest -R '^test_collectives_np2$' --output-on-failure) >>"$log" 2>&1 ||
  { echo "test_collectives_np2 under $mpiexec failed:"; tail -40 "$log"; exit 1; }
echo "MPICH build: $(basename "$lib") links $(grep -o 'libmpich[^ ]*' <<<"$libs" | head -1); test_collectives passed on 2 ranks under $cmd"
