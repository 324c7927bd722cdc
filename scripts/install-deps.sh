#!/usr/bin/env bash
# Installs what libparallel needs from Debian's packages, and nothing when it is all there already.
# Works as root and as a user (through sudo). docs/dependencies.md says why each package is here.
#   --with-torch   also install python3-torch (only needed to regenerate the PyTorch fixtures)
#   --with-plots   also install python3-matplotlib (scripts/plot_metrics.py; scripts/test.sh asks for it)
#   --with-fuzz    also install clang and its sanitizer/libFuzzer runtimes (only for scripts/fuzz.sh)
#   --with-avx512-emulator  also install Bochs and what its guests boot from (scripts/avx512_emulated.sh)
set -euo pipefail

packages=(
  build-essential cmake git pkg-config
  libopenmpi-dev openmpi-bin
  libmpich-dev mpich
  libeigen3-dev libdnnl-dev ocl-icd-opencl-dev libfmt-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  jargon-text
  patchelf debootstrap
  bc iproute2
)
# A Clang build (CXX=clang++ ./scripts/test.sh) needs the compiler and its OpenMP runtime.
[[ "${CXX:-}" == *clang* ]] && packages+=(clang libomp-dev)
# PyTorch from Debian calls the system BLAS: OpenBLAS, not the reference BLAS, for a fair baseline.
[[ " $* " == *" --with-torch "* ]] && packages+=(python3-torch libopenblas0-openmp)
# Plots of runs (scripts/plot_metrics.py): matplotlib brings ~47 packages (SciPy, Tk, fonts; about
# 2 minutes to install on 2 cores), so it is opt-in for a build; scripts/test.sh opts in, so that
# the test plot_metrics runs in CI (it skips without it when ctest is run by hand).
[[ " $* " == *" --with-plots "* ]] && packages+=(python3-matplotlib)
# Fuzzing (scripts/fuzz.sh): libclang-rt-14-dev holds libFuzzer and the ASan/UBSan runtimes; it is
# only recommended by clang, and recommendations are not installed. ctest replays the corpora
# without any of this.
[[ " $* " == *" --with-fuzz "* ]] && packages+=(clang libclang-rt-14-dev)
# The AVX-512 check on machines without AVX-512 (scripts/avx512_emulated.sh, docs/ops.md): Bochs,
# its BIOS images and terminal display, a static busybox, and the tools that make a bootable CD; for
# the Sapphire Rapids guest (scripts/setup_spr_emulator.sh), what fetches, checks and builds Debian
# 13's Bochs.
[[ " $* " == *" --with-avx512-emulator "* ]] &&
  packages+=(bochs bochsbios vgabios bochs-term busybox-static isolinux syslinux-common xorriso cpio
    curl gpgv debian-archive-keyring xz-utils libncurses-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
