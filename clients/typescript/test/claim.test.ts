// What a claim sends, against a stand-in shim (test/fixtures/fake-shim.ts)
// that writes back the claim exactly as it read it: volumes with their
// host directories made absolute here, passed through by SandboxPool, and
// a claim whose volumes the provider cannot mount (unsupported) leaving
// the pool as it was. No guest is booted: the real shim's part of volumes
// is proved by its own tests. Every wait is on an event.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { CommandError, Sandbox, SandboxPool, type ClaimVolume, type PoolEvent } from '../src/index.js';
import { uniqueName } from './helpers.js';

/** An executable that runs the stand-in shim with this Node (the client spawns the shim path directly). */
function fakeShim(t: { after: (f: () => void) => void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'oac-fake-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'oac-shim');
  const script = join(process.cwd(), 'dist', 'test', 'fixtures', 'fake-shim.js');
  writeFileSync(path, `#!/bin/sh\nexec '${process.execPath}' '${script}' "$@"\n`);
  chmodSync(path, 0o755);
  return path;
}

/** The claim command as the shim read it. */
async function claimSeen(sbx: Sandbox): Promise<Record<string, unknown>> {
  const e = await sbx.waitForEvent((e) => e.event === 'log' && e.stream === 'fake/claim', { timeoutMs: 10_000 });
  return JSON.parse((e as { line: string }).line) as Record<string, unknown>;
}

test('a claim sends its volumes, a relative host directory made absolute against this working directory', { skip: process.platform === 'win32' }, async (t) => {
  const sbx = Sandbox.start({ name: uniqueName('claimvol'), shim: fakeShim(t), args: ['--warm'] });
  t.after(() => sbx.kill());
  await sbx.waitFor('warm', { timeoutMs: 10_000 });
  const volumes: ClaimVolume[] = [{ guest: '/home', host: 'tenant/home' }, { guest: '/environment', host: '/srv/env' }];
  const r = await sbx.claim({ bootstrap: { version: 1 }, volumes: volumes as [ClaimVolume, ClaimVolume] }, { timeoutMs: 10_000 });
  assert.equal(r.attempt, 2);
  const seen = await claimSeen(sbx);
  assert.deepEqual(seen.volumes, [{ guest: '/home', host: join(process.cwd(), 'tenant', 'home') }, { guest: '/environment', host: '/srv/env' }]);
  assert.deepEqual(seen.bootstrap, { version: 1 });
  assert.equal(volumes[0]!.host, 'tenant/home', "the caller's volumes are left as given");
  await sbx.waitFor('ready', { attempt: 2, timeoutMs: 10_000 });
  await sbx.stop({ timeoutMs: 10_000 });
});

test('the pool passes a claim\'s volumes through, and a claim without volumes sends none', { skip: process.platform === 'win32' }, async (t) => {
  const pool = new SandboxPool({ start: { shim: fakeShim(t) }, size: 2, namePrefix: 'claimvol' });
  t.after(() => pool.close());
  const withVolumes = await pool.claim({ bootstrap: { version: 1 }, volumes: [{ guest: '/environment', host: '/srv/tenant' }], timeoutMs: 10_000 });
  assert.deepEqual((await claimSeen(withVolumes.sandbox)).volumes, [{ guest: '/environment', host: '/srv/tenant' }]);
  const without = await pool.claim({ bootstrap: { version: 1 }, timeoutMs: 10_000 });
  assert.equal('volumes' in (await claimSeen(without.sandbox)), false, 'no volumes key: the shapes of schema version 8');
  await withVolumes.sandbox.stop({ timeoutMs: 10_000 });
  await without.sandbox.stop({ timeoutMs: 10_000 });
});

test('a claim whose volumes the provider cannot mount (unsupported) leaves the pool as it was: the sandbox back warm, nothing replaced', { skip: process.platform === 'win32' }, async (t) => {
  const seen: PoolEvent[] = [];
  let warmed!: () => void;
  const warm = new Promise<void>((resolve) => (warmed = resolve));
  const pool = new SandboxPool({
    start: { shim: fakeShim(t), args: ['--fake-volumes-unsupported'] },
    size: 2,
    namePrefix: 'claimvol',
    onEvent: (e) => {
      seen.push(e);
      if (seen.filter((x) => x.event === 'warm').length === 2) warmed();
    },
  });
  t.after(() => pool.close());
  await warm;
  await assert.rejects(
    pool.claim({ bootstrap: { version: 1 }, volumes: [{ guest: '/home', host: '/srv/home' }], timeoutMs: 10_000 }),
    (e: unknown) => e instanceof CommandError && e.code === 'unsupported' && !e.retryable,
  );
  assert.equal(pool.stats().warm, 2, 'the refused sandbox is back, the other never tried');
  assert.deepEqual(seen.map((e) => e.event).filter((k) => k !== 'warm'), ['refill', 'refill'], 'no hit, no failure, no refill for it');

  const r = await pool.claim({ bootstrap: { version: 1 }, timeoutMs: 10_000 });
  assert.equal(r.hit, true, 'the same pool serves the claim without volumes');
  await r.sandbox.stop({ timeoutMs: 10_000 });
});
