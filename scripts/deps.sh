#!/usr/bin/env bash
# Installs the Debian packages the project needs when they are missing.
# Usage: scripts/deps.sh PACKAGE... ; a no-op when every package is present.
set -euo pipefail
missing=()
for p in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ! command -v go >/dev/null 2>&1; then
  echo "deps: Go is not on PATH; install Go 1.26.8 or newer (go.mod requires it) (https://go.dev/doc/install) and retry" >&2
  exit 1
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "deps: need root to run: apt-get install -y ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
