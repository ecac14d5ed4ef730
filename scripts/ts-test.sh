#!/usr/bin/env bash
# Builds and tests the TypeScript client (clients/typescript) against the
# real oac-shim in BIN, booting real bwrap guests. Installs the client's
# development dependencies from the npm registry (npm ci: exactly the
# lockfile), then packs it and imports the tarball from a scratch project
# (scripts/npm-pack-test.sh). With CI=true a missing Node.js 20+ fails; otherwise it skips.
# Usage: scripts/ts-test.sh BIN
set -euo pipefail
bin=$1
need() {
  if [ "${CI:-}" = true ]; then echo "ts-test: missing dependency with CI=true: $*" >&2; exit 1; fi
  echo "ts-test: skipped: $*" >&2; exit 0
}
command -v node >/dev/null 2>&1 || need "Node.js 20 or newer is not installed (https://nodejs.org, or Debian's nodejs)"
command -v npm >/dev/null 2>&1 || need "npm is not installed"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 20 ] || need "Node.js $(node --version) is older than 20"
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../clients/typescript"
npm ci --no-audit --no-fund --loglevel=error
OAC_BIN=$bin npm test
# The package as npm publishes it: packed, installed, imported (ESM, CJS).
"$here/npm-pack-test.sh"
