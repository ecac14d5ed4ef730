// These tests start the real oac-shim, which boots a real bwrap guest.
// OAC_BIN names the directory with oac-shim, oac-guest and the stand-ins
// (make ts-test builds them); with CI=true a missing piece fails.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';

import { Shim, ShimError, CommandError, createKept, destroyKept, list, listKept, resetKept, stopAll, type Bootstrap, type Event, type StartOptions } from '../src/index.js';

const bin = process.env.OAC_BIN ?? join(process.cwd(), '..', '..', 'bin');
const shimPath = join(bin, 'oac-shim');
const sandboxIO = join(bin, 'fixtures', 'sandbox-io-standin');
const daemon = join(bin, 'fixtures', 'daemon-standin');

const tenant = '0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21';
const environment = '1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32';
const allocation = '2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43';
const credential = `ts-credential-${randomBytes(8).toString('hex')}`;

// The version every line carries: the one of the schema the types were generated from.
const schemaVersion = (JSON.parse(readFileSync(join(process.cwd(), '..', '..', 'schema', 'event.schema.json'), 'utf8')) as { $defs: { SchemaVersion: { const: number } } }).$defs.SchemaVersion.const;

let skip: string | false = false;

before(() => {
  const missing: string[] = [];
  for (const p of [shimPath, join(bin, 'oac-guest'), sandboxIO, daemon]) if (!existsSync(p)) missing.push(p);
  let bwrap = true;
  try {
    execFileSync('bwrap', ['--version']);
  } catch {
    bwrap = false;
  }
  const why = missing.length > 0 ? `missing ${missing.join(', ')} (run make build fixtures)`
    : !bwrap ? 'bubblewrap is not installed (make deps)'
    : process.getuid?.() !== 0 ? 'the bwrap provider needs root (sudo make ts-test)' : '';
  if (why) {
    if (process.env.CI === 'true') throw new Error(`missing dependency with CI=true: ${why}`);
    skip = why;
  }
});

