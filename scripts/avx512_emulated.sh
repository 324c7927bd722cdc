#!/usr/bin/env bash
# The CPU kernels' AVX-512 code run on a machine without AVX-512 (issue 28):
#   scripts/avx512_emulated.sh BUILD_DIR OUT_DIR [TEST[:GTEST_FILTER] ...]
# boots a Linux guest in Bochs (an x86 emulator that implements AVX-512; QEMU's TCG does not),
# emulating a Skylake-X or a Sapphire Rapids, and runs the named gtest binaries of BUILD_DIR there, one
# process each, on one emulated core. The dispatchers then pick what an AVX-512 machine picks: the
# avx512f clones of the element-wise kernels, AdamW, the norms, cross-entropy, conversions and
# initialisation, oneDNN's avx512_core GEMMs, the x86-64-v4 dropout masks. With no TEST, the tests
# that cover those paths run.
#
# AVX512_EMU_CPU is the emulated CPU, one of two:
#   corei7_skylake_x (the default)  AVX-512F/CD/BW/DQ/VL: Debian 12's Bochs 2.7 (bochs-bin) and Debian
#                                   12's cloud kernel (6.1, fetched once with apt-get download);
#   sapphire_rapids                 AVX512-BF16 and AVX512-FP16 too: the Bochs 3 and the Debian 13
#                                   kernel that scripts/setup_spr_emulator.sh puts into the cache. The
#                                   bf16 attention's dot-product kernel (kernels/cpu/attention_bf16.cpp),
#                                   oneDNN's avx512_core_bf16 GEMMs and the peak probe's FP16 and BF16
#                                   loops run there. AMX does not: Bochs 3.0 has no XFD, without which
#                                   Linux grants no tile state (the peak probe prints the refusal).
# AVX512_EMU_BOCHS overrides the emulator binary. Timings inside the guest mean nothing.
#
# BUILD_DIR must be a build without CUDA (-DPARALLEL_WITH_CUDA=OFF): the guest's initramfs carries every
# library a test loads, and the CUDA libraries alone are over a gigabyte.
#
# Needs: bochs, bochsbios, vgabios, bochs-term, busybox-static, isolinux, syslinux-common, xorriso,
# cpio (scripts/install-deps.sh --with-avx512-emulator), script (util-linux), and a Debian cloud
# kernel image, fetched once with apt-get download (from this machine's own apt sources) into
# $AVX512_EMU_CACHE (default /var/cache/libparallel).
# AVX512_EMU_JOBS guests run side by side (default: the number of cores); AVX512_EMU_TIMEOUT is one
# guest's wall-clock limit in seconds (default 3600).
# Exit status: 0 every test passed (gtest's own skips count as passes), 1 a test failed or a guest
# did not finish, 2 usage, 77 skipped (a tool or the kernel image unavailable), with one line saying why.
set -euo pipefail

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "avx512_emulated: FAILED: $*"
  exit 1
}

