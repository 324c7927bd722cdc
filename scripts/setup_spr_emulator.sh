#!/usr/bin/env bash
# An emulated Sapphire Rapids (AVX512-BF16, AVX512-FP16) for scripts/avx512_emulated.sh:
#   scripts/setup_spr_emulator.sh [CACHE]
# Debian 12's own Bochs (2.7) stops at Skylake-X, and its 6.1 kernel cannot boot the newer model in
# Bochs (below). This puts two things from Debian 13 (trixie) into CACHE (default $AVX512_EMU_CACHE,
# itself defaulting to /var/cache/libparallel):
#   CACHE/bochs/bin/bochs      Bochs 3.x built from trixie's source package with x86-64, AVX, EVEX
#                              (AVX-512) and AMX, the terminal display and no debugger;
#   CACHE/trixie/vmlinuz-*     trixie's cloud kernel (6.12), which knows no5lvl: Bochs 3.0 fails the
#                              return from system-management mode (the BIOS's SMIs) of a guest that
#                              runs 5-level paging, and the 6.1 kernel cannot turn 5-level paging off.
# Both come from this machine's own Debian mirror (read from apt's configuration) and are checked the
# way apt checks them: the suite's InRelease against the Debian archive keyring, the Sources and
# Packages indexes against InRelease, the tarball and the .deb against those indexes.
# Then: AVX512_EMU_CPU=sapphire_rapids scripts/avx512_emulated.sh BUILD_DIR OUT_DIR ...
# Needs: curl, gpgv, debian-archive-keyring, xz-utils, dpkg-deb, g++, make, libncurses-dev.
# Exit status: 0 set up (or already there), 1 a check or the build failed, 77 skipped (no Debian
# mirror in apt's sources, or a tool missing), with one line saying why.
set -euo pipefail

skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "setup_spr_emulator: FAILED: $*"
  exit 1
}

suite=trixie
cache=${1:-${AVX512_EMU_CACHE:-/var/cache/libparallel}}
mkdir -p "$cache"
cache=$(readlink -f "$cache")
# (Lists are read whole: grep -q closing a pipe early would fail it under pipefail.)
has_spr() { grep -q -x sapphire_rapids <<<"$("$1" --help cpu 2>&1 || true)"; }
have_bochs=0
have_kernel=0
[[ -x $cache/bochs/bin/bochs ]] && has_spr "$cache/bochs/bin/bochs" && have_bochs=1
compgen -G "$cache/$suite/vmlinuz-*-cloud-amd64" >/dev/null && have_kernel=1
if [[ $have_bochs == 1 && $have_kernel == 1 ]]; then
  echo "setup_spr_emulator: $cache/bochs/bin/bochs and $cache/$suite/ are there"
  exit 0
fi
for tool in curl gpgv xz sha256sum dpkg-deb g++ make apt-get; do
  command -v $tool >/dev/null || skip "$tool is missing"
done
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f $keyring ]] || skip "$keyring is missing (debian-archive-keyring)"

# The mirror: the first Debian archive (not debian-security) apt's sources name.
# shellcheck disable=SC2016 # apt's own $(FIELD) syntax
mirror=$(apt-get indextargets --format '$(ORIGIN) $(REPO_URI)' 2>/dev/null |
  awk '$1 == "Debian" && $2 !~ /-security\/?$/ {print $2; exit}')
[[ -n $mirror ]] || skip "apt's sources name no Debian archive"
mirror=${mirror%/}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fetch() { curl -fsS --retry 2 -m 600 -o "$2" "$mirror/$1" || fail "could not fetch $mirror/$1"; }
# sha256_list FILE: "SHA256 NAME" for each file that a Release file or a Sources stanza lists.
sha256_list() {
  awk '/^[A-Za-z0-9-]+:/ {in256 = ($1 == "SHA256:" || $1 == "Checksums-Sha256:")}
    in256 && NF == 3 {print $1, $3}' "$1"
}
# sha256_of FILE NAME: the SHA256 that FILE gives NAME.
sha256_of() { sha256_list "$1" | awk -v name="$2" '$2 == name {print $1}'; }
check() {
  [[ -n $2 ]] || fail "no SHA256 for $1"
  echo "$2  $1" | sha256sum -c --quiet - || fail "$1 does not match its SHA256"
}
# index PATH: an index of the suite (main/source/Sources, main/binary-amd64/Packages), checked and
# unpacked.
index() {
  fetch "dists/$suite/$1.xz" index.xz
  check index.xz "$(sha256_of Release "$1.xz")"
  xz -dc index.xz
  rm index.xz
}
# stanza INDEX PACKAGE: the package's paragraph of an unpacked index.
stanza() { awk -v p="$2" '$0 == "Package: " p {on = 1} on {print} on && /^$/ {exit}' "$1"; }

