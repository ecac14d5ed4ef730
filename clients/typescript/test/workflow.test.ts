// The desktop app's workflow against the real oac-shim and real bwrap
// guests: check, create until ready, abort at each wait, the typed errors
// of a create that cannot succeed (and nothing left running), the bounded
// history, stop; and the README's snippet, compiled and run.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, sep } from 'node:path';
import { promisify } from 'node:util';

import {
  AbortError,
  CommandError,
  DEFAULT_HISTORY_SIZE,
  FAILURES,
  HistoryError,
  LaunchError,
  OacError,
  SCHEMA_VERSION,
  Sandbox,
  SchemaVersionError,
  Shim,
  ShimError,
  TimeoutError,
  besidePackage,
  check,
  findBinary,
  list,
  unpacked,
  type Event,
} from '../src/index.js';
import { alive, daemonSandbox, keepRoot, shellSandbox, shimPath, uniqueName, whyNot } from './helpers.js';

let skip = '';
before(() => {
  skip = whyNot();
});

test('check: the OS policy and every provider, typed; the shim found through OAC_SHIM', async (t) => {
  if (skip) return t.skip(skip);
  const r = await check({ env: { ...process.env, OAC_SHIM: shimPath } });
  assert.equal(r.ok, true);
  assert.equal(r.os.goos, 'linux');
  assert.equal(r.policy.level, 'ok');
  const bwrap = r.providers.find((p) => p.name === 'bwrap');
  assert.equal(bwrap?.available, true);
  assert.ok(bwrap?.honours.includes('--install'));
  assert.deepEqual(r.available.map((p) => p.name).includes('bwrap'), true);
  for (const p of r.providers.filter((p) => !p.available)) {
    assert.ok(r.toFix.some((l) => l.startsWith(`${p.name}: `)), `what to fix for ${p.name}`);
  }
  await assert.rejects(check({ shim: '/nonexistent/oac-shim' }), (e: unknown) => e instanceof LaunchError && e.errno === 'ENOENT');
});

test('the binary beside the package: found when neither the option nor OAC_SHIM names one', async (t) => {
  if (skip) return t.skip(skip);
  const beside = besidePackage('oac-shim');
  assert.equal(beside, join(process.cwd(), 'bin', 'oac-shim'));
  assert.equal(besidePackage('oac-shim', 'win32'), join(process.cwd(), 'bin', 'oac-shim.exe'), 'Windows: the .exe');
  mkdirSync(dirname(beside), { recursive: true });
  symlinkSync(shimPath, beside);
  t.after(() => rmSync(beside));
  const env = { ...process.env, OAC_SHIM: '' };
  assert.equal(findBinary('oac-shim', undefined, env), beside);
  assert.equal(findBinary('oac-shim', undefined, { ...env, OAC_SHIM: '/x/oac-shim' }), '/x/oac-shim', 'OAC_SHIM before the package');
  assert.equal(findBinary('oac-shim', '/y/oac-shim', { ...env, OAC_SHIM: '/x/oac-shim' }), '/y/oac-shim', 'the option first');
  assert.equal((await check({ env })).ok, true, 'check ran the one beside the package');
});

test('the binary beside the package inside an Electron asar is the unpacked one', () => {
  assert.equal(unpacked(`${sep}app${sep}resources${sep}app.asar${sep}node_modules${sep}x${sep}bin${sep}oac-shim`),
    `${sep}app${sep}resources${sep}app.asar.unpacked${sep}node_modules${sep}x${sep}bin${sep}oac-shim`);
  assert.equal(unpacked(`${sep}usr${sep}lib${sep}oac-shim`), `${sep}usr${sep}lib${sep}oac-shim`);
});

