// attach(): a Node parent creates a sandbox that outlives it and is
// SIGKILLed; this process attaches to the sandbox by name, reads the
// events since the seq the parent last handled, drives it and stops it,
// and nothing is left running.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

import { AbortError, OacError, attach, list, type Event } from '../src/index.js';
import { alive, keepRoot, shimPath, uniqueName, whyNot } from './helpers.js';

let skip = '';
before(() => {
  skip = whyNot();
});

/** Starts the parent fixture and resolves with the line it prints once its sandbox runs. */
async function parent(root: string, name: string): Promise<{ pid: number; exited: Promise<unknown>; line: { name: string; seq: number; pid: number } }> {
  const child = spawn(process.execPath, [join(process.cwd(), 'dist', 'test', 'fixtures', 'parent.js'), shimPath, root, name], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise((r) => child.once('exit', r));
  const first = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', resolve);
    child.once('exit', (status) => reject(new Error(`the parent exited with status ${status} before its sandbox ran`)));
  });
  return { pid: child.pid!, exited, line: JSON.parse(first) as { name: string; seq: number; pid: number } };
}

test('attach after the parent was SIGKILLed: the events since its last seq, control, stop, nothing left', async (t) => {
  if (skip) return t.skip(skip);
  const root = keepRoot(t);
  const name = uniqueName('ts-attach');
  const p = await parent(root, name);
  assert.equal(p.line.name, name);
  process.kill(p.pid, 'SIGKILL');
  await p.exited;
  assert.ok(alive(p.line.pid), 'the sandbox\'s shim outlived its parent');
  assert.deepEqual((await list({ shim: shimPath, keepRoot: root })).sandboxes.map((e) => e.name), [name]);

  const sbx = await attach(name, { shim: shimPath, keepRoot: root, from: p.line.seq, signal: AbortSignal.timeout(10_000) });
  try {
    const first = await sbx.waitForEvent(() => true, { timeoutMs: 5_000 });
    assert.equal(first.seq, p.line.seq, 'the replay starts at the seq asked for');
    for (const e of sbx.received) assert.equal(e.sandbox, name);
    assert.equal((await sbx.status({ timeoutMs: 5_000 })).state, 'ready', 'control reaches the sandbox');
    const fw = await sbx.addForward('127.0.0.1:0', 4096, { timeoutMs: 5_000 });
    const live = await sbx.waitForEvent((e): e is Extract<Event, { event: 'forward' }> => e.event === 'forward' && e.listen === fw.listen, { timeoutMs: 5_000 });
    assert.ok(live.seq > p.line.seq, 'a live event follows the replay');
    await assert.rejects(sbx.password(), (e: unknown) => e instanceof OacError && e.code === 'no_password', 'an attach knows no password it was not given');

    await sbx.stop({ timeoutMs: 20_000 });
    const last = sbx.received.at(-1);
    assert.equal(last?.event === 'state' && last.state, 'stopped', 'the attach saw the stop');
    assert.ok(!alive(p.line.pid), 'the shim is gone');
    assert.deepEqual((await list({ shim: shimPath, keepRoot: root })).sandboxes, [], 'nothing runs any more');
  } catch (e) {
    if (process.env.OAC_TS_DEBUG) console.error(JSON.stringify(sbx.received, null, 0));
    throw e;
  } finally {
    await sbx.kill();
    if (alive(p.line.pid)) process.kill(p.line.pid, 'SIGKILL');
  }

  // An attach to a name that does not run, and an aborted one, reject typed.
  await assert.rejects(attach(name, { shim: shimPath, keepRoot: root, timeoutMs: 5_000 }), (e: unknown) => e instanceof OacError && e.code === 'not_running');
  const ac = new AbortController();
  ac.abort();
  await assert.rejects(attach(name, { shim: shimPath, keepRoot: root, signal: ac.signal }), AbortError);
});
