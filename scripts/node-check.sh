#!/usr/bin/env bash
# Checks, before make test starts its long parts, for what apt cannot give:
# Node.js 20 or newer and npm, which the TypeScript client's tests need
# (Debian 12's archive has Node.js 18). With CI=true a missing one fails
# here; otherwise it warns and ts-test skips later.
set -euo pipefail
problem=""
if ! command -v node >/dev/null 2>&1; then
  problem="Node.js is not installed"
elif [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  problem="Node.js $(node --version) is older than 20"
elif ! command -v npm >/dev/null 2>&1; then
  problem="npm is not installed"
fi
[ -z "$problem" ] && exit 0
fix="install Node.js 20 or newer with npm (Debian 13: apt-get install nodejs npm; the archives of Debian 12 and Ubuntu 24.04 have 18, so there use a Node.js 20 package your distribution or organisation provides)"
if [ "${CI:-}" = true ]; then
  echo "test-deps: $problem: $fix" >&2
  exit 1
fi
echo "test-deps: warning: $problem; the TypeScript client's tests will be skipped: $fix" >&2
