#!/usr/bin/env bash
# The GPU bundle rehearsed on a bare machine in the test suite (issue 23, item 3): a CPU-only bundle
# (scripts/gpu_bundle.sh with GPU_BUNDLE_CUDA=OFF: the same packing, RPATHs, MPICH singleton start,
# packed CPU references and gpu_check.sh as the GPU bundle, without the CUDA kernels, whose nvcc
# build would take most of the suite's time on 2 cores) made in the MPICH build folder that
# mpich_two_ranks uses (the library is compiled once for both; only pretrain_gpt, test_moe,
# test_backend_ops and the two CUDA benchmark programs are added), then scripts/gpu_rehearsal.sh:
# unpacked in a bare Debian chroot without network, every binary loads and pretrain_gpt trains the
# tiny config on the CPU as one process, and the report says "no GPU".
# Skipped (77) with one line when not root, without MPICH, inside a plain chroot ("/" not a mount
# point: gpu_rehearsal.sh says so), or when no bare system can be made
# (debootstrap or the mirror unavailable, and none cached in /var/cache/libparallel).
#   gpu_rehearsal_test.sh SOURCE_DIR BINARY_DIR CXX_COMPILER
set -euo pipefail
src=$1 bin=$2 cxx=$3
[[ $(id -u) -eq 0 ]] || {
  echo "SKIPPED: the GPU rehearsal needs root (debootstrap, chroot, mount and network namespaces)"
  exit 77
}
command -v mpicc.mpich >/dev/null || {
  echo "SKIPPED: MPICH is not installed (the bundle's MPI; Debian: libmpich-dev mpich)"
  exit 77
}
command -v patchelf >/dev/null || {
  echo "FAILED: patchelf is missing (scripts/install-deps.sh installs it)"
  exit 1
}
t0=$(date +%s)
work=$bin/gpu_rehearsal
rm -rf "$work"
mkdir -p "$work"
bash "$src/tests/scripts/mpich_build.sh" "$src" "$bin" "$cxx" configure
bundle=$(GPU_BUNDLE_CUDA=OFF GPU_BUNDLE_OUT=$work/libparallel-cpu-bundle.tar.gz "$src/scripts/gpu_bundle.sh" "$bin/mpich" \
  2>"$work/bundle.log" | tail -1) || {
  tail -30 "$work/bundle.log"
  echo "FAILED: scripts/gpu_bundle.sh (CPU bundle in $bin/mpich)"
  exit 1
}
t1=$(date +%s)
echo "bundle: $bundle ($(($(stat -c %s "$bundle") / 1024)) KiB) in $((t1 - t0)) s"
bash "$src/scripts/gpu_rehearsal.sh" "$bundle" "$work/out"
echo "rehearsal: $(($(date +%s) - t1)) s"