function uniqueName(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString('hex')}`;
}

function sha256(s: string): string {
  return createHash('sha256').update(s).digest('hex');
}

/** A hosted bootstrap: oac-sandbox-io with its private file, the daemon stand-in with a health check. */
function contract(linkURL = 'wss://link.example.com/api/v1/sandbox-link'): Bootstrap {
  return {
    version: 1,
    hostname: 'ts',
    stop_grace: '2s',
    sandbox_io: {
      bootstrap: {
        version: 1,
        link_url: linkURL,
        credential,
        resource: { tenant_id: tenant, environment_id: environment, kind: 'allocation', id: allocation, generation: 1 },
      },
    },
    daemon: {
      argv: ['/usr/local/bin/oac-daemon-standin', 'serve', '--hostname', '127.0.0.1', '--port', '4096', '--healthy-after-requests', '2'],
      env: ['XDG_STATE_HOME=/home/runtime/.state'],
    },
    credentials: { username: 'runtime', username_env: 'OAC_SERVER_USERNAME', password_env: 'OAC_SERVER_PASSWORD' },
    health: { port: 4096 },
  };
}

function start(o: Partial<StartOptions> & { name: string }): Shim {
  const stderr: string[] = [];
  const s = Shim.start({
    shim: shimPath,
    identity: { tenant, environment, allocation },
    args: ['--sandbox-io', sandboxIO, '--install', `oac-daemon-standin=${daemon}`],
    onStderr: (l) => stderr.push(l),
    ...o,
  });
  s.exited().then((x) => {
    if (x.status !== 0 && process.env.OAC_TS_DEBUG) console.error(stderr.join('\n'));
  });
  return s;
}

function logLine(events: readonly Event[], prefix: string): string | undefined {
  for (const e of events) if (e.event === 'log' && e.line?.startsWith(prefix)) return e.line.slice(prefix.length);
  return undefined;
}

test('ready with url and username, typed and ordered events, status, the password made here and handed over on stdin, stop', async (t) => {
  if (skip) return t.skip(skip);
  const name = uniqueName('ts');
  const shim = start({ name, bootstrap: contract(), forwards: ['127.0.0.1:0=4096'] });
  try {
    const ready = await shim.waitFor('ready', { timeoutMs: 30_000 });
    assert.equal(ready.state, 'ready');
    assert.match(ready.url ?? '', /^http:\/\/127\.0\.0\.1:\d+$/, 'the forward carries the daemon');
    assert.equal(ready.guest_url, 'http://127.0.0.1:4096');
    assert.equal(ready.username, 'runtime');
    assert.equal(ready.attempt, 1);

    // The daemon answers through the forward with the password this client
    // made and handed over on stdin (never a file, argv or a descriptor).
    const password = await shim.password();
    assert.equal(password.length, 43);
    const res = await fetch(`${ready.url}/global/health`, {
      headers: { authorization: 'Basic ' + Buffer.from(`runtime:${password}`).toString('base64') },
    });
    assert.equal(res.status, 200);

    const st = await shim.status();
    assert.equal(st.server_id, `sandbox:${name}`);
    assert.equal(st.state, 'ready');
    assert.equal(st.guest_connected, true);
    assert.equal(st.forwards.length, 1);

    const exit = await shim.stop({ timeoutMs: 20_000 });
    assert.equal(exit.status, 0);
    assert.equal(exit.last?.state, 'stopped');

    const all = shim.received;
    for (const e of all) {
      assert.equal(e.schema_version, schemaVersion, 'the version of schema/ this client was built from');
      assert.equal(e.sandbox, name);
    }
    const kinds = all.map((e) => e.event);
    const states = all.flatMap((e) => (e.event === 'state' ? [e.state] : []));
    assert.deepEqual(states.slice(0, 1), ['starting']);
    assert.equal(states.at(-1), 'stopped', 'the last state is stopped');
    assert.ok(kinds.indexOf('forward') < kinds.indexOf('agent'), 'the forward listens before the guest connects');
    assert.ok(kinds.indexOf('agent') < all.indexOf(ready), 'the agent connects before ready');
    assert.match(states.join(' '), /^(starting )+ready stopped$/, 'the lifecycle in order');
    const daemonStarted = all.findIndex((e) => e.event === 'process' && e.process === 'daemon' && e.running);
    assert.ok(daemonStarted > kinds.indexOf('agent') && daemonStarted < all.indexOf(ready), 'the daemon starts between the agent and ready');
    for (const e of all) assert.ok(!Number.isNaN(Date.parse(e.time)), 'every event has an RFC 3339 time');
    assert.equal(logLine(all, 'daemon: password-sha256='), sha256(password), 'the daemon got that password');
    for (const e of all) assert.ok(!JSON.stringify(e).includes(password) && !JSON.stringify(e).includes(credential), 'no secret in an event');
  } finally {
    await shim.kill();
  }
});

test('the bootstrap is piped on stdin: nothing of it is on disk or in argv', async (t) => {
  if (skip) return t.skip(skip);
  const shim = start({ name: uniqueName('ts-stdin'), bootstrap: contract() });
  try {
    await shim.waitFor('ready', { timeoutMs: 30_000 });
    const argv = readFileSync(`/proc/${shim.pid}/cmdline`, 'utf8').split('\0');
    assert.deepEqual(argv.slice(argv.indexOf('--bootstrap'), argv.indexOf('--bootstrap') + 2), ['--bootstrap', '-']);
    assert.ok(!argv.join(' ').includes(credential));
    const prefix = 'sandbox-io: credential-sha256=';
    const line = await shim.waitForEvent(
      (e): e is Extract<Event, { event: 'log' }> => e.event === 'log' && !!e.line?.startsWith(prefix),
      { timeoutMs: 10_000 },
    );
    assert.equal(line.line?.slice(prefix.length), sha256(credential), 'oac-sandbox-io read the credential from its private file');
    await shim.stop({ timeoutMs: 20_000 });
  } finally {
    await shim.kill();
  }
});

test("Core's sandbox.Bootstrap on stdin boots the same sandbox", async (t) => {
  if (skip) return t.skip(skip);
  const b = contract();
  const shim = start({
    name: uniqueName('ts-core'),
    coreBootstrap: {
      runtime: {
        command: b.daemon!.argv,
        env: { XDG_STATE_HOME: '/home/runtime/.state' },
        port: 4096,
        username: 'runtime',
        username_env: 'OAC_SERVER_USERNAME',
        password_env: 'OAC_SERVER_PASSWORD',
        stop_grace_ms: 2000,
      },
      sandbox_io: b.sandbox_io!.bootstrap!,
    },
  });
  try {
    const ready = await shim.waitFor('ready', { timeoutMs: 30_000 });
    assert.equal(ready.url, 'http://127.0.0.1:4096');
    assert.equal(ready.username, 'runtime');
    await shim.stop({ timeoutMs: 20_000 });
  } finally {
    await shim.kill();
  }
});

test('egress denied is an event; control commands answer typed results and typed errors', async (t) => {
  if (skip) return t.skip(skip);
  const shim = start({
    name: uniqueName('ts-egress'),
    identity: undefined,
    args: [],
    allow: ['*.example.com:443'],
    bootstrap: {
      version: 1,
      daemon: { argv: ['/bin/sh', '-c', 'curl -s -o /dev/null -w "%{http_code}\\n" http://blocked.example.com/; exec sleep 1000'] },
    },
  });
  try {
    await shim.waitFor('ready', { timeoutMs: 30_000 });
    const denied = await shim.waitForEvent(
      (e): e is Extract<Event, { event: 'egress' }> => e.event === 'egress' && e.decision === 'denied',
      { timeoutMs: 15_000 },
    );
    assert.equal(denied.target, 'blocked.example.com:80');
    assert.equal(denied.code, 'Denied');
    assert.equal(denied.effect, 'none');
    assert.equal(denied.rule, '*.example.com:443');
    assert.equal(denied.via, 'http');
    assert.ok(denied.source_port !== undefined && denied.source_port > 0, 'the event names the connection by its source port in the guest');

    const pol = await shim.setPolicy(['api.example.com:443']);
    assert.deepEqual(pol.egress, ['api.example.com:443']);
    const fw = await shim.addForward('127.0.0.1:0', 4096);
    assert.match(fw.url ?? '', /^http:\/\/127\.0\.0\.1:\d+$/);
    await shim.removeForward(fw.listen);
    await assert.rejects(shim.removeForward('127.0.0.1:1'), (e: unknown) => {
      assert.ok(e instanceof CommandError);
      assert.equal(e.command, 'remove_forward');
      assert.equal(e.answer.ok, false);
      assert.equal(e.code, 'not_found');
      assert.equal(e.answer.code, 'not_found');
      return true;
    });
    await assert.rejects(shim.pushTime(), (e: unknown) => e instanceof CommandError && e.code === 'unsupported', 'a bwrap guest sets no clock');
    await assert.rejects(shim.addForward('0.0.0.0:80', 4096), (e: unknown) => e instanceof CommandError && e.code === 'invalid_argument');
    await shim.stop({ timeoutMs: 20_000 });
  } finally {
    await shim.kill();
  }
});

test("a failed start's code: waitFor rejects with it and the exit status says its class", async (t) => {
  if (skip) return t.skip(skip);
  const shim = start({ name: uniqueName('ts-fail'), bootstrap: contract('ws://link.example.com/api/v1/sandbox-link') });
  await assert.rejects(shim.waitFor('ready', { timeoutMs: 10_000 }), (e: unknown) => {
    assert.ok(e instanceof ShimError);
    assert.equal(e.code, 'public_url_unreachable');
    assert.equal(e.event?.state, 'failed');
    return true;
  });
  const exit = await shim.exited();
  assert.equal(exit.status, 3, 'exit status 3: the caller\'s input');
  assert.equal(exit.last?.state, 'failed');
  assert.equal(shim.received.length, 1, 'nothing was created: one failed event');
  await assert.rejects(shim.status(), (e: unknown) => e instanceof ShimError && e.code === 'public_url_unreachable');
});

test('kill ends the shim at once', async (t) => {
  if (skip) return t.skip(skip);
  const shim = start({ name: uniqueName('ts-kill'), identity: undefined, args: [], bootstrap: { version: 1, daemon: { argv: ['/bin/sleep', '1000'] } } });
  await shim.waitFor('ready', { timeoutMs: 30_000 });
  const exit = await shim.kill();
  assert.equal(exit.signal, 'SIGKILL');
});

test('a kept sandbox: create, start twice, reset, list and destroy', async (t) => {
  if (skip) return t.skip(skip);
  const keepRoot = mkdtempSync(join(tmpdir(), 'oac-ts-keep-'));
  chmodSync(keepRoot, 0o711);
  t.after(() => rmSync(keepRoot, { recursive: true, force: true }));
  const name = uniqueName('ts-keep');
  const o = { shim: shimPath, keepRoot };
  await createKept({ ...o, name, args: ['--agent', join(bin, 'oac-guest')] });
  // The daemon writes the file before it says what it found, so a stop
  // that follows the found line never races the write.
  const boot = async (want: string) => {
    const shim = start({
      name, kept: { keepRoot }, identity: undefined, args: ['--agent', join(bin, 'oac-guest')],
      bootstrap: { version: 1, daemon: { argv: ['/bin/sh', '-c', 'f=$(cat /home/runtime/f 2>/dev/null || echo absent); echo kept > /home/runtime/f; echo found=$f; exec sleep 1000'] } },
    });
    try {
      await shim.waitFor('ready', { timeoutMs: 30_000 });
      const found = await shim.waitForEvent((e) => e.event === 'log' && (e.line ?? '').startsWith('found='), { timeoutMs: 10_000 });
      assert.equal(found.event === 'log' && found.line, `found=${want}`);
    } finally {
      await shim.stop({ timeoutMs: 30_000 });
    }
  };
  await boot('absent');
  await boot('kept');
  let list = await listKept(o);
  assert.equal(list.sandboxes.find((e) => e.name === name)?.state, 'stopped');
  await resetKept(name, { ...o, agent: join(bin, 'oac-guest') });
  await boot('absent');
  await destroyKept(name, o);
  list = await listKept(o);
  assert.equal(list.sandboxes.find((e) => e.name === name), undefined);
});

test('many sandboxes from one parent: list them with their control sockets, stopAll stops every one in order', async (t) => {
  if (skip) return t.skip(skip);
  // A keep root of the test's own: only its sandboxes are listed and stopped.
  const keepRoot = mkdtempSync(join(tmpdir(), 'oac-ts-many-'));
  chmodSync(keepRoot, 0o711);
  t.after(() => rmSync(keepRoot, { recursive: true, force: true }));
  const ctl = join(keepRoot, 'a.ctl');
  const shims = [
    start({ name: uniqueName('ts-many'), identity: undefined, args: ['--keep-root', keepRoot, '--control-socket', ctl], bootstrap: { version: 1, daemon: { argv: ['/bin/sleep', '1000'] } } }),
    start({ name: uniqueName('ts-many'), identity: undefined, args: ['--keep-root', keepRoot], bootstrap: { version: 1, daemon: { argv: ['/bin/sleep', '1000'] } } }),
  ];
  try {
    for (const s of shims) await s.waitFor('ready', { timeoutMs: 30_000 });
    const o = { shim: shimPath, keepRoot };
    const listed = await list(o);
    assert.deepEqual(listed.sandboxes.map((e) => e.name).sort(), shims.map((s) => s.name).sort());
    assert.deepEqual(listed.cleaned, []);
    for (const e of listed.sandboxes) {
      const s = shims.find((x) => x.name === e.name)!;
      assert.equal(e.pid, s.pid, 'its shim\'s pid');
      assert.equal(e.kind, 'run');
      assert.equal(e.control_socket, s === shims[0] ? ctl : undefined, 'its control socket, or none');
    }

    const report = await stopAll({ ...o, graceMs: 30_000 });
    assert.equal(report.all_stopped, true);
    assert.equal(report.grace_ms, 30_000);
    const via = Object.fromEntries(report.sandboxes.map((e) => [e.name, `${e.outcome} ${e.via}`]));
    assert.deepEqual(via, { [shims[0]!.name]: 'stopped control', [shims[1]!.name]: 'stopped signal' });
    for (const s of shims) {
      const exit = await s.exited();
      assert.equal(exit.status, 0, 'a clean stop');
      assert.equal(exit.last?.state, 'stopped');
    }
    assert.deepEqual((await list(o)).sandboxes, [], 'nothing runs any more');
    assert.deepEqual((await stopAll(o)).sandboxes, [], 'stopping nothing is no error');
  } finally {
    for (const s of shims) await s.kill();
  }
});
