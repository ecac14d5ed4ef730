#!/usr/bin/env bash
# Boots real bubblewrap guests with the embedded default rootfs (a read-only
# view of this host), shows their events, and stops them in order. The first
# run shows the whole boot contract: the private bootstrap file,
# oac-sandbox-io and the daemon as 1000:1000, health, ready, stop. The real
# oac-sandbox-io and daemon are not part of this repository: the demo
# installs the TEST FIXTURES from e2e/internal/standin in their place. The
# second run shows egress: one request allowed to a loopback upstream this
# script starts (no internet needed), one refused by policy.
set -euo pipefail
bin=${1:-bin}
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
pwdir=$(mktemp -d)
trap 'rm -rf "$pwdir"' EXIT
chmod 0755 "$pwdir"
echo "== oac-shim check"
$sudo "$bin/oac-shim" check || true
echo
echo "== oac-shim run --provider bwrap --name demo --bootstrap examples/demo-bootstrap.json"
echo "     --tenant ... --environment ... --allocation ...   (the identity the sandbox_io resource must name)"
echo "     --sandbox-io $bin/fixtures/sandbox-io-standin      (stand-in installed as /usr/local/bin/oac-sandbox-io)"
echo "     --install oac-daemon-standin=$bin/fixtures/daemon-standin --password-file ... --timeout 3s"
echo "   (events on stdout, one JSON object per line; diagnostics on stderr)"
$sudo "$bin/oac-shim" run --provider bwrap --name demo \
  --bootstrap examples/demo-bootstrap.json \
  --tenant 0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21 \
  --environment 1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32 \
  --allocation 2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43 \
  --sandbox-io "$bin/fixtures/sandbox-io-standin" \
  --install "oac-daemon-standin=$bin/fixtures/daemon-standin" \
  --password-file "$pwdir/password" --timeout 3s
echo
echo "== the daemon's password was generated for this start and handed over in a 0600 file, never in an event:"
$sudo stat -c '   %n: mode %a, %s bytes' "$pwdir/password"
echo "   its SHA-256 (compare with the daemon's password-sha256 line above): $($sudo sha256sum "$pwdir/password" | cut -d' ' -f1)"
echo
echo "== what you saw: the agent wrote /home/runtime/sandbox-io-bootstrap.json (0600, 1000:1000, in a 0700 dir),"
echo "   started oac-sandbox-io (empty environment, uid/gid 1000, own session, no-new-privs) and the daemon,"
echo "   reported 'bootstrap complete', polled GET /global/health with Basic auth until it answered 200,"
echo "   reported ready with the URL and username, and on the time limit stopped both in order (exit codes 0)."
echo

# Egress: a loopback HTTP server on the host stands in for an upstream.
upfifo=$(mktemp -u)
mkfifo "$upfifo"
"$bin/demo-upstream" --listen 127.0.0.1:0 >"$upfifo" &
uppid=$!
trap 'kill "$uppid" 2>/dev/null || true; rm -rf "$upfifo" "$pwdir"' EXIT
read -r upaddr <"$upfifo"
events=$(mktemp)
trap 'kill "$uppid" 2>/dev/null || true; rm -rf "$upfifo" "$events" "$pwdir"' EXIT
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
echo

# Ingress and the control API: a parent in one line of shell (docs/events-and-control.md).
port=$(shuf -i 20000-40000 -n 1)
echo "== ingress: --forward 127.0.0.1:$port=4096 --control stdin: the parent curls the daemon through the forward"
echo "   with its Basic auth (the password from --password-file), asks for the status, and stops the sandbox"
rm -f "$pwdir/password"
( until curl -sf -u "runtime:$($sudo cat "$pwdir/password" 2>/dev/null)" "http://127.0.0.1:$port/global/health" >&2; do sleep 0.2; done
  echo >&2; echo '{"id":"1","cmd":"status"}'; echo '{"id":"2","cmd":"stop"}' ) |
  $sudo "$bin/oac-shim" run --provider bwrap --name demo-ingress --bootstrap examples/demo-bootstrap.json \
    --tenant 0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21 --environment 1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32 \
    --allocation 2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43 --sandbox-io "$bin/fixtures/sandbox-io-standin" \
    --install "oac-daemon-standin=$bin/fixtures/daemon-standin" \
    --password-file "$pwdir/password" --forward "127.0.0.1:$port=4096" --control stdin |
  grep -E '"event":"(state|forward|answer)"' || true
