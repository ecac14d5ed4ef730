#!/usr/bin/env bash
# Fetches Debian's cloud kernel into a cache for VM tests and the demo, without
# installing it: apt-get download of the versioned package the metapackage
# depends on, dpkg-deb -x, depmod -b. A no-op when the cache is complete.
#
# Usage: scripts/kernel.sh [CACHE_DIR] [ARCH]   (defaults .cache/kernel, amd64)
# ARCH is a Debian architecture (amd64, arm64). A foreign one is added with
# dpkg --add-architecture first (as root), the same package is fetched for it.
# Result: CACHE_DIR/vmlinuz, CACHE_DIR/modules (a symlink to the
# lib/modules/VERSION tree, with modules.dep), CACHE_DIR/version, CACHE_DIR/arch.
set -euo pipefail
cache=${1:-.cache/kernel}
arch=${2:-amd64}
meta=${OAC_KERNEL_PACKAGE:-linux-image-cloud-$arch}
if [ -f "$cache/version" ] && [ -e "$cache/vmlinuz" ] && [ -f "$cache/modules/modules.dep" ]; then
  exit 0
fi
case "$arch" in
  amd64 | arm64) ;;
  *) echo "kernel: architecture $arch: want amd64 or arm64" >&2; exit 2 ;;
esac
for tool in apt-get apt-cache dpkg dpkg-deb depmod; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "kernel: $tool not found; on Debian or Ubuntu run make deps (kmod provides depmod)" >&2; exit 1; }
done
step() { echo "kernel [$arch]: $*" >&2; }
sudo=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
native=$(dpkg --print-architecture)
qual=""
if [ "$arch" != "$native" ]; then
  qual=":$arch"
  if ! { echo "$native"; dpkg --print-foreign-architectures; } | grep -qx "$arch"; then
    step "adding the $arch architecture to dpkg (dpkg --add-architecture $arch; apt-get update)"
    $sudo dpkg --add-architecture "$arch"
    $sudo apt-get update -qq >/dev/null
  fi
fi
resolve() { apt-cache depends "$meta$qual" 2>/dev/null | awk '/Depends: linux-image-/ {sub(/:.*/, "", $2); print $2; exit}'; }
step "resolving the kernel behind $meta$qual"
pkg=$(resolve)
if [ -z "$pkg" ]; then
  # A fresh machine may have no package lists yet.
  step "no package lists for it yet: apt-get update"
  $sudo apt-get update -qq >/dev/null 2>&1 || true
  pkg=$(resolve)
fi
if [ -z "$pkg" ]; then
  echo "kernel: cannot resolve the kernel package behind $meta$qual; run apt-get update (as root) and retry" >&2
  exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/oac-kernel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 0777 "$tmp" # apt-get download runs as _apt when it can
size=$(apt-cache show "$pkg$qual" 2>/dev/null | awk '/^Size:/ {printf "%.0f MB", $2/1e6; exit}')
step "downloading $pkg$qual (${size:-size unknown}) with apt-get download"
start=$(date +%s)
(cd "$tmp" && apt-get download "$pkg$qual" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || {
  echo "kernel: apt-get download $pkg$qual failed; run apt-get update and check the network" >&2; exit 1; }
deb=$(ls "$tmp"/*.deb)
step "downloaded $(du -h "$deb" | cut -f1) in $(($(date +%s) - start))s; unpacking"
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
step "running depmod for $version"
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
echo "$arch" >"$out/arch"
mkdir -p "$(dirname "$cache")"
rm -rf "$cache"
mv "$out" "$cache"
step "$pkg ($version) cached in $cache"