fetch "dists/$suite/InRelease" InRelease
gpgv --keyring "$keyring" --output Release InRelease 2>gpgv.log || {
  cat gpgv.log
  fail "dists/$suite/InRelease: no good signature from the Debian archive keyring"
}

if [[ $have_kernel == 0 ]]; then
  index main/binary-amd64/Packages >Packages
  # The metapackage names the versioned image (isolinux boots its signed bzImage as any other).
  image=$(stanza Packages linux-image-cloud-amd64 | awk '/^Depends:/ {print $2}' | sed 's/,$//')
  [[ $image == linux-image-*-cloud-amd64 ]] || fail "$suite's linux-image-cloud-amd64 names no kernel image"
  stanza Packages "$image" >kstanza
  deb=$(awk '/^Filename:/ {print $2}' kstanza)
  sha=$(awk '/^SHA256:/ {print $2}' kstanza)
  [[ -n $deb && -n $sha ]] || fail "$suite's Packages has no $image"
  fetch "$deb" kernel.deb
  check kernel.deb "$sha"
  dpkg-deb -x kernel.deb kernel
  mkdir -p "$cache/$suite"
  cp kernel/boot/vmlinuz-*-cloud-amd64 "$cache/$suite/"
  echo "setup_spr_emulator: $cache/$suite/$(basename kernel/boot/vmlinuz-*) ($image)"
fi

if [[ $have_bochs == 0 ]]; then
  index main/source/Sources >Sources
  stanza Sources bochs >stanza
  version=$(awk '/^Version:/ {print $2}' stanza)
  dir=$(awk '/^Directory:/ {print $2}' stanza)
  orig=$(sha256_list stanza | awk '$2 ~ /\.orig\.tar\./ {print $2}')
  [[ -n $version && -n $dir && -n $orig ]] || fail "$suite's Sources has no bochs source package"
  [[ ${version%%.*} -ge 3 ]] || fail "$suite's bochs is $version; AVX512-FP16 needs Bochs 3.0 or later"
  fetch "$dir/$orig" "$orig"
  check "$orig" "$(sha256_of stanza "$orig")"
  tar -xf "$orig"
  src=$(find . -maxdepth 1 -type d -name 'bochs-*' | head -1)
  [[ -n $src ]] || fail "$orig holds no bochs-* directory"
  echo "setup_spr_emulator: Bochs $version from $mirror ($suite), building (a few minutes)"
  cd "$src"
  ./configure --prefix="$cache/bochs" --with-term --with-nogui --without-x11 --without-sdl2 --without-wx \
    --without-rfb --enable-x86-64 --enable-cpu-level=6 --enable-avx --enable-evex --enable-amx --enable-pci \
    --enable-all-optimizations --enable-repeat-speedups --enable-handlers-chaining --enable-trace-linking \
    --disable-docbook >"$work/configure.log" 2>&1 || {
    tail -20 "$work/configure.log"
    fail "configure (libncurses-dev for the terminal display?)"
  }
  make -j"$(nproc)" >"$work/make.log" 2>&1 || {
    tail -20 "$work/make.log"
    fail "make"
  }
  has_spr ./bochs || fail "the built bochs has no sapphire_rapids model"
  mkdir -p "$cache/bochs/bin"
  install -m 755 bochs "$cache/bochs/bin/bochs.new"
  mv "$cache/bochs/bin/bochs.new" "$cache/bochs/bin/bochs"
  echo "setup_spr_emulator: $cache/bochs/bin/bochs (Bochs $version)"
fi
