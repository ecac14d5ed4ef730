#!/usr/bin/env bash
# Boots real bubblewrap guests with the embedded default rootfs (a read-only
# view of this host), shows their events, and stops them in order. The
# second run shows egress: one request allowed to a loopback upstream this
# script starts (no internet needed), one refused by policy.
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
echo

# Egress: a loopback HTTP server on the host stands in for an upstream.
upfifo=$(mktemp -u)
mkfifo "$upfifo"
"$bin/demo-upstream" --listen 127.0.0.1:0 >"$upfifo" &
uppid=$!
trap 'kill "$uppid" 2>/dev/null || true; rm -f "$upfifo"' EXIT
read -r upaddr <"$upfifo"
events=$(mktemp)
trap 'kill "$uppid" 2>/dev/null || true; rm -f "$upfifo" "$events"' EXIT
echo "== egress: demo-upstream listens on $upaddr (host loopback)"
echo "== oac-shim run --name demo-egress --bootstrap examples/demo-egress-bootstrap.json --upstream demo-upstream.test:80=$upaddr --allow '*.example.com:443' --timeout 3s"
echo "   the daemon curls http://demo-upstream.test/hello (a named upstream: allowed)"
echo "   and http://blocked.example.com/ (only port 443 is allowed there: denied with an explicit 403)"
$sudo "$bin/oac-shim" run --provider bwrap --name demo-egress \
  --bootstrap examples/demo-egress-bootstrap.json \
  --upstream "demo-upstream.test:80=$upaddr" --allow "*.example.com:443" --timeout 3s | tee "$events"
echo
echo "== the egress decisions, as events (one per decision, one per close):"
grep -E '"event":"egress' "$events" || true
echo
echo "== what the daemon saw:"
grep -E '"stream":"daemon/stdout"' "$events" | sed -E 's/.*"line":"(.*)"\}$/\1/' || true
