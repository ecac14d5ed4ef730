#!/usr/bin/env bash
# Proves the npm package of clients/typescript is publishable: `npm pack`
# (prepack builds it and copies LICENSE and NOTICE in), then a scratch
# project installs the tarball and imports it from ESM and from CommonJS,
# type-checked with tsc against the package's own types, and runs both.
# Installs nothing but the tarball (the client has no runtime
# dependencies); tsc and @types/node come from the client's development
# dependencies (npm ci). Usage: scripts/npm-pack-test.sh
set -euo pipefail
client=$(cd "$(dirname "$0")/../clients/typescript" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$client"
[ -d node_modules/typescript ] || npm ci --no-audit --no-fund --loglevel=error
npm pack --silent --pack-destination "$tmp" >/dev/null
tgz=$(ls "$tmp"/*.tgz)
echo "npm-pack-test: $(basename "$tgz")"

# What the tarball holds: the compiled client, its types, the licenses; no
# tests, no sources of the build.
listing=$(tar tzf "$tgz" | sort)
for want in package/LICENSE package/NOTICE package/README.md package/package.json package/dist/src/index.js package/dist/src/index.d.ts; do
  grep -qx "$want" <<<"$listing" || { echo "npm-pack-test: $want missing from the tarball" >&2; exit 1; }
done
if grep -q -e '^package/dist/test/' -e '^package/src/' -e '^package/test/' <<<"$listing"; then
  echo "npm-pack-test: tests or sources in the tarball:" >&2; grep -e test/ -e /src/ <<<"$listing" | grep -v dist/src >&2; exit 1
fi
tar xzf "$tgz" -C "$tmp" package/package.json
node -e '
const p = require(process.argv[1]);
const fail = (m) => { console.error("npm-pack-test: package.json: " + m); process.exit(1); };
if (p.private) fail("private");
if (p.license !== "Apache-2.0") fail("license " + p.license);
if (!p.name.startsWith("@")) fail("not scoped: " + p.name);
if (!Number.isInteger(p.oac?.schemaVersion)) fail("no oac.schemaVersion");
' "$tmp/package/package.json"

# The scratch project: ESM (.mts) and CommonJS (.cts, and plain .cjs).
mkdir -p "$tmp/proj"
cd "$tmp/proj"
cat > package.json <<'JSON'
{"name": "scratch", "version": "1.0.0", "private": true}
JSON
npm install --no-audit --no-fund --loglevel=error "$tgz"
cat > esm.mts <<'TS'
import { SCHEMA_VERSION, SchemaVersionError, findBinary } from '@oac/sandbox-agent-client';
import type { Event } from '@oac/sandbox-agent-client';
const v: number = SCHEMA_VERSION;
// @ts-expect-error: the types are the package's own (a string is no schema version)
const wrong: string = SCHEMA_VERSION;
const e: Event | undefined = undefined;
console.log(`esm ${v} ${typeof SchemaVersionError} ${findBinary('oac-shim', '/x')} ${String(e)} ${typeof wrong}`);
TS
cat > cjs.cts <<'TS'
import { SCHEMA_VERSION, SchemaVersionError, findBinary } from '@oac/sandbox-agent-client';
const v: number = SCHEMA_VERSION;
// @ts-expect-error: the types are the package's own
findBinary('not-a-binary', undefined);
console.log(`cjs ${v} ${typeof SchemaVersionError} ${findBinary('oac-shim', '/x')}`);
TS
cat > plain.cjs <<'JS'
const c = require('@oac/sandbox-agent-client');
console.log(`require ${c.SCHEMA_VERSION} ${typeof c.Sandbox}`);
JS
cat > tsconfig.json <<JSON
{"compilerOptions": {"module": "nodenext", "moduleResolution": "nodenext", "target": "ES2022", "strict": true,
  "outDir": "out", "typeRoots": ["$client/node_modules/@types"], "types": ["node"], "skipLibCheck": false},
 "files": ["esm.mts", "cjs.cts"]}
JSON
"$client/node_modules/.bin/tsc" -p .
grep -q 'require("@oac/sandbox-agent-client")' out/cjs.cjs || { echo "npm-pack-test: cjs.cts did not compile to require()" >&2; exit 1; }
want=$(node -p 'require(process.argv[1]).oac.schemaVersion' "$tmp/package/package.json")
got=$(node out/esm.mjs; node out/cjs.cjs; node plain.cjs)
expect="esm $want function /x undefined number
cjs $want function /x
require $want function"
if [ "$got" != "$expect" ]; then
  echo "npm-pack-test: the scratch project printed" >&2; echo "$got" >&2; echo "want" >&2; echo "$expect" >&2; exit 1
fi
echo "npm-pack-test: ok (ESM, CommonJS and types; schema version $want)"