test('create resolves on ready: the URL answers to the password made here; stop ends it cleanly', async (t) => {
  if (skip) return t.skip(skip);
  const seen: string[] = [];
  const sbx = await Sandbox.create(daemonSandbox(uniqueName('ts-create'), { onEvent: (e) => seen.push(e.event === 'state' ? e.state : e.event) }), { signal: AbortSignal.timeout(30_000) });
  try {
    assert.equal(sbx.ready?.state, 'ready');
    assert.match(sbx.url ?? '', /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(sbx.username, 'runtime');
    const password = await sbx.password();
    assert.match(password, /^[A-Za-z0-9_-]{43}$/, '32 random bytes, base64url');
    const auth = (p: string) => ({ authorization: 'Basic ' + Buffer.from(`runtime:${p}`).toString('base64') });
    assert.equal((await fetch(`${sbx.url}/global/health`, { headers: auth(password) })).status, 200);
    assert.equal((await fetch(`${sbx.url}/global/health`, { headers: auth('not-the-password-at-all') })).status, 401);
    const argv = readFileSync(`/proc/${sbx.pid}/cmdline`, 'utf8');
    assert.ok(!argv.includes(password), 'the password is not in argv');
    assert.ok(!readFileSync(`/proc/${sbx.pid}/environ`, 'utf8').includes(password), 'nor in the environment');
    assert.ok(seen.includes('agent') && seen.indexOf('agent') < seen.indexOf('ready'), 'onEvent saw the boot as it went, up to ready');
    const x = await sbx.stop({ signal: AbortSignal.timeout(20_000) });
    assert.equal(x.status, 0);
    assert.equal(x.last?.state, 'stopped');
    for (const e of sbx.received) assert.ok(!JSON.stringify(e).includes(password), 'no event carries the password');
  } finally {
    await sbx.kill();
  }

  // The caller's own password, kept where the app keeps its secrets, is the daemon's.
  const mine = `callers-own-${'x'.repeat(20)}`;
  const own = await Sandbox.create(daemonSandbox(uniqueName('ts-own'), { password: mine }), { timeoutMs: 30_000 });
  try {
    assert.equal(await own.password(), mine);
    const auth = 'Basic ' + Buffer.from(`runtime:${mine}`).toString('base64');
    assert.equal((await fetch(`${own.url}/global/health`, { headers: { authorization: auth } })).status, 200);
    await own.stop({ timeoutMs: 20_000 });
  } finally {
    await own.kill();
  }
  await assert.rejects(Sandbox.create(daemonSandbox(uniqueName('ts-short'), { password: 'short' })), TypeError, 'a password the shim would refuse starts nothing');
});

test('abort at each wait: create, waitFor, waitForEvent, events, a command, stop; timeouts are TimeoutErrors', async (t) => {
  if (skip) return t.skip(skip);
  const root = keepRoot(t);

  // create, aborted while the guest waits for a daemon that never gets healthy.
  const ac = new AbortController();
  const never = daemonSandbox(uniqueName('ts-abort'), { keepRoot: root, onEvent: (e) => e.event === 'agent' && ac.abort() });
  never.bootstrap = { ...never.bootstrap!, daemon: { argv: ['/bin/sleep', '1000'] } };
  await assert.rejects(Sandbox.create(never, { signal: ac.signal }), (e: unknown) => {
    assert.ok(e instanceof AbortError);
    assert.equal(e.code, 'aborted');
    assert.equal(e.retryable, false);
    return true;
  });
  assert.deepEqual((await list({ shim: shimPath, keepRoot: root })).sandboxes, [], 'the aborted create left nothing running');

  const sbx = await Sandbox.create(shellSandbox(uniqueName('ts-waits'), 'exec sleep 1000', { keepRoot: root }), { timeoutMs: 30_000 });
  try {
    const aborts = async (what: string, f: (signal: AbortSignal) => Promise<unknown>) => {
      const c = new AbortController();
      const p = f(c.signal);
      c.abort();
      await assert.rejects(p, (e: unknown) => e instanceof AbortError && e.message.startsWith(what), what);
    };
    await aborts('state stopped', (signal) => sbx.waitFor('stopped', { signal }));
    await aborts('an event', (signal) => sbx.waitForEvent((e) => e.event === 'egress', { signal }));
    await aborts('events', async (signal) => {
      for await (const e of sbx.events({ from: 'now', signal })) assert.fail(`no event expected, got ${e.event}`);
    });
    const done = new AbortController();
    done.abort();
    await assert.rejects(sbx.status({ signal: done.signal }), AbortError, 'an aborted command is not sent');
    assert.equal((await sbx.status()).state, 'ready', 'the sandbox still answers');

    await assert.rejects(sbx.waitFor('stopped', { timeoutMs: 1 }), (e: unknown) => e instanceof TimeoutError && e.code === 'timeout' && e.retryable);
    await assert.rejects(sbx.waitFor('stopped', { signal: AbortSignal.timeout(1) }), TimeoutError, "AbortSignal.timeout's reason is a TimeoutError");

    // stop, aborted: the shim is killed and waited for.
    await assert.rejects(sbx.stop({ signal: done.signal }), AbortError);
    const x = await sbx.exited();
    assert.equal(x.signal, 'SIGKILL');
    assert.ok(sbx.pid !== undefined && !alive(sbx.pid));
    assert.deepEqual((await list({ shim: shimPath, keepRoot: root })).sandboxes, [], 'nothing runs any more');
  } finally {
    await sbx.kill();
  }
});

test('a create that cannot succeed rejects with a typed error and leaves nothing running', async (t) => {
  if (skip) return t.skip(skip);
  const root = keepRoot(t);

  // A wrong binary path: the launch error, not "exited before ready".
  await assert.rejects(Sandbox.create(daemonSandbox(uniqueName('ts-enoent'), { shim: '/nonexistent/oac-shim' })), (e: unknown) => {
    assert.ok(e instanceof LaunchError && e instanceof OacError);
    assert.equal(e.errno, 'ENOENT');
    assert.equal(e.code, 'launch_failed');
    assert.match(e.message, /\/nonexistent\/oac-shim.*ENOENT.*OAC_SHIM/);
    return true;
  });

  // A refused bootstrap: the failure code, its retryability and what to do, from the published table.
  const refused = daemonSandbox(uniqueName('ts-refused'), { keepRoot: root });
  refused.bootstrap = { ...refused.bootstrap!, daemon: { argv: [] as unknown as [string] } }; // the types refuse it too
  await assert.rejects(Sandbox.create(refused), (e: unknown) => {
    assert.ok(e instanceof ShimError);
    assert.equal(e.code, 'invalid_bootstrap');
    assert.equal(e.retryable, false);
    assert.equal(e.action, FAILURES.invalid_bootstrap.action);
    assert.equal(e.event?.state, 'failed');
    return true;
  });
  assert.deepEqual((await list({ shim: shimPath, keepRoot: root })).sandboxes, []);

  // A shim of another schema version: which one to install.
  const dir = mkdtempSync(join(tmpdir(), 'oac-ts-fake-'));
  const fake = join(dir, 'oac-shim');
  const other = SCHEMA_VERSION + 1;
  writeFileSync(fake, `#!/bin/sh\necho '{"time":"2026-01-02T03:04:05Z","sandbox":"x","event":"state","schema_version":${other},"seq":1,"state":"starting","attempt":1}'\nexec sleep 1000\n`);
  chmodSync(fake, 0o755);
  await assert.rejects(Sandbox.create({ ...daemonSandbox(uniqueName('ts-version')), shim: fake, onEvent: () => assert.fail('no event of another schema is used') }), (e: unknown) => {
    assert.ok(e instanceof SchemaVersionError);
    assert.equal(e.code, 'schema_version');
    assert.equal(e.got, other);
    assert.equal(e.want, SCHEMA_VERSION);
    assert.match(e.message, new RegExp(`install the oac-shim of this client's release \\(@oac/sandbox-agent-client [0-9A-Za-z.+-]+; its events carry schema_version ${SCHEMA_VERSION}\\)`));
    return true;
  });
  const ps = await promisify(execFile)('ps', ['-eo', 'args']);
  assert.ok(!ps.stdout.includes(fake), 'the fake shim was killed');
});

test('the event history is bounded: events from now, from a seq, and a HistoryError for what it no longer holds', async (t) => {
  if (skip) return t.skip(skip);
  assert.equal(DEFAULT_HISTORY_SIZE, 1024);
  // The last line is seen through onEvent: the history may have dropped it before a wait for it begins.
  let done: () => void = () => {};
  const printed = new Promise<void>((r) => (done = r));
  const sbx = await Sandbox.create(
    shellSandbox(uniqueName('ts-ring'), 'for i in 1 2 3 4 5 6 7 8 9 10; do echo line=$i; done; echo done; exec sleep 1000', {
      historySize: 4,
      onEvent: (e) => e.event === 'log' && e.line === 'done' && done(),
    }),
    { timeoutMs: 30_000 },
  );
  try {
    await printed;
    assert.ok(sbx.received.length <= 4, 'at most historySize events are kept');
    const seqs = sbx.received.map((e) => (e as { seq?: number }).seq!);
    assert.ok(seqs[0]! > 1, 'the first events are gone');
    const it = sbx.events({ from: seqs[0]! - 1 });
    await assert.rejects(it.next(), HistoryError, 'events from a seq no longer kept');

    const from = sbx.events({ from: seqs.at(-1)! });
    assert.equal(((await from.next()).value as unknown as { seq: number }).seq, seqs.at(-1), 'from a kept seq: that event first');
    await from.return();

    const now = sbx.events({ from: 'now' });
    const first = now.next();
    const fw = await sbx.addForward('127.0.0.1:0', 4096);
    const e = (await first).value as Event;
    assert.equal(e.event, 'forward', 'from now: the first event after the call');
    assert.ok(e.event === 'forward' && e.listen === fw.listen);
    await now.return();
    await sbx.removeForward('127.0.0.1:1').catch((e: unknown) => assert.ok(e instanceof CommandError && e.code === 'not_found' && !e.retryable));
    await sbx.stop({ timeoutMs: 20_000 });
  } finally {
    await sbx.kill();
  }
});

test('an iterator that falls behind the bounded history ends with a HistoryError', async (t) => {
  // A stand-in shim that prints an event of this schema, and nine more at
  // once when a line comes on its stdin.
  const dir = mkdtempSync(join(tmpdir(), 'oac-ts-behind-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fake = join(dir, 'oac-shim');
  const line = (seq: number) => JSON.stringify({ time: '2026-01-02T03:04:05Z', sandbox: 'x', event: 'log', schema_version: SCHEMA_VERSION, seq, stream: 'stdout', process: 'daemon', line: `l${seq}` });
  writeFileSync(fake, `#!/bin/sh\necho '${line(1)}'\nread x\ncat <<'EOF'\n${Array.from({ length: 9 }, (_, i) => line(i + 2)).join('\n')}\nEOF\nexec sleep 1000\n`);
  chmodSync(fake, 0o755);
  const shim = Shim.start({ name: 'x', shim: fake, historySize: 2 });
  try {
    const it = shim.events();
    assert.equal((await it.next()).value?.seq, 1, 'the first event, while it is kept');
    shim.status().catch(() => {}); // the line that lets the stand-in print the rest (it answers none)
    await shim.waitForEvent((e) => e.seq === 10, { timeoutMs: 10_000 });
    assert.deepEqual(shim.received.map((e) => e.seq), [9, 10], 'two kept');
    await assert.rejects(it.next(), (e: unknown) => e instanceof HistoryError && e.code === 'history_lost' && /fell 7 events behind/.test(e.message));
  } finally {
    await shim.kill();
  }
});

test('the README snippet: compiled with the package and run against the real shim', async (t) => {
  if (skip) return t.skip(skip);
  const dir = mkdtempSync(join(tmpdir(), 'oac-ts-readme-'));
  const opts = join(dir, 'sandbox.json');
  const { name: _name, shim: _shim, ...rest } = daemonSandbox('unused');
  writeFileSync(opts, JSON.stringify(rest));
  const r = await promisify(execFile)(process.execPath, [join(process.cwd(), 'dist', 'examples', 'readme.js'), opts], {
    env: { ...process.env, OAC_SHIM: shimPath },
    timeout: 60_000,
  });
  assert.equal(r.stdout, '200\n');
});
