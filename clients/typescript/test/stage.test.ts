// stage() against the real oac-image and a local mirror (node:http on
// 127.0.0.1 serving a manifest's artifact): verified staging with typed
// progress, a corrupt mirror, a cancel half-way through a slow transfer
// and the resume that follows.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { AbortError, LaunchError, StageError, stage, stageEvents, type StageEvent } from '../src/index.js';
import { imagePath, whyNot } from './helpers.js';

let skip = '';
before(() => {
  skip = whyNot();
});

const artifact = randomBytes(512 << 10);
const sha256 = createHash('sha256').update(artifact).digest('hex');

/** How the mirror serves the artifact: all at once, other bytes of the same size, or slowly (16 KiB every 20 ms). */
type Mode = 'good' | 'corrupt' | 'slow';

interface Mirror {
  url: string;
  mode: Mode;
  /** The Range header of each request. */
  ranges: (string | undefined)[];
  close(): Promise<void>;
}

async function mirror(mode: Mode): Promise<Mirror> {
  const m: Partial<Mirror> & { ranges: (string | undefined)[]; mode: Mode } = { ranges: [], mode };
  const server: Server = createServer((req, res) => {
    m.ranges.push(req.headers.range);
    const body = m.mode === 'corrupt' ? Buffer.alloc(artifact.length, 7) : artifact;
    let from = 0;
    const r = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    if (r) {
      from = Number(r[1]);
      res.writeHead(206, { 'content-length': body.length - from, 'content-range': `bytes ${from}-${body.length - 1}/${body.length}` });
    } else {
      res.writeHead(200, { 'content-length': body.length });
    }
    if (m.mode !== 'slow') return res.end(body.subarray(from));
    let at = from;
    const timer = setInterval(() => {
      if (res.destroyed || at >= body.length) {
        clearInterval(timer);
        return res.end();
      }
      res.write(body.subarray(at, at + (16 << 10)));
      at += 16 << 10;
    }, 20);
    res.on('close', () => clearInterval(timer));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  m.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/disk.ext4`;
  m.close = () => new Promise<void>((r) => {
    server.closeAllConnections();
    server.close(() => r());
  });
  return m as Mirror;
}

function hostPlatform(): string {
  return process.platform === 'win32' ? 'windows' : process.platform;
}
function hostArch(): string {
  return process.arch === 'x64' ? 'amd64' : process.arch;
}

/** A store and a manifest pinning the artifact at the mirror (and one of another platform, not staged by default). */
function setup(t: { after: (f: () => void) => void }, url: string): { store: string; manifest: string } {
  const dir = mkdtempSync(join(tmpdir(), 'oac-ts-stage-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const manifest = join(dir, 'manifest.json');
  writeFileSync(manifest, JSON.stringify({
    schema: 1,
    release: 'ts-test',
    artifacts: [
      { name: 'disk', kind: 'disk-ext4', platform: hostPlatform(), arch: hostArch(), url, size: artifact.length, sha256 },
      { name: 'other', kind: 'disk-ext4', platform: hostPlatform() === 'darwin' ? 'windows' : 'darwin', arch: hostArch(), url: url.replace('disk.ext4', 'other.ext4'), size: 1, sha256: 'ab'.repeat(32) },
    ],
  }));
  return { store: join(dir, 'store'), manifest };
}

test('stage: the host\'s artifacts, verified into the store, with typed progress; a second stage finds them staged', async (t) => {
  if (skip) return t.skip(skip);
  const m = await mirror('good');
  t.after(() => m.close());
  const { store, manifest } = setup(t, m.url);
  const events: StageEvent[] = [];
  const staged = await stage(manifest, { store, image: imagePath, onProgress: (e) => events.push(e) });
  assert.deepEqual(staged, [{ name: 'disk', path: join(store, 'sha256', sha256) }]);
  assert.ok(readFileSync(staged[0]!.path).equals(artifact));
  assert.deepEqual(events.map((e) => e.event).filter((k) => k !== 'progress'), ['start', 'done']);
  const done = events.at(-1)!;
  assert.equal(done.bytes, artifact.length);
  assert.equal(done.total, artifact.length);
  assert.equal(done.name, 'disk');
  assert.equal(m.ranges.length, 1, 'one download: the other platform\'s artifact is not staged');

  // The iterator form, again: staged already, verified, nothing downloaded.
  const it = stageEvents(manifest, { store, image: imagePath });
  const seen: StageEvent[] = [];
  let r = await it.next();
  while (!r.done) {
    seen.push(r.value);
    r = await it.next();
  }
  assert.deepEqual(r.value, staged);
  assert.equal(seen.at(-1)?.event, 'done');
  assert.equal(seen.at(-1)?.cached, true);
  assert.equal(m.ranges.length, 1, 'nothing downloaded again');

  await assert.rejects(stage(manifest, { store, image: '/nonexistent/oac-image' }), (e: unknown) => e instanceof LaunchError && e.errno === 'ENOENT' && /OAC_IMAGE/.test(e.message));
});

test('stage from a corrupt mirror: a typed error, not retryable, nothing placed', async (t) => {
  if (skip) return t.skip(skip);
  const m = await mirror('corrupt');
  t.after(() => m.close());
  const { store, manifest } = setup(t, m.url);
  const events: StageEvent[] = [];
  await assert.rejects(stage(manifest, { store, image: imagePath, onProgress: (e) => events.push(e) }), (e: unknown) => {
    assert.ok(e instanceof StageError);
    assert.equal(e.code, 'corrupt');
    assert.equal(e.retryable, false);
    assert.equal(e.event?.event, 'error');
    assert.equal(e.exitStatus, 1);
    return true;
  });
  assert.equal(events.at(-1)?.code, 'corrupt');
  assert.ok(!existsSync(join(store, 'sha256', sha256)), 'nothing placed');
});

test('stage, cancelled half-way through a slow transfer, then resumed from what it kept', async (t) => {
  if (skip) return t.skip(skip);
  const m = await mirror('slow');
  t.after(() => m.close());
  const { store, manifest } = setup(t, m.url);

  // Abort at the first progress event: those bytes are in the partial file.
  const ac = new AbortController();
  let kept = 0;
  await assert.rejects(
    stage(manifest, {
      store,
      image: imagePath,
      signal: ac.signal,
      onProgress: (e) => {
        if (e.event === 'progress' && e.bytes > 0 && !ac.signal.aborted) {
          kept = e.bytes;
          ac.abort();
        }
      },
    }),
    (e: unknown) => e instanceof AbortError && e.code === 'aborted',
  );
  assert.ok(kept > 0 && kept < artifact.length, `aborted half-way (${kept} of ${artifact.length} bytes)`);
  assert.ok(!existsSync(join(store, 'sha256', sha256)), 'nothing placed');
  assert.ok(readdirSync(join(store, 'tmp')).some((f) => f.endsWith('.partial')), 'the partial download is kept');

  m.mode = 'good';
  const events: StageEvent[] = [];
  const staged = await stage(manifest, { store, image: imagePath, onProgress: (e) => events.push(e) });
  assert.ok(readFileSync(staged[0]!.path).equals(artifact), 'the resumed file is the artifact');
  const start = events.find((e) => e.event === 'start');
  assert.ok((start?.resumed_from ?? 0) >= kept, `resumed from what the cancelled run kept (${start?.resumed_from} >= ${kept})`);
  assert.equal(m.ranges.at(-1), `bytes=${start?.resumed_from}-`, 'a Range request');
  assert.equal(events.at(-1)?.event, 'done');
});
