// stage(): verified, resumable, cancellable staging of a manifest's
// artifacts into the store (`oac-image stage --progress json`, its events
// typed from schema/stage-progress.schema.json).
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

import { findBinary, launchError } from './binary.js';
import { StageError } from './errors.js';
import type { StageEvent } from './generated/stage-progress.js';
import { abortError } from './wait.js';

/** One staged artifact: its name and the verified file in the store. */
export interface Staged {
  name: string;
  path: string;
}

export interface StageOptions {
  /** The store directory (--store): STORE/sha256/HEX, with partial downloads in STORE/tmp. */
  store: string;
  /** The oac-image binary (default: OAC_IMAGE, then beside this package, then PATH). */
  image?: string;
  /** oac-image's environment, and where OAC_IMAGE is looked up (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Only this artifact (--name). */
  name?: string;
  /** Only artifacts of this kind (--kind). */
  kind?: string;
  /** Only artifacts for this platform and arch (default: this host's, darwin/linux/windows and amd64/arm64; null: every one). */
  platform?: string | null;
  arch?: string | null;
  /** Fail a transfer that receives nothing for this long (--idle-timeout; default oac-image's, 30 s). */
  idleTimeoutMs?: number;
  /** Stops staging: oac-image is ended and waited for, what it downloaded is kept for the next stage to resume, and the call rejects with an AbortError. */
  signal?: AbortSignal;
  /** Receives every progress event. */
  onProgress?: (e: StageEvent) => void;
}

function hostPlatform(): string {
  return process.platform === 'win32' ? 'windows' : process.platform;
}

function hostArch(): string {
  return process.arch === 'x64' ? 'amd64' : process.arch;
}

/**
 * Stages the artifacts of a manifest file that match the filters (by
 * default those of this host's platform and arch) into the store:
 * downloaded from each one's URL, then its mirrors, verified by size and
 * sha256 before anything is placed. A second call resumes what the first
 * left (an interrupted download is kept) and finds what is staged already.
 * Rejects with a StageError (code corrupt, truncated, http, ...; retryable
 * says whether staging again may help), a LaunchError, or an AbortError.
 */
export function stage(manifest: string, o: StageOptions): Promise<Staged[]> {
  const path = findBinary('oac-image', o.image, o.env);
  if (o.signal?.aborted) return Promise.reject(abortError(o.signal, 'stage'));
  const args = ['stage', '--store', o.store, '--manifest', manifest, '--progress', 'json'];
  if (o.name) args.push('--name', o.name);
  if (o.kind) args.push('--kind', o.kind);
  const platform = o.platform === undefined ? hostPlatform() : o.platform;
  const arch = o.arch === undefined ? hostArch() : o.arch;
  if (platform) args.push('--platform', platform);
  if (arch) args.push('--arch', arch);
  if (o.idleTimeoutMs !== undefined) args.push('--idle-timeout', `${o.idleTimeoutMs}ms`);

  return new Promise((resolve, reject) => {
    const child = spawn(path, args, { env: o.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'], windowsHide: true });
    const staged: Staged[] = [];
    const said: string[] = [];
    let failed: StageEvent | undefined;
    createInterface({ input: child.stdout, crlfDelay: Infinity }).on('line', (l) => {
      // "NAME PATH" per staged artifact (the path may hold spaces, the name not).
      const sp = l.indexOf(' ');
      if (sp > 0) staged.push({ name: l.slice(0, sp), path: l.slice(sp + 1) });
    });
    const stderr = createInterface({ input: child.stderr, crlfDelay: Infinity });
    stderr.on('line', (l) => {
      let e: StageEvent | undefined;
      if (l.startsWith('{')) {
        try {
          e = JSON.parse(l) as StageEvent;
        } catch {
          e = undefined;
        }
      }
      if (!e) {
        said.push(l);
        return;
      }
      if (e.event === 'error') failed = e;
      o.onProgress?.(e);
    });
    const stderrClosed = new Promise<void>((r) => stderr.on('close', r));
    // SIGTERM: oac-image cancels, keeps what it downloaded and exits (on
    // Windows the process is ended; the partial file is kept all the same).
    const onAbort = (): void => {
      child.kill('SIGTERM');
    };
    o.signal?.addEventListener('abort', onAbort, { once: true });
    child.on('error', (err) => {
      if (child.pid === undefined) {
        o.signal?.removeEventListener('abort', onAbort);
        reject(launchError('oac-image', path, err));
      }
    });
    child.on('close', async (status, signal) => {
      o.signal?.removeEventListener('abort', onAbort);
      await stderrClosed;
      if (o.signal?.aborted) return reject(abortError(o.signal, 'stage'));
      if (status === 0) return resolve(staged);
      const text = said.join('\n').trim();
      if (status === 2) return reject(new StageError(`oac-image stage: ${text}`, 'usage', undefined, status));
      if (failed?.code) return reject(new StageError(`stage ${failed.name || failed.sha256}: ${failed.error ?? failed.code}`, failed.code, failed, status));
      reject(new StageError(`oac-image stage: ${text || `exit status ${status ?? signal}`}`, 'other', undefined, status));
    });
  });
}

/**
 * stage() as an async iterator of its progress events; it returns the
 * staged artifacts when done, and throws what stage() rejects with.
 */
export async function* stageEvents(manifest: string, o: Omit<StageOptions, 'onProgress'>): AsyncGenerator<StageEvent, Staged[], undefined> {
  const queue: StageEvent[] = [];
  let wake: () => void = () => {};
  let done = false;
  const result = stage(manifest, {
    ...o,
    onProgress: (e) => {
      queue.push(e);
      wake();
    },
  }).finally(() => {
    done = true;
    wake();
  });
  result.catch(() => {});
  for (;;) {
    while (queue.length > 0) yield queue.shift()!;
    if (done) return result;
    await new Promise<void>((r) => (wake = r));
  }
}
