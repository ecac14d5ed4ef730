// SandboxPool against the real oac-shim and real bwrap guests: claims under
// load (hits, then misses that boot), the refill back to N within the
// bound on concurrent boots, the maximum age (expired ones replaced), and
// close leaving nothing. Every wait is on an event.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { AbortError, CommandError, OacError, SandboxPool, ShimError, list, type PoolEvent, type PoolOptions, type Sandbox } from '../src/index.js';
import { alive, daemon, daemonBootstrap, keepRoot, shimPath, whyNot } from './helpers.js';

let skip = '';
before(() => {
  skip = whyNot();
});

/** The pool's events as they come, and a wait for the one that makes pred true. */
class Recorder {
  readonly seen: PoolEvent[] = [];
  private waiters: Array<() => void> = [];
  readonly on = (e: PoolEvent): void => {
    this.seen.push(e);
    for (const w of this.waiters.splice(0)) w();
  };
  count(kind: PoolEvent['event']): number {
    return this.seen.filter((e) => e.event === kind).length;
  }
  async until(what: string, pred: () => boolean, timeoutMs = 60_000): Promise<void> {
    const deadline = AbortSignal.timeout(timeoutMs);
    while (!pred()) {
      if (deadline.aborted) throw new Error(`not within ${timeoutMs} ms: ${what}; the pool said ${JSON.stringify(this.seen)}`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        deadline.addEventListener('abort', () => resolve(), { once: true });
      });
    }
  }
}

/** The operator's part: bwrap with the daemon stand-in installed; the tenant's comes with each claim. */
function poolOptions(rec: Recorder, more: Partial<PoolOptions> = {}): PoolOptions {
  return {
    start: { shim: shimPath, args: ['--install', `oac-daemon-standin=${daemon}`] },
    size: 2,
    onEvent: rec.on,
    ...more,
  };
}

const tenant = { bootstrap: daemonBootstrap(), forwards: [{ listen: '127.0.0.1:0', guest_port: 4096 }], timeoutMs: 60_000 };

async function answers(sbx: Sandbox): Promise<number> {
  const auth = 'Basic ' + Buffer.from(`runtime:${await sbx.password()}`).toString('base64');
  return (await fetch(`${sbx.url}/global/health`, { headers: { authorization: auth } })).status;
}