[[ $# -ge 2 ]] || {
  echo "usage: scripts/avx512_emulated.sh BUILD_DIR OUT_DIR [TEST[:GTEST_FILTER] ...]" >&2
  exit 2
}
build=$(readlink -f "$1")
out=$(mkdir -p "$2" && readlink -f "$2")
shift 2
tests=("$@")
jobs=${AVX512_EMU_JOBS:-$(nproc)}
cpu_model=${AVX512_EMU_CPU:-corei7_skylake_x}
limit=${AVX512_EMU_TIMEOUT:-3600}
cache=${AVX512_EMU_CACHE:-/var/cache/libparallel}
if [[ $cpu_model == corei7_skylake_x ]]; then
  bochs=${AVX512_EMU_BOCHS:-bochs-bin}
  kernel_dir=$cache
  kernel_args=""
else
  # Bochs 3.0 fails the return from system-management mode (the BIOS's SMIs) of a guest running
  # 5-level paging, which its newer models offer; Debian 13's kernel can be told not to use it.
  bochs=${AVX512_EMU_BOCHS:-$cache/bochs/bin/bochs}
  kernel_dir=$cache/trixie
  kernel_args="no5lvl"
fi

for tool in "$bochs" busybox xorriso cpio script apt-get dpkg-deb ldd; do
  command -v "$tool" >/dev/null ||
    skip "$tool is missing (the packages at the top of this script; for sapphire_rapids, scripts/setup_spr_emulator.sh)"
done
for f in /usr/share/bochs/BIOS-bochs-latest /usr/share/vgabios/vgabios.bin /usr/lib/ISOLINUX/isolinux.bin \
  /usr/lib/syslinux/modules/bios/ldlinux.c32; do
  [[ -f $f ]] || skip "$f is missing (bochsbios, vgabios, isolinux, syslinux-common)"
done
# (The emulator's lists are read whole: grep -q closing the pipe early would fail it under pipefail.)
models=$("$bochs" --help cpu 2>&1 || true)
grep -q -x -F "$cpu_model" <<<"$models" ||
  skip "$bochs does not emulate the CPU model $cpu_model ($bochs --help cpu lists those it does)"
usage=$("$bochs" --help 2>&1 || true)
bochs_version=$(sed -n 's/.*Bochs x86 Emulator \([0-9][0-9.]*\).*/\1/p' <<<"$usage" | head -1)
if [[ ${#tests[@]} -eq 0 ]]; then
  # Each covers code with an avx512f (or x86-64-v4) clone or an AVX-512 dispatch; the last four run
  # whole models (one rank) against the single-rank and PyTorch references.
  tests=(test_dtype test_hardware_peak test_init test_tensor test_adamw test_adamw_fused
         test_bf16_kernels_exact test_attention_tiles test_init_vectorised test_pair_reduce
         test_multi_tensor test_ops test_fused_passes test_attention test_backend_ops
         test_step_conversions test_mixed_precision test_gpt_parity test_pytorch_parity)
  # Bochs 2.7's F16C conversion does not round ties to even (the guest's own probe, "f16c ties" in
  # the report, shows it; Bochs 3.0 does): under it the fp16 cases that round weights or sums to
  # fp16 are left out. Those paths are F16C code that AVX2 machines run too.
  if [[ ${bochs_version%%.*} -lt 3 ]]; then
    tests=("${tests[@]/#test_adamw_fused/test_adamw_fused:-*Fp16*}")
    tests=("${tests[@]/#test_pair_reduce/test_pair_reduce:-*Fp16*}")
    tests=("${tests[@]/#test_backend_ops/test_backend_ops:-*adamw_update*fp16*}")
  fi
fi
busybox_bin=$(command -v busybox)
# ldd fails on a static executable.
if ldd "$busybox_bin" >/dev/null 2>&1; then skip "$busybox_bin is not static (busybox-static)"; fi
[[ -f $build/CMakeCache.txt ]] || fail "$build is not a CMake build directory"
if [[ -n $(find "$build/lib" -name 'libparallel.so*' -exec ldd {} + 2>/dev/null | grep -m1 libcudart) ]]; then
  fail "$build links CUDA: configure a build with -DPARALLEL_WITH_CUDA=OFF for the guest"
fi
for t in "${tests[@]}"; do
  [[ -x $build/bin/${t%%:*} ]] || fail "no $build/bin/${t%%:*} (build it first)"
done
source_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
[[ -d $source_dir/tests/reference ]] || fail "no checkout at $source_dir (from $build/CMakeCache.txt)"

# ---- the guest kernel: Debian's cloud image (serial console, initramfs, no modules needed) --------
mkdir -p "$cache"
kernel=$(ls "$kernel_dir"/vmlinuz-*-cloud-amd64 2>/dev/null | sort -V | tail -1 || true)
if [[ -z $kernel ]]; then
  [[ $kernel_dir == "$cache" ]] || skip "no kernel in $kernel_dir: run scripts/setup_spr_emulator.sh first"
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [[ -n $pkg ]] || skip "apt knows no linux-image-cloud-amd64 (no Debian apt sources on this machine)"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1) || { rm -rf "$tmp"; skip "apt-get download $pkg failed (no mirror reachable)"; }
  dpkg-deb -x "$tmp"/*.deb "$tmp/x"
  cp "$tmp"/x/boot/vmlinuz-* "$cache/"
  rm -rf "$tmp"
  kernel=$(ls "$cache"/vmlinuz-*-cloud-amd64 | sort -V | tail -1)
fi

# ---- one initramfs per guest: busybox, the tests, every library they load -------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# What the emulator gets wrong that the hardware does not: F16C's rounding of halfway cases, which
# the hardware rounds to even (1 + 2^-11 -> 0x3c00; 2^-13 + 2^-24 -> 0x0800).
cat >"$work/f16c_ties.c" <<'EOF'
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
__attribute__((target("f16c"))) static unsigned short to_f16(float x) { return _cvtss_sh(x, 0); }
int main(void) {
  volatile float one = 1.0f;  // computed at run time, in the guest
  const unsigned short a = to_f16(one + ldexpf(one, -11)), b = to_f16(ldexpf(one, -13) + ldexpf(one, -24));
  printf("=== f16c ties: 1+2^-11 -> 0x%04x, 2^-13+2^-24 -> 0x%04x: %s\n", a, b,
         a == 0x3c00 && b == 0x0800 ? "to even, as the hardware" : "NOT to even (the hardware rounds to even)");
  return 0;
}
EOF
command -v gcc >/dev/null || skip "gcc is missing (for the guest's F16C probe)"
gcc -O1 -static -o "$work/f16c_ties" "$work/f16c_ties.c" -lm || skip "no static C library (libc6-dev) for the guest's probe"
deps=$(for t in "${tests[@]}"; do ldd "$build/bin/${t%%:*}"; done)
! grep -q 'not found' <<<"$deps" || fail "a test has a library ldd cannot find"
libs=$(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$deps" | sort -u)
# A test that links Open MPI runs as a singleton (one rank, no mpirun): the guest needs the
# components Open MPI opens at run time, their libraries and its help texts.
ompi_dirs=()
if grep -q '/libmpi\.so' <<<"$libs"; then
  for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi; do [[ -d $d ]] && ompi_dirs+=("$d"); done
  libs=$(
    echo "$libs"
    find /usr/lib/x86_64-linux-gnu/openmpi -name '*.so' -exec ldd {} \; 2>/dev/null |
      awk '$2 == "=>" && $3 ~ /^\// {print $3}'
  )
  libs=$(sort -u <<<"$libs")
fi

guests=$((jobs < ${#tests[@]} ? jobs : ${#tests[@]}))
for ((g = 0; g < guests; g++)); do
  root=$work/root$g
  mkdir -p "$root"/{bin,proc,sys,dev,tmp,t}
  cp "$busybox_bin" "$root/bin/busybox"
  cp "$work/f16c_ties" "$root/bin/"
  for a in sh mount poweroff cat echo grep sort tr timeout sync; do ln -s busybox "$root/bin/$a"; done
  for l in $libs; do cp -L --parents "$l" "$root/"; done
  for d in "${ompi_dirs[@]}"; do mkdir -p "$root${d%/*}" && cp -a "$d" "$root${d%/*}/"; done
  # The tests' fixtures and configs, found through PARALLEL_SOURCE_DIR as under ctest.
  mkdir -p "$root/src/tests"
  cp -r "$source_dir/tests/reference" "$source_dir/tests/data" "$root/src/tests/"
  cp -r "$source_dir/configs" "$root/src/"
  # Round-robin, so both guests get a share of the cheap and the slow tests.
  : >"$root/tests"
  for ((i = g; i < ${#tests[@]}; i += guests)); do
    t=${tests[$i]}
    cp "$build/bin/${t%%:*}" "$root/t/"
    echo "$t" >>"$root/tests"
  done
  cat >"$root/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
export PATH=/bin HOME=/tmp TMPDIR=/tmp OMP_NUM_THREADS=1 PARALLEL_SOURCE_DIR=/src
# Open MPI singletons without a server process, as root, over shared memory only.
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
cd /tmp
echo "=== guest cpu: $(grep -o -w -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
/bin/f16c_ties
for t in $(cat /tests); do
  name=${t%%:*}
  filter=*
  [ "$name" != "$t" ] && filter=${t#*:}
  echo "=== test $t start"
  /t/$name --gtest_brief=1 --gtest_color=no "--gtest_filter=$filter" </dev/null
  echo "=== test $t rc=$?"
done
echo "=== guest done"
sync
poweroff -f
EOF
  chmod +x "$root/init"
  iso=$work/iso$g
  mkdir -p "$iso/isolinux"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$iso/isolinux/initrd.gz"
  cp "$kernel" "$iso/isolinux/vmlinuz"
  cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$iso/isolinux/"
  # clearcpuid=321,323 (XSAVEC, XSAVES): Bochs 2.7 reports the standard-format size for the compacted
  # XSAVE format, so a Linux that uses the compacted one (6.0 and later) finds the sizes inconsistent
  # and turns XSAVE off, AVX-512 with it. Under Bochs 3.0 as a Sapphire Rapids, Debian 13's kernel
  # takes a general protection fault in fpu__init_cpu_xstate, probably at XSETBV: Bochs has no XFD,
  # so Linux drops the AMX tile data but keeps the tile configuration, a pair XCR0 refuses. Without
  # XSAVES, Linux drops AMX altogether (XFD depends on it). The standard format works in both.
  cat >"$iso/isolinux/isolinux.cfg" <<EOF
default linux
prompt 0
timeout 0
label linux
  kernel vmlinuz
  append initrd=initrd.gz console=ttyS0,115200 loglevel=4 nokaslr mitigations=off clearcpuid=321,323 lpj=2000000 rdinit=/init${kernel_args:+ $kernel_args}
EOF
  xorriso -as mkisofs -quiet -o "$work/guest$g.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat -no-emul-boot \
    -boot-load-size 4 -boot-info-table "$iso" 2>/dev/null
  rm -rf "$iso"
  # vga update_freq=1: the terminal display otherwise redraws often enough to slow the guest tenfold.
  cat >"$work/bochsrc$g" <<EOF
megs: 2048
cpu: model=$cpu_model, count=1, ips=50000000, reset_on_triple_fault=0
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/vgabios/vgabios.bin
vga: extension=none, update_freq=1
ata0: enabled=1, ioaddr1=0x1f0, ioaddr2=0x3f0, irq=14
ata0-master: type=cdrom, path=$work/guest$g.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=$out/guest$g.serial
display_library: term
clock: sync=none, time0=local
log: $out/guest$g.bochs.log
panic: action=fatal
error: action=ignore
info: action=ignore
debug: action=ignore
EOF
done

# ---- run the guests -------------------------------------------------------------------------------
# A Bochs with its debugger built in (Debian's bochs-bin) stops at a prompt first: -rc feeds it "c".
# The terminal display wants a terminal, which script(1) provides. The guest's power-off ends Bochs
# (ACPI soft off is a "panic" to Bochs, fatal by the settings above).
printf 'c\nquit\n' >"$work/continue"
rc_args=""
if grep -q -e '^ *-rc ' <<<"$usage"; then rc_args="-rc $work/continue"; fi
start=$(date +%s)
pids=()
for ((g = 0; g < guests; g++)); do
  rm -f "$out/guest$g.serial"
  (cd "$work" && script -qfc "timeout -s KILL $limit $bochs -q $rc_args -f $work/bochsrc$g" /dev/null \
    >"$out/guest$g.terminal" 2>&1 </dev/null || true) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "avx512_emulated: $guests guest(s) ran in $(($(date +%s) - start)) s"
if grep -q '^PARALLEL_EMULATE_AVX512_BF16:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "bf16 attention: the AVX512-BF16 kernel, its two instructions spelled in AVX-512F (PARALLEL_EMULATE_AVX512_BF16=ON)"
elif grep -a -q -w avx512_bf16 "$out/guest0.serial" 2>/dev/null; then
  echo "bf16 attention: the AVX512-BF16 kernel, on the emulated CPU's own AVX512-BF16 instructions"
else
  echo "bf16 attention: widened to fp32 (the guest has no AVX512-BF16; -DPARALLEL_EMULATE_AVX512_BF16=ON runs the bf16 kernel)"
fi

# ---- the report -----------------------------------------------------------------------------------
status=0
for ((g = 0; g < guests; g++)); do
  [[ -f $out/guest$g.serial ]] || {
    echo "guest $g: no serial output (see $out/guest$g.bochs.log)"
    status=1
    continue
  }
  serial=$work/serial$g
  tr -d '\r' <"$out/guest$g.serial" >"$serial"
  grep -a -E '^=== (guest cpu|f16c ties):' "$serial" | sed "s/^=== /guest $g: /" || true
  grep -a -q 'avx512f' "$serial" || {
    echo "guest $g: the guest reports no avx512f: nothing AVX-512 ran"
    status=1
  }
  while read -r t; do
    rc=$(grep -a -F "=== test $t rc=" "$serial" | tail -1 | sed 's/.*rc=//' || true)
    if [[ -z $rc ]]; then
      echo "  $t: DID NOT FINISH (guest limit ${limit}s)"
      status=1
    elif [[ $rc != 0 ]]; then
      echo "  $t: FAILED (exit $rc)"
      status=1
    elif awk -v s="=== test $t start" -v e="=== test $t rc=" \
      'index($0, s) == 1 {on = 1} on && /\] 0 tests from 0 test suites ran/ {n = 1} index($0, e) == 1 {on = 0} END {exit !n}' \
      "$serial"; then
      echo "  $t: NO TEST matched the filter"
      status=1
    else
      echo "  $t: passed"
    fi
  done <"$work/root$g/tests"
  grep -a -q '^=== guest done' "$serial" || { echo "guest $g: did not reach the end"; status=1; }
done
exit $status
