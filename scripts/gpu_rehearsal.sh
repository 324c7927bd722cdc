#!/usr/bin/env bash
# The GPU check rehearsed on a bare machine, here (issue 23, item 3):
#   scripts/gpu_rehearsal.sh BUNDLE.tar.gz [OUT_DIR]
# unpacks BUNDLE (made by scripts/gpu_bundle.sh) inside a bare Debian chroot (debootstrap
# --variant=minbase, the release of this machine, from the mirror named in this machine's own apt
# sources: none of our packages, no compiler, no MPI) and runs the bundle's gpu_check.sh there with
# no network (a network namespace of its own), as the GPU machine will. Without a GPU the check
# still loads every binary and trains the tiny config on the CPU as one process (MPI singleton, no
# mpirun); the rehearsal then asserts that
#   - every binary of the bundle loads (ldd resolves every library; each one starts and exits),
#   - pretrain_gpt trained configs/tiny.yaml for its steps on the CPU as one process,
#   - the report says "no GPU" and that is the only reason any GPU step did not run.
# The bare system is made once and cached as a tarball outside the repository
# ($GPU_REHEARSAL_CACHE, default /var/cache/libparallel): later runs unpack it in seconds.
#
# Needs root (chroot, mounts, namespaces). Exit status: 0 passed, 1 failed, 77 skipped (not root,
# "/" not a mount point as in a plain chroot, or no cached system and debootstrap or the mirror
# unavailable), with one line saying why.
set -euo pipefail

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "gpu_rehearsal: FAILED: $*"
  exit 1
}

[[ $# -ge 1 && $# -le 2 ]] || {
  echo "usage: scripts/gpu_rehearsal.sh BUNDLE.tar.gz [OUT_DIR]" >&2
  exit 2
}
bundle=$(readlink -f "$1")
[[ -f $bundle ]] || fail "no bundle at $1 (scripts/gpu_bundle.sh makes one)"
[[ $(id -u) -eq 0 ]] || skip "the GPU rehearsal needs root (debootstrap, chroot, mount and network namespaces)"
for tool in unshare chroot mount tar; do
  command -v $tool >/dev/null || skip "$tool is missing (util-linux / coreutils)"
done
# The check's mounts are kept from the machine by making every mount of its namespace private from
# "/" down, which needs "/" to be a mount point. Inside a plain chroot it is not, and unshare stops
# with "cannot change root filesystem propagation".
awk '$5 == "/" {found = 1} END {exit !found}' /proc/self/mountinfo 2>/dev/null ||
  skip "/ is not a mount point here (a chroot?), so the check's mounts cannot be made private"

start=$(date +%s)
# ---- the bare system: cached tarball, else debootstrap ---------------------------------------
. /etc/os-release
codename=${VERSION_CODENAME:-}
[[ -n $codename ]] || skip "/etc/os-release names no VERSION_CODENAME: not a Debian release debootstrap knows"
cache=${GPU_REHEARSAL_CACHE:-/var/cache/libparallel}
system=$cache/debian-$codename-minbase.tar.gz

# The mirror of this machine's apt sources for the release itself (not -security / -updates):
# one-line sources.list entries and deb822 .sources files alike. Never written anywhere else.
apt_mirror() {
  local f
  if [[ -f /etc/apt/sources.list ]]; then
    awk -v s="$codename" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == s) { print $i; exit } }' /etc/apt/sources.list
  fi
  for f in /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] && awk -v s="$codename" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($(i + 1) == s) { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && awk -v s="$codename" '
      function flush() { if (deb && on && suite_ok && uri != "") { print uri; found = 1 } deb = 0; on = 1; suite_ok = 0; uri = "" }
      BEGIN { on = 1 }
      /^[ \t]*$/ { flush(); if (found) exit; next }
      /^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      /^Enabled:/ { if ($2 == "no") on = 0 }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) suite_ok = 1 }
      END { if (!found) flush() }' "$f"
  done
}