test('claims under load: the warm ones are hits (oldest first, with their age), the rest misses that boot; the pool refills to N, never more than maxBoots booting', async (t) => {
  if (skip) return t.skip(skip);
  const rec = new Recorder();
  let pool: SandboxPool | undefined;
  let mostBooting = 0;
  pool = new SandboxPool(poolOptions(rec, {
    maxBoots: 2,
    onEvent: (e) => {
      mostBooting = Math.max(mostBooting, pool?.stats().booting ?? 0);
      rec.on(e);
    },
  }));
  const claimed: Sandbox[] = [];
  try {
    await rec.until('2 warm', () => rec.count('warm') === 2);
    assert.deepEqual(rec.seen.filter((e) => e.event === 'refill').map((e) => e.event === 'refill' && e.reason), ['fill', 'fill']);
    const warmNames = rec.seen.flatMap((e) => (e.event === 'warm' ? [e.name] : []));
    assert.equal(pool.stats().warm, 2);

    // A warm shim holds nothing of a tenant: no bootstrap, no password on its stdin.
    const warmEvent = rec.seen.find((e) => e.event === 'warm')!;
    const argv = readFileSync(`/proc/${warmEvent.event === 'warm' && warmEvent.pid}/cmdline`, 'utf8').split('\0');
    assert.ok(argv.includes('--warm') && !argv.includes('--password-stdin') && !argv.includes('--bootstrap'), argv.join(' '));

    // A claim the shim refuses for its input leaves the sandbox warm in the pool.
    await assert.rejects(pool.claim({ ...tenant, forwards: [{ listen: '0.0.0.0:80', guest_port: 4096 }] }), (e: unknown) => e instanceof CommandError && e.code === 'invalid_argument');
    assert.equal(pool.stats().warm, 2, 'still warm, still in the pool');
    assert.equal(rec.count('refill'), 2, 'nothing to replace');
    // So does a volume the shim's decoder refuses: the volumes reach it.
    await assert.rejects(pool.claim({ ...tenant, volumes: [{ guest: '/home', host: '' }] }), (e: unknown) => e instanceof CommandError && e.code === 'invalid_argument' && /volumes/.test(e.message));
    assert.equal(pool.stats().warm, 2, 'still warm, still in the pool');
    assert.equal(rec.count('refill'), 2, 'nothing to replace');

    // Four claims at once on a pool of two.
    const results = await Promise.all([1, 2, 3, 4].map(() => pool!.claim(tenant)));
    for (const r of results) claimed.push(r.sandbox);
    const hits = results.filter((r) => r.hit);
    const misses = results.filter((r) => !r.hit);
    assert.equal(hits.length, 2, 'the two warm ones');
    assert.equal(misses.length, 2, 'two booted for their claims');
    assert.deepEqual(hits.map((r) => r.sandbox.name), warmNames, 'the oldest warm first');
    for (const r of hits) assert.ok(r.ageMs > 0, 'a hit says how long it was warm');
    for (const r of misses) assert.equal(r.ageMs, 0);
    assert.deepEqual(rec.seen.filter((e) => e.event === 'hit').map((e) => e.name).sort(), hits.map((r) => r.sandbox.name).sort());
    assert.deepEqual(rec.seen.filter((e) => e.event === 'miss').map((e) => e.name).sort(), misses.map((r) => r.sandbox.name).sort());
    assert.deepEqual(pool.stats().hits, 2);
    assert.deepEqual(pool.stats().misses, 2);

    // Each is the caller's and ready: its forward answers to the password made for its claim.
    const passwords = new Set<string>();
    for (const r of results) {
      assert.equal(r.ready.state, 'ready');
      assert.equal(r.ready.attempt, r.claim.attempt);
      assert.match(r.sandbox.url ?? '', /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.equal(await answers(r.sandbox), 200);
      passwords.add(await r.sandbox.password());
      for (const e of r.sandbox.received) assert.ok(!JSON.stringify(e).includes(await r.sandbox.password()), 'no event carries the password');
    }
    assert.equal(passwords.size, 4, 'a password of its own for each claim');

    // The two claimed from the pool are replaced: back to two warm.
    await rec.until('refilled to 2', () => rec.count('warm') === 4 && pool!.stats().warm === 2);
    assert.deepEqual(rec.seen.filter((e) => e.event === 'refill').map((e) => e.event === 'refill' && e.reason), ['fill', 'fill', 'claimed', 'claimed']);
    assert.ok(mostBooting <= 2, `at most maxBoots booting at once (saw ${mostBooting})`);
    assert.ok(mostBooting >= 1);

    for (const s of claimed) {
      const x = await s.stop({ timeoutMs: 20_000 });
      assert.equal(x.status, 0);
      assert.ok(!alive(s.pid!), 'its shim is gone');
    }
  } finally {
    await pool.close();
    for (const s of claimed) await s.kill();
  }
});

test('max age: a warm sandbox stops by itself at its maximum age and is replaced, with events', async (t) => {
  if (skip) return t.skip(skip);
  const rec = new Recorder();
  const maxAgeMs = 1500;
  const pool = new SandboxPool(poolOptions(rec, { size: 1, maxAgeMs }));
  try {
    await rec.until('the first one expired and its replacement warm', () => {
      const i = rec.seen.findIndex((e) => e.event === 'expired');
      return i >= 0 && rec.seen.slice(i).some((e) => e.event === 'warm');
    }, 90_000);
    const first = rec.seen.find((e) => e.event === 'warm')!;
    const expired = rec.seen.find((e) => e.event === 'expired')!;
    assert.ok(expired.event === 'expired' && first.event === 'warm');
    assert.equal(expired.name, first.name, 'the first warm one expired');
    assert.match(expired.message ?? '', /^stopped while warm: warm for its maximum age \(1\.5s\) and never claimed$/);
    assert.ok(expired.ageMs > maxAgeMs / 2, `warm about its maximum age (${expired.ageMs} ms)`);
    assert.ok(!alive(expired.pid!), 'its shim has exited');
    const after = rec.seen.slice(rec.seen.indexOf(expired));
    const replacement = after.find((e) => e.event === 'refill');
    assert.ok(replacement?.event === 'refill' && replacement.reason === 'expired', 'a refill replaces it');
    assert.ok(after.some((e) => e.event === 'warm' && e.name === replacement.name), 'and its replacement is warm');

    // A claim takes a fresh one, younger than the maximum age.
    const r = await pool.claim(tenant);
    try {
      assert.equal(r.hit, true);
      assert.ok(r.ageMs < maxAgeMs);
      assert.equal(await answers(r.sandbox), 200);
    } finally {
      await r.sandbox.stop({ timeoutMs: 20_000 });
    }
  } finally {
    await pool.close();
  }
});

test('close stops every sandbox the pool holds (warm, booting, being claimed) and waits for their shims: nothing is left but the one handed over', async (t) => {
  if (skip) return t.skip(skip);
  const root = keepRoot(t);
  const rec = new Recorder();
  let closeAtNextRefill = false;
  let closing: Promise<void> | undefined;
  const pool: SandboxPool = new SandboxPool(poolOptions(rec, {
    start: { shim: shimPath, keepRoot: root, args: ['--install', `oac-daemon-standin=${daemon}`] },
    onEvent: (e) => {
      rec.on(e);
      // The moment a replacement's shim is started: one warm, one booting, one being claimed.
      if (closeAtNextRefill && e.event === 'refill') {
        closeAtNextRefill = false;
        closing = pool.close();
      }
    },
  }));
  let mine: Sandbox | undefined;
  try {
    await rec.until('2 warm', () => rec.count('warm') === 2);
    mine = (await pool.claim(tenant)).sandbox;
    await rec.until('refilled to 2', () => rec.count('warm') === 3 && pool.stats().warm === 2);

    closeAtNextRefill = true;
    await assert.rejects(pool.claim(tenant), (e: unknown) => e instanceof OacError && e.code === 'closed', 'the claim in flight when close began');
    await closing;
    const poolPids = rec.seen.flatMap((e) => (e.event === 'refill' && e.name !== mine!.name ? [e.pid!] : []));
    assert.equal(poolPids.length, 3, 'the warm one, the one being claimed, the one booting');
    for (const pid of poolPids) assert.ok(!alive(pid), `shim ${pid} has exited`);
    assert.deepEqual(rec.seen.at(-1), { event: 'closed', stopped: 3 });
    assert.equal(pool.stats().warm, 0);
    assert.equal(pool.stats().booting, 0);
    const running = await list({ shim: shimPath, keepRoot: root });
    assert.deepEqual(running.sandboxes.map((e) => e.name), [mine.name], 'only the sandbox handed over runs');

    // The one handed over is the caller's: close left it ready.
    assert.equal((await mine.status()).state, 'ready');
    assert.equal(await answers(mine), 200);
    await assert.rejects(pool.claim(tenant), (e: unknown) => e instanceof OacError && e.code === 'closed');
    assert.equal((await mine.stop({ timeoutMs: 20_000 })).status, 0);
    assert.deepEqual((await list({ shim: shimPath, keepRoot: root })).sandboxes, [], 'nothing runs any more');
  } finally {
    await pool.close();
    await mine?.kill();
  }
});

test('a pool of none: every claim is a miss, booted within maxBoots; an abort while waiting for a boot slot boots nothing; a sandbox that fails after its claim is stopped and the claim rejects with its failure', async (t) => {
  if (skip) return t.skip(skip);
  const rec = new Recorder();
  const pool = new SandboxPool(poolOptions(rec, { size: 0, maxBoots: 1 }));
  try {
    // The first claim takes the only boot slot; the second waits for it and is aborted there.
    const failing = pool.claim({ ...tenant, bootstrap: { ...daemonBootstrap(), daemon: { argv: ['/bin/sh', '-c', 'exit 3'] } } });
    const ac = new AbortController();
    const waiting = pool.claim({ ...tenant, signal: ac.signal });
    assert.equal(pool.stats().booting, 1, 'one boot at a time');
    ac.abort();
    await assert.rejects(waiting, AbortError);

    await assert.rejects(failing, (e: unknown) => e instanceof ShimError && e.code === 'daemon_failed');
    const missed = rec.seen.filter((e) => e.event === 'miss');
    assert.equal(missed.length, 1, 'only the first claim booted a sandbox');
    assert.ok(!alive(missed[0]!.pid!), 'the failed sandbox\'s shim has exited');

    const r = await pool.claim(tenant);
    try {
      assert.equal(r.hit, false);
      assert.equal(r.ageMs, 0);
      assert.equal(await answers(r.sandbox), 200);
    } finally {
      await r.sandbox.stop({ timeoutMs: 20_000 });
    }
    assert.deepEqual({ ...pool.stats(), agesMs: undefined }, { warm: 0, booting: 0, hits: 0, misses: 2, agesMs: undefined });
    assert.equal(rec.count('refill'), 0, 'a pool of none boots nothing for itself');
  } finally {
    await pool.close();
  }
});
