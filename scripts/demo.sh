#!/usr/bin/env bash
# Boots a real bubblewrap guest with the embedded default rootfs (a read-only
# view of this host), shows its events, and stops it in order.
set -euo pipefail
bin=${1:-bin}
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "== oac-shim check"
$sudo "$bin/oac-shim" check || true
echo
echo "== oac-shim run --provider bwrap --name demo --bootstrap examples/demo-bootstrap.json --timeout 3s"
echo "   (events on stdout, one JSON object per line; diagnostics on stderr)"
$sudo "$bin/oac-shim" run --provider bwrap --name demo \
  --bootstrap examples/demo-bootstrap.json --timeout 3s
echo
echo "== the guest booted, reported ready, ran its daemon as uid 1000 and stopped in order"