if [[ ! -s $system ]]; then
  if ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || skip "debootstrap is not installed and there is no apt-get"
    apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
      skip "debootstrap is not installed and apt-get could not install it (no network?)"
  fi
  mirror=$(apt_mirror | head -1)
  [[ -n $mirror ]] || skip "no apt source for $codename in /etc/apt/sources.list(.d): no mirror for debootstrap"
  echo "gpu_rehearsal: making a bare Debian $codename (debootstrap --variant=minbase, this machine's mirror) into $system"
  mkdir -p "$cache"
  tmp_root=$(mktemp -d "$cache/debootstrap.XXXXXX")
  if ! debootstrap --variant=minbase "$codename" "$tmp_root/root" "$mirror" >"$tmp_root/debootstrap.log" 2>&1; then
    tail -5 "$tmp_root/debootstrap.log"
    rm -rf "$tmp_root"
    skip "debootstrap of $codename failed (network or mirror unavailable; log above)"
  fi
  rm -rf "$tmp_root/root/var/cache/apt/archives"/*.deb "$tmp_root/root/var/lib/apt/lists"/*_Packages
  tar -czf "$tmp_root/system.tar.gz" -C "$tmp_root/root" .
  mv "$tmp_root/system.tar.gz" "$system"
  rm -rf "$tmp_root"
fi

# ---- the rehearsal ----------------------------------------------------------------------------
work=$(mktemp -d /tmp/gpu_rehearsal.XXXXXX)
# The chroot's mounts live in the check's own mount namespace and vanish with it; never delete
# through one that did not (a bound /dev).
cleanup() {
  if grep -q " $work/" /proc/mounts; then
    echo "gpu_rehearsal: $work still has mounts: left in place" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
root=$work/root
mkdir -p "$root"
tar -xzf "$system" -C "$root"
cp "$bundle" "$root/tmp/bundle.tar"
# What the chroot holds besides the bundle: nothing of ours. Checked so that a cached system that
# somehow got an MPI, a compiler or CUDA into it cannot make the rehearsal pass.
for path in usr/bin/mpirun usr/bin/mpiexec usr/bin/g++ usr/bin/cc usr/local/cuda usr/bin/nvidia-smi; do
  [[ ! -e $root/$path ]] || fail "the cached bare system $system has /$path: delete it to make a fresh one"
done
if grep -qE '^lib(mpi|mpich|dnnl|yaml-cpp|fmt|spdlog|gtest|benchmark)\.so' <<<"$(ls "$root"/usr/lib/x86_64-linux-gnu/)"; then
  fail "the cached bare system $system has one of our libraries: delete it to make a fresh one"
fi

# A CUDA bundle needs the CUDA libraries the GPU machine provides (bundle.json:
# cuda_libraries_needed): this machine's copies (one file each) are mounted read-only where that
# machine has them, NCCL where PyTorch's wheel puts it (site-packages/nvidia/nccl/lib, no Python
# needed to find it) and the rest where the CUDA toolkit does (/usr/local/cuda/lib64), so that the
# check's search through both is rehearsed too.
manifest=$(tar -xOf "$bundle" --wildcards '*/bundle.json' 2>/dev/null || true)
[[ -n $manifest ]] || fail "$bundle holds no bundle.json"
mounts=()
while read -r soname path; do
  [[ -n $soname ]] || continue
  [[ -f $path ]] || fail "the CUDA library $soname the bundle was built with is gone from $path"
  point=/usr/local/cuda/lib64/$soname
  [[ $soname == libnccl* ]] && point=/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/$soname
  mkdir -p "$(dirname "$root$point")"
  : >"$root$point"
  mounts+=("$path" "$point")
done < <(sed -n '/"cuda_libraries_needed"/s/.*{\(.*\)}.*/\1/p' <<<"$manifest" | tr ',' '\n' |
  sed -n 's/^ *"\([^"]*\)": "\([^"]*\)".*/\1 \2/p')
