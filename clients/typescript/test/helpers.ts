// What the tests share: where the real binaries are (OAC_BIN, which make
// ts-test sets), whether they can run here (with CI=true a missing piece
// fails), and the bootstraps they boot.
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { Bootstrap, StartOptions } from '../src/index.js';

export const bin = process.env.OAC_BIN ?? join(process.cwd(), '..', '..', 'bin');
export const shimPath = join(bin, 'oac-shim');
export const imagePath = join(bin, 'oac-image');
export const guestPath = join(bin, 'oac-guest');
export const sandboxIO = join(bin, 'fixtures', 'sandbox-io-standin');
export const daemon = join(bin, 'fixtures', 'daemon-standin');

export const tenant = '0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21';
export const environment = '1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32';
export const allocation = '2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43';

/** Why these tests cannot run here ('' when they can); throws with CI=true. */
export function whyNot(): string {
  const missing: string[] = [];
  for (const p of [shimPath, imagePath, guestPath, sandboxIO, daemon]) if (!existsSync(p)) missing.push(p);
  let bwrap = true;
  try {
    execFileSync('bwrap', ['--version']);
  } catch {
    bwrap = false;
  }
  const why = missing.length > 0 ? `missing ${missing.join(', ')} (run make build fixtures)`
    : !bwrap ? 'bubblewrap is not installed (make deps)'
    : process.getuid?.() !== 0 ? 'the bwrap provider needs root (sudo make ts-test)' : '';
  if (why && process.env.CI === 'true') throw new Error(`missing dependency with CI=true: ${why}`);
  return why;
}

export function uniqueName(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString('hex')}`;
}

/** A keep root of the test's own (removed after it): list() and stopAll() see only its sandboxes. */
export function keepRoot(t: { after: (f: () => void) => void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'oac-ts-'));
  chmodSync(dir, 0o711);
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The daemon stand-in behind Basic auth with a health check: ready once it answered twice. */
export function daemonBootstrap(): Bootstrap {
  return {
    version: 1,
    hostname: 'ts',
    stop_grace: '2s',
    daemon: {
      argv: ['/usr/local/bin/oac-daemon-standin', 'serve', '--hostname', '127.0.0.1', '--port', '4096', '--healthy-after-requests', '2'],
      env: ['XDG_STATE_HOME=/home/runtime/.state'],
    },
    credentials: { username: 'runtime', username_env: 'OAC_SERVER_USERNAME', password_env: 'OAC_SERVER_PASSWORD' },
    health: { port: 4096 },
  };
}

/** The options of a sandbox running the daemon stand-in, forwarded to a free port of this host. */
export function daemonSandbox(name: string, more: Partial<StartOptions> = {}): StartOptions {
  return {
    name,
    shim: shimPath,
    bootstrap: daemonBootstrap(),
    forwards: ['127.0.0.1:0=4096'],
    args: ['--install', `oac-daemon-standin=${daemon}`],
    ...more,
  };
}

/** A sandbox whose daemon is a shell line, without credentials or health check: ready once it runs. */
export function shellSandbox(name: string, line: string, more: Partial<StartOptions> = {}): StartOptions {
  return { name, shim: shimPath, bootstrap: { version: 1, daemon: { argv: ['/bin/sh', '-c', line] } }, ...more };
}

/**
 * Whether a process runs: it exists and is not a zombie (an orphan whose
 * parent was killed is reaped by init, in its own time).
 */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}
