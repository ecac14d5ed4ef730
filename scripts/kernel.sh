#!/usr/bin/env bash
# Fetches Debian's cloud kernel into a cache for VM tests and the demo, without
# installing it: apt-get download of the versioned package the metapackage
# depends on, dpkg-deb -x, depmod -b. A no-op when the cache is complete.
#
# Usage: scripts/kernel.sh [CACHE_DIR] (default .cache/kernel)
# Result: CACHE_DIR/vmlinuz, CACHE_DIR/modules (a symlink to the
# lib/modules/VERSION tree, with modules.dep), CACHE_DIR/version.
set -euo pipefail
cache=${1:-.cache/kernel}
meta=${OAC_KERNEL_PACKAGE:-linux-image-cloud-amd64}
if [ -f "$cache/version" ] && [ -e "$cache/vmlinuz" ] && [ -f "$cache/modules/modules.dep" ]; then
  exit 0
fi
for tool in apt-get apt-cache dpkg-deb depmod; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "kernel: $tool not found; on Debian or Ubuntu run make deps (kmod provides depmod)" >&2; exit 1; }
done
resolve() { apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}'; }
pkg=$(resolve)
if [ -z "$pkg" ]; then
  # A fresh machine may have no package lists yet.
  sudo=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  $sudo apt-get update -qq >/dev/null 2>&1 || true
  pkg=$(resolve)
fi
if [ -z "$pkg" ]; then
  echo "kernel: cannot resolve the kernel package behind $meta; run apt-get update (as root) and retry" >&2
  exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/oac-kernel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp" # apt-get download runs as _apt when it can
echo "kernel: downloading $pkg with apt-get download" >&2
(cd "$tmp" && apt-get download -qq "$pkg") || {
  echo "kernel: apt-get download $pkg failed; run apt-get update and check the network" >&2; exit 1; }
deb=$(ls "$tmp"/*.deb)
mkdir -p "$tmp/root"
dpkg-deb -x "$deb" "$tmp/root"
moddir=""
for d in "$tmp"/root/lib/modules/* "$tmp"/root/usr/lib/modules/*; do
  [ -d "$d" ] && { moddir=$d; break; }
done
[ -n "$moddir" ] || { echo "kernel: $pkg has no lib/modules tree" >&2; exit 1; }
version=$(basename "$moddir")
vmlinuz="$tmp/root/boot/vmlinuz-$version"
[ -f "$vmlinuz" ] || { echo "kernel: $pkg has no boot/vmlinuz-$version" >&2; exit 1; }
# depmod -b wants BASE/lib/modules/VERSION.
base="$tmp/depmod"
mkdir -p "$base/lib/modules"
mv "$moddir" "$base/lib/modules/$version"
depmod -b "$base" "$version"
out="$tmp/out"
mkdir -p "$out/lib/modules"
mv "$base/lib/modules/$version" "$out/lib/modules/$version"
ln -s "lib/modules/$version" "$out/modules"
mv "$vmlinuz" "$out/vmlinuz"
echo "$version" >"$out/version"
echo "$pkg" >"$out/package"
mkdir -p "$(dirname "$cache")"
rm -rf "$cache"
mv "$out" "$cache"
echo "kernel: $pkg ($version) cached in $cache" >&2