if grep -q '"cuda": "ON"' <<<"$manifest" && ((${#mounts[@]} == 0)); then
  fail "a CUDA bundle that names no CUDA library (bundle.json)"
fi

# The command of docs/gpu.md, inside the chroot, in its own mount and network namespaces (the
# mounts vanish with it; only a loopback device, down): unpack to /tmp, run the check into /out.
cat >"$root/tmp/rehearse.sh" <<'EOF'
#!/bin/sh
set -e
cd /tmp
ls /tmp/*/gpu_check.sh >/dev/null 2>&1 || tar -xf /tmp/bundle.tar -C /tmp
dir=$(ls -d /tmp/*/gpu_check.sh | head -1)
exec "$dir" /out
EOF
chmod +x "$root/tmp/rehearse.sh"
if [[ $bundle == *.xz && ! -x $root/usr/bin/xz ]]; then
  echo "gpu_rehearsal: a bare $codename has no xz: unpacking the .tar.xz outside the chroot (a machine without xz: python3 -m tarfile -e BUNDLE /tmp)"
  tar -xf "$bundle" -C "$root/tmp"
fi
mkdir -p "$root/out"
echo "gpu_rehearsal: running the bundle's gpu_check.sh in the bare chroot, no network"
set +e
unshare --mount --net --fork -- bash -c '
  set -e
  mount --make-rprivate /
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  mount -t sysfs sysfs "$1/sys" 2>/dev/null || true
  root=$1
  shift
  while (($#)); do
    mount --bind "$1" "$root$2"
    mount -o remount,bind,ro "$root$2"
    shift 2
  done
  exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 GPU_CHECK_REHEARSAL=1 /tmp/rehearse.sh
' _ "$root" "${mounts[@]}" >"$work/check.log" 2>&1
rc=$?
set -e
cat "$work/check.log"
out=$root/out
if [[ $# -eq 2 ]]; then
  mkdir -p "$2"
  cp -r "$out"/. "$2"/
fi

# ---- assertions -------------------------------------------------------------------------------
[[ $rc -eq 0 ]] || fail "the bundle's gpu_check.sh exited $rc in the bare chroot (its output above)"
[[ $(wc -l <"$work/check.log") -eq 1 ]] || fail "without a GPU the check must print one line; it printed $(wc -l <"$work/check.log")"
[[ -s $out/results.json && -s $out/report.md ]] || fail "the check wrote no results.json / report.md"
grep -q 'no GPU' "$out/report.md" || fail "report.md does not say 'no GPU'"
# results.json: one step per line, "name", "status", "seconds" (gpu_check.sh writes it so).
status_of() { grep -o "\"name\": \"$1\", \"status\": \"[^\"]*\"" "$out/results.json" | sed 's/.*"status": "//;s/"$//'; }
[[ $(status_of load) == passed ]] || fail "not every binary loads: load step '$(status_of load)' (report.md, load section)"
[[ $(status_of cpu_train) == passed ]] || fail "pretrain_gpt did not train on the CPU: cpu_train step '$(status_of cpu_train)'"
limits=$(sed -n 's/^  "limits_total_s": \([0-9]*\),$/\1/p' "$out/results.json")
[[ -n $limits && $limits -le 360 ]] || fail "the GPU steps' limits add up to ${limits:-?} s, over 360 s (6 minutes)"
grep -q 'cpu_check losses match' "$out/results.json" ||
  fail "the CPU run's losses do not match the bundle's packed CPU reference: $(grep -o '"cpu_check[^"]*"' "$out/results.json")"
others=$(grep -o '"name": "[^"]*", "status": "[^"]*"' "$out/results.json" |
  grep -v '"name": "\(load\|cpu_train\|cuda_libraries\)"' | grep -v '"status": "not run (no GPU)"' || true)
[[ -z $others ]] || fail "GPU steps not run for another reason than 'no GPU': $others"
echo "gpu_rehearsal: passed in $(($(date +%s) - start)) s: GPU step limits $limits s; every binary loads in a bare $codename chroot without network, pretrain_gpt trains the tiny config on the CPU as one process, the report says no GPU"
